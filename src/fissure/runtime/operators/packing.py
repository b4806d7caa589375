"""Packed exchange: a keyed stage's input grouped by its grouping key in the stage before it.

Spark's stateful Python operator (transformWithStateInPandas) takes its input row by row: PySpark
turns every Arrow batch into pandas, iterates it with `itertuples` and rebuilds a pandas frame
per group from those rows, and the exchange before it moves every record as a row of its own.
Measured on PySpark 4.3 with the word count, this row handling was about a third of the keyed
stage's Python time, above the operator's own work. So the stage that feeds a keyed stage
groups its envelopes by the keyed stage's grouping key itself, and ships each group as ONE row:
the grouping key and the group's envelopes as an Arrow IPC stream (`pack`). The exchange then
moves a few rows per task and batch (one per grouping key present, at most `MAX_PACKED_ROWS`
records each), and the keyed stage reads its envelopes back column by column (`unpack`).

Grouping keys (int32):
- a partitioned operator's records: their bucket of keys, a stable hash of the key's JSON text
  (crc32) mod the checkpoint's bucket count (`PackSpec.buckets`), computed once per distinct key
  value of the batch; equal keys are always in one bucket, whatever task or micro-batch they come
  in. The row carries the bucket's value in the checkpoint's scheme (`PackSpec.keys`,
  fissure.runtime.state.grouping_keys: values that Spark's hash splits evenly over the partitions);
- an unkeyed stateful operator's records: 0;
- every other row (other streams, dead letters): spread key number `seq mod spread`, a negative
  value of the scheme, which the keyed stage passes through without touching state, spread over
  its partitions.

A keyed stage whose output goes on to a pe stage in the same Spark stage (no exchange between
them: LogWatch's `range`, then `cutoff,realtime`) packs its output too (`pack_rows`, key 0): each
call's envelopes as a few rows instead of a row per record, which PySpark would otherwise turn
from pandas into Arrow value by value, and the JVM into its rows and back into Arrow for the pe
stage, which reads them back (`unpacked`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fissure.runtime.records.arrow_rows import column_values
from fissure.runtime.records.columns import DEAD_OPERATOR, SEQ
from fissure.runtime.operators.keyed import key_values_text
from fissure.runtime.state.grouping_keys import PLAIN_KEYS, GroupingKeys

PACKED_KEY = "_fissure_key"
PAYLOAD = "_fissure_payload"
PACKED_SCHEMA = pa.schema([pa.field(PACKED_KEY, pa.int32()), pa.field(PAYLOAD, pa.binary())])
# Records per packed row: bounds a row's size (a 250,000-record batch of an unkeyed operator
# would otherwise be one row of tens of MB) while keeping rows few.
MAX_PACKED_ROWS = 32_768
EMPTY_PACKED = pa.RecordBatch.from_arrays([pa.array([], pa.int32()), pa.array([], pa.binary())], schema=PACKED_SCHEMA)


@dataclass(frozen=True)
class PackSpec:
    """How to group envelopes for one keyed node: the route of its input stream, the envelope
    columns of its key fields (None: an unkeyed operator, one group), the spread of the rows it
    passes through, and the checkpoint's grouping keys (their bucket count is the buckets')."""

    route: int
    key_columns: tuple[str, ...] | None
    spread: int
    every_group: bool = False  # a row (maybe without records) for every bucket, or group 0 when unkeyed
    # The values buckets and spread keys travel as (fissure.runtime.state.grouping_keys): the checkpoint's scheme.
    keys: GroupingKeys = PLAIN_KEYS

    @property
    def buckets(self) -> int:
        """The checkpoint's bucket count: one value, so a spec cannot hash into more buckets than
        its keys name."""
        return self.keys.buckets

    def groups(self) -> list[int]:
        """Every group's grouping key value: each bucket's, or 0 for an unkeyed operator."""
        return list(self.keys.bucket_values) if self.key_columns is not None else [0]


def key_bucket(values: Sequence, buckets: int) -> int:
    """The bucket of a key (its fields' values): crc32 of its JSON text, mod `buckets`. Stable
    across processes and runs (Python's own hash of a str is salted per process)."""
    return zlib.crc32(key_values_text(values).encode("utf-8", "surrogatepass")) % buckets


def _buckets_of(batch: pa.RecordBatch, columns: Sequence[str], buckets: int) -> np.ndarray:
    """Each row's bucket: one hash per distinct key (the key's values read from the columns'
    dictionaries, not per row) when Arrow can dictionary-encode every key column; else per row."""
    encoded = distinct_keys(batch, columns)
    if encoded is not None:
        keys, rows = encoded
        per_key = np.array([key_bucket(key, buckets) for key in keys] or [0], dtype=np.int32)
        return per_key[rows]
    values = [column_values(batch.column(batch.schema.get_field_index(name))) for name in columns]
    cache: dict = {}
    result = np.empty(batch.num_rows, dtype=np.int32)
    for row, key in enumerate(zip(*values)):
        try:
            bucket = cache.get(key)
            if bucket is None:
                bucket = cache[key] = key_bucket(key, buckets)
        except TypeError:  # an unhashable value (a list): no cache
            bucket = key_bucket(key, buckets)
        result[row] = bucket
    return result


def distinct_keys(batch: pa.RecordBatch, columns: Sequence[str]) -> tuple[list[tuple], np.ndarray] | None:
    """(the distinct keys of the batch as tuples of Python values, each row's place among them),
    from each key column's dictionary encoding (nulls a value of their own); None when Arrow
    cannot encode a column (a list) or the combined codes would not fit an int64."""
    dictionaries, indices = [], []
    for name in columns:
        try:
            encoded = pc.dictionary_encode(batch.column(batch.schema.get_field_index(name)), null_encoding="encode")
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            return None
        dictionaries.append(column_values(encoded.dictionary))
        indices.append(encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64))
    if len(columns) == 1:
        return [(value,) for value in dictionaries[0]], indices[0]
    if np.prod([float(max(1, len(values))) for values in dictionaries]) >= 2.0 ** 62:
        return None
    codes = indices[0]
    for values, column in zip(dictionaries[1:], indices[1:]):
        codes = codes * max(1, len(values)) + column
    distinct, rows = np.unique(codes, return_inverse=True)
    keys = []
    for code in distinct.tolist():
        places = []
        for values in reversed(dictionaries[1:]):
            code, place = divmod(code, max(1, len(values)))
            places.append(place)
        places.append(code)
        keys.append(tuple(values[place] for values, place in zip(dictionaries, reversed(places))))
    return keys, rows.reshape(-1)


def grouping_keys(batch: pa.RecordBatch, spec: PackSpec) -> np.ndarray:
    """Each envelope's grouping key under `spec` (see the module docstring)."""
    live = pc.and_(pc.equal(batch.column(0), pa.scalar(spec.route, pa.int32())),
                   batch.column(batch.schema.get_field_index(DEAD_OPERATOR)).is_null())
    live = live.to_numpy(zero_copy_only=False)
    seqs = batch.column(batch.schema.get_field_index(SEQ)).to_numpy(zero_copy_only=False)
    spread_values = np.asarray(spec.keys.spread_values(spec.spread), dtype=np.int32)
    keys = spread_values[np.mod(seqs, len(spread_values))]
    if live.any():
        if spec.key_columns is None:
            keys[live] = 0
        else:
            keys[live] = spec.keys.bucket_array(_buckets_of(batch.filter(pa.array(live)), spec.key_columns, spec.buckets))
    return keys


def _ipc_bytes(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def pack(batch: pa.RecordBatch, spec: PackSpec) -> pa.RecordBatch:
    """`batch`'s envelopes as packed rows: one per grouping key (and per MAX_PACKED_ROWS)."""
    if not batch.num_rows:
        return EMPTY_PACKED
    keys = grouping_keys(batch, spec)
    order = np.argsort(keys, kind="stable")
    ordered = batch.take(pa.array(order))
    sorted_keys = keys[order]
    starts = np.concatenate(([0], np.flatnonzero(np.diff(sorted_keys)) + 1, [len(sorted_keys)]))
    packed_keys: list[int] = []
    payloads: list[bytes] = []
    for start, end in zip(starts[:-1], starts[1:]):
        for chunk in range(int(start), int(end), MAX_PACKED_ROWS):
            packed_keys.append(int(sorted_keys[start]))
            payloads.append(_ipc_bytes(ordered.slice(chunk, min(MAX_PACKED_ROWS, int(end) - chunk))))
    if spec.every_group:  # the keyed stage then runs every group's state, with records or not
        empty = _ipc_bytes(batch.slice(0, 0))
        present = set(packed_keys)
        for group in spec.groups():
            if group not in present:
                packed_keys.append(group)
                payloads.append(empty)
    return pa.RecordBatch.from_arrays([pa.array(packed_keys, pa.int32()), pa.array(payloads, pa.binary())],
                                      schema=PACKED_SCHEMA)


def pack_rows(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch`'s envelopes as packed rows in their order (MAX_PACKED_ROWS a row, key 0), for a pe
    stage that reads them where they are made: no exchange looks at the key."""
    if not batch.num_rows:
        return EMPTY_PACKED
    payloads = [_ipc_bytes(batch.slice(start, MAX_PACKED_ROWS)) for start in range(0, batch.num_rows, MAX_PACKED_ROWS)]
    return pa.RecordBatch.from_arrays([pa.array([0] * len(payloads), pa.int32()), pa.array(payloads, pa.binary())],
                                      schema=PACKED_SCHEMA)


def unpacked(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The envelopes of batches of packed rows (`pack_rows`), in their order, batch by batch."""
    for batch in batches:
        payloads = batch.column(batch.schema.get_field_index(PAYLOAD)).to_pylist()
        if payloads:
            envelopes = unpack(payloads, schema)
            if envelopes.num_rows:
                yield envelopes


def pack_partials(partials: pa.RecordBatch, text_column: str, spec: PackSpec) -> pa.RecordBatch:
    """A combined operator's partials (fissure.runtime.operators.combine) as packed rows: each partial in the
    bucket of its key's text, the bucket `pack` gives the key's records (a partial without key,
    which only carries an event time, in bucket 0; every partial of an unkeyed operator in its one group)."""
    if not partials.num_rows:
        return EMPTY_PACKED if not spec.every_group else empty_groups(partials.schema, spec)
    texts = column_values(partials.column(partials.schema.get_field_index(text_column)))
    cache: dict[str, int] = {}
    first_group = spec.groups()[0]  # a partial without key text, or any of an unkeyed operator's
    keyed, buckets, bucket_value = spec.key_columns is not None, spec.buckets, spec.keys.bucket_value
    keys = np.empty(len(texts), dtype=np.int32)
    for row, text in enumerate(texts):
        bucket = cache.get(text) if text is not None and keyed else first_group
        if bucket is None:
            bucket = cache[text] = bucket_value(zlib.crc32(text.encode("utf-8", "surrogatepass")) % buckets)
        keys[row] = bucket
    order = np.argsort(keys, kind="stable")
    ordered = partials.take(pa.array(order))
    sorted_keys = keys[order]
    starts = np.concatenate(([0], np.flatnonzero(np.diff(sorted_keys)) + 1, [len(sorted_keys)]))
    packed_keys = [int(sorted_keys[start]) for start in starts[:-1]]
    payloads = [_ipc_bytes(ordered.slice(int(start), int(end - start))) for start, end in zip(starts[:-1], starts[1:])]
    if spec.every_group:  # as `pack`: the keyed stage then runs every bucket, with partials or not
        empty, present = _ipc_bytes(partials.slice(0, 0)), set(packed_keys)
        missing = [group for group in spec.groups() if group not in present]
        packed_keys += missing
        payloads += [empty] * len(missing)
    return pa.RecordBatch.from_arrays([pa.array(packed_keys, pa.int32()), pa.array(payloads, pa.binary())],
                                      schema=PACKED_SCHEMA)


def empty_groups(schema: pa.Schema, spec: PackSpec) -> pa.RecordBatch:
    """A packed row without records for every group of `spec`: what makes a keyed stage call
    every bucket in a batch (a time-aware operator's keys that are due fire there)."""
    groups = spec.groups()
    empty = _ipc_bytes(pa.RecordBatch.from_pylist([], schema=schema))
    return pa.RecordBatch.from_arrays([pa.array(groups, pa.int32()), pa.array([empty] * len(groups), pa.binary())],
                                      schema=PACKED_SCHEMA)


def unpack_apart(payloads: Iterable[bytes], schema: pa.Schema,
                 apart: Callable[[pa.Schema], bool]) -> tuple[pa.RecordBatch, list[pa.RecordBatch]]:
    """The envelopes of packed rows' payloads as one batch of `schema` (as `unpack`), and apart
    from them the batches of the payloads whose schema `apart` picks (a combined operator's
    partials)."""
    envelopes: list[bytes] = []
    others: list[pa.RecordBatch] = []
    for payload in payloads:
        reader = pa.ipc.open_stream(pa.py_buffer(payload))
        if apart(reader.schema):
            others += [batch for batch in reader.read_all().to_batches() if batch.num_rows]
        else:
            envelopes.append(payload)
    return unpack(envelopes, schema), others


def unpack(payloads: Iterable[bytes], schema: pa.Schema) -> pa.RecordBatch:
    """The envelopes of packed rows' payloads, as one batch of `schema`."""
    batches = [batch for payload in payloads
               for batch in pa.ipc.open_stream(pa.py_buffer(payload)).read_all().to_batches()]
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=schema)
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
