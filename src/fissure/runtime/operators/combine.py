"""Aggregates combined before the exchange (no pyspark here).

An `aggregate` (no `expire_after`) or a tumbling or sliding `window` whose aggregate can merge
accumulators gets, in the stage before its exchange, one partial per key (and window) per task
and micro-batch instead of every record. The stage before is a pe stage, the source's envelopes,
or another keyed operator's stage (a per-user aggregate before a per-region count, a window
before a wider window), which folds per handler call, one bucket of its keys: Spark gives a
transformWithStateInPandas handler no end-of-task call to emit from. The task folds its records
with the aggregate's `create`/`add` (`Combiner`), ships the partials, and the keyed stage merges them into the key's
state with `merge` and emits once per changed key or closed window (`CombinedAggregateKeys`,
`CombinedWindowKeys`), exactly what the per-record functions of fissure.runtime.operators.timed emit. Spark,
Flink and Beam combine the same way before their shuffles (Beam's CombineFn "combiner lifting").

Which operators combine is a pure decision (fissure.program.combine_policy.combine_decision):
- an `aggregate` without `expire_after`: nothing depends on the key's state but the accumulator;
- a `Tumbling` or `Sliding` window: a record is late when every window it falls in ended at or
  before the batch before's watermark (W_prev), which the task reads from the batch's clock, so the
  task judges lateness itself and folds only records it keeps. A pe stage's or a keyed stage's
  task reads the clock the window's own stage runs with (a task whose clock is not its batch's
  ships the records whole); the source's envelopes are made without it, but a window never reads
  a source directly (its `event_time` declaration runs before it). A session window's lateness
  depends on the key's stored sessions, so sessions are not combined;
- the aggregate is combinable: a fold (`Count`, `Sum`, `Min`, `Max`, `Mean`, or an object whose
  `merge` is its own), not `Aggregate.of(fn)` (its accumulator is the window's records: nothing
  to gain) and not an object that sets `combinable = False`. Merging assumes what Beam's
  CombineFn and Flink's AggregateFunction assume: `merge` is associative and commutative, so
  partials from any tasks merged in any order give the result of adding the records one by one;
- the operator's input stream is read by it alone (no sink, no other operator), so the records
  need not travel as well.

How the task gets the records: a pe stage whose one piece makes the operator's input with a run
of per-record operators hands the run's output dicts to `Combiner.add_records` (no Arrow row per
record, fissure.runtime.operators.dict_fold, which judges each record as its conversion to Arrow
would and sends a batch it cannot judge through Arrow); otherwise `Combiner.add` takes the Arrow
rows, and a `Count` is counted on their columns (fissure.runtime.operators.column_fold).

Equal outputs: a record that fails `add` (e.g. `Sum` over a None field), has no key value or (a
window) no event time, or is late is a dead letter of the operator with the same reason, made in
the task instead of the keyed stage. An output's sequence number is the last record added to it,
as before: the largest for an aggregate, the last in (event time, sequence) order for a window;
each partial carries it. Replayed, a micro-batch's tasks read the same records with the same
clock, so they make the same partials.
"""

from __future__ import annotations

import time as clock
import typing
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from fissure.program.aggregates import Count
from fissure.program.eventtime import AggregateRole, WindowRole, event_seconds, no_event_time
from fissure.runtime.records.arrow_rows import batch_records, column_values
from fissure.runtime.records.columns import SEQ
from fissure.runtime.operators.count_fold import count_plain_keys, flush_counts
from fissure.runtime.operators.keyed import BatchTime, KeyEmitted, group_by_key, null_key_error
from fissure.runtime.operators.column_fold import add_counts, counts_by_columns
from fissure.runtime.records.gc_pause import collector_paused
from fissure.runtime.records.fate import DeadLetter, OperatorFailedError, operator_stopped, record_failed, record_text
from fissure.runtime.state.codec import StateCodec, StateCodecError
from fissure.runtime.operators.timed import TimedKeyFunction, emit_window, open_windows

