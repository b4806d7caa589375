"""One run at a time per checkpoint: `CheckpointLock`, taken before anything touches the
checkpoint and released when the run ends (stop, failure, interpreter exit).

Two runs started at once on one checkpoint both write its logs and the sinks' batches: measured,
one batch directory of a FileSink got two Parquet files (its rows twice, for good), or a run died
with `CONCURRENT_STREAM_LOG_UPDATE`, `Rename destination .../_metadata/v2/0 already exists` or a
`FileNotFoundException` of a `_temporary` folder. The second run is refused instead
(`CheckpointLocked`, naming the holder). The decisions are fissure.lifecycle.checkpoint_lock's;
here are the files (`fissure/lock/<generation>` under the checkpoint, through
fissure.spark.checkpoint.files: exclusive on local file systems and HDFS, best effort on object
stores), the identity of this process and whether another one still runs.

A run holds the lock through every query it starts on the checkpoint (the adaptive loop's
restarts, `fissure.run`'s restarts after a worker crash) and renews its lease every quarter of
`lease_s`; a run that finds a newer generation than its own at a renewal has lost the checkpoint
to another (its lease ran out) and stops.

Spark mechanism with no pyspark import: its files are written through
fissure.spark.checkpoint.files, on whatever file system the checkpoint is.
"""

from __future__ import annotations

import atexit
import logging
import os
import shlex
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable

from fissure.lifecycle.checkpoint_lock import (
    LockAction, LockDecision, LockFile, LockRecord, ProcessIdentity, ProcessProbe, decide, holds,
)
from fissure.spark.checkpoint.files import CheckpointStore

log = logging.getLogger(__name__)

LOCK_FOLDER = "fissure/lock"
DEFAULT_LEASE_S = 120.0
ENDING_JVM_WAIT_S = 20.0  # a killed driver's JVM ends when it sees its Python process gone
RACES = 5  # generations lost to other runs before this one gives up


class CheckpointLocked(RuntimeError):
    """Another run holds the checkpoint."""

    def __init__(self, message: str, decision: LockDecision | None = None) -> None:
        super().__init__(message)
        self.decision = decision

    @property
    def holder(self) -> LockRecord | None:
        return self.decision.holder if self.decision is not None else None


