"""A combined `Count()` folded on the Arrow columns (no pyspark here).

fissure.runtime.operators.combine's `Combiner` folds a task's records into one partial per key
(and window) with the aggregate's `add(acc, record)`, a dict per record. A `Count`'s `add` reads
nothing of the record, so for it the task counts on the columns instead: the keys' distinct values
from the key columns' dictionaries (fissure.runtime.operators.packing.distinct_keys), each event
time's tumbling window, its lateness and the counts per key and window with NumPy. The entries,
the largest event time and the dead letters (same reasons, same order) are the per-record fold's;
only the records that become dead letters are made dicts, for their text (tests/runtime/test_combine.py
compares the two paths).
"""

from __future__ import annotations

import math
import time as clock

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fissure.program.aggregates import Count
from fissure.program.eventtime import event_seconds, no_event_time
from fissure.program.windows import Tumbling
from fissure.runtime.operators.keyed import key_values_text, null_key_error
from fissure.runtime.operators.packing import distinct_keys
from fissure.runtime.operators.timed import open_windows
from fissure.runtime.records.arrow_rows import batch_records, column_values
from fissure.runtime.records.columns import SEQ
from fissure.runtime.records.fate import DeadLetter, record_text


def counts_by_columns(plan) -> bool:
    """Whether a task can count the records per key (and tumbling window) from the Arrow
    columns, without a dict per record: a `Count()` (its `add` reads nothing of the record),
    running or over `Tumbling` windows of a float or integer event time, keyed on text or
    integer fields, whose key texts the columns' distinct values give exactly (one value type
    per column). Any other aggregate, window, key or time type goes through the records."""
    if type(plan.aggregate) is not Count or not plan.key:
        return False
    fields = {field.name: field.type for field in plan.input_schema}
    if not all(name in fields and _exact_key_type(fields[name]) for name in plan.key):
        return False
    if plan.window is None:
        return True
    kind = fields.get(plan.time_field)
    return (type(plan.window) is Tumbling and kind is not None
            and (pa.types.is_float64(kind) or pa.types.is_integer(kind)))


def _exact_key_type(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind)