PARTIAL_KEY = "_fissure_partial_key"  # the key's text (fissure.runtime.operators.keyed.key_text); null: a task's largest only
# {"key": [values], "acc": accumulator} under the operator's state codec; null: the key's records
# all failed, the row only carries their counts
PARTIAL = "_fissure_partial"
FIRST_SEQ = "_fissure_first_seq"  # the smallest sequence number of the key's records in the task
LAST_SEQ = "_fissure_last_seq"  # the sequence number of the last record added
LAST_TIME = "_fissure_last_time"  # that record's event time (windows)
WINDOW_START, WINDOW_END = "_fissure_window_start", "_fissure_window_end"
LARGEST = "_fissure_largest"  # the largest usable event time the task saw (the watermark's input)
# The key's records in the task and the dead letters made of them (on the key's first partial,
# 0 on its others): the operator's counts, as if its records had travelled.
RECORDS, DEAD = "_fissure_records", "_fissure_dead"
# The task's thread-CPU seconds folding the key's records (its share of each `add` call, by its
# records; on the key's first partial): what a profile adds to the operator's timed merges.
FOLD_CPU_S = "_fissure_fold_cpu_s"
PARTIAL_SCHEMA = pa.schema([
    pa.field(PARTIAL_KEY, pa.string()), pa.field(PARTIAL, pa.binary()), pa.field(FIRST_SEQ, pa.int64()),
    pa.field(LAST_SEQ, pa.int64()), pa.field(LAST_TIME, pa.float64()), pa.field(WINDOW_START, pa.float64()),
    pa.field(WINDOW_END, pa.float64()), pa.field(LARGEST, pa.float64()), pa.field(RECORDS, pa.int64()),
    pa.field(DEAD, pa.int64()), pa.field(FOLD_CPU_S, pa.float64()),
])


def is_partial_schema(schema: pa.Schema) -> bool:
    return PARTIAL in schema.names


@dataclass(frozen=True)
class CombinePlan:
    """What a task needs to combine one operator's records: the operator's name, key fields,
    input schema, aggregate, window (None: a running aggregate), event-time field and input
    stream."""

    name: str
    key: tuple[str, ...]
    input_schema: pa.Schema
    aggregate: typing.Any
    window: typing.Any = None
    time_field: str | None = None
    stream: str = ""

    @classmethod
    def of(cls, operator: typing.Any, input_schema: pa.Schema, time_field: str | None,
           stream: str = "") -> CombinePlan:
        role = operator.time
        return cls(operator.name, tuple(operator.key), input_schema, role.aggregate,
                   role.window if isinstance(role, WindowRole) else None, time_field, stream)

    @property
    def needs_clock(self) -> bool:
        return self.window is not None

    @property
    def counts_by_columns(self) -> bool:
        """Whether a task folds this operator's records on the Arrow columns
        (fissure.runtime.operators.column_fold.counts_by_columns)."""
        return counts_by_columns(self)


# --- the task's side ------------------------------------------------------------------------------


