"""Thread-level elasticity: which thread level the in-worker scheduler should run at next.

Two policies, both pure (no threads, no clock reads, no I/O): each period the caller hands in a
`PeriodMeasurement` (the throughput seen during the period, the CPU usage, the time) and gets a
`ThreadLevelDecision` back, a frozen value that carries its reason.

- `TrustTrendPolicy`: updateThreadLevel() of Schneider & Wu, "Low-synchronization, mostly
  lock-free, elastic scheduling for streaming runtimes" (IBM Streams 4.2): a record per level with
  trust, trends towards the level below and the level above, all trust dropped on a change in
  load, the CPU-usage check before any increase.
- `ElasticOperatorPolicy`: the elastic operator algorithm of Schneider et al., "Elastic scaling of
  data parallel operators in stream processing" (IPDPS 2009): peak and last rate per level, decay
  of the peak, invalidation of the peaks above on a big gain, the peaking state after a decrease.

The papers' rules are kept as written, and `ElasticityConfig.as_written()` turns every
improvement below off. On synthetic curves (`fissure elastic-sim`; docs/elastic-scheduler.md has
the numbers) the rules as written settle far from the best level: their threshold applies to one
more thread, which at 20 threads asks for a steeper slope than linear scaling has; they only look
one step up or down, so a slow start hides a far better level; single noisy samples raise false
trends and false changes in load. The improvements, each a named step behind a parameter:

1. Level ladder (`ladder_ratio`): the level below and the level above are the neighbouring rungs
   of a geometric ladder (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, ...), which the Streams paper's separate
   `levelBelow` / `levelAbove` allow, instead of +-1.
2. Sensitivity per doubling (`sensitivity_per_doubling`): a trend from level a to level b needs a
   relative gain of (1 + SENS) ** log2(b / a) - 1, so SENS means the same at 2 threads as at 20.
3. Smoothing (`smoothing_window`): a level's throughput is the mean of its last samples.
4. Significance (`trend_noise_z`): a trend must also exceed that many standard errors of the
   measurement noise, estimated from consecutive periods at one level (`assumed_noise` before).
5. Confirmed change in load (`load_change_confirmations`, `load_change_noise_z`): several
   deviating samples in a row at one level, each beyond SENS and beyond the noise; with
   `elastic_operator_load_change` the elastic operator starts afresh on the same test.
6. Trust horizon (`trust_horizon_periods`): what a level not visited for that many periods recorded
   is forgotten (the Streams paper's `lastTime`, unused as written), so neighbours get re-probed
   and a change that leaves the current level's rate as it was is still found; a refinement (8)
   is redone after three horizons.
7. Coarse scan (`coarse_scan_ratio`): at the start and after each change in load, measure a few
   levels spread over the whole range, one period each, and start the rules from the best.
8. Refinement (`refine`): when the rules first hold at a level in an epoch, measure every level
   between its two neighbouring rungs, one period each, and go to the best (the smallest within
   `settle_tie_margin` of it); the rules go on from there.
9. Guard (`decrease_guard_margin`): a decrease for want of a trend only goes to a level measured
   close to the best of the epoch, and a level measured clearly below the best moves towards it,
   so that many small "no trend" steps cannot add up to a large loss on a long gentle slope.
"""

from __future__ import annotations

import logging
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

log = logging.getLogger(__name__)

POLICY_NAMES = ("trust-trend", "elastic-operator")

# A refinement ages like trust, but slower: it costs a period per level between two rungs.
REFINEMENT_HORIZONS = 3