def add_counts(combiner, carried: pa.RecordBatch) -> list[DeadLetter] | None:
    """`add` for a Count (`counts_by_columns`): the entries, largest event time and
    dead letters (same reasons, same order) of the per-record fold, from the Arrow columns;
    only the records that become dead letters are made dicts, for their text. None (nothing
    added): the keys do not fit one integer code, `add` goes through the records."""
    plan, window = combiner.plan, combiner.plan.window
    ordered = carried.take(pc.sort_indices(carried, sort_keys=[(SEQ, "ascending")]))  # stable
    rows = ordered.num_rows
    seqs = ordered.column(SEQ).to_numpy(zero_copy_only=False)
    no_key = np.zeros(rows, dtype=bool)
    for name in plan.key:
        no_key |= ordered.column(name).is_null().to_numpy(zero_copy_only=False)
    keyed = np.flatnonzero(~no_key)
    found = distinct_keys(ordered.take(pa.array(keyed, pa.int64())).select(list(plan.key)), plan.key) \
        if len(keyed) else ([], [])
    if found is None:  # keys Arrow cannot encode into one code: through the records
        return None
    combiner.records_in += rows
    if window is not None:
        times = ordered.column(plan.time_field).cast(pa.float64())
        t = times.fill_null(math.nan).to_numpy(zero_copy_only=False)
        usable = np.isfinite(t)  # a null, NaN or infinite event time is none
        if usable.any():  # every usable event time counts for the watermark, a null key's too
            seen = float(t[usable].max())
            if combiner.largest is None or seen > combiner.largest:
                combiner.largest = seen
    started_s = clock.thread_time()
    key_values, key_of = found
    key_of = np.asarray(key_of, dtype=np.int64)
    _, first_place, records_per_key = np.unique(key_of, return_index=True, return_counts=True)
    order = np.argsort(first_place, kind="stable")  # keys by their first record in sequence order
    dead_rows: list[tuple] = [(0, int(row)) for row in np.flatnonzero(no_key)]  # (sort key..., row, kind)
    dead_per_key = np.zeros(len(key_values), dtype=np.int64)
    rank = np.empty(len(key_values), dtype=np.int64)
    rank[order] = np.arange(len(key_values))
    if window is None:
        folded = np.arange(len(keyed))
    else:
        t_keyed = t[keyed]
        index = np.floor(t_keyed / window.size)  # fissure.program.windows.aligned_index, elementwise
        index = np.where(index * window.size > t_keyed, index - 1, index)
        index = np.where((index + 1) * window.size <= t_keyed, index + 1, index)
        starts, ends = index * window.size, (index + 1) * window.size
        late = ends <= combiner.time.previous
        timeless = ~usable[keyed]
        for place in np.flatnonzero(timeless):
            dead_rows.append((1, int(rank[key_of[place]]), 0, int(place), int(keyed[place]), "time"))
        for place in np.flatnonzero(late & ~timeless):
            dead_rows.append((1, int(rank[key_of[place]]), 1, float(t_keyed[place]), int(seqs[keyed[place]]),
                              int(place), int(keyed[place]), "late"))
        np.add.at(dead_per_key, key_of[timeless | late], 1)
        folded = np.flatnonzero(~(timeless | late))
    touched = []
    for position in order:
        values = key_values[position]
        text = key_values_text(values)
        first_seq = int(seqs[keyed[first_place[position]]])
        entry = combiner.entries.get(text)
        if entry is None:
            entry = combiner.entries[text] = [list(values), first_seq, {}, 0, 0, 0.0]
        else:
            entry[1] = min(entry[1], first_seq)
        entry[3] += int(records_per_key[position])
        entry[4] += int(dead_per_key[position])
        touched.append((entry, int(records_per_key[position])))
    if len(folded):
        folded_keys, folded_seqs = key_of[folded], seqs[keyed[folded]]
        if window is None:
            sort = np.lexsort((folded_seqs, folded_keys))
            spans = (folded_keys[sort],)
            last_times = last_starts = last_ends = None
        else:
            folded_t, folded_starts = t_keyed[folded], starts[folded]
            sort = np.lexsort((folded_seqs, folded_t, folded_starts, folded_keys))
            spans = (folded_keys[sort], folded_starts[sort])
            last_times, last_starts, last_ends = folded_t[sort], folded_starts[sort], ends[folded][sort]
        changes = np.zeros(len(sort), dtype=bool)
        changes[0] = True
        for column in spans:
            changes[1:] |= column[1:] != column[:-1]
        group_starts = np.flatnonzero(changes)
        group_ends = np.append(group_starts[1:], len(sort)) - 1  # each group's last: its largest (t, seq)
        counts = group_ends - group_starts + 1
        sorted_seqs = folded_seqs[sort]
        for first, last, count in zip(group_starts.tolist(), group_ends.tolist(), counts.tolist()):
            windows = touched[rank[spans[0][first]]][0][2]
            last_seq = int(sorted_seqs[last])
            if window is None:
                slot = windows.get(None)
                acc = slot[0] if slot is not None else plan.aggregate.create()
                windows[None] = [acc + count, last_seq if slot is None else max(slot[1], last_seq), None, None]
                continue
            start, last_time, end = float(last_starts[last]), float(last_times[last]), float(last_ends[last])
            slot = windows.get(start)
            if slot is None:
                windows[start] = [plan.aggregate.create() + count, last_seq, last_time, end]
            elif (last_time, last_seq) > (slot[2], slot[1]):
                windows[start] = [slot[0] + count, last_seq, last_time, end]
            else:
                slot[0] += count
    if len(keyed):
        per_record_s = (clock.thread_time() - started_s) / len(keyed)
        for entry, count in touched:
            entry[5] += per_record_s * count
    return _dead_letters_of(combiner, ordered, sorted(dead_rows))

def _dead_letters_of(combiner, ordered: pa.RecordBatch, dead_rows: list[tuple]) -> list[DeadLetter]:
    """The dead letters of `add_counts`, in its order: records without a key value, then per
    key those without an event time, then its late ones in (event time, sequence) order."""
    if not dead_rows:
        return []
    plan = combiner.plan
    picked = [(row[-2], row[-1]) if row[0] else (row[1], "key") for row in dead_rows]
    rows = ordered.take(pa.array([row for row, _ in picked], pa.int64()))
    records = batch_records(rows.select(plan.input_schema.names))
    combiner.records_as_dicts += len(records)
    seqs = column_values(rows.column(SEQ))
    dead = []
    for (_, why), record, seq in zip(picked, records, seqs):
        if why == "key":
            reason = null_key_error(record, plan.key)
        elif why == "time":
            reason = no_event_time(plan.time_field, record)
        else:
            reason = open_windows(plan.window, event_seconds(record.get(plan.time_field)), combiner.time.previous)[1]
        dead.append(DeadLetter(plan.name, reason, record_text(record), seq))
    return dead
