"""The keyed windowed stream-stream join of one key in one micro-batch (no pyspark here).

Semantics: fissure.program.graph's module docstring. The state of a key is a plain dict, stored as
data between micro-batches (fissure.runtime.state.codec, never pickled): its watermark and, per
open window, the left and right records seen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from fissure.runtime.records.arrow_rows import batch_records, column_values
from fissure.runtime.records.columns import SEQ
from fissure.runtime.records.carried import assemble, dead_letter_batch, live_batch, records_to_batch
from fissure.program.eventtime import no_event_time
from fissure.runtime.operators.keyed import null_key_error
from fissure.runtime.records.fate import (DeadLetter, OperatorFailedError, describe_error, normalize_emitted, record_failed,
                                          record_text)
from fissure.runtime.state.codec import StateCodec, StateCodecError, decode_data
from fissure.runtime.operators.timed import late_reason, seconds_text

LEFT, RIGHT = 0, 1


@dataclass(frozen=True)
class JoinStep:
    name: str
    fn: Callable[[dict, dict], Any]
    time_field: str
    window_size: float
    lateness: float
    output_schema: pa.Schema
    key: tuple[str, ...] = ()  # a record with a null key field is a dead letter (keyed.null_key_error)
    trust_legacy_pickle: bool = False  # migrating: a state an earlier fissure pickled may be read once


@dataclass(frozen=True)
class JoinArrival:
    """One record reaching the join: its side (LEFT or RIGHT) and sequence number."""

    side: int
    record: dict
    seq: int


@dataclass(frozen=True)
class JoinResult:
    records: list
    seqs: list[int]
    dead: list[DeadLetter]
    state: bytes  # as stored: sealed by the join's data codec


def load_join_state(step: JoinStep, stored: bytes | None) -> dict:
    if stored is None:
        return {"watermark": None, "windows": {}}
    codec = StateCodec(step.name, trust_legacy_pickle=step.trust_legacy_pickle)
    if codec.is_legacy(stored):
        return codec.unpickle_legacy(stored)  # refused unless migrating
    body, _ = codec.unseal(stored)  # a join's state is always data: never unpickled
    return decode_data(body)


def dump_join_state(step: JoinStep, state: dict) -> bytes:
    codec = StateCodec(step.name)
    try:
        return codec.seal(codec.dumps(state, "of a key"))
    except StateCodecError as error:
        raise OperatorFailedError(str(error)) from error


def arrival_order(arrival: JoinArrival, time_field: str) -> tuple:
    return (arrival.record[time_field], arrival.seq, arrival.side)


def run_join_group(step: JoinStep, arrivals: Sequence[JoinArrival], stored_state: bytes | None) -> JoinResult:
    """Join one key's arrivals (any order: they are taken by event time, then sequence number)."""
    state = load_join_state(step, stored_state)
    windows: dict[int, tuple[list, list]] = state["windows"]
    records, seqs, dead = [], [], []
    for arrival in sorted(arrivals, key=lambda a: arrival_order(a, step.time_field)):
        if step.key and any(arrival.record[name] is None for name in step.key):
            dead.append(DeadLetter(step.name, null_key_error(arrival.record, step.key), record_text(arrival.record),
                                   arrival.seq))
            continue
        event_time = arrival.record[step.time_field]
        if event_time is None:
            dead.append(DeadLetter(step.name, no_event_time(step.time_field, arrival.record),
                                   record_text(arrival.record), arrival.seq))
            continue
        watermark = event_time if state["watermark"] is None else max(state["watermark"], event_time)
        state["watermark"] = watermark
        for closed in [w for w in windows if (w + 1) * step.window_size + step.lateness <= watermark]:
            del windows[closed]
        window = int(event_time // step.window_size)
        if (window + 1) * step.window_size + step.lateness <= watermark:
            dead.append(DeadLetter(
                step.name, late_reason(event_time, window * step.window_size, (window + 1) * step.window_size,
                                       watermark) + f" of this key (lateness {seconds_text(step.lateness)})",
                record_text(arrival.record), arrival.seq))
            continue
        sides = windows.setdefault(window, ([], []))
        for other in sides[1 - arrival.side]:
            left, right = (arrival.record, other) if arrival.side == LEFT else (other, arrival.record)
            try:
                emitted = normalize_emitted(step.fn(left, right))
            except Exception as error:  # noqa: BLE001 - a bad pair becomes a dead letter
                dead.append(record_failed(step.name, error, {"left": left, "right": right}, arrival.seq))
                continue
            records.extend(emitted)
            seqs.extend([arrival.seq] * len(emitted))
        sides[arrival.side].append(arrival.record)
    return JoinResult(records, seqs, dead, dump_join_state(step, state))


def arrivals_of(carried: pa.RecordBatch, data_schema: pa.Schema, side: int) -> list[JoinArrival]:
    """The live rows of a carried batch as arrivals on `side`."""
    records = batch_records(carried.select(data_schema.names))
    seqs = column_values(carried.column(carried.schema.get_field_index(SEQ)))
    return [JoinArrival(side, record, seq) for record, seq in zip(records, seqs)]


def joined_batch(step: JoinStep, records: list, seqs: list[int], dead: list[DeadLetter]) -> pa.RecordBatch:
    """The join's output as a carried batch: the records that fit its schema, then dead letters
    (late records, failed pairs, records that do not fit)."""
    dead = list(dead)
    data, kept_seqs = records_to_batch(records, seqs, step.output_schema, step.name, dead)
    emitted = live_batch(data, kept_seqs)
    return assemble([emitted, dead_letter_batch(dead, step.output_schema) if dead else None], emitted.schema)
