"""Time on Spark, the driver's side: the clock of every micro-batch in the checkpoint, and the
end-of-input control folder.

Why fissure's own clock and not Spark's watermark (`withWatermark`, transformWithState's
EventTime mode and timers), checked against PySpark 4.3:

- the event time of a keyed operator's records is not a Spark column where the operator runs:
  its input arrives packed, a group's envelopes as Arrow IPC in one binary column
  (fissure.runtime.operators.packing), so Spark's watermark would need a column of its own per packed row;
- a handler in EventTime mode reads one watermark (`TimerValues.get_current_watermark_in_ms`),
  the one that fires; fissure's late rule needs the batch before's as well;
- Spark's timers belong to a grouping key, and a keyed stage's grouping keys are buckets of keys
  (fissure.model.state_buckets): a call for every bucket in a batch costs a handler call per
  bucket, so each bucket keeps its keys' deadlines (fissure.runtime.operators.watermark.Deadlines) in its own state and
  fires the keys that are due in that call, with no timer to register and move;
- a Spark local property set in the foreachBatch function is what every task of that batch
  reads, in every stage (measured: a mapInArrow before a round-robin repartition and two
  transformWithStateInPandas stages after it all read the batch's own value), so the driver
  hands each batch its clock that way.

So the driver makes each batch's BatchClock from the one before (`next_clock`: the in-process
reference's rules), writes it to `fissure-time/` in the checkpoint before the batch runs and
reads it back when the batch runs again: the watermark of a batch is the same on every plan and
after any restart. The stages report the largest event time they saw (fissure.runtime.operators.time_tally);
the driver adds it to the batch's clock once the batch ran.

A batch runs only when a source has new input, so at end of input the runner writes one file into
`fissure-end-of-input/`, a text source of the query: its row becomes a report envelope that every
stage passes on (its only effect: each keyed stage runs every bucket), and the batch that reads it
runs with the end-of-input clock.

Spark mechanism with no pyspark import: the clock travels as a Spark local property and lives in
the query's checkpoint.
"""

from __future__ import annotations

import uuid

from fissure.spark.checkpoint.files import CheckpointStore
from fissure.runtime.operators.watermark import BatchClock

TIME_DIRECTORY = "fissure-time"
END_OF_INPUT_DIRECTORY = "fissure-end-of-input"
KEPT_CLOCKS = 100  # like Spark's spark.sql.streaming.minBatchesToRetain
BATCH_CLOCK_PROPERTY = "fissure.batch_clock"  # the Spark local property a batch's tasks read


class TimeLog:
    """The batch clocks of one checkpoint, a file per batch."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store

    @staticmethod
    def _name(batch: int) -> str:
        return f"{TIME_DIRECTORY}/{batch:012d}"

    def clock(self, batch: int) -> BatchClock | None:
        text = self.store.read(self._name(batch))
        return BatchClock.from_json(text) if text else None

    def last_before(self, batch: int) -> BatchClock | None:
        """The clock of the newest batch before `batch` (None: none ran)."""
        earlier = [int(name) for name in self.store.names(TIME_DIRECTORY) if name.isdigit() and int(name) < batch]
        return self.clock(max(earlier)) if earlier else None

    def write(self, clock: BatchClock) -> None:
        self.store.write(self._name(clock.batch), clock.to_json())
        for name in self.store.names(TIME_DIRECTORY):
            if name.isdigit() and int(name) < clock.batch - KEPT_CLOCKS:
                self.store.delete(f"{TIME_DIRECTORY}/{name}")


def end_of_input_folder(checkpoint: str) -> str:
    return checkpoint.rstrip("/") + "/" + END_OF_INPUT_DIRECTORY


def prepare_end_of_input_folder(store: CheckpointStore) -> None:
    """The control folder exists before the query reads it (a hidden file: no row)."""
    if not store.exists(f"{END_OF_INPUT_DIRECTORY}/_folder"):
        store.write(f"{END_OF_INPUT_DIRECTORY}/_folder", "")


def write_end_of_input_marker(store: CheckpointStore) -> str:
    name = f"{END_OF_INPUT_DIRECTORY}/end-{uuid.uuid4().hex}.txt"
    store.write(name, "end of input\n")
    return name
