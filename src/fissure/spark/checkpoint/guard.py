"""What a start checks and keeps in its checkpoint, under the checkpoint's lock
(fissure.spark.checkpoint.lock):

- the logs are whole (fissure.lifecycle.checkpoint_logs): a missing offsets file is named as such,
  before Spark reads it as `Multiple streaming jobs detected`;
- the program's stateful operators are those that wrote the state (fissure.program.fingerprint):
  the record `fissure/program.json` is written before the first batch, and a start whose program
  differs stops before Spark starts its query, saying what changed and how to go on
  (`ProgramChanged`); `migrate_state` records the changes the stored state survives;
- a start that fails removes only what it can prove it made (`StartGuard.undo`): the entries that
  were not in the checkpoint when the lock was taken, and only when the checkpoint held no
  stream then and holds no committed batch now (a run holding the lock is the only writer).

Spark mechanism with no pyspark import: what it checks are Spark's checkpoint logs, for the runs
that start a query on them.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fissure.lifecycle.checkpoint_logs import missing_log_files
from fissure.program.chain import Pipeline
from fissure.program.operators import PipelineError
from fissure.program.fingerprint import (NEW_CHECKPOINT, ProgramComparison, ProgramFingerprint, StateMigration,
                                         compare_programs, program_fingerprint, refusal_text)
from fissure.spark.checkpoint.files import CheckpointStore, open_store
from fissure.spark.checkpoint.lock import CheckpointLock
from fissure.program.graph import StreamGraph, as_graph

log = logging.getLogger(__name__)

PROGRAM_RECORD = "fissure/program.json"
FISSURE_FOLDER = "fissure"
LOCK_NAME = "lock"
# What Spark writes at the top of a checkpoint.
SPARK_ENTRIES = ("metadata", ".metadata.crc", "offsets", "commits", "sources", "state")


class ProgramChanged(PipelineError):
    """The program's stateful operators are not those that wrote the checkpoint's state."""


class CheckpointDamaged(RuntimeError):
    """A file of the checkpoint is missing or unreadable."""


def batch_ids(store: CheckpointStore, log_name: str) -> list[int]:
    return sorted(int(name) for name in store.names(log_name) if name.isdigit())


@dataclass
class StartGuard:
    """One start's view of its checkpoint, taken once the lock is held."""

    store: CheckpointStore
    entries_before: frozenset[str]  # top-level entries when the start began
    fissure_before: frozenset[str]  # fissure's own files then
    fresh: bool  # no stream had been started on it (no metadata, offsets or commits)

    @classmethod
    def open(cls, store: CheckpointStore) -> StartGuard:
        entries = frozenset(store.names(""))
        fresh = not ({"metadata"} & entries) and not batch_ids(store, "offsets") and not batch_ids(store, "commits")
        return cls(store, entries, frozenset(store.names(FISSURE_FOLDER)), fresh)

    def check_logs(self) -> None:
        """Raise CheckpointDamaged naming the missing offsets files, if any."""
        if self.fresh:
            return
        finding = missing_log_files(batch_ids(self.store, "offsets"), batch_ids(self.store, "commits"))
        if finding is not None:
            raise CheckpointDamaged(
                f"checkpoint {self.store.location} is damaged: {finding.reason} ({', '.join(finding.missing)} "
                f"missing: deleted or lost). Spark would stop on it with a misleading error ('Multiple streaming jobs "
                f"detected' or 'batch N doesn't exist'). Restore the file(s) from a copy of the checkpoint, or run on "
                f"a new checkpoint")

    def check_program(self, current: ProgramFingerprint) -> ProgramComparison:
        """Compare `current` with the checkpoint's record, write the record when it is new (or
        the checkpoint holds no committed state yet, or a recorded migration was applied), and
        raise ProgramChanged when the program changed."""
        committed = bool(batch_ids(self.store, "commits"))
        recorded, migration = read_program_record(self.store)
        if recorded is None:
            if committed:
                log.warning("checkpoint %s has no record of the program that wrote its state (an older fissure): "
                            "recording %r's; its stateful operators are checked from the next start on",
                            self.store.location, current.program)
            write_program_record(self.store, current)
            return ProgramComparison()
        if not committed:  # no state yet: nothing to protect
            if recorded != current or migration is not None:
                write_program_record(self.store, current)
            return ProgramComparison()
        comparison = compare_programs(recorded, current, migration)
        if not comparison.compatible:
            raise ProgramChanged(refusal_text(self.store.location, recorded, comparison, migration))
        if migration is not None:
            log.warning("checkpoint %s: applied the recorded state migration (%s)", self.store.location,
                        migration.describe())
        if recorded != current or migration is not None:
            write_program_record(self.store, current)
        return comparison

    def undo(self) -> tuple[str, ...]:
        """After a failed start: remove what it made (see the module docstring); returns the entries removed."""
        if not self.fresh:
            return ()
        if batch_ids(self.store, "commits"):
            log.warning("checkpoint %s: kept after the failed start: it holds committed batches", self.store.location)
            return ()
        removed = []
        try:
            for entry in SPARK_ENTRIES:
                if entry not in self.entries_before and self.store.exists(entry):
                    self.store.delete(entry, recursive=True)
                    removed.append(entry)
            for name in self.store.names(FISSURE_FOLDER):
                if name != LOCK_NAME and name not in self.fissure_before:
                    self.store.delete(f"{FISSURE_FOLDER}/{name}", recursive=True)
                    removed.append(f"{FISSURE_FOLDER}/{name}")
        except Exception as error:  # noqa: BLE001 - report the start's own error, not this one
            log.warning("checkpoint %s: could not remove what the failed start wrote: %s", self.store.location, error)
        return tuple(removed)