class Combiner:
    """One task's partials of one operator over a micro-batch: `add` each carried batch of the
    operator's live input rows (returns the dead letters it made), then `partials()`."""

    def __init__(self, plan: CombinePlan, time: BatchTime | None = None, columnar: bool = True) -> None:
        if plan.needs_clock and time is None:
            raise ValueError(f"operator {plan.name!r}: a window is combined only with its batch's watermarks")
        self.plan, self.time = plan, time
        # `columnar`: count from the Arrow columns when the plan allows it (False: a dict per record,
        # the reference the columnar path is tested against)
        self.columnar = columnar and plan.counts_by_columns
        self.records_as_dicts = 0  # the records `add` turned into dicts (on the columns: its dead letters only)
        self.codec = StateCodec(plan.name)
        self._entries: dict[str, list] = {}  # `entries`
        # a running Count's batches counted on the columns, not in the entries yet (count_fold):
        # (distinct key values, records, first seq, last seq per value, fold seconds per record)
        self._pending: list[tuple] = []
        self.largest: float | None = None
        self.records_in = 0

    def add(self, carried: pa.RecordBatch) -> list[DeadLetter]:
        if not carried.num_rows:
            return []
        if self.columnar:
            dead = add_counts(self, carried)
            if dead is not None:
                return dead
        plan = self.plan
        ordered = carried.take(pc.sort_indices(carried, sort_keys=[(SEQ, "ascending")]))
        records = batch_records(ordered.select(plan.input_schema.names))
        self.records_as_dicts += len(records)
        seqs = column_values(ordered.column(ordered.schema.get_field_index(SEQ)))
        return self._add_ordered(records, seqs)

    def add_records(self, records: list[dict], seqs: list[int],
                    key_column: tuple[list, set] | None = None) -> list[DeadLetter]:
        """`add` of records a fused run emitted, as the dicts themselves: each a dict of exactly
        the input schema's fields whose values are what Arrow would give back for them
        (fissure.runtime.operators.dict_fold judges that). No Arrow row is made of them.
        `key_column`: the one key field's values in the records' order and their Python types,
        when the caller has them already."""
        if not records:
            return []
        if seqs != sorted(seqs):  # a run emits in sequence order: the check is one C-level pass
            order = sorted(range(len(seqs)), key=seqs.__getitem__)  # stable, as the batch's sort by SEQ
            records, seqs = [records[position] for position in order], [seqs[position] for position in order]
            key_column = None
        counting = type(self.plan.aggregate) is Count
        if counting and self.plan.window is None and count_plain_keys(self, records, seqs, key_column):
            return []
        return self._add_ordered(records, seqs, counting=counting)

    @property
    def entries(self) -> dict[str, list]:
        """key text -> [key values, first seq, {window start or None: [acc, last seq, last time,
        end]}, records, dead letters, fold CPU seconds]"""
        flush_counts(self)
        return self._entries

    def _add_ordered(self, records: list[dict], seqs: list[int], counting: bool = False) -> list[DeadLetter]:
        """`counting`: a running `Count` adds each key's number of records at once (its `add` is
        `acc + 1`, reads nothing and cannot fail), not one `add` call per record."""
        plan = self.plan
        self.records_in += len(records)
        if plan.window is not None:  # every usable event time counts for the watermark, a null key's too
            for record in records:
                t = event_seconds(record.get(plan.time_field))
                if t is not None and (self.largest is None or t > self.largest):
                    self.largest = t
        dead: list[DeadLetter] = []
        grouped = group_by_key(records, plan.key)
        started_s = clock.thread_time()  # the fold, not the conversion to dicts nor the grouping
        for position in grouped.pop(None, []):
            record = records[position]
            dead.append(DeadLetter(plan.name, null_key_error(record, plan.key), record_text(record), seqs[position]))
        for text, positions in grouped.items():
            entry = self.entries.get(text)
            if entry is None:
                entry = self.entries[text] = [[records[positions[0]][name] for name in plan.key], seqs[positions[0]],
                                              {}, 0, 0, 0.0]
            else:
                entry[1] = min(entry[1], seqs[positions[0]])
            dead_before = len(dead)
            if plan.window is None and counting:
                slot = entry[2].get(None)
                last_seq = max(map(seqs.__getitem__, positions))
                entry[2][None] = [len(positions), last_seq, None, None] if slot is None else \
                    [slot[0] + len(positions), max(slot[1], last_seq), None, None]
            elif plan.window is None:
                self._fold(entry[2], records, seqs, positions, dead)
            else:
                self._fold_windows(entry[2], records, seqs, positions, dead)
            entry[3] += len(positions)
            entry[4] += len(dead) - dead_before
        per_record_s = (clock.thread_time() - started_s) / max(1, sum(len(places) for places in grouped.values()))
        for text, positions in grouped.items():
            self.entries[text][5] += per_record_s * len(positions)
        return dead

    def _failed(self, error: BaseException, record: dict, seq: int) -> DeadLetter:
        if isinstance(error, (SystemExit, KeyboardInterrupt)):
            raise operator_stopped(self.plan.name, error) from error
        return record_failed(self.plan.name, error, record, seq)

    def _fold(self, windows: dict, records: list[dict], seqs: list[int], positions: list[int],
              dead: list[DeadLetter]) -> None:
        aggregate = self.plan.aggregate
        slot = windows.get(None)
        acc = slot[0] if slot is not None else aggregate.create()
        last_seq = slot[1] if slot is not None else None
        for position in positions:
            record, seq = records[position], seqs[position]
            try:
                acc = aggregate.add(acc, record)
            except BaseException as error:  # noqa: BLE001 - the aggregate's error: the record's dead letter
                dead.append(self._failed(error, record, seq))
                continue
            last_seq = seq if last_seq is None else max(last_seq, seq)
        if last_seq is not None:
            windows[None] = [acc, last_seq, None, None]

    def _fold_windows(self, windows: dict, records: list[dict], seqs: list[int], positions: list[int],
                      dead: list[DeadLetter]) -> None:
        plan, time = self.plan, self.time
        aggregate, field = plan.aggregate, plan.time_field
        items = []
        for position in positions:
            record, seq = records[position], seqs[position]
            t = event_seconds(record.get(field))
            if t is None:
                dead.append(DeadLetter(plan.name, no_event_time(field, record), record_text(record), seq))
                continue
            items.append((t, seq, record))
        items.sort(key=lambda item: (item[0], item[1]))
        for t, seq, record in items:
            open_spans, late = open_windows(plan.window, t, time.previous)
            if late:
                dead.append(DeadLetter(plan.name, late, record_text(record), seq))
                continue
            try:
                added = [(start, end, aggregate.add(windows[start][0] if start in windows else aggregate.create(),
                                                    record)) for start, end in open_spans]
            except BaseException as error:  # noqa: BLE001 - the aggregate's error: the record's dead letter
                dead.append(self._failed(error, record, seq))
                continue
            for start, end, acc in added:
                slot = windows.get(start)
                if slot is None or (t, seq) > (slot[2], slot[1]):
                    windows[start] = [acc, seq, t, end]
                else:
                    slot[0] = acc

    def partials(self) -> pa.RecordBatch:
        """The task's partials: a row per key (and window); a row without key when the task saw an
        event time but made no partial (its records all failed), so the watermark still learns it.
        The cyclic collector waits while they are made (a list or more per key, all alive until
        they are Arrow: fissure.runtime.records.gc_pause)."""
        with collector_paused():
            return self._partials()

    def _partials(self) -> pa.RecordBatch:
        columns: list[list] = [[] for _ in PARTIAL_SCHEMA]
        for text, (values, first_seq, windows, records, dead, fold_s) in self.entries.items():
            if not windows:  # every record of the key failed: its counts still reach the profile
                for column, value in zip(columns, (text, None, first_seq, None, None, None, None, self.largest,
                                                   records, dead, fold_s)):
                    column.append(value)
                continue
            for number, (start, (acc, last_seq, last_time, end)) in enumerate(windows.items()):
                try:
                    body = self.codec.dumps({"key": values, "acc": acc}, f"of key {text!r}")
                except StateCodecError as error:
                    raise OperatorFailedError(str(error)) from error
                for column, value in zip(columns, (text, body, first_seq, last_seq, last_time, start, end,
                                                   self.largest, 0 if number else records, 0 if number else dead,
                                                   0.0 if number else fold_s)):
                    column.append(value)
        if not columns[0] and self.largest is not None:
            for column, value in zip(columns, (None, None, None, None, None, None, None, self.largest, 0, 0, 0.0)):
                column.append(value)
        return pa.RecordBatch.from_arrays([pa.array(values, field.type) for values, field in
                                           zip(columns, PARTIAL_SCHEMA)], schema=PARTIAL_SCHEMA)


