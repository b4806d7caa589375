"""Keyed state across plan switches: what a checkpoint holds, and repartitioning it offline.

All stateful operators of a fissure query keep their state in S state partitions
(`spark.sql.shuffle.partitions` when the checkpoint was created, recorded in every entry of its
offset log). A restart with another plan keeps the checkpoint's S; so when a switch changes S
(`fissure.worker.graph_pe.state_partitions_of`), the state is repartitioned offline first, with
Spark's streaming checkpoint manager (PySpark 4.2+, experimental:
`spark._streamingCheckpointManager.repartition`). Requirements, measured on PySpark 4.3:

- the query must be stopped, and the checkpoint's last batch committed: the repartitioner
  refuses a checkpoint whose last offset-log entry has no commit (STATE_REPARTITION_INVALID_CHECKPOINT
  .LAST_BATCH_FAILED). Its escape hatch, `enforce_exactly_once_sink=False`, marks that batch
  committed and re-reads its input in a new batch; with a file source the restarted query then
  failed an assertion (available offsets behind committed ones), so fissure never uses it.
- RocksDB state store (the repartitioner refuses the default one, and leaves an unfinished
  batch behind that blocks the next start).

A plan switch stops the query at a batch boundary: the batch that was about to run when the stop
came is abandoned before it computed anything (`fissure.spark.batch_gate` holds every batch at the
entry of its `foreachBatch` until the loop has decided), so only its offset-log entry exists.
`drop_abandoned_batch` removes that entry, which makes the checkpoint one that stopped cleanly
after the last committed batch; the next query reads that input again (a file source's own log
keeps the files of the dropped batch as seen, and its next batch covers them: measured).
Checkpoint files are read and written through Hadoop's FileSystem, so any checkpoint location
Spark can use works (local, HDFS, S3, ...).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"

# repartition(spark, checkpoint, partitions): the offline state repartitioner (injectable for tests)
Repartitioner = Callable[[SparkSession, str, int], None]


class StateRepartitionError(RuntimeError):
    """The checkpoint's state could not be repartitioned (the query was not restarted)."""


@dataclass(frozen=True)
class CheckpointStatus:
    """The batches a checkpoint recorded and its state partitions (None: nothing recorded)."""

    last_batch: int | None  # newest offset-log entry
    last_committed: int | None  # newest commit-log entry
    state_partitions: int | None  # S recorded in the newest offset-log entry

    @property
    def has_uncommitted_batch(self) -> bool:
        return self.last_batch is not None and (self.last_committed is None or self.last_batch > self.last_committed)


class _CheckpointFiles:
    """The checkpoint's files through Hadoop's FileSystem (the JVM's view, any scheme)."""

    def __init__(self, spark: SparkSession, checkpoint: str) -> None:
        self._jvm = spark._jvm
        self._root = self._jvm.org.apache.hadoop.fs.Path(checkpoint)
        self._fs = self._root.getFileSystem(spark._jsc.hadoopConfiguration())

    def _path(self, *parts: str):
        path = self._root
        for part in parts:
            path = self._jvm.org.apache.hadoop.fs.Path(path, part)
        return path

    def batch_ids(self, log_name: str) -> list[int]:
        directory = self._path(log_name)
        if not self._fs.exists(directory):
            return []
        names = [status.getPath().getName() for status in self._fs.listStatus(directory)]
        return sorted(int(name) for name in names if name.isdigit())

    def read(self, *parts: str) -> str:
        stream = self._fs.open(self._path(*parts))
        try:
            return self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()

    def delete(self, *parts: str) -> bool:
        return bool(self._fs.delete(self._path(*parts), False))


def offset_entry_state_partitions(text: str) -> int | None:
    """S from an offset-log entry (`v1`, then the batch metadata JSON with its `conf`, then offsets)."""
    lines = text.splitlines()
    if len(lines) < 2:
        return None
    try:
        metadata = json.loads(lines[1])
    except ValueError:
        return None
    value = (metadata.get("conf") or {}).get(SHUFFLE_PARTITIONS) if isinstance(metadata, dict) else None
    return int(value) if value is not None and str(value).isdigit() else None