def read_program_record(store: CheckpointStore) -> tuple[ProgramFingerprint | None, StateMigration | None]:
    text = store.read(PROGRAM_RECORD)
    if text is None:
        return None, None
    try:
        data = json.loads(text)
        return ProgramFingerprint.from_dict(data), StateMigration.from_dict(data.get("migration"))
    except ValueError as error:
        raise CheckpointDamaged(f"checkpoint {store.location}: its program record {PROGRAM_RECORD} cannot be read "
                                f"({error}); restore it from a copy of the checkpoint, or run on a new checkpoint") from error


def write_program_record(store: CheckpointStore, fingerprint: ProgramFingerprint,
                         migration: StateMigration | None = None) -> None:
    document = {**fingerprint.to_dict(), "recorded_at": time.time()}
    if migration is not None:
        document["migration"] = migration.to_dict()
    store.write(PROGRAM_RECORD, json.dumps(document, indent=1, sort_keys=True) + "\n")


def migrate_state(checkpoint: str, program: Pipeline | StreamGraph, *, renamed: Mapping[str, str] | None = None,
                  reads_old_state: Iterable[str] = (), spark=None) -> StateMigration:
    """Record in `checkpoint` the changes of `program` that its stored state survives; the next
    run on it applies them (checked again with the sources' schemas) and records the program.

    `renamed`: old name -> new name of stateful operators that only got a new name (Spark keeps
    state by place). `reads_old_state`: operators whose `state_version` or state type changed
    and whose function reads the state the old one wrote. A changed key, kind, window, input
    fields or order of stateful operators cannot be migrated: run on a new checkpoint.
    `spark`: needed for a checkpoint on HDFS or an object store. Raises ProgramChanged when
    changes remain that these do not cover.
    """
    graph = as_graph(program)
    migration = StateMigration.of(renamed, reads_old_state)
    store = open_store(spark, checkpoint)
    lock = CheckpointLock.acquire(store, graph.name, spark=spark, renew=False)
    try:
        recorded, _ = read_program_record(store)
        if recorded is None:
            raise PipelineError(f"checkpoint {store.location} has no program record ({PROGRAM_RECORD}): a run on it "
                                f"records its program; there is nothing to migrate")
        current = program_fingerprint(graph)
        _check_names(store.location, recorded, current, migration)
        comparison = compare_programs(recorded, current, migration)
        if not comparison.compatible:
            blocking = [change for change in comparison.changes if change.route == NEW_CHECKPOINT]
            heading = ("these changes cannot be migrated" if blocking else
                       "these changes remain after the migration asked for")
            raise ProgramChanged(f"{heading}:\n" + refusal_text(store.location, recorded, comparison, migration))
        write_program_record(store, recorded, migration)
        log.warning("checkpoint %s: state migration recorded (%s); the next run applies it", store.location,
                    migration.describe())
        return migration
    finally:
        lock.release()


def _check_names(checkpoint: str, recorded: ProgramFingerprint, current: ProgramFingerprint,
                 migration: StateMigration) -> None:
    old = [operator.name for operator in recorded.operators]
    new = [operator.name for operator in current.operators]
    problems = [f"renamed names {name!r}, which the checkpoint's record does not have (it has {', '.join(old)})"
                for name, _ in migration.renamed if name not in old]
    problems += [f"renamed {before!r} to {name!r}, which is no stateful operator of the program (they are "
                 f"{', '.join(new)})" for before, name in migration.renamed if name not in new]
    problems += [f"reads_old_state names {name!r}, which is no stateful operator of the program (they are "
                 f"{', '.join(new)})" for name in migration.reads_old_state if name not in new]
    if problems:
        raise PipelineError(f"checkpoint {checkpoint}: {'; '.join(problems)}")