# --- the keyed stage's side -------------------------------------------------------------------------


@dataclass(frozen=True)
class PartialInputs:
    """A keyed call's partials, grouped by key as fissure.runtime.operators.keyed.run_grouped_keys takes
    them (keys in order of their first record), and the largest event time they carry."""

    grouped: dict[str, list[int]]
    inputs: list[dict]
    seqs: list[int]
    largest: float | None


def partial_inputs(batch: pa.RecordBatch, codec: StateCodec) -> PartialInputs:
    """Decode a batch of PARTIAL_SCHEMA rows (from any tasks) for the keyed stage."""
    largest_values = [value for value in column_values(batch.column(LARGEST)) if value is not None]
    largest = max(largest_values) if largest_values else None
    rows = batch.filter(batch.column(PARTIAL_KEY).is_valid())
    if rows.num_rows:
        rows = rows.take(pc.sort_indices(rows, sort_keys=[(FIRST_SEQ, "ascending"), (LAST_SEQ, "ascending")]))
    texts = column_values(rows.column(PARTIAL_KEY))
    bodies = column_values(rows.column(PARTIAL))
    first_seqs = column_values(rows.column(FIRST_SEQ))
    last_seqs = column_values(rows.column(LAST_SEQ))
    last_times = column_values(rows.column(LAST_TIME))
    starts = column_values(rows.column(WINDOW_START))
    ends = column_values(rows.column(WINDOW_END))
    counts = column_values(rows.column(RECORDS))
    deads = column_values(rows.column(DEAD))
    fold_seconds = column_values(rows.column(FOLD_CPU_S))
    grouped: dict[str, list[int]] = {}
    inputs: list[dict] = []
    for position, text in enumerate(texts):
        decoded = codec.loads(bodies[position], False) if bodies[position] is not None else None
        inputs.append({"key": decoded["key"] if decoded else None, "acc": decoded["acc"] if decoded else None,
                       "has_acc": decoded is not None, "last_seq": last_seqs[position],
                       "last_time": last_times[position], "start": starts[position], "end": ends[position],
                       "records": counts[position], "dead": deads[position], "fold_cpu_s": fold_seconds[position]})
        grouped.setdefault(text, []).append(position)
    return PartialInputs(grouped, inputs, first_seqs, largest)


