"""Keyed state across plan switches: what a checkpoint holds, and repartitioning it offline.

All stateful operators of a fissure query keep their state in S state partitions
(`spark.sql.shuffle.partitions` when the checkpoint was created, recorded in every entry of its
offset log). A restart with another plan keeps the checkpoint's S; so when a switch changes S
(`fissure.compile.stages.state_partitions_of`), the state is repartitioned offline first, with
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
came is abandoned before it computed anything (`fissure.spark.adaptive.batch_gate` holds every batch at the
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

    def exists(self) -> bool:
        return bool(self._fs.exists(self._root))

    def delete_tree(self) -> bool:
        return bool(self._fs.delete(self._root, True))


def checkpoint_exists(spark: SparkSession, checkpoint: str) -> bool:
    return _CheckpointFiles(spark, checkpoint).exists()


def delete_checkpoint(spark: SparkSession, checkpoint: str) -> None:
    """Remove a checkpoint directory and everything in it (one fissure created)."""
    try:
        _CheckpointFiles(spark, checkpoint).delete_tree()
    except Exception as error:  # noqa: BLE001 - report the start's own error, not this one
        log.warning("state: could not remove %s: %s", checkpoint, error)


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


@dataclass(frozen=True)
class UnfinishedRepartition:
    """A checkpoint whose newest batch is an offline state repartition that never committed (the
    process running it died): Spark refuses to start a query on it
    (STREAMING_UNFINISHED_REPARTITION_DETECTED) until the repartition is run again to its end."""

    batch: int  # the repartition's batch (newest offset-log entry, no commit)
    last_committed: int  # the batch before it, committed
    partitions_before: int | None
    partitions_after: int  # what the interrupted repartition was asked for

    def describe(self) -> str:
        return (f"batch {self.batch} is a state repartition from {self.partitions_before} to {self.partitions_after}"
                f" partitions that did not finish (last committed batch {self.last_committed})")


def _offsets_part(text: str) -> list[str]:
    """An offset-log entry's source offsets (the lines after its version and metadata)."""
    return text.splitlines()[2:]


def unfinished_repartition(spark: SparkSession, checkpoint: str) -> UnfinishedRepartition | None:
    """The checkpoint's unfinished state repartition, if its newest batch is one.

    Spark's repartitioner writes batch N+1 with the offsets of batch N (it reads no input) and the
    new partition count, then the state of every new partition, then N+1's commit. A newest entry
    without a commit whose offsets equal the committed batch before it and whose state partitions
    differ is such a batch: an ordinary batch always reads new offsets, and a no-data batch keeps
    the partitions.
    """
    files = _CheckpointFiles(spark, checkpoint)
    offsets, commits = files.batch_ids("offsets"), files.batch_ids("commits")
    if len(offsets) < 2:
        return None
    last, before = offsets[-1], offsets[-1] - 1
    if (commits and commits[-1] >= last) or before not in offsets or before not in commits:
        return None
    last_text, before_text = files.read("offsets", str(last)), files.read("offsets", str(before))
    after, previous = offset_entry_state_partitions(last_text), offset_entry_state_partitions(before_text)
    if after is None or after == previous or _offsets_part(last_text) != _offsets_part(before_text):
        return None
    return UnfinishedRepartition(last, before, previous, after)


@dataclass(frozen=True)
class RepartitionRecovery:
    """What `recover_unfinished_repartition` found and did."""

    unfinished: UnfinishedRepartition
    action: str  # "finished": the repartition was run again to its end
    reason: str


def recover_unfinished_repartition(spark: SparkSession, checkpoint: str, *,
                                   repartition: Repartitioner | None = None) -> RepartitionRecovery | None:
    """Finish a state repartition a dead process left unfinished in `checkpoint` (None: there was none).

    Finished, not undone: the interrupted repartition may already have written the new
    partitions' state (a snapshot of version N+2 in each); undoing it by dropping batch N+1 would
    let the query re-run N+1 under the old partitions while those snapshots stay, and the state
    store loads the newest snapshot of a version, not the changelog N+1 writes next to it: keys
    would go missing. Running the repartition again with the same partition count is what Spark
    prescribes (LAST_BATCH_ABANDONED_REPARTITION): it reads the committed state of batch N again,
    rewrites every new partition and commits N+1; the source offsets stay N's, so the next batch
    reads exactly the input after N: nothing lost, nothing twice.
    """
    found = unfinished_repartition(spark, checkpoint)
    if found is None:
        return None
    repartition = repartition or spark_repartitioner
    try:
        repartition(spark, checkpoint, found.partitions_after)
    except Exception as error:
        raise StateRepartitionError(
            f"{checkpoint}: {found.describe()}, and running it again failed: {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}") from error
    recovery = RepartitionRecovery(found, "finished", "Spark refuses a query on an unfinished repartition, and "
                                   "undoing one that wrote state would lose keys")
    log.warning("state: recovered %s: %s; finished it (the state now has %d partitions)", checkpoint,
                found.describe(), found.partitions_after)
    return recovery


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
                      clock: Callable[[], float] = time.monotonic,
                      status: CheckpointStatus | None = None) -> StateRepartition:
    """Give the stopped query's state `partitions` partitions.

    `abandoned_batch`: the batch the stop abandoned before it computed anything (its offset-log
    entry is dropped first). `status`: the checkpoint's, when the caller read it after the stop
    (else read here). On failure the checkpoint is left as the last committed batch left it (an
    unfinished repartition batch is dropped again) and StateRepartitionError is raised.
    """
    status = status or checkpoint_status(spark, checkpoint)
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
        _after_failed_repartition(spark, checkpoint, status, repartition)
        raise StateRepartitionError(
            f"repartitioning the state of {checkpoint} from {status.state_partitions} to {partitions} partitions"
            f" failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}") from error
    return StateRepartition(status.state_partitions, partitions, dropped, clock() - started)


def _after_failed_repartition(spark: SparkSession, checkpoint: str, before: CheckpointStatus,
                              repartition: Repartitioner) -> None:
    """After a failed repartition: finish the batch it left unfinished, if it left one (the
    reason to finish rather than drop it: `recover_unfinished_repartition`); when that fails too,
    drop it, as before the repartition."""
    try:
        if recover_unfinished_repartition(spark, checkpoint, repartition=repartition) is not None:
            return
    except Exception as error:  # noqa: BLE001 - report the repartition's own error, not this one
        log.warning("state: could not finish the failed repartition of %s: %s", checkpoint, error)
    _drop_unfinished_repartition(spark, checkpoint, before)


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
