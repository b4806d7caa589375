"""When a running micro-batch is stuck, and in which operator (pure: no Spark, no clock of its own).

A batch is stuck once it has run `factor` times longer than expected, and at least `min_s`:
expected is the longest of the median of the last `history` batches and the model's predicted
batch time (fissure.plan.batch_size, when fissure chose the batch size). The first batch,
with neither, is stuck after `min_s` alone. The warning repeats each time the batch's time has
doubled since the last one.

Python accumulators reach the driver only at a task's end, and a stuck task does not end: so
each Python worker notes the operator it enters and leaves in a small heartbeat file
(fissure.runtime.records.fate.beat), and `stuck_operator` picks the operator that has been running
longest in this batch.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StallPolicy:
    factor: float = 10.0
    min_s: float = 60.0
    history: int = 5

    def __post_init__(self) -> None:
        if not self.factor > 1:
            raise ValueError(f"the stall factor must be > 1, got {self.factor!r}")
        if not self.min_s > 0:
            raise ValueError(f"the stall minimum must be > 0 s, got {self.min_s!r}")
        if self.history < 1:
            raise ValueError(f"the stall history must be >= 1 batch, got {self.history!r}")


@dataclass(frozen=True)
class StallVerdict:
    stuck: bool
    elapsed_s: float
    threshold_s: float
    expected_s: float | None
    reason: str


def judge_batch(elapsed_s: float, recent_s: Sequence[float], predicted_s: float | None,
                policy: StallPolicy) -> StallVerdict:
    """Whether a batch running for `elapsed_s` is stuck, given the last batches' times (oldest
    first) and the model's predicted batch time (None: no prediction)."""
    recent = [seconds for seconds in recent_s[-policy.history:] if seconds >= 0]
    candidates = ([statistics.median(recent)] if recent else []) + ([predicted_s] if predicted_s else [])
    expected = max(candidates) if candidates else None
    basis = " and ".join(name for name, present in (("the last batches' median", recent),
                                                     ("the model's prediction", predicted_s)) if present)
    threshold = max(policy.min_s, policy.factor * expected) if expected is not None else policy.min_s
    if expected is None:
        because = f"no batch time to compare with: stuck after {policy.min_s:g} s"
    else:
        because = (f"{elapsed_s / expected:,.0f}x the {expected:.1f} s expected ({basis}); stuck after "
                   f"{threshold:.0f} s ({policy.factor:g}x, at least {policy.min_s:g} s)")
    return StallVerdict(elapsed_s >= threshold, elapsed_s, threshold, expected, because)


def report_due(verdict: StallVerdict, last_reported_s: float | None) -> bool:
    """Whether a stuck batch is reported now: first when it is stuck, then each time its time doubled."""
    return verdict.stuck and (last_reported_s is None or verdict.elapsed_s >= 2 * last_reported_s)


@dataclass(frozen=True)
class Heartbeat:
    """A Python worker process's note: the operator it runs (None: none) since a wall-clock time."""

    pid: int
    operator: str | None
    since_s: float


def read_heartbeat(name: str, text: str) -> Heartbeat | None:
    """A heartbeat file's content (`name`: the process id); None when unreadable (being written)."""
    try:
        data = json.loads(text)
        return Heartbeat(int(name), data.get("operator"), float(data["since"]))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def stuck_operator(heartbeats: Iterable[Heartbeat], batch_started_s: float) -> Heartbeat | None:
    """The heartbeat of the operator running longest among those entered since the batch started
    (earlier notes are other batches' and dead processes'); None: no operator runs now."""
    running = [beat for beat in heartbeats if beat.operator is not None and beat.since_s >= batch_started_s]
    return min(running, key=lambda beat: beat.since_s, default=None)


@dataclass(frozen=True)
class Stall:
    """A stuck batch as reported: when, how long, where."""

    batch_id: int
    elapsed_s: float
    expected_s: float | None
    operator: str | None  # the operator running longest in the batch (None: not known)
    operator_s: float | None  # for how long
    pid: int | None
    reason: str

    def describe(self) -> str:
        where = (f"operator {self.operator!r} has been running for {self.operator_s:.0f} s (Python worker pid "
                 f"{self.pid})" if self.operator else
                 "no operator noted as running (outside fissure's operators, or workers whose heartbeats this "
                 "driver cannot read: a cluster's executors, a session fissure did not create)")
        return f"micro-batch {self.batch_id} has run for {self.elapsed_s:.0f} s, {self.reason}; {where}"