class CheckpointLockLost(RuntimeError):
    """Another run took the checkpoint over while this one ran (this run's lease had run out)."""


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of a process, from /proc (None: unknown)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return (fields[0], fields[19]) if len(fields) > 19 else None


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def this_process(spark=None) -> ProcessIdentity:
    """This Python process, its machine and (with a local session) the JVM it drives."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    own = _proc_stat(os.getpid())
    jvm_pid, jvm_stat = None, None
    jvm = getattr(spark, "_jvm", None) if spark is not None else None
    if jvm is not None:
        try:
            candidate = int(jvm.java.lang.ProcessHandle.current().pid())
            jvm_stat = _proc_stat(candidate)
            jvm_pid = candidate if jvm_stat is not None else None  # a JVM elsewhere cannot be checked from here
        except Exception as error:  # noqa: BLE001 - a remote session: only this process counts
            log.debug("checkpoint lock: no JVM pid: %s", error)
    return ProcessIdentity(pid=os.getpid(), host=socket.gethostname(), boot_id=_read("/proc/sys/kernel/random/boot_id"),
                           pid_namespace=namespace, started=own[1] if own else "", jvm_pid=jvm_pid,
                           jvm_started=jvm_stat[1] if jvm_stat else "")


def process_alive(pid: int, started: str) -> bool:
    """Whether process `pid` (started at mark `started`, "" unknown) runs on this machine: a reused
    pid has another start mark, and a zombie (killed, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    stat = _proc_stat(pid)
    if stat is None:
        return True
    state, start = stat
    return state not in ("Z", "X") and (not started or start == started)


def _command() -> str:
    text = shlex.join([os.path.basename(sys.executable), *sys.argv]) if sys.argv and sys.argv[0] else ""
    return text if len(text) <= 200 else text[:197] + "..."


def _generation_name(generation: int) -> str:
    return f"{LOCK_FOLDER}/{generation:010d}"


def generations(store: CheckpointStore) -> list[int]:
    return sorted(int(name) for name in store.names(LOCK_FOLDER) if name.isdigit())


def read_latest(store: CheckpointStore) -> LockFile | None:
    """The newest generation of the checkpoint's lock (None: there is none)."""
    for _ in range(RACES):
        found = generations(store)
        if not found:
            return None
        newest = found[-1]
        text = store.read(_generation_name(newest))
        if text is None:
            continue  # pruned by a run that just took a newer one: look again
        try:
            record, problem = LockRecord.from_json(text), ""
        except ValueError as error:
            record, problem = None, str(error)
        return LockFile(newest, record, store.modified_s(_generation_name(newest)), problem)
    return None


_HELD: set[CheckpointLock] = set()


@atexit.register
def _release_at_exit() -> None:
    for lock in list(_HELD):
        lock.release()


class CheckpointLock:
    """The lock of one checkpoint, held by this run (`acquire`)."""

    def __init__(self, store: CheckpointStore, generation: int, record: LockRecord, *,
                 clock: Callable[[], float] = time.time, renew: bool = True) -> None:
        self.store, self.generation, self.record, self.clock = store, generation, record, clock
        self.lost: str | None = None  # why this run no longer holds the checkpoint
        self.on_lost: list[Callable[[str], None]] = []
        self._stop_renewing = threading.Event()
        self._released = False
        self._process = os.getpid()  # a forked child's copy of the lock is not the holder
        self._renewer = None
        if renew:
            self._renewer = threading.Thread(target=self._renew, name="fissure-checkpoint-lease", daemon=True)
            self._renewer.start()
        _HELD.add(self)

    @property
    def checkpoint(self) -> str:
        return self.store.location

    @classmethod
    def acquire(cls, store: CheckpointStore, program: str, *, spark=None, lease_s: float = DEFAULT_LEASE_S,
                clock: Callable[[], float] = time.time, alive: ProcessProbe = process_alive,
                identity: ProcessIdentity | None = None, sleep: Callable[[float], None] = time.sleep,
                renew: bool = True) -> CheckpointLock:
        """Take the checkpoint's lock for this run, or raise CheckpointLocked naming its holder."""
        created = store.make_directory()
        me = identity or this_process(spark)
        record = LockRecord(token=uuid.uuid4().hex, holder=me, program=program, command=_command(),
                            started_at=clock(), lease_s=lease_s, created_directory=created)
        waited_until = clock() + ENDING_JVM_WAIT_S
        races = 0
        while True:
            decision = decide(read_latest(store), me, clock(), alive, lease_s)
            if decision.action is LockAction.WAIT and clock() < waited_until:
                sleep(0.5)
                continue
            if not decision.proceeds:
                raise CheckpointLocked(_refusal(store, decision, clock(), me), decision)
            if store.create_exclusive(_generation_name(decision.generation), record.to_json()):
                if holds(generations(store), decision.generation):
                    lock = cls(store, decision.generation, record, clock=clock, renew=renew)
                    lock._prune()
                    if decision.action is LockAction.TAKE_OVER:
                        log.warning("checkpoint %s: took over the lock of %s: %s", store.location,
                                    decision.holder.describe(clock()) if decision.holder else "an unreadable record",
                                    decision.reason)
                    return lock
            races += 1
            if races >= RACES:
                raise CheckpointLocked(f"checkpoint {store.location}: other runs took its lock {races} times while "
                                       "this one tried; only one run at a time can use a checkpoint", decision)

    def _prune(self) -> None:
        for generation in generations(self.store):
            if generation < self.generation:
                try:
                    self.store.delete(_generation_name(generation))
                except Exception as error:  # noqa: BLE001 - an old generation left behind is harmless
                    log.debug("checkpoint lock: could not prune generation %d: %s", generation, error)

    def _renew(self) -> None:
        interval = max(0.05, self.record.lease_s / 4)
        while not self._stop_renewing.wait(interval):
            try:
                if not holds(generations(self.store), self.generation):
                    latest = read_latest(self.store)
                    holder = latest.record.describe(self.clock()) if latest and latest.record else "another run"
                    self._lose(f"another run took the checkpoint {self.checkpoint} over: {holder}")
                    return
                self.store.touch(_generation_name(self.generation), self.clock())
            except Exception as error:  # noqa: BLE001 - try again at the next renewal
                log.warning("checkpoint %s: could not renew the lock's lease: %s", self.checkpoint, error)

    def _lose(self, reason: str) -> None:
        self.lost = reason
        log.error("checkpoint lock lost: %s; this run stops", reason)
        for callback in list(self.on_lost):
            try:
                callback(reason)
            except Exception as error:  # noqa: BLE001 - every callback gets its turn
                log.warning("checkpoint lock: a lost-lock callback failed: %s", error)

    def check_held(self) -> None:
        """Raise CheckpointLockLost when another run took the checkpoint over."""
        if self.lost is not None:
            raise CheckpointLockLost(self.lost)

    def release(self) -> None:
        """Let the checkpoint go: a `released` generation, or, when this run made the checkpoint
        directory and nothing but the lock is in it, the directory removed."""
        if self._released:
            return
        self._released = True
        self._stop_renewing.set()
        _HELD.discard(self)
        if os.getpid() != self._process or self.lost is not None:
            return  # a forked child's copy, or not ours any more
        try:
            if not holds(generations(self.store), self.generation):
                return
            if self.record.created_directory and self.store.names("") == ["fissure"] and \
                    self.store.names("fissure") == ["lock"]:
                self.store.delete("", recursive=True)  # nothing but the lock: the start made nothing to keep
                return
            if self.store.exists(LOCK_FOLDER):
                self.store.create_exclusive(_generation_name(self.generation + 1),
                                            self.record.released_by(self.clock()).to_json())
        except Exception as error:  # noqa: BLE001 - the lock is taken over when its holder is gone
            log.warning("checkpoint %s: could not release the lock: %s", self.checkpoint, error)


def _refusal(store: CheckpointStore, decision: LockDecision, now_s: float, me: ProcessIdentity) -> str:
    if decision.holder is None:
        return (f"checkpoint {store.location}: {decision.reason}; if no run uses the checkpoint, remove "
                f"{store.location}/{LOCK_FOLDER} and start again")
    remote = not decision.holder.holder.same_machine(me)
    after = (f" on another machine once its lease ({decision.holder.lease_s:.0f} s) runs out without a renewal"
             if remote else " at the next start once its process has ended")
    return (f"checkpoint {store.location} is in use by another run: {decision.holder.describe(now_s)}; "
            f"{decision.reason}. Two runs on one checkpoint would write the same batches twice: wait for that run "
            f"to end or stop it, or use another checkpoint (a run that died is taken over{after})")
