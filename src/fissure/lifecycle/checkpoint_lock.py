"""Who may run on a checkpoint: the lock's records and its decisions (pure; the files are
fissure.spark.checkpoint.lock's).

The lock is a series of generations, `fissure/lock/<n>` under the checkpoint, each a record
written once by create-exclusive: the newest generation tells who holds the checkpoint (or that
the last holder released it). Taking the lock, or taking it over, is creating generation n + 1:
of several runs that try at once exactly one creates it. A holder renews its lease by touching
its own generation's file and has lost the lock once a newer generation exists.

A holder is alive when:
- it ran on this machine (same host, boot and process namespace): its Python process, or the JVM
  it drives, still runs (a pid reused by another process has another start time: dead);
- it ran elsewhere: its lease was renewed within `lease_s` (clocks of the hosts must agree to
  well within the lease).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from enum import Enum

RECORD_FORMAT = 1


@dataclass(frozen=True)
class ProcessIdentity:
    """A process and the machine it runs on, as far as another process can check it."""

    pid: int
    host: str
    boot_id: str = ""  # changes at every boot of the machine ("" unknown)
    pid_namespace: str = ""  # pids are comparable within one namespace only ("" unknown)
    started: str = ""  # the process's start mark: a reused pid has another ("" unknown)
    jvm_pid: int | None = None  # the JVM this Python process drives (it writes the checkpoint too)
    jvm_started: str = ""

    def same_machine(self, other: ProcessIdentity) -> bool:
        """Whether `other`'s pids can be checked from here."""
        return (self.host, self.boot_id, self.pid_namespace) == (other.host, other.boot_id, other.pid_namespace)


@dataclass(frozen=True)
class LockRecord:
    """One generation of the lock: who took it (or released it), when, and what for."""

    token: str  # one run's own: two runs in one process differ
    holder: ProcessIdentity
    program: str  # the program's name
    command: str  # the command line of the holder's process
    started_at: float  # wall clock (epoch seconds) when the lock was taken
    lease_s: float  # the holder renews its generation's file at least this often
    created_directory: bool = False  # the run made the checkpoint directory when it took the lock
    released: bool = False  # a generation that says the previous holder let go

    def to_json(self) -> str:
        return json.dumps({"format": RECORD_FORMAT, **asdict(self)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LockRecord:
        """The record in `text`; ValueError when it is not one."""
        try:
            data = json.loads(text)
            data.pop("format", None)
            holder = ProcessIdentity(**data.pop("holder"))
            return cls(holder=holder, **data)
        except (TypeError, KeyError, AttributeError, json.JSONDecodeError) as error:
            raise ValueError(f"not a fissure lock record: {error}") from error

    def released_by(self, at_s: float) -> LockRecord:
        return replace(self, released=True, started_at=at_s)

    def describe(self, now_s: float | None = None) -> str:
        """`program 'wc' (python job.py), pid 12 on host h, started 2025-01-02 10:00:00 (5 min ago)`."""
        started = datetime.datetime.fromtimestamp(self.started_at).strftime("%Y-%m-%d %H:%M:%S")
        ago = f" ({_duration(now_s - self.started_at)} ago)" if now_s is not None else ""
        jvm = f" (JVM pid {self.holder.jvm_pid})" if self.holder.jvm_pid is not None else ""
        command = f" ({self.command})" if self.command else ""
        return (f"program {self.program!r}{command}, pid {self.holder.pid}{jvm} on host {self.holder.host}, "
                f"started {started}{ago}")


@dataclass(frozen=True)
class LockFile:
    """The newest generation as read: its number, its record (None: unreadable) and when its
    file was last modified (the holder's renewals touch it)."""

    generation: int
    record: LockRecord | None
    modified_s: float | None = None
    problem: str = ""  # why the record could not be read


class LockAction(str, Enum):
    ACQUIRE = "acquire"  # nobody holds the checkpoint
    TAKE_OVER = "take over"  # the holder is gone
    WAIT = "wait"  # the holder's Python process is gone, its JVM is still ending
    REFUSE = "refuse"  # the holder runs


@dataclass(frozen=True)
class LockDecision:
    action: LockAction
    generation: int  # the generation to create (ACQUIRE, TAKE_OVER)
    reason: str
    holder: LockRecord | None = None

    @property
    def proceeds(self) -> bool:
        return self.action in (LockAction.ACQUIRE, LockAction.TAKE_OVER)


# alive(pid, start mark) -> whether that process runs on this machine
ProcessProbe = Callable[[int, str], bool]


def decide(latest: LockFile | None, me: ProcessIdentity, now_s: float, alive: ProcessProbe,
           lease_s: float) -> LockDecision:
    """What a run that wants the checkpoint does, given the newest generation of its lock.

    `lease_s` applies to a record that cannot be read (a record names its own lease)."""
    if latest is None:
        return LockDecision(LockAction.ACQUIRE, 1, "no run has held the checkpoint")
    following = latest.generation + 1
    record = latest.record
    if record is None:
        age = None if latest.modified_s is None else now_s - latest.modified_s
        if age is not None and age > lease_s:
            return LockDecision(LockAction.TAKE_OVER, following,
                                f"lock generation {latest.generation} is unreadable ({latest.problem}) and "
                                f"{_duration(age)} old, beyond the {_duration(lease_s)} lease")
        return LockDecision(LockAction.REFUSE, following,
                            f"lock generation {latest.generation} is unreadable ({latest.problem}); it is taken "
                            f"as held until it is {_duration(lease_s)} old")
    if record.released:
        return LockDecision(LockAction.ACQUIRE, following, "the last run released the checkpoint", record)
    holder = record.holder
    if holder.same_machine(me):
        if alive(holder.pid, holder.started):
            same = " (this process: another run in it)" if holder.pid == me.pid else ""
            return LockDecision(LockAction.REFUSE, following, f"its process {holder.pid} is running{same}", record)
        if holder.jvm_pid is not None and alive(holder.jvm_pid, holder.jvm_started):
            return LockDecision(LockAction.WAIT, following,
                                f"its process {holder.pid} is gone but its JVM {holder.jvm_pid} is still ending", record)
        return LockDecision(LockAction.TAKE_OVER, following, f"its process {holder.pid} on this machine is gone", record)
    renewed = max(record.started_at, latest.modified_s or 0.0)
    age = now_s - renewed
    if age > record.lease_s:
        return LockDecision(LockAction.TAKE_OVER, following,
                            f"it runs on another machine ({holder.host}) and its lease was last renewed "
                            f"{_duration(age)} ago, beyond its {_duration(record.lease_s)} lease", record)
    return LockDecision(LockAction.REFUSE, following,
                        f"it runs on another machine ({holder.host}) and renewed its lease {_duration(max(age, 0))} ago "
                        f"(it is taken over once {_duration(record.lease_s)} pass without a renewal)", record)


def holds(generations: Iterable[int], mine: int) -> bool:
    """Whether the run that created generation `mine` holds the lock: no newer generation exists."""
    return max(generations, default=mine) <= mine


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
