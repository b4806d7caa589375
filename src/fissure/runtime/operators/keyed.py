"""One stateful operator over the records of a micro-batch (no pyspark here).

The Spark layer's state processor calls `run_keys` once per bucket of keys of a partitioned
operator (each key's stored state, its bytes under the operator's StateCodec or None for a key
seen for the first time, is loaded and its new state stored through callbacks), and `run_group`
once per batch for an operator without key. A key's records reach the operator in sequence-number
order (or by `order_by` first), whatever order the exchange delivered them in.

A state equal to a fresh `state_factory()` after a key's records (a cleared dict, by default) is
deleted, not stored: a key without state gets a fresh one when it comes back, so the two cannot be
told apart, and a deleted key costs nothing in the state store.

A per-key step (`StatefulStep.per_key`: windows, aggregates, deduplication, expiry; built by
fissure.runtime.operators.timed) is called once per key and batch with all the key's records,
`fn(state, records, seqs, time) -> KeyEmitted`, and also for the keys `due` in that batch without
records (their windows or expiries fire); `time` is the batch's BatchTime. Its new state None
deletes the key's state (`store(key, None)`), and `deadline(key, seconds or None)` learns when
the key next has something to fire.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii  # json.dumps's own escaping of a str
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from fissure.runtime.records.arrow_rows import batch_records, column_values
from fissure.runtime.records.columns import SEQ
from fissure.runtime.records.carried import (assemble, dead_letter_batch, live_batch, records_to_batch, reshape_dead,
                                             split_dead)
from fissure.runtime.records.fate import (DeadLetter, OperatorFailedError, describe_error, mark_idle, mark_running,
                                          normalize_emitted, operator_stopped, record_failed, record_text)
from fissure.runtime.state.codec import StateCodec, StateCodecError

# A key's stored state: its bytes under the operator's codec, and whether they are a (verified) pickle.
Stored = tuple[bytes, bool]


@dataclass(frozen=True)
class StatefulStep:
    """A partitioned (key set) or unkeyed (key None) stateful operator as the worker runs it."""

    name: str
    fn: Callable[[Any, dict], Any]
    state_factory: Callable[[], Any]
    input_schema: pa.Schema  # the user's fields it receives
    output_schema: pa.Schema  # the user's fields it emits
    key: tuple[str, ...] | None = None
    order_by: str | None = None  # field sorted on before the sequence number
    codec: StateCodec | None = None  # None: plain data (StateCodec(name))

    per_key: bool = False  # fn(state, records, seqs, time) -> KeyEmitted once per key and batch

    @property
    def state_codec(self) -> StateCodec:
        return self.codec if self.codec is not None else StateCodec(self.name)


@dataclass(frozen=True)
class BatchTime:
    """The two watermarks (event-time seconds; processing-time steps: batch times) a micro-batch
    runs a time-aware step with: a record whose windows all ended at or before `previous` (the
    batch before's watermark) is late; everything due at or before `current` fires."""

    previous: float
    current: float


@dataclass
class KeyEmitted:
    """What a per-key step did with one key in one batch."""

    records: list  # emitted records (dicts)
    seqs: list[int]  # their sequence numbers
    dead: list[DeadLetter]  # the key's records it could not process (late, no event time, raised)
    state: Any  # the key's new state; None: delete it
    deadline: float | None = None  # when the key next has something to fire; None: nothing pending


@dataclass(frozen=True)
class GroupResult:
    """What one key's records produced: the carried output batch and the state to store."""

    batch: pa.RecordBatch
    state: bytes | None  # None: nothing to store (no live record for this key in the batch), or deleted
    deleted: bool = False  # the state ended equal to a fresh one: remove what is stored


def fresh_state(step: StatefulStep) -> Any:
    try:
        return step.state_factory()
    except Exception as error:
        raise OperatorFailedError(f"operator {step.name!r}: its state_factory raised {describe_error(error)}") from error


def load_state(step: StatefulStep, stored: Stored | None, codec: StateCodec | None = None) -> Any:
    if stored is not None:
        return (codec or step.state_codec).loads(*stored)
    return fresh_state(step)


def dump_state(step: StatefulStep, key: str, state: Any, codec: StateCodec | None = None) -> bytes:
    try:
        return (codec or step.state_codec).dumps(state, f"of key {key!r}" if step.key else "")
    except StateCodecError as error:
        raise OperatorFailedError(str(error)) from error


def key_values_text(values: Sequence) -> str:
    """A key's fields' values as text, `json.dumps(list(values), default=repr)`: one state per
    distinct text, and the text packing hashes into the key's bucket. One text or whole-number
    field gets the same text without json.dumps's set-up (it is made once per key and batch)."""
    if len(values) == 1:
        (value,) = values
        if type(value) is str:
            return "[" + encode_basestring_ascii(value) + "]"
        if type(value) is int:
            return "[" + int.__repr__(value) + "]"
    return json.dumps(list(values), default=repr)


def key_text(record: Mapping, fields: Sequence[str]) -> str:
    """A record's key as text: `key_values_text` of its key fields' values."""
    return key_values_text([record[field] for field in fields])


_NONE_TYPE = type(None)


def null_key_error(record: Mapping, fields: Sequence[str]) -> str:
    """The reason a record whose key field is null (None) or missing is a dead letter."""
    null = [name for name in fields if record.get(name) is None]
    names = ", ".join(map(repr, null))
    return (f"NullKey: key field{'s' if len(null) > 1 else ''} {names} "
            f"{'are' if len(null) > 1 else 'is'} null or missing; state is kept per key value, so a record "
            f"without one is not processed (give it a key upstream, or filter it out)")


def group_by_key(records: list[dict], fields: Sequence[str]) -> dict[str | None, list[int]]:
    """The positions of `records` per key text (`key_text`), in order of first appearance; the
    records whose key field is null or missing under None. Grouped on the key's values, its text
    made once per key, not per record; the value's type is part of the group: 1, 1.0 and True are
    equal in Python, not as text."""
    positions: dict[tuple, list[int]] = {}
    try:
        if len(fields) == 1:  # the common case, without a tuple of values per record
            (field,) = fields
            for position, record in enumerate(records):
                value = record[field]
                positions.setdefault((type(value), value), []).append(position)
        else:
            for position, record in enumerate(records):
                values = tuple(record[name] for name in fields)
                positions.setdefault((tuple(map(type, values)), values), []).append(position)
    except TypeError:  # an unhashable key value (a list): group on the text itself
        positions = {}
        for position, record in enumerate(records):
            values = tuple(record[name] for name in fields)
            positions.setdefault(None if None in values else key_values_text(values), []).append(position)
    grouped: dict[str | None, list[int]] = {}
    nulls = positions.pop((_NONE_TYPE, None), []) + positions.pop(None, [])
    if len(fields) > 1:
        for group_key in [group_key for group_key in positions if isinstance(group_key, tuple)
                          and None in group_key[1]]:
            nulls += positions.pop(group_key)
    if nulls:
        grouped[None] = sorted(nulls)  # no key: dead letters (NULL_KEY)
    for places in positions.values():
        text = key_text(records[places[0]], fields)
        # values unequal to themselves (NaN) make several groups of one text: merged, in order
        grouped[text] = sorted(grouped[text] + places) if text in grouped else places
    return grouped


def run_group(step: StatefulStep, batch: pa.RecordBatch, stored_state: Stored | None) -> GroupResult:
    """Run `step` over one key's carried rows in sequence order; dead letters pass through."""
    stored = {}

    def store(key: str, state: bytes | None) -> None:
        stored["state"] = state

    output = _run(step, batch, lambda records: {"": list(range(len(records)))}, lambda key: stored_state, store)
    if "state" in stored and stored["state"] is None:
        return GroupResult(output, None, deleted=True)
    return GroupResult(output, stored.get("state"))


def run_keys(step: StatefulStep, batch: pa.RecordBatch, load: Callable[[str], Stored | None],
             store: Callable[[str, bytes | None], None],
             prefetch: Callable[[list[str]], None] | None = None, *, time: BatchTime | None = None,
             due: Sequence[str] = (), deadline: Callable[[str, float | None], None] | None = None
             ) -> pa.RecordBatch:
    """Run the partitioned `step` over the carried rows of many keys at once (a bucket of keys, one
    Spark call): each key's records in (order_by, sequence) order with the state `load(key)`
    returns (None: a key seen for the first time), its new state handed to `store(key, state)`;
    keys are `key_text`; `prefetch`, when given, gets every key of the batch before the first
    `load`. A record whose key field is null (or missing) is a dead letter (`null_key_error`): no
    state is kept for it. Dead letters pass through. Returns the carried output."""
    fields = step.key
    return _run(step, batch, lambda records: group_by_key(records, fields), load, store, prefetch, time, due,
                deadline)


def run_grouped_keys(step: StatefulStep, grouped: Mapping[str, list[int]], inputs: list, input_seqs: list[int],
                     load: Callable[[str], Stored | None], store: Callable[[str, bytes | None], None],
                     prefetch: Callable[[list[str]], None] | None = None, *, time: BatchTime | None = None,
                     due: Sequence[str] = (), deadline: Callable[[str, float | None], None] | None = None
                     ) -> pa.RecordBatch:
    """Run the per-key `step` over inputs already grouped by key text (a combined aggregate's
    partials, fissure.runtime.operators.combine: `inputs[i]` is one partial, `input_seqs[i]` its first
    sequence number), then over the keys `due`, as `run_keys` does. Returns the carried output."""
    records: list = []
    seqs: list[int] = []
    dead: list[DeadLetter] = []
    if inputs or due:
        mark_running(step.name)
        _run_per_key(step, {key: list(places) for key, places in grouped.items()}, inputs, input_seqs, load, store,
                     prefetch, time, due, deadline, records, seqs, dead)
    mark_idle()
    data, seqs = records_to_batch(records, seqs, step.output_schema, step.name, dead)
    emitted_batch = live_batch(data, seqs)
    return assemble([emitted_batch, dead_letter_batch(dead, step.output_schema) if dead else None],
                    emitted_batch.schema)


def _run(step: StatefulStep, batch: pa.RecordBatch, group: Callable[[list[dict]], dict[str, list[int]]],
         load: Callable[[str], Stored | None], store: Callable[[str, bytes | None], None],
         prefetch: Callable[[list[str]], None] | None = None, time: BatchTime | None = None,
         due: Sequence[str] = (), deadline: Callable[[str, float | None], None] | None = None) -> pa.RecordBatch:
    live, upstream_dead = split_dead(batch)
    codec = step.state_codec
    fresh: list[bytes] = []  # a fresh state's bytes, made when the first key is stored
    dead: list[DeadLetter] = []
    records: list = []
    seqs: list[int] = []
    if step.per_key:
        inputs, input_seqs = [], []
        if live.num_rows:
            ordered = live.take(pc.sort_indices(live, sort_keys=[(SEQ, "ascending")]))
            inputs = batch_records(ordered.select(step.input_schema.names))
            input_seqs = column_values(ordered.column(ordered.schema.get_field_index(SEQ)))
        if inputs or due:
            mark_running(step.name)
            grouped = group(inputs) if inputs else {}
            _run_per_key(step, grouped, inputs, input_seqs, load, store, prefetch, time, due, deadline,
                         records, seqs, dead)
    elif live.num_rows:
        sort_keys = ([(step.order_by, "ascending")] if step.order_by else []) + [(SEQ, "ascending")]
        ordered = live.take(pc.sort_indices(live, sort_keys=sort_keys))
        inputs = batch_records(ordered.select(step.input_schema.names))
        input_seqs = column_values(ordered.column(ordered.schema.get_field_index(SEQ)))
        mark_running(step.name)
        fn, append, append_seq = step.fn, records.append, seqs.append
        grouped = group(inputs)
        if prefetch is not None:
            prefetch([key for key in grouped if key is not None])
        for key, positions in grouped.items():
            if key is None:  # records without a key value
                for position in positions:
                    record = inputs[position]
                    dead.append(DeadLetter(step.name, null_key_error(record, step.key), record_text(record),
                                           input_seqs[position]))
                continue
            state = load_state(step, load(key), codec)
            for position in positions:
                record, seq = inputs[position], input_seqs[position]
                try:
                    emitted = fn(state, record)
                    if emitted is None:
                        continue
                    if type(emitted) is dict:  # one record: the common case, without a list
                        append(emitted)
                        append_seq(seq)
                        continue
                    emitted = normalize_emitted(emitted)
                except Exception as error:  # noqa: BLE001 - a bad record becomes a dead letter
                    dead.append(record_failed(step.name, error, record, seq))
                    continue
                except (SystemExit, KeyboardInterrupt) as error:
                    raise operator_stopped(step.name, error) from error
                records.extend(emitted)
                seqs.extend([seq] * len(emitted))
            data = dump_state(step, key, state, codec)
            if not fresh:
                fresh.append(dump_state(step, key, fresh_state(step), codec))
            store(key, None if data == fresh[0] else data)
    mark_idle()
    data, seqs = records_to_batch(records, seqs, step.output_schema, step.name, dead)
    emitted_batch = live_batch(data, seqs)
    return assemble(
        [emitted_batch,
         reshape_dead(upstream_dead, step.output_schema) if upstream_dead is not None else None,
         dead_letter_batch(dead, step.output_schema) if dead else None],
        emitted_batch.schema,
    )


def _run_per_key(step: StatefulStep, grouped: dict[str | None, list[int]], inputs: list[dict], input_seqs: list[int],
                 load: Callable[[str], bytes | None], store: Callable[[str, bytes | None], None],
                 prefetch: Callable[[list[str]], None] | None, time: BatchTime | None, due: Sequence[str],
                 deadline: Callable[[str, float | None], None] | None, records: list, seqs: list[int],
                 dead: list[DeadLetter]) -> None:
    """A per-key step over each key with records, then each due key without: one call per key."""
    for position in grouped.pop(None, []):  # records without a key value
        record = inputs[position]
        dead.append(DeadLetter(step.name, null_key_error(record, step.key), record_text(record), input_seqs[position]))
    keys = list(grouped) + [key for key in dict.fromkeys(due) if key not in grouped]
    if prefetch is not None and keys:
        prefetch(keys)
    fn = step.fn
    for key in keys:
        positions = grouped.get(key, ())
        stored = load(key)
        state = load_state(step, stored)
        try:
            emitted = fn(state, [inputs[position] for position in positions],
                         [input_seqs[position] for position in positions], time)
        except (SystemExit, KeyboardInterrupt) as error:
            raise operator_stopped(step.name, error) from error
        records.extend(emitted.records)
        seqs.extend(emitted.seqs)
        dead.extend(emitted.dead)
        if emitted.state is not None:
            store(key, dump_state(step, key, emitted.state))
        elif stored is not None:
            store(key, None)
        if deadline is not None:
            deadline(key, emitted.deadline if emitted.state is not None else None)