class CombinedKeys(TimedKeyFunction):
    """The base of the per-key functions over partials: what a profile counts of a call."""

    @staticmethod
    def records_of(partials: list[dict]) -> int:
        """The records the partials stand for (the operator's records in)."""
        return sum(partial["records"] for partial in partials)

    @staticmethod
    def dead_of(partials: list[dict]) -> int:
        """The dead letters the tasks made of those records."""
        return sum(partial["dead"] for partial in partials)

    @staticmethod
    def groups_of(partials: list[dict]) -> int:
        """The distinct windows the key's partials hold (an aggregate's: one): what the tasks'
        folds would have made of the key's records had one task seen them all."""
        return len({partial["start"] for partial in partials if partial["has_acc"]})

    @staticmethod
    def fold_cpu_of(partials: list[dict]) -> float:
        """The tasks' thread-CPU seconds folding those records."""
        return sum(partial["fold_cpu_s"] for partial in partials)


class CombinedAggregateKeys(CombinedKeys):
    """An `aggregate`'s per-key function over partials: the state and output of
    fissure.runtime.operators.timed.AggregateKeys (no expiry) from merged accumulators."""

    def __init__(self, name: str, key: Sequence[str], role: AggregateRole) -> None:
        super().__init__(name, key, None)
        self.aggregate = role.aggregate

    def __call__(self, state, records, seqs, time):
        dead: list[DeadLetter] = []
        records = [partial for partial in records if partial["has_acc"]]
        if not records and "key" not in state:
            return KeyEmitted([], [], [], None)
        key = state["key"] if "key" in state else records[0]["key"]
        aggregate = self.aggregate
        has_state = "acc" in state
        acc, last_seq = state.get("acc"), state.get("seq")
        batch_seq = None
        for partial in records:
            try:
                acc = aggregate.merge(acc, partial["acc"]) if has_state else partial["acc"]
            except BaseException as error:  # noqa: BLE001 - merge's error: the partial's dead letter
                dead.append(self.dead(error, {"key": key, "partial": partial["acc"]}, partial["last_seq"]))
                continue
            has_state = True
            batch_seq = partial["last_seq"] if batch_seq is None else max(batch_seq, partial["last_seq"])
        out, out_seqs = [], []
        if batch_seq is not None:
            last_seq = batch_seq
            record = dict(zip(self.key, key))
            try:
                result = aggregate.result(acc)
                if not isinstance(result, typing.Mapping):
                    raise TypeError(f"{aggregate!r}.result must return a dict, got {type(result).__name__}")
                record.update(result)
                out.append(record)
                out_seqs.append(last_seq)
            except BaseException as error:  # noqa: BLE001 - the key's result: a dead letter
                dead.append(self.dead(error, record, last_seq))
        if not has_state:
            return KeyEmitted(out, out_seqs, dead, None)
        return KeyEmitted(out, out_seqs, dead, {"key": key, "acc": acc, "last": state.get("last"), "seq": last_seq})