@dataclass(frozen=True)
class ElasticityConfig:
    """Every parameter of the thread-level policies, with its default and the papers' value.

    Attributes:
        min_threads: lowest level. The Streams paper keeps one more scheduler thread than the most
            input ports of one operator, so that the scheduler cannot deadlock; fissure's runner
            feeds the scheduler from the caller's thread, which drains full queues itself, so 1 is safe.
        max_threads: highest level (the Streams paper caps it at the logical processors).
        period_s: seconds between two decisions (Streams: 10 s, 2009 paper: 1 s): long enough for a
            new level to show in the throughput, short enough to follow the workload.
        sensitivity: SENS, the relative difference that is a trend or a change in load (Streams: 0.05).
        cpu_usage_limit: trust-trend makes no increase while the machine's CPU usage (0..1) is above
            this (Streams: 0.8, from /proc/stat). None disables the check.
        tolerance: TOLERANCE of the elastic operator's less() (2009 paper: value not given).
        decay_rate: DECAY_RATE, the share a peak loses in each period that does not reach it (2009
            paper: value not given).
        ladder_ratio: improvement 1, geometric step between rungs; 1.0 is the papers' +-1.
        sensitivity_per_doubling: improvement 2; False is the papers' threshold per step.
        smoothing_window: improvement 3, samples averaged per level; 1 is the papers' last sample.
        trend_noise_z: improvement 4, standard errors of noise a trend must exceed; 0 is the papers'.
        assumed_noise: improvement 4, relative noise of one sample until repeated samples tell.
        load_change_confirmations: improvement 5, deviating periods in a row; 1 is the Streams paper's.
        load_change_noise_z: improvement 5, standard errors of noise a deviation must also exceed.
        elastic_operator_load_change: improvement 5 for the elastic operator (the 2009 paper has no
            change-in-load test: it decays peaks and invalidates those above a big gain).
        trust_horizon_periods: improvement 6, periods after which what a level not visited recorded
            is forgotten; None is the papers' (trust lasts until a change in load).
        coarse_scan_ratio: improvement 7, geometric step of the scanned levels; None: no scan.
        refine: improvement 8, measure the levels between the neighbouring rungs once the rules hold.
        settle_tie_margin: improvement 8, levels within this share of the best count as equal, and
            the smallest wins (fewer threads for the same throughput).
        refine_samples: improvement 8, periods spent at each level the refinement measures.
        decrease_guard_margin: improvement 9, a level counts as clearly below the epoch's best when
            the best beats it by more than this share (and the noise); such a level is not the
            target of a decrease for want of a trend (trust-trend's rule 5, the elastic operator
            staying low after peaking), and the policy moves from it towards the best. None: off.
    """

    min_threads: int = 1
    max_threads: int = 32
    period_s: float = 1.0
    sensitivity: float = 0.05
    cpu_usage_limit: float | None = 0.8
    tolerance: float = 0.05
    decay_rate: float = 0.01
    ladder_ratio: float = 1.25
    sensitivity_per_doubling: bool = True
    smoothing_window: int = 4
    trend_noise_z: float = 0.5
    assumed_noise: float = 0.02
    load_change_confirmations: int = 2
    load_change_noise_z: float = 2.5
    elastic_operator_load_change: bool = True
    trust_horizon_periods: int | None = 40
    coarse_scan_ratio: float | None = 1.6
    refine: bool = True
    settle_tie_margin: float = 0.01
    refine_samples: int = 1
    decrease_guard_margin: float | None = 0.01

    def __post_init__(self) -> None:
        if not 1 <= self.min_threads <= self.max_threads:
            raise ValueError(
                f"thread levels need 1 <= min_threads <= max_threads, got {self.min_threads}..{self.max_threads}"
            )
        if not self.period_s > 0:
            raise ValueError(f"period_s must be > 0, got {self.period_s}")
        for name in ("sensitivity", "tolerance", "decay_rate", "settle_tie_margin", "assumed_noise"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
        if self.cpu_usage_limit is not None and not 0 < self.cpu_usage_limit <= 1:
            raise ValueError(f"cpu_usage_limit must be in (0, 1] or None, got {self.cpu_usage_limit}")
        if not self.ladder_ratio >= 1:
            raise ValueError(f"ladder_ratio must be >= 1 (1 means neighbours +-1), got {self.ladder_ratio}")
        if self.coarse_scan_ratio is not None and not self.coarse_scan_ratio > 1:
            raise ValueError(f"coarse_scan_ratio must be > 1 or None, got {self.coarse_scan_ratio}")
        if self.smoothing_window < 1 or self.load_change_confirmations < 1 or self.refine_samples < 1:
            raise ValueError("smoothing_window, load_change_confirmations and refine_samples must be >= 1")
        if self.trust_horizon_periods is not None and self.trust_horizon_periods < 1:
            raise ValueError(f"trust_horizon_periods must be >= 1 or None, got {self.trust_horizon_periods}")
        if self.trend_noise_z < 0 or self.load_change_noise_z < 0:
            raise ValueError("trend_noise_z and load_change_noise_z must be >= 0")
        if self.decrease_guard_margin is not None and not 0 <= self.decrease_guard_margin < 1:
            raise ValueError(f"decrease_guard_margin must be in [0, 1) or None, got {self.decrease_guard_margin}")

    @classmethod
    def as_written(cls, **overrides) -> ElasticityConfig:
        """The papers' algorithms without any improvement (for comparison)."""
        paper = dict(
            ladder_ratio=1.0,
            sensitivity_per_doubling=False,
            smoothing_window=1,
            trend_noise_z=0.0,
            load_change_confirmations=1,
            load_change_noise_z=0.0,
            elastic_operator_load_change=False,
            trust_horizon_periods=None,
            coarse_scan_ratio=None,
            refine=False,
            decrease_guard_margin=None,
        )
        return cls(**{**paper, **overrides})

    def with_levels(self, min_threads: int, max_threads: int) -> ElasticityConfig:
        return replace(self, min_threads=min_threads, max_threads=max_threads)


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

    @classmethod
    def hold(cls, level: int, now_s: float, reason: str) -> ThreadLevelDecision:
        return cls(level=level, previous_level=level, now_s=now_s, reason=reason)

    @classmethod
    def move(cls, previous_level: int, level: int, now_s: float, reason: str) -> ThreadLevelDecision:
        return cls(level=level, previous_level=previous_level, now_s=now_s, reason=reason)


class ThreadLevelPolicy(Protocol):
    """What the runner and `fissure elastic-sim` need from a policy."""

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


class _Record:
    """The Streams paper's ThreadRecord (and the 2009 paper's peak / last), plus recent samples."""

    __slots__ = ("last_time", "first_throughput", "recent", "trusted", "peak")

    def __init__(self, window: int) -> None:
        self.last_time = -1
        self.first_throughput = math.nan
        self.recent: deque[float] = deque(maxlen=window)
        self.trusted = False
        self.peak: float | None = None

    @property
    def throughput(self) -> float:
        return sum(self.recent) / len(self.recent) if self.recent else math.nan

    def record(self, throughput: float, time: int) -> None:
        if not self.trusted:
            self.first_throughput = throughput
            self.recent.clear()
        self.recent.append(throughput)
        self.last_time = time
        self.trusted = True

    def forget(self) -> None:
        self.trusted = False
        self.recent.clear()
        self.peak = None


class _Ladder:
    """The levels the rules move between (improvement 1); reset at the start of each epoch."""

    def __init__(self, config: ElasticityConfig) -> None:
        self.config = config
        self.rungs: list[int] = []
        self.reset(config.min_threads)

    def reset(self, current_level: int) -> None:
        """Geometric rungs, the one nearest to current_level moved onto it (ends stay put)."""
        config = self.config
        self.rungs = list(geometric_ladder(config.min_threads, config.max_threads, config.ladder_ratio))
        if current_level not in self.rungs:
            # Replace rather than insert: two adjacent rungs at 20+ threads differ by less than noise.
            inner = self.rungs[1:-1] or self.rungs
            nearest = min(inner, key=lambda rung: (abs(rung - current_level), rung))
            self.rungs = sorted((set(self.rungs) - {nearest}) | {current_level})

    def below(self, level: int) -> int | None:
        lower = [rung for rung in self.rungs if rung < level]
        return lower[-1] if lower else None

    def above(self, level: int) -> int | None:
        return next((rung for rung in self.rungs if rung > level), None)

    def levels_between_neighbours(self, level: int) -> list[int]:
        """Levels strictly between the rungs around `level`, nearest first, without `level`."""
        low = self.below(level) or level
        high = self.above(level) or level
        inside = [candidate for candidate in range(low + 1, high) if candidate != level]
        return sorted(inside, key=lambda candidate: (abs(candidate - level), candidate))


@dataclass
class _Survey:
    """Levels still to measure, one period each, then the best of `candidates` is chosen."""

    purpose: str  # "coarse scan" (improvement 7) or "refine" (improvement 8)
    todo: deque[int]
    candidates: tuple[int, ...]
    home: int | None  # refine: the level the rules held at


class _PolicyBase:
    """The skeleton both policies share; subclasses supply the paper's rules.

    Each period: validate the measurement, let the subclass observe it (change in load, expiry),
    record it, then continue a survey (coarse scan, refinement) if one is running, else move towards
    the best level if this one is clearly below it, else apply the paper's rules. When the rules
    hold at a level for the first time in an epoch, the refinement starts. An epoch begins at the
    start and at each change in load; it forgets every record.
    """

    name = "abstract"

    def __init__(self, config: ElasticityConfig | None = None) -> None:
        self.config = config or ElasticityConfig()
        self._level = self.config.min_threads
        self._ladder = _Ladder(self.config)
        self._records = {
            level: _Record(self.config.smoothing_window)
            for level in range(self.config.min_threads, self.config.max_threads + 1)
        }
        self._time = 0
        self._survey: _Survey | None = None
        self._refined: dict[int, int] = {}  # level -> logical time of its last refinement
        self._deviations: dict[int, list[float]] = {}  # per level: consecutive deviating samples
        self._step_changes: deque[float] = deque(maxlen=32)  # |x_t / x_(t-1) - 1| at one level
        self._previous_level: int | None = None
        self._previous_throughput = math.nan
        self._start_epoch()

    @property
    def level(self) -> int:
        return self._level

    def records(self) -> tuple[LevelRecord, ...]:
        """What the policy knows about each level, for tests, logs and timelines."""
        return tuple(
            LevelRecord(
                level=level,
                trusted=record.trusted,
                throughput_per_s=record.throughput,
                first_throughput_per_s=record.first_throughput,
                peak_per_s=record.peak,
                last_time=record.last_time,
                samples=len(record.recent),
            )
            for level, record in self._records.items()
        )

    def rungs(self) -> tuple[int, ...]:
        return tuple(self._ladder.rungs)

    # -- the template -------------------------------------------------------------------------
    def decide(self, measurement: PeriodMeasurement) -> ThreadLevelDecision:
        now_s = measurement.now_s
        throughput = usable_throughput(measurement)
        if throughput is None:
            return ThreadLevelDecision.hold(self._level, now_s, "no usable throughput measurement: no change")
        if measurement.level_in_force is not None and measurement.level_in_force != self._level:
            return ThreadLevelDecision.hold(
                self._level,
                now_s,
                f"level {self._level} not in force yet ({measurement.level_in_force} threads active): no change",
            )
        self._time += 1
        self._note_step_change(throughput)
        prefix = self._observe(throughput)
        self._records[self._level].record(throughput, self._time)
        self._after_record()
        if self._survey is not None:
            return self._continue_survey(now_s, prefix)
        decision = self._pull_towards_best(measurement, prefix) or self._rules(measurement, prefix)
        if decision is not None:
            return decision
        return self._start_refinement(now_s, prefix) or ThreadLevelDecision.hold(
            self._level, now_s, prefix + self._stable_reason()
        )

    def _observe(self, throughput: float) -> str:
        """Before recording: the subclass's change-in-load or peak bookkeeping; a reason prefix."""
        return ""

    def _after_record(self) -> None:
        """After recording: the subclass's bookkeeping that needs this period's sample."""

    def _rules(self, measurement: PeriodMeasurement, prefix: str) -> ThreadLevelDecision | None:
        """The paper's rules: a decision, or None when they hold the level (stable)."""
        raise NotImplementedError

    def _stable_reason(self) -> str:
        return "stable"

    # -- shared steps -------------------------------------------------------------------------
    def _move(self, level: int, now_s: float, reason: str) -> ThreadLevelDecision:
        previous, self._level = self._level, level
        if level == previous:
            return ThreadLevelDecision.hold(level, now_s, reason)
        return ThreadLevelDecision.move(previous, level, now_s, reason)

    def _value(self, level: int) -> float:
        return self._records[level].throughput

    def _noise(self) -> float:
        """Relative noise of one sample (improvement 4), from consecutive periods at one level:
        the median of |x_t / x_(t-1) - 1| is 0.954 sigma for normal noise, and a median is not
        thrown by the one jump a change in load makes. `assumed_noise` weighs as two pairs."""
        prior_weight = 2.0
        pairs = sorted(self._step_changes)
        if not pairs:
            return self.config.assumed_noise
        robust = pairs[len(pairs) // 2] / 0.954
        return math.sqrt(
            (prior_weight * self.config.assumed_noise**2 + len(pairs) * robust**2) / (prior_weight + len(pairs))
        )

    def _note_step_change(self, throughput: float) -> None:
        if self._previous_level == self._level and self._previous_throughput > 0:
            self._step_changes.append(abs(throughput / self._previous_throughput - 1))
        self._previous_level, self._previous_throughput = self._level, throughput

    def _significantly_greater(
        self, lower: float, upper: float, threshold: float, lower_samples: int, upper_samples: int
    ) -> bool:
        """`upper` beats `lower` by more than `threshold` and by more than the noise (improvement 4)."""
        gain = relative_gain(lower, upper)
        if gain <= threshold:
            return False
        if self.config.trend_noise_z == 0:
            return True
        standard_error = self._noise() * math.sqrt(1 / max(1, lower_samples) + 1 / max(1, upper_samples))
        return gain > self.config.trend_noise_z * standard_error

    def _is_trend(self, lower_level: int, upper_level: int, base: float) -> bool:
        """The measured throughput of upper_level beats lower_level's by a trend (both trusted)."""
        lower, upper = self._records[lower_level], self._records[upper_level]
        if not (lower.trusted and upper.trusted):
            return False
        return self._significantly_greater(
            lower.throughput,
            upper.throughput,
            trend_threshold(self.config, lower_level, upper_level, base),
            len(lower.recent),
            len(upper.recent),
        )

    def _load_changed(self, throughput: float) -> bool:
        """The Streams paper's changeInLoad(), left out of the paper (it cites Gedik et al., TPDS
        2014, Algorithm 3): this period departs from the level's trusted record by more than SENS.
        The reference is the first trusted throughput as written, the smoothed one with
        improvement 3; improvement 5 wants several deviating samples in a row at the level, in one
        direction (per level, so that alternating between two levels cannot hide a change).
        """
        record = self._records[self._level]
        streak = self._deviations.setdefault(self._level, [])
        if not record.trusted:
            streak.clear()
            return False
        reference = record.first_throughput if self.config.smoothing_window == 1 else record.throughput
        deviation = relative_gain(reference, throughput)
        threshold = max(
            self.config.sensitivity,
            self.config.load_change_noise_z * self._noise() * math.sqrt(1 + 1 / len(record.recent)),
        )
        if abs(deviation) <= threshold or (streak and (streak[-1] > 0) != (deviation > 0)):
            streak.clear()
        if abs(deviation) <= threshold:
            return False
        streak.append(deviation)
        if len(streak) < self.config.load_change_confirmations:
            return False
        self._deviations.clear()
        return True

    def _expire_trust(self) -> None:
        """Improvement 6: what a level not visited within the horizon recorded is forgotten."""
        horizon = self.config.trust_horizon_periods
        if horizon is None:
            return
        for level, record in self._records.items():
            if record.trusted and level != self._level and self._time - record.last_time > horizon:
                record.forget()

    def _start_epoch(self) -> None:
        """Forget every record, reset the ladder, and schedule the coarse scan (improvement 7)."""
        for record in self._records.values():
            record.forget()
        self._refined.clear()
        self._ladder.reset(self._level)
        self._survey = None
        ratio = self.config.coarse_scan_ratio
        if ratio is not None:
            scan = geometric_ladder(self.config.min_threads, self.config.max_threads, ratio)
            # Start with the level in force (it is measured now anyway), then climb.
            todo = [level for level in scan if level != self._level]
            self._survey = _Survey("coarse scan", deque(todo), tuple(sorted({self._level, *scan})), None)

    def _start_refinement(self, now_s: float, prefix: str) -> ThreadLevelDecision | None:
        """Improvement 8: the rules hold at a rung; measure the levels between its neighbours."""
        if not self.config.refine or self._refined_recently(self._level):
            return None
        self._refined[self._level] = self._time
        candidates = self._ladder.levels_between_neighbours(self._level)
        if not candidates:
            return None
        todo = deque(level for level in candidates for _ in range(self.config.refine_samples))
        self._survey = _Survey("refine", todo, (self._level, *candidates), self._level)
        return self._continue_survey(now_s, prefix)

    def _refined_recently(self, level: int) -> bool:
        """Refined in this epoch, and (improvement 6) not longer ago than three trust horizons."""
        if level not in self._refined:
            return False
        horizon = self.config.trust_horizon_periods
        return horizon is None or self._time - self._refined[level] <= REFINEMENT_HORIZONS * horizon

    def _continue_survey(self, now_s: float, prefix: str) -> ThreadLevelDecision:
        survey = self._survey
        assert survey is not None
        if survey.todo:
            level = survey.todo.popleft()
            return self._move(level, now_s, prefix + f"{survey.purpose}: measure level {level}")
        self._survey = None
        chosen = self._best_of(survey.candidates)
        if survey.home is not None:
            self._refined[chosen] = self._time
            reason = f"refine: settle on level {chosen}, the best between the rungs around {survey.home}"
        else:
            self._ladder.reset(chosen)
            reason = f"coarse scan: start the rules from level {chosen}, the best scanned"
        return self._move(chosen, now_s, prefix + reason)

    def _best_trusted(self) -> int:
        """The trusted level with the highest smoothed throughput."""
        return max((level for level, record in self._records.items() if record.trusted), key=self._value)

    def _within_guard(self, level: int) -> bool:
        """Improvement 9: the epoch's best level does not clearly beat `level` (margin and noise)."""
        margin = self.config.decrease_guard_margin
        record = self._records[level]
        if margin is None or not record.trusted:
            return True
        best_level = self._best_trusted()
        return not self._significantly_greater(
            record.throughput, self._value(best_level), margin, len(record.recent), len(self._records[best_level].recent)
        )

    def _pull_towards_best(self, measurement: PeriodMeasurement, prefix: str) -> ThreadLevelDecision | None:
        """Improvement 9: this level is clearly worse than the epoch's best level, so move towards
        it: to the best level itself, or to the next rung on the way if that comes first."""
        if self.config.decrease_guard_margin is None or self._within_guard(self._level):
            return None
        best_level = self._best_trusted()
        if best_level > self._level:
            if not cpu_usage_acceptable(self.config, measurement):
                return None
            step = self._ladder.above(self._level)
            target = best_level if step is None else min(best_level, step)
        else:
            step = self._ladder.below(self._level)
            target = best_level if step is None else max(best_level, step)
        return self._move(
            target,
            measurement.now_s,
            prefix + f"towards the best: level {self._level} measured clearly below level {best_level}",
        )

    def _best_of(self, levels: tuple[int, ...]) -> int:
        """The smallest measured level within settle_tie_margin of the best measured one."""
        measured = {level: self._value(level) for level in levels if self._records[level].trusted}
        best = max(measured.values())
        return min(level for level, value in measured.items() if value >= best * (1 - self.config.settle_tie_margin))


class TrustTrendPolicy(_PolicyBase):
    """updateThreadLevel() of the Streams 4.2 paper (Figure 7), with the improvements."""

    name = "trust-trend"

    def _level_below(self) -> int | None:
        return self._ladder.below(self._level)

    def _level_above(self) -> int | None:
        return self._ladder.above(self._level)

    def _trend_below(self) -> bool:
        below = self._level_below()
        return below is not None and self._is_trend(below, self._level, self.config.sensitivity)

    def _trend_above(self) -> bool:
        above = self._level_above()
        return above is not None and self._is_trend(self._level, above, self.config.sensitivity)

    def _trust_below(self) -> bool:
        below = self._level_below()
        return below is not None and self._records[below].trusted

    def _trust_above(self) -> bool:
        above = self._level_above()
        return above is not None and self._records[above].trusted

    def _observe(self, throughput: float) -> str:
        self._expire_trust()
        if not self._load_changed(throughput):
            return ""
        self._start_epoch()
        return "load changed, all data untrusted; "

    def _rules(self, measurement: PeriodMeasurement, prefix: str) -> ThreadLevelDecision | None:
        now_s, level = measurement.now_s, self._level
        at_bottom = level == self.config.min_threads
        trend_below, trend_above = self._trend_below(), self._trend_above()
        trust_below, trust_above = self._trust_below(), self._trust_above()
        wants_increase = (trend_below and not trust_above) or trend_above or (at_bottom and not trust_above)
        cpu_ok = cpu_usage_acceptable(self.config, measurement)
        if wants_increase and cpu_ok:
            above = self._level_above()
            if above is None:
                return None  # at the top already: stable
            if trend_above:
                why = f"level {above} measured better"
            elif at_bottom and not trust_above:
                why = "lowest level, nothing trusted above"
            else:
                why = f"trend from level {self._level_below()}, nothing trusted above"
            return self._move(above, now_s, prefix + f"increase: {why}")
        # As in the paper, an increase the CPU check refuses falls through to this test.
        below = self._level_below()
        no_trend_below = trust_below and not trend_below and self._within_guard(below)
        if below is not None and (not trust_below or no_trend_below):
            why = "nothing trusted below" if not trust_below else f"no trend from level {below}"
            if wants_increase:
                why += f" (increase refused: CPU usage {measurement.cpu_usage:.0%})"
            return self._move(below, now_s, prefix + f"decrease: {why}")
        if wants_increase:
            return ThreadLevelDecision.hold(
                level, now_s, prefix + f"hold: increase refused, CPU usage {measurement.cpu_usage:.0%}"
            )
        return None

    def _stable_reason(self) -> str:
        return "stable: trend from below, none above"


class ElasticOperatorPolicy(_PolicyBase):
    """The elastic operator algorithm of the 2009 paper (Figure 2), with the improvements.

    Figure 2 indexes threads from 0 (n is one less than the level) and marks an invalidated peak
    with INFINITY; here peaks are kept per level and an invalidated or never measured peak is
    None: "probe higher" when the level above has none, replaced by the first rate measured there.
    """

    name = "elastic-operator"

    def __init__(self, config: ElasticityConfig | None = None) -> None:
        super().__init__(config)
        self._peaking_from: int | None = None  # the level above, while in the peaking state

    def _less(self, lower_level: int, lower: float, upper_level: int, upper: float) -> bool:
        """less(a, b) of Figure 2: b is significantly larger than a, ((b - a) / a) >= TOLERANCE."""
        threshold = trend_threshold(self.config, lower_level, upper_level, self.config.tolerance)
        return self._significantly_greater(
            lower,
            upper,
            threshold,
            len(self._records[lower_level].recent),
            len(self._records[upper_level].recent),
        )

    def _observe(self, throughput: float) -> str:
        self._expire_trust()
        if self.config.elastic_operator_load_change and self._load_changed(throughput):
            self._start_epoch()
            self._peaking_from = None
            return "load changed, all peaks forgotten; "
        return ""

    def _after_record(self) -> None:
        """set(peak, n, curr) of Figure 2: new peak (invalidating those above on a big gain) or decay."""
        record = self._records[self._level]
        current = record.throughput  # calcAverageRate(): smoothed with improvement 3
        if record.peak is None:
            record.peak = current
        elif current > record.peak:
            if self._less(self._level, record.peak, self._level, current):
                for level, other in self._records.items():
                    if level > self._level:
                        other.forget()
            record.peak = current
        else:
            record.peak -= record.peak * self.config.decay_rate

    def _rules(self, measurement: PeriodMeasurement, prefix: str) -> ThreadLevelDecision | None:
        now_s, level = measurement.now_s, self._level
        record = self._records[level]
        current, peak = record.throughput, record.peak
        below, above = self._ladder.below(level), self._ladder.above(level)
        if self._peaking_from is not None:
            origin, self._peaking_from = self._peaking_from, None
            if current < self._value(origin) or not self._within_guard(level):
                # strict comparison as in the paper, so that the rate cannot creep downwards
                return self._move(origin, now_s, prefix + f"peaking: level {level} did worse than {origin}; back up")
            return ThreadLevelDecision.hold(level, now_s, prefix + f"peaking: level {level} did at least as well; stay")
        peak_below = self._records[below].peak if below is not None else None
        # Infer a busy system: the rate fell well below this level's peak, or the level below peaked higher.
        busy = self._less(level, current, level, peak) or (
            peak_below is not None and self._less(level, peak, below, peak_below)
        )
        if busy:
            if below is None:
                return ThreadLevelDecision.hold(level, now_s, prefix + "busy system, but never below the lowest level")
            self._peaking_from = level
            return self._move(below, now_s, prefix + "busy system: decrease and check (peaking)")
        if below is not None and peak_below is None:
            # Never measured since the scan, or forgotten (improvement 6): the peaking state checks it.
            self._peaking_from = level
            return self._move(below, now_s, prefix + f"no peak known at level {below}: decrease and check (peaking)")
        if below is None or self._less(below, peak_below, level, peak):
            if above is None:
                return None
            peak_above = self._records[above].peak
            if peak_above is None:
                return self._move(above, now_s, prefix + "upward trend: probe higher")
            if peak < peak_above:
                return self._move(above, now_s, prefix + f"upward trend: level {above} peaked higher")
            return None  # stable from above
        return None  # stable from below

    def _stable_reason(self) -> str:
        return "stable: no better peak above, or no gain over the level below"


def make_policy(name: str, config: ElasticityConfig | None = None) -> ThreadLevelPolicy:
    """The policy called `name` (one of POLICY_NAMES)."""
    if name == "trust-trend":
        return TrustTrendPolicy(config)
    if name == "elastic-operator":
        return ElasticOperatorPolicy(config)
    raise ValueError(f"unknown thread-level policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")


@dataclass(frozen=True)
class CurvePhase:
    """A synthetic workload for a stretch of periods: the noise-free throughput at each level."""

    periods: int
    throughput_per_s: tuple[float, ...]  # [i] is the rate at level i + 1


def settled_level(levels: Sequence[int]) -> int:
    """The elastic-sim contract's settled level: the most frequent level over the last quarter of
    the periods; a tie goes to the level in force last."""
    if not levels:
        raise ValueError("no periods: nothing settled")
    tail = levels[-max(1, len(levels) // 4) :]
    counts = {level: tail.count(level) for level in set(tail)}
    top = max(counts.values())
    return next(level for level in reversed(tail) if counts[level] == top)


def replay_curves(
    policy: ThreadLevelPolicy, phases: Sequence[CurvePhase], noise: float, seed: int, period_s: float = 1.0
) -> tuple[tuple[int, ...], ...]:
    """Drive `policy` through the phases with a fake clock; the level in force in each period.

    Each period the policy sees the phase's throughput at the level in force times
    (1 + noise x a standard normal draw from random.Random(seed)); the CPU check passes.
    """
    draws = random.Random(seed)
    now_s = 0.0
    levels_per_phase = []
    for phase in phases:
        levels = []
        for _ in range(phase.periods):
            level = policy.level
            levels.append(level)
            measured = phase.throughput_per_s[level - 1] * (1 + noise * draws.gauss(0.0, 1.0))
            now_s += period_s
            policy.decide(PeriodMeasurement(now_s=now_s, throughput_per_s=measured))
        levels_per_phase.append(tuple(levels))
    return tuple(levels_per_phase)


@dataclass(frozen=True)
class ThreadingVerdict:
    """Whether an operator should run under the in-worker scheduler, and why."""

    run_threaded: bool
    reason: str


def threading_verdict(
    operator: str,
    *,
    declared_io_bound: bool = False,
    declared_releases_gil: bool = False,
    wall_time_s: float | None = None,
    cpu_time_s: float | None = None,
    wait_ratio: float = 2.0,
) -> ThreadingVerdict:
    """Threads help an operator that waits (I/O) or releases the GIL, nothing else.

    A declaration decides; otherwise a profile whose wall time is at least `wait_ratio` times its
    CPU time shows waiting. Releasing the GIL does not show in such a profile (wall and CPU time
    grow together), so GIL-releasing operators must be declared.
    """
    if declared_io_bound or declared_releases_gil:
        what = "I/O-bound" if declared_io_bound else "GIL-releasing"
        return ThreadingVerdict(True, f"operator {operator!r} is declared {what}")
    if wall_time_s is None or cpu_time_s is None or not (math.isfinite(wall_time_s) and math.isfinite(cpu_time_s)):
        return ThreadingVerdict(False, f"operator {operator!r}: no wall/CPU time profile yet")
    if wall_time_s <= 0:
        return ThreadingVerdict(False, f"operator {operator!r}: no time measured yet")
    if wall_time_s >= wait_ratio * max(cpu_time_s, 0.0):
        return ThreadingVerdict(
            True,
            f"operator {operator!r} waits: wall time {wall_time_s:.3g} s is >= {wait_ratio:g} x CPU time {cpu_time_s:.3g} s",
        )
    return ThreadingVerdict(
        False,
        f"operator {operator!r} is CPU-bound: wall time {wall_time_s:.3g} s < {wait_ratio:g} x CPU time {cpu_time_s:.3g} s",
    )


# -- synthetic workloads: for elastic-sim specs, tests and benchmarks -------------------------------
def rise_peak_fall_curve(max_threads: int, peak_level: float, sharpness: float, peak_rate: float) -> tuple[float, ...]:
    """A smooth bump, peak_rate at peak_level: (n / p) ** a * exp(a * (1 - n / p))."""
    return tuple(
        peak_rate * (level / peak_level) ** sharpness * math.exp(sharpness * (1 - level / peak_level))
        for level in range(1, max_threads + 1)
    )


def tent_curve(
    max_threads: int, peak_level: int, base_share: float, fall_per_level: float, peak_rate: float
) -> tuple[float, ...]:
    """Linear rise from base_share x peak_rate at 1 thread to peak_rate, then a linear fall."""
    rates = []
    for level in range(1, max_threads + 1):
        if level <= peak_level:
            rise = (level - 1) / (peak_level - 1) if peak_level > 1 else 1.0
            share = base_share + (1 - base_share) * rise
        else:
            share = max(0.05, 1 - fall_per_level * (level - peak_level))
        rates.append(peak_rate * share)
    return tuple(rates)


def plateau_curve(max_threads: int, knee_level: int, rate_per_thread: float, softness: float = 0.0) -> tuple[float, ...]:
    """rate_per_thread x min(n, knee): flat from the knee on; softness > 0 rounds the knee off."""
    if softness <= 0:
        return tuple(rate_per_thread * min(level, knee_level) for level in range(1, max_threads + 1))
    exponent = 4 / softness
    return tuple(
        rate_per_thread * knee_level * (1 + (knee_level / level) ** exponent) ** (-1 / exponent)
        for level in range(1, max_threads + 1)
    )


def scalability_law_curve(max_threads: int, peak_level: float, contention: float, rate: float) -> tuple[float, ...]:
    """Gunther's universal scalability law, its coherency term set so the peak is at peak_level."""
    coherency = (1 - contention) / peak_level**2
    return tuple(
        rate * level / (1 + contention * (level - 1) + coherency * level * (level - 1))
        for level in range(1, max_threads + 1)
    )


def random_workload_spec(seed: int, max_threads: int = 32, phases: int = 2, noise: float = 0.02) -> dict:
    """An elastic-sim spec of seeded realistic phases: rise-peak-fall (smooth bump, tent, scalability
    law) with the peak anywhere in 1..max_threads, or a plateau (sharp or soft knee); each phase a
    new curve, so each phase boundary is a change in load. Phases last 100 to 140 periods."""
    draw = random.Random(seed)
    spec_phases = []
    for _ in range(phases):
        scale = draw.uniform(50, 5000)
        kind = draw.choice(("bump", "tent", "scalability-law", "plateau"))
        if kind == "bump":
            curve = rise_peak_fall_curve(max_threads, draw.uniform(1, max_threads), draw.uniform(0.5, 3), scale)
        elif kind == "tent":
            curve = tent_curve(
                max_threads, draw.randint(1, max_threads), draw.uniform(0.02, 0.6), draw.uniform(0.01, 0.15), scale
            )
        elif kind == "scalability-law":
            curve = scalability_law_curve(max_threads, draw.uniform(1, 1.25 * max_threads), draw.uniform(0, 0.3), scale)
        else:
            curve = plateau_curve(max_threads, draw.randint(1, max_threads), scale / 10, draw.choice((0, 0, 0.5, 1)))
        spec_phases.append({"periods": draw.randint(100, 140), "throughput": [round(rate, 3) for rate in curve]})
    return {"max_threads": max_threads, "noise": noise, "seed": seed, "phases": spec_phases}
