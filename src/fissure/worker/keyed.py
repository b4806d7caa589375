"""One stateful operator over the records of one key in one micro-batch (no pyspark here).

The Spark layer's state processor calls `run_group` once per key and batch with the key's stored
state (pickled bytes, or None for a key seen for the first time) and stores the state it returns.
Records reach the operator in sequence-number order, whatever order the exchange delivered them in.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from fissure.worker.columns import SEQ
from fissure.worker.fused import assemble, dead_letter_batch, live_batch, records_to_batch, reshape_dead, split_dead
from fissure.worker.records import DeadLetter, describe_error, normalize_emitted, record_text


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


@dataclass(frozen=True)
class GroupResult:
    """What one key's records produced: the carried output batch and the state to store."""

    batch: pa.RecordBatch
    state: bytes | None  # None: nothing to store (no live record for this key in the batch)


def load_state(step: StatefulStep, stored: bytes | None) -> Any:
    return step.state_factory() if stored is None else pickle.loads(stored)


def run_group(step: StatefulStep, batch: pa.RecordBatch, stored_state: bytes | None) -> GroupResult:
    """Run `step` over one key's carried rows in sequence order; dead letters pass through."""
    live, upstream_dead = split_dead(batch)
    dead: list[DeadLetter] = []
    records: list = []
    seqs: list[int] = []
    state_blob = None
    if live.num_rows:
        sort_keys = ([(step.order_by, "ascending")] if step.order_by else []) + [(SEQ, "ascending")]
        ordered = live.take(pc.sort_indices(live, sort_keys=sort_keys))
        inputs = ordered.select(step.input_schema.names).to_pylist()
        input_seqs = ordered.column(ordered.schema.get_field_index(SEQ)).to_pylist()
        state = load_state(step, stored_state)
        for record, seq in zip(inputs, input_seqs):
            try:
                emitted = normalize_emitted(step.fn(state, record))
            except Exception as error:  # noqa: BLE001 - a bad record becomes a dead letter
                dead.append(DeadLetter(step.name, describe_error(error), record_text(record), seq))
                continue
            records.extend(emitted)
            seqs.extend([seq] * len(emitted))
        state_blob = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    data, seqs = records_to_batch(records, seqs, step.output_schema, step.name, dead)
    emitted_batch = live_batch(data, seqs)
    output = assemble(
        [emitted_batch,
         reshape_dead(upstream_dead, step.output_schema) if upstream_dead is not None else None,
         dead_letter_batch(dead, step.output_schema) if dead else None],
        emitted_batch.schema,
    )
    return GroupResult(output, state_blob)
