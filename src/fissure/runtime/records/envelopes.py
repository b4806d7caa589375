"""A stream graph's records as envelopes: one row per record of any stream of the graph.

`_fissure_route` names the stream the row belongs to (the node that produced it: a source, an
operator, a union or a join); then the sequence number and the dead-letter columns of the chain
runner (fissure.runtime.records.columns); then, per distinct stream schema i, its fields as
nullable columns `_fissure_s{i}_{field}` (null on the rows of other streams). Rows are routed by
the stream they belong to, not by the node they go to: a row of a stream with several consumers
travels once and each consumer reads it where it runs; a stage forwards a stream's rows only while
a consumer after it still needs them (fissure.compile.stages.stream_lifetimes). No pyspark here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from fissure.runtime.records.carried import split_dead
from fissure.runtime.records.columns import DEAD_COLUMNS, DEAD_OPERATOR, INTERNAL_FIELDS, SEQ, carried_schema


ROUTE = "_fissure_route"


COLUMN_PREFIX = "_fissure_s"


class EnvelopeLayout:
    """The envelope schema of a graph at one point of its query, and the conversions between
    envelopes and carried batches.

    Schema groups are numbered over every stream of the graph (streams of equal schemas share
    one), so a column has the same name at every point; a layout restricted to the streams `live`
    there carries only their groups' columns: carrying every group everywhere (35 columns for 7
    groups on the LogWatch chain) ran clearly slower than the chain runner when it was timed by
    hand, a run no results file keeps, so no figure of it is given here."""

    def __init__(self, stream_schemas: Mapping[str, pa.Schema], live: Iterable[str] | None = None) -> None:
        self.stream_schemas = dict(stream_schemas)
        self.stream_names = tuple(self.stream_schemas) if live is None else tuple(live)  # the streams it carries
        self.schemas: list[pa.Schema] = []
        self.index: dict[str, int] = {}
        for stream, schema in self.stream_schemas.items():
            for number, known in enumerate(self.schemas):
                if known.equals(schema):
                    self.index[stream] = number
                    break
            else:
                self.index[stream] = len(self.schemas)
                self.schemas.append(schema)
        self.carried = tuple(range(len(self.schemas)) if live is None else sorted({self.index[name] for name in live}))
        self.routes = {stream: number for number, stream in enumerate(self.stream_schemas)}
        fields = [pa.field(ROUTE, pa.int32()), *INTERNAL_FIELDS]
        for number in self.carried:
            fields += [pa.field(self.column(number, field.name), field.type) for field in self.schemas[number]]
        self.schema = pa.schema(fields)

    def restricted(self, live: Iterable[str]) -> EnvelopeLayout:
        """The layout carrying only the columns of the streams `live` (same column names)."""
        return EnvelopeLayout(self.stream_schemas, live)

    @staticmethod
    def column(schema_number: int, field_name: str) -> str:
        return f"{COLUMN_PREFIX}{schema_number}_{field_name}"

    def route_of(self, stream: str) -> int:
        """The route column's value for rows of `stream` (a number: cheaper than its name through
        Spark's exchanges and Arrow conversions)."""
        return self.routes[stream]

    def streams_in(self, batch: pa.RecordBatch) -> set[str]:
        """The streams that have rows in `batch`."""
        present = {route for route in pc.unique(batch.column(0)).to_pylist() if route is not None}
        return {stream for stream, number in self.routes.items() if number in present}

    def _route_column(self, stream: str, rows: int) -> pa.Array:
        return pa.repeat(pa.scalar(self.routes[stream], pa.int32()), rows)

    def carries(self, stream: str) -> bool:
        return self.index[stream] in self.carried

    def stream_schema(self, stream: str) -> pa.Schema:
        return self.schemas[self.index[stream]]

    def columns_of(self, stream: str) -> list[str]:
        number = self.index[stream]
        return [self.column(number, name) for name in self.schemas[number].names]

    def extract(self, batch: pa.RecordBatch, stream: str) -> pa.RecordBatch:
        """The live rows of `stream` in `batch`, as a carried batch (user fields, seq, dead columns)."""
        mask = pc.and_(pc.equal(batch.column(0), pa.scalar(self.routes[stream], pa.int32())),
                       batch.column(batch.schema.get_field_index(DEAD_OPERATOR)).is_null())
        rows = batch.filter(mask)
        schema = self.stream_schema(stream)
        columns = [rows.column(rows.schema.get_field_index(name)) for name in self.columns_of(stream)]
        columns += [rows.column(rows.schema.get_field_index(name)) for name in (SEQ, *DEAD_COLUMNS)]
        return pa.RecordBatch.from_arrays(columns, schema=carried_schema(schema))

    def wrap(self, carried: pa.RecordBatch, stream: str) -> pa.RecordBatch:
        """A carried batch of `stream` (live rows and dead letters) as envelopes routed to it."""
        if not self.carries(stream):
            live, dead = split_dead(carried)
            if live.num_rows:
                raise ValueError(f"envelope layout without the columns of stream {stream!r} got its live rows")
            return self.wrap_dead(carried, stream)
        rows = carried.num_rows
        own = self.index[stream]
        by_name = {name: carried.column(position) for position, name in enumerate(carried.schema.names)}
        columns = [self._route_column(stream, rows)]
        columns += [by_name[name] for name in (SEQ, *DEAD_COLUMNS)]
        for number in self.carried:
            for field in self.schemas[number]:
                if number != own:
                    columns.append(pa.nulls(rows, field.type))
                    continue
                column = by_name[field.name]
                columns.append(column if column.type == field.type else column.cast(field.type))
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def wrap_dead(self, dead: pa.RecordBatch, stream: str) -> pa.RecordBatch:
        """Dead-letter rows of `stream` (a carried batch) as envelopes: no user field set."""
        rows = dead.num_rows
        by_name = {name: dead.column(position) for position, name in enumerate(dead.schema.names)}
        columns = [self._route_column(stream, rows)] + [by_name[name] for name in (SEQ, *DEAD_COLUMNS)]
        columns += [pa.nulls(rows, field.type) for field in list(self.schema)[len(columns):]]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Envelopes of another layout of the same graph in this one: its columns kept, the columns
        this one adds null (a dropped column only ever held nulls or rows no later node reads)."""
        if batch.schema.equals(self.schema):
            return batch
        names = set(batch.schema.names)
        columns = [batch.column(batch.schema.get_field_index(field.name)) if field.name in names
                   else pa.nulls(batch.num_rows, field.type) for field in self.schema]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def empty(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist([], schema=self.schema)
