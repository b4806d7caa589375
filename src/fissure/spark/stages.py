"""The functions Spark ships to its Python workers: a region's PE and a stateful operator's handler.

These run inside the workers; they are the Spark layer's (they read the task's partition id and
implement Spark's StatefulProcessor) and hand the real work to fissure.worker.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pandas as pd
import pyarrow as pa
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from fissure.worker.columns import carried_schema, sequence_numbers
from fissure.worker.fused import FusedStage
from fissure.worker.keyed import StatefulStep, run_group
from fissure.worker.region import processing_element


def with_sequence_numbers(batches: Iterator[pa.RecordBatch], source_schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Source batches as carried batches: sequence numbers from the task's partition, no dead letters."""
    from pyspark import TaskContext

    partition_id = TaskContext.get().partitionId()
    schema = carried_schema(source_schema)
    first_row = 0
    for batch in batches:
        rows = batch.num_rows
        columns = [batch.column(batch.schema.get_field_index(name)) for name in source_schema.names]
        columns.append(sequence_numbers(partition_id, first_row, rows))
        columns += [pa.nulls(rows, pa.string())] * 3
        first_row += rows
        yield pa.RecordBatch.from_arrays(columns, schema=schema)


class RegionFunction:
    """The mapInArrow function of a compiled stage: its pipelines in one processing element."""

    def __init__(self, pipelines: Sequence[Sequence[FusedStage]], fingerprint: str,
                 source_schema: pa.Schema | None, output_schema: pa.Schema) -> None:
        self.pipelines = [list(pipeline) for pipeline in pipelines]
        self.fingerprint = fingerprint
        self.source_schema = source_schema  # set: this stage assigns the sequence numbers
        self.output_schema = output_schema  # carried

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        if self.source_schema is not None:
            batches = with_sequence_numbers(batches, self.source_schema)
        if not self.pipelines:
            yield from batches
            return
        element = processing_element(self.pipelines, self.fingerprint)
        for batch in element.process(batches):
            if batch.num_rows:
                yield batch


def carried_batch_from_pandas(frame: pd.DataFrame, carried_input: pa.Schema,
                              positions: Sequence[int] | None = None) -> pa.RecordBatch:
    """One key's rows as a carried Arrow batch; `positions`: the frame's columns that make it, in
    order (default: the first ones).

    PySpark renames columns that start with "_" on the way in (namedtuple rules): the columns are
    taken by position. Column by column through numpy objects: `RecordBatch.from_pandas` costs
    about 0.8 ms per call, far more than a key's few rows.
    """
    columns = frame.to_numpy(dtype=object).T
    if positions is not None:
        columns = [columns[position] for position in positions]
    return pa.RecordBatch.from_arrays(
        [pa.array(values, type=field.type, from_pandas=True) for values, field in zip(columns, carried_input)],
        schema=carried_input)


def pandas_frame(batch: pa.RecordBatch) -> pd.DataFrame:
    """A carried batch as pandas, column by column (about half the cost of `to_pandas` on a few
    rows); dates and times through pandas so they keep their time zone."""
    return pd.DataFrame({name: column.to_pandas() if pa.types.is_temporal(column.type)
                         else column.to_numpy(zero_copy_only=False)
                         for name, column in zip(batch.schema.names, batch.columns)}, copy=False)


class OperatorStateProcessor(StatefulProcessor):
    """transformWithStateInPandas handler: one fissure stateful operator, its state per key."""

    STATE_NAME = "fissure_state"

    def __init__(self, step: StatefulStep, carried_input: pa.Schema) -> None:
        self.step = step
        self.carried_input = carried_input
        self._state = None

    def init(self, handle) -> None:
        self._state = handle.getValueState(self.STATE_NAME, "value binary")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        frames = list(rows)
        frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        batch = carried_batch_from_pandas(frame, self.carried_input)
        stored = self._state.get()  # None for a new key: one state-server round trip, not two
        result = run_group(self.step, batch, stored[0] if stored is not None else None)
        if result.state is not None:
            self._state.update((result.state,))
        if result.batch.num_rows:
            yield pandas_frame(result.batch)

    def close(self) -> None:
        pass