def checkpoint_status(spark: SparkSession, checkpoint: str) -> CheckpointStatus:
    files = _CheckpointFiles(spark, checkpoint)
    offsets, commits = files.batch_ids("offsets"), files.batch_ids("commits")
    last = offsets[-1] if offsets else None
    partitions = offset_entry_state_partitions(files.read("offsets", str(last))) if last is not None else None
    return CheckpointStatus(last, commits[-1] if commits else None, partitions)


def drop_abandoned_batch(spark: SparkSession, checkpoint: str, batch_id: int) -> None:
    """Remove the offset-log entry of `batch_id`, a batch that was abandoned before it computed
    anything: only when it is the newest entry and has no commit."""
    status = checkpoint_status(spark, checkpoint)
    if status.last_batch != batch_id or not status.has_uncommitted_batch:
        raise StateRepartitionError(
            f"will not drop batch {batch_id} from {checkpoint}: the newest batch is {status.last_batch} and the"
            f" newest committed one {status.last_committed}")
    _CheckpointFiles(spark, checkpoint).delete("offsets", str(batch_id))
    log.info("state: dropped the abandoned batch %d from the offset log of %s", batch_id, checkpoint)


def spark_repartitioner(spark: SparkSession, checkpoint: str, partitions: int) -> None:
    """Spark's offline state repartitioner (PySpark 4.2+, experimental)."""
    manager = getattr(spark, "_streamingCheckpointManager", None)
    if manager is None:
        raise StateRepartitionError("this PySpark has no streaming checkpoint manager (4.2+ needed) to repartition state")
    manager.repartition(checkpoint, partitions)


@dataclass(frozen=True)
class StateRepartition:
    """One offline repartition of a checkpoint's state, as it went."""

    partitions_before: int
    partitions_after: int
    dropped_batch: int | None  # the abandoned batch removed from the offset log first
    duration_s: float


def repartition_state(spark: SparkSession, checkpoint: str, partitions: int, *,
                      abandoned_batch: int | None = None, repartition: Repartitioner = spark_repartitioner,
                      clock: Callable[[], float] = time.monotonic) -> StateRepartition:
    """Give the stopped query's state `partitions` partitions.

    `abandoned_batch`: the batch the stop abandoned before it computed anything (its offset-log
    entry is dropped first). On failure the checkpoint is left as the last committed batch left
    it (an unfinished repartition batch is dropped again) and StateRepartitionError is raised.
    """
    status = checkpoint_status(spark, checkpoint)
    if status.state_partitions is None:
        raise StateRepartitionError(f"{checkpoint} records no batch: nothing to repartition")
    dropped = None
    if abandoned_batch is not None and status.last_batch == abandoned_batch and status.has_uncommitted_batch:
        drop_abandoned_batch(spark, checkpoint, abandoned_batch)
        status, dropped = checkpoint_status(spark, checkpoint), abandoned_batch
    if status.has_uncommitted_batch:
        raise StateRepartitionError(
            f"{checkpoint}: batch {status.last_batch} is not committed (the last committed is {status.last_committed});"
            " the state can only be repartitioned after a committed batch")
    started = clock()
    try:
        repartition(spark, checkpoint, partitions)
    except Exception as error:
        _drop_unfinished_repartition(spark, checkpoint, status)
        raise StateRepartitionError(
            f"repartitioning the state of {checkpoint} from {status.state_partitions} to {partitions} partitions"
            f" failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}") from error
    return StateRepartition(status.state_partitions, partitions, dropped, clock() - started)


def _drop_unfinished_repartition(spark: SparkSession, checkpoint: str, before: CheckpointStatus) -> None:
    """After a failed repartition: drop the batch it started, if it left one uncommitted."""
    try:
        after = checkpoint_status(spark, checkpoint)
        if after.has_uncommitted_batch and after.last_batch is not None and (
                before.last_batch is None or after.last_batch > before.last_batch):
            _CheckpointFiles(spark, checkpoint).delete("offsets", str(after.last_batch))
            log.warning("state: dropped the unfinished repartition batch %d of %s", after.last_batch, checkpoint)
    except Exception as error:  # noqa: BLE001 - report the repartition's own error, not this one
        log.warning("state: could not inspect %s after a failed repartition: %s", checkpoint, error)
