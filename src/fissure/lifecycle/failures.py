"""Whose fault a failed query is, and whether the run starts it again (pure: no Spark, the clock
passed in).

A record's fault becomes its dead letter in the worker and never fails a query. What does fail
one is the machine's or the program's:

- the machine's (`RESTARTABLE`): a Python worker process that died (a crash, a signal, the
  kernel's out-of-memory killer), an operator that ran out of memory or of another resource
  (MemoryError; an OSError of ENOMEM, ENOSPC, EDQUOT, EMFILE, ENFILE, ENOBUFS: the worker raises
  fissure.runtime.records.fate.ResourceExhausted naming the operator and the record instead of making
  the record a dead letter), a JVM that found the disk full or no file handle left. The run starts
  the query again on its checkpoint: the batch is replayed, nothing is lost or written twice;
- the program's (anything else): the run ends with it.

`decide_restart` is the policy: at most `max_restarts` restarts within any `window_s` seconds
(a long run survives any number of unrelated crashes spread over it; a crash loop ends quickly),
and never a restart for the same failure of the same record seen `max_restarts` + 1 times in a
row: a record that exhausts memory on every try stops the run, named, with its cause.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Sequence
from dataclasses import dataclass

# What Spark says when a Python worker process died instead of raising an error.
WORKER_CRASH = "Python worker exited unexpectedly"
# fissure.runtime.records.fate.ResourceExhausted's message, as the driver reads it back.
RESOURCE_FAULT = re.compile(r"operator '(?P<operator>(?:[^'\\]|\\.)*)' ran out of resources \((?P<cause>.*)\) "
                            r"on record (?P<record>.*?); not the record's fault")
# The innermost error of a Python traceback or a JVM stack, when it is a resource's.
RESOURCE_ERRNOS = frozenset({errno.ENOMEM, errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE, errno.ENOBUFS})
_PYTHON_RESOURCE = re.compile(r"^(?:MemoryError\b.*|\w*(?:OSError|IOError): \[Errno (?:%s)\].*)$"
                              % "|".join(map(str, sorted(RESOURCE_ERRNOS))))
_JVM_RESOURCE = re.compile(r"(java\.lang\.OutOfMemoryError[^\n]*|[\w.$]*(?:IOException|FSError)[^\n]*"
                           r"(?:No space left on device|Disk quota exceeded|Too many open files)[^\n]*)")

CRASH, RESOURCE = "worker crash", "resource"


@dataclass(frozen=True)
class Failure:
    """A failed query the run may start again: what happened, where and to which record."""

    kind: str  # CRASH or RESOURCE
    cause: str  # the crash line or the resource error, whole
    operator: str | None = None  # the operator running, when known
    record: str | None = None  # the record it was processing, when known (as text)

    def describe(self) -> str:
        where = f" in operator {self.operator!r}" if self.operator else ""
        record = f" on record {self.record}" if self.record else ""
        return f"{self.cause}{where}{record}"

    @property
    def signature(self) -> tuple:
        """The same failure of the same record: kind, cause, operator and record."""
        return self.kind, self.cause, self.operator, self.record


@dataclass(frozen=True)
class RestartPolicy:
    """At most `max_restarts` restarts of the query in any `window_s` seconds."""

    max_restarts: int = 3
    window_s: float = 600.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts!r}")
        if not self.window_s > 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s!r}")


@dataclass(frozen=True)
class Restart:
    """A restart the run made: when (the clock's seconds) and after which failure."""

    at_s: float
    failure: Failure


@dataclass(frozen=True)
class RestartDecision:
    restart: bool
    reason: str


def restartable_failure(text: str) -> Failure | None:
    """The machine's failure in a failed query's error text (None: the program's, or unknown)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        match = RESOURCE_FAULT.search(line)
        if match:
            return Failure(RESOURCE, match["cause"], match["operator"].replace("\\'", "'"), match["record"])
    crash = next((line for line in lines if WORKER_CRASH in line), None)
    if crash is not None:
        cause = crash[crash.index(WORKER_CRASH):].split(". Consider")[0].split(": fissure:")[0].strip()
        running = [line for line in lines if "fissure: operator " in line and line.endswith("was running")]
        operator = None
        if running:  # the operator fissure noted in the worker's fault-handler log (records.mark_running)
            operator = running[-1].split("fissure: operator ", 1)[1].rsplit(" was running", 1)[0].strip("'")
        return Failure(CRASH, cause, operator)
    for line in reversed(lines):
        if _PYTHON_RESOURCE.match(line):
            return Failure(RESOURCE, line)
    match = _JVM_RESOURCE.search(text)
    if match:
        return Failure(RESOURCE, match.group(1).strip())
    return None


def decide_restart(failure: Failure, restarts: Sequence[Restart], now_s: float,
                   policy: RestartPolicy) -> RestartDecision:
    """Whether the run starts its query again after `failure` at `now_s`, given the `restarts`
    it made so far (oldest first)."""
    repeated = 0
    for earlier in reversed(restarts):
        if earlier.failure.signature != failure.signature:
            break
        repeated += 1
    if failure.record is not None and repeated >= max(1, policy.max_restarts):
        return RestartDecision(False, f"the same failure {repeated + 1} times in a row on the same record: "
                                      f"{failure.describe()}; the record fails this way on every try")
    recent = [restart for restart in restarts if now_s - restart.at_s < policy.window_s]
    if len(recent) >= policy.max_restarts:
        return RestartDecision(False, f"{len(recent)} restart{'' if len(recent) == 1 else 's'} in the last "
                                      f"{policy.window_s:g} s already (at most {policy.max_restarts} in "
                                      f"{policy.window_s:g} s): {failure.describe()}")
    return RestartDecision(True, f"{failure.describe()}; restart {len(recent) + 1} of at most "
                                 f"{policy.max_restarts} in {policy.window_s:g} s")