class CombinedWindowKeys(CombinedKeys):
    """A tumbling or sliding window's per-key function over partials: the state and output of
    fissure.runtime.operators.timed.WindowKeys from merged accumulators (the tasks judged lateness)."""

    def __init__(self, name: str, key: Sequence[str], time_field: str, role: WindowRole) -> None:
        super().__init__(name, key, time_field)
        self.aggregate = role.aggregate

    def __call__(self, state, records, seqs, time):
        dead: list[DeadLetter] = []
        records = [partial for partial in records if partial["has_acc"]]
        key = state["key"] if "key" in state else (records[0]["key"] if records else [])
        windows = {entry[0]: list(entry) for entry in state.get("windows", ())}
        aggregate = self.aggregate
        latest: dict[float, tuple[float, int]] = {}  # window start -> (event time, seq) of its last record
        for partial in records:
            start, end = partial["start"], partial["end"]
            try:
                acc = aggregate.merge(windows[start][2], partial["acc"]) if start in windows else partial["acc"]
            except BaseException as error:  # noqa: BLE001 - merge's error: the partial's dead letter
                dead.append(self.dead(error, {"key": key, "window_start": start, "partial": partial["acc"]},
                                      partial["last_seq"]))
                continue
            order = (partial["last_time"], partial["last_seq"])
            if start not in latest or order > latest[start]:
                latest[start], seq = order, partial["last_seq"]
            else:
                seq = windows[start][3]
            windows[start] = [start, end, acc, seq]
        out, out_seqs = [], []
        for start, end, acc, seq in sorted(entry for entry in windows.values() if entry[1] <= time.current):
            del windows[start]
            emit_window(self, aggregate, key, start, end, acc, seq, out, out_seqs, dead)
        remaining = sorted(windows.values(), key=lambda entry: entry[0])
        if not remaining:
            return KeyEmitted(out, out_seqs, dead, None)
        return KeyEmitted(out, out_seqs, dead, {"key": key, "windows": remaining},
                          min(entry[1] for entry in remaining))


def combined_key_function(operator: typing.Any, time_field: str | None) -> CombinedKeys:
    """The per-key function that merges a combined operator's partials."""
    role = operator.time
    if isinstance(role, WindowRole):
        return CombinedWindowKeys(operator.name, operator.key, time_field, role)
    return CombinedAggregateKeys(operator.name, operator.key, role)
