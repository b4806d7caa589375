"""Where results and dead letters go. Every sink is written from one foreachBatch per micro-batch.

The query's output holds results and dead letters together (a dead letter has its
`_fissure_dead_operator` set); the runner's foreachBatch persists each micro-batch once, writes
the dead letters to the dead-letter sink and every sink's results, all keyed by the batch id, so
a batch replayed after a crash overwrites what it wrote before: exactly once with the checkpoint.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from fissure.runtime.records.columns import DEAD_ERROR, DEAD_OPERATOR, DEAD_RECORD, SEQ

BATCH_ID_COLUMN = "batch_id"


class FileSink:
    """Files under `path`, one Hive-style directory per micro-batch: `path/batch_id=N/`.

    A replayed batch overwrites its own directory, so the files hold every result exactly once.
    Read them back with `spark.read.format(format).load(path)` (a `batch_id` column comes along).
    """

    reads_every_row = True  # its write is one action over every row of the frame (the runner counts there)

    def __init__(self, path: str, format: str = "parquet", options: dict[str, str] | None = None) -> None:
        self.path = path
        self.format = format
        self.options = dict(options or {})

    def __repr__(self) -> str:
        return f"FileSink({self.path!r}, {self.format!r})"

    def write(self, frame: DataFrame, batch_id: int) -> None:
        target = os.path.join(self.path, f"{BATCH_ID_COLUMN}={batch_id}")
        frame.write.mode("overwrite").format(self.format).options(**self.options).save(target)

    def read(self, spark: SparkSession) -> DataFrame:
        return spark.read.format(self.format).options(**self.options).load(self.path)


class ForeachBatchSink:
    """Calls `fn(results, batch_id)` per micro-batch; make it idempotent per batch id for exactly-once."""

    def __init__(self, fn: Callable[[DataFrame, int], None]) -> None:
        self.fn = fn

    def write(self, frame: DataFrame, batch_id: int) -> None:
        self.fn(frame, batch_id)


class ConsoleSink:
    """Prints each micro-batch's results (at least once: a replayed batch prints again)."""

    def __init__(self, rows: int = 20, truncate: bool = True) -> None:
        self.rows, self.truncate = rows, truncate

    def write(self, frame: DataFrame, batch_id: int) -> None:
        # On a line of its own: the progress line (stderr) may be waiting without a newline.
        print(f"\n--- batch {batch_id} ---")
        frame.show(self.rows, self.truncate)


class NoopSink:
    """Computes every result and keeps none (benchmarks)."""

    reads_every_row = True

    def write(self, frame: DataFrame, batch_id: int) -> None:
        frame.write.format("noop").mode("overwrite").save()


class MemorySink:
    """Results kept in the driver, per batch id (a replay replaces its batch), as a temp view `name`.

    Like Spark's memory sink: for tests and small outputs, lost when the driver stops.
    """

    reads_every_row = True

    def __init__(self, name: str | None = None) -> None:
        self.name = name
        self._rows_by_batch: dict[int, list[Row]] = {}
        self._lock = threading.Lock()
        self._schema = None

    def write(self, frame: DataFrame, batch_id: int) -> None:
        rows = frame.collect()
        with self._lock:
            self._rows_by_batch[batch_id] = rows
            self._schema = frame.schema
        if self.name:
            # A streaming query runs in a clone of the session: a view made there stays invisible
            # to the caller's session, the one getOrCreate returns.
            spark = SparkSession.builder.getOrCreate()
            spark.createDataFrame(self.rows(), self._schema).createOrReplaceTempView(self.name)

    def rows(self) -> list[Row]:
        """Every result row so far, in batch order."""
        with self._lock:
            return [row for batch_id in sorted(self._rows_by_batch) for row in self._rows_by_batch[batch_id]]

    def records(self) -> list[dict]:
        return [row.asDict(recursive=True) for row in self.rows()]

    @property
    def batches(self) -> int:
        with self._lock:
            return len(self._rows_by_batch)


@dataclass(frozen=True)
class DeadLetterRecord:
    """A record an operator raised on (or that did not fit its declared schema), or input a source
    could not read (`operator` is then the source's name)."""

    operator: str
    error: str
    record: str  # JSON; for a JSON or CSV line a source could not read, the line as read
    seq: int


@dataclass
class DeadLetterLog:
    """Counts every dead letter and keeps the most recent ones in the driver."""

    kept: int = 1000
    count: int = 0
    recent: list[DeadLetterRecord] = field(default_factory=list)

    def write(self, frame: DataFrame, batch_id: int) -> None:
        letters = [DeadLetterRecord(row[DEAD_OPERATOR], row[DEAD_ERROR], row[DEAD_RECORD], row[SEQ])
                   for row in frame.limit(self.kept).collect()] if self.kept else []
        self.recent = (self.recent + letters)[-self.kept:] if self.kept else []


def write_dead_letters(frame: DataFrame, batch_id: int, log: DeadLetterLog, sink, count: int | None = None,
                       extra: Sequence[tuple[str, str, str]] = ()) -> int:
    """Write a (persisted) micro-batch's dead letters to the run's log and to `sink` (if any);
    the number written. `count`: the number already counted (0: nothing to do, no job).
    `extra`: dead letters of the batch that are no rows of it, as (operator, error, record):
    a source's unreadable files (fissure.spark.io.file_staging), with seq -1."""
    dead = frame.filter(F.col(DEAD_OPERATOR).isNotNull()).select(DEAD_OPERATOR, DEAD_ERROR, DEAD_RECORD, SEQ)
    # Collecting the dead letters' sequence numbers is one single-stage job; count() adds an
    # exchange and a second stage, about 40-90 ms per micro-batch on local[2].
    dead_count = len(dead.select(SEQ).collect()) if count is None else count
    if extra:
        letters = frame.sparkSession.createDataFrame([(*letter, -1) for letter in extra],
                                                     f"{DEAD_OPERATOR} string, {DEAD_ERROR} string, "
                                                     f"{DEAD_RECORD} string, {SEQ} long")
        dead = dead.unionByName(letters) if dead_count else letters
        dead_count += len(extra)
    if dead_count:
        log.count += dead_count
        log.write(dead, batch_id)
        if sink is not None:
            sink.write(dead.select(F.col(DEAD_OPERATOR).alias("operator"), F.col(DEAD_ERROR).alias("error"),
                                   F.col(DEAD_RECORD).alias("record"), F.col(SEQ).alias("seq")), batch_id)
    return dead_count
