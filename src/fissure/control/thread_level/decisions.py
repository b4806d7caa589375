"""What a thread-level policy sees each period and what it answers: `PeriodMeasurement` in,
`ThreadLevelDecision` (a frozen value with its reason) out; the `ThreadLevelPolicy` protocol and
the small pure rules both policies share (ladder rungs, trend thresholds, usable samples).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Protocol

from fissure.control.thread_level.config import ElasticityConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeriodMeasurement:
    """What the runner saw during one period.

    Attributes:
        now_s: the injected clock at the end of the period.
        throughput_per_s: items completed per second; NaN or None when nothing could be measured.
        cpu_usage: share of the machine's CPU capacity in use (0..1); None when unknown (passes).
        level_in_force: threads that really were active; None when the last decision took effect.
    """

    now_s: float
    throughput_per_s: float | None
    cpu_usage: float | None = None
    level_in_force: int | None = None

    def summary(self) -> str:
        """One line for a loop's timeline: `412/s, CPU 63%`."""
        value = self.throughput_per_s
        parts = [f"{value:.4g}/s" if value is not None else "no throughput"]
        if self.cpu_usage is not None:
            parts.append(f"CPU {self.cpu_usage:.0%}")
        if self.level_in_force is not None:
            parts.append(f"{self.level_in_force} threads active")
        return ", ".join(parts)


@dataclass(frozen=True)
class ThreadLevelDecision:
    """The thread level for the next period, and why."""

    level: int
    previous_level: int
    now_s: float
    reason: str

    @property
    def changed(self) -> bool:
        return self.level != self.previous_level

    def summary(self) -> str:
        """One line for a loop's timeline: `level 3 -> 5` or `hold level 3`."""
        return f"level {self.previous_level} -> {self.level}" if self.changed else f"hold level {self.level}"

    @classmethod
    def hold(cls, level: int, now_s: float, reason: str) -> ThreadLevelDecision:
        return cls(level=level, previous_level=level, now_s=now_s, reason=reason)

    @classmethod
    def move(cls, previous_level: int, level: int, now_s: float, reason: str) -> ThreadLevelDecision:
        return cls(level=level, previous_level=previous_level, now_s=now_s, reason=reason)


class ThreadLevelPolicy(Protocol):
    """What the runner and `fissure elastic-sim` need from a policy: a loop policy
    (fissure.control.loop) that also tells the level it holds."""

    name: str

    @property
    def level(self) -> int: ...

    def decide(self, measurement: PeriodMeasurement) -> ThreadLevelDecision: ...


@dataclass(frozen=True)
class LevelRecord:
    """A read-only view of what a policy remembers about one thread level."""

    level: int
    trusted: bool  # measured in the current epoch (trust-trend: the paper's `trusted`)
    throughput_per_s: float  # mean of the recent samples (improvement 3) or the last one
    first_throughput_per_s: float  # first trusted sample (the paper's `firstThput`)
    peak_per_s: float | None  # elastic operator: peak rate; None when unknown or invalidated
    last_time: int  # logical time of the last visit (the paper's `lastTime`)
    samples: int


def geometric_ladder(min_level: int, max_level: int, ratio: float) -> tuple[int, ...]:
    """Levels from min_level to max_level, each about `ratio` times the previous and at least +1."""
    rungs = [min_level]
    while rungs[-1] < max_level:
        rungs.append(min(max_level, max(rungs[-1] + 1, round(rungs[-1] * ratio))))
    return tuple(rungs)


def trend_threshold(config: ElasticityConfig, lower_level: int, upper_level: int, base: float) -> float:
    """Relative gain from lower_level to upper_level that counts as a trend (improvement 2)."""
    if not config.sensitivity_per_doubling or lower_level == upper_level:
        return base
    return (1 + base) ** math.log2(upper_level / lower_level) - 1


def usable_throughput(measurement: PeriodMeasurement) -> float | None:
    """The measurement's throughput, or None (logged) when it is missing, NaN or negative."""
    value = measurement.throughput_per_s
    if value is None or not math.isfinite(value) or value < 0:
        log.info("thread level: no usable throughput at t=%.3f s (%r): no change", measurement.now_s, value)
        return None
    return value


def cpu_usage_acceptable(config: ElasticityConfig, measurement: PeriodMeasurement) -> bool:
    """The Streams paper's isCPUUsageAcceptable(); an unknown usage passes."""
    usage = measurement.cpu_usage
    if config.cpu_usage_limit is None or usage is None or not math.isfinite(usage):
        return True
    return usage <= config.cpu_usage_limit


def relative_gain(lower: float, upper: float) -> float:
    if lower > 0:
        return (upper - lower) / lower
    return math.inf if upper > 0 else 0.0
