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
trends and false changes in load. On a real machine one period's throughput at a fixed level
varies by 10-15 %, which single-sample comparisons cannot resolve at all: improvements 3-5, 8 and
10 are about that. The improvements, each a named step behind a parameter:

1. Level ladder (`ladder_ratio`): the level below and the level above are the neighbouring rungs
   of a geometric ladder (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, ...), which the Streams paper's separate
   `levelBelow` / `levelAbove` allow, instead of +-1.
2. Sensitivity per doubling (`sensitivity_per_doubling`): a trend from level a to level b needs a
   relative gain of (1 + SENS) ** log2(b / a) - 1, so SENS means the same at 2 threads as at 20.
3. Smoothing (`smoothing_window`): a level's throughput is the mean of its last samples (up to
   32: a level held for long gets a sharp estimate; comparisons weigh means by their sample counts).
4. Significance (`trend_noise_z`): a trend must also exceed that many standard errors of the
   measurement noise, estimated robustly from every sample taken at a level measured before
   (`assumed_noise`, a cautious 10 %, until samples tell).
5. Confirmed change in load (`load_change_confirmations`, `load_change_noise_z`): several
   deviating samples in a row at one level, each beyond SENS and beyond the noise; or
   (`load_change_window`, `load_change_mean_z`) the mean of the level's last few samples departing
   from the mean of its earlier ones; with `elastic_operator_load_change` the elastic operator
   starts afresh on the same tests.
6. Trust horizon (`trust_horizon_periods`): what a level not visited for that many periods recorded
   is forgotten (the Streams paper's `lastTime`, unused as written), so neighbours get re-probed
   and a change that leaves the current level's rate as it was is still found; a refinement (8)
   is redone after three horizons.
7. Coarse scan (`coarse_scan_ratio`): at the start and after each change in load, measure a few
   levels spread over the whole range, one period each, and start the rules from the best.
8. Refinement (`refine`, `refine_samples`): when the rules first hold at a level in an epoch,
   measure every level between its two neighbouring rungs and go to the best. Without the settled
   state (10): one period each, the best is the smallest within `settle_tie_margin`, and the rules
   go on from there. With it: the rungs join, and a race of successive halving (every level left
   sampled as often, the better half kept, up to `refine_samples` each; a level the leader beats
   significantly drops out) picks the level with the highest mean (neighbours at half weight).
9. Guard (`decrease_guard_margin`): a decrease for want of a trend only goes to a level measured
   close to the best of the epoch, and a level measured clearly below the best moves towards it,
   so that many small "no trend" steps cannot add up to a large loss on a long gentle slope.
10. Settled state (`settle`, `settle_noise_z`, `probe_interval_periods`,
   `max_probe_interval_periods`, `probe_samples`): after the refinement the policy holds the
   chosen level and keeps sampling it. Now and then it probes one neighbouring rung (alternating
   sides), and moves there only when that rung's mean beats the held level's by the papers'
   threshold (SENS per doubling for trust-trend, TOLERANCE for the elastic operator) plus
   `settle_noise_z` standard errors of the two means; a probe that finds no gain doubles the
   interval to the next one. The rules run the search; the settled state replaces their
   re-probing (the trust horizon, the elastic operator's peak decay and invalidation) until a
   change in load, which starts a new epoch (scan, rules, refinement) as before.
11. Local rescan (`load_change_scan_span`): after a change in load the coarse scan covers only its
   levels within that factor of the level in force, not the whole range from 1, and goes on past
   an end of it that is the best or not clearly below the best (a best that moved far, or a floor
   or plateau with no slope for the rules). A new epoch's scan of levels 1, 2, 3 costs most of its
   periods' throughput, and a change that was only the machine drifting (a slow 20-30 % swing at
   one level passes the tests of 5) pays all of it. Every scan climbs only while the CPU usage is
   acceptable (the Streams paper's check before any increase).
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
# Races in a row that may each move the window on when its best level is at the window's end.
MAX_RACE_EXTENSIONS = 2


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
        smoothing_window: improvement 3, samples averaged per level (the most recent ones); 1 is the
            papers' last sample. Large, so that a level held for long gets a sharp estimate; a
            change in load starts every level afresh, so old samples never mix with new ones.
        trend_noise_z: improvement 4, standard errors of noise a trend must exceed; 0 is the papers'.
        assumed_noise: improvement 4, relative noise of one sample until repeated samples tell
            (weighs as two samples; cautious, since a low guess makes noise look like trends).
        load_change_confirmations: improvement 5, deviating periods in a row; 1 is the Streams paper's.
        load_change_noise_z: improvement 5, standard errors of noise a deviation must also exceed.
        elastic_operator_load_change: improvement 5 for the elastic operator (the 2009 paper has no
            change-in-load test: it decays peaks and invalidates those above a big gain).
        trust_horizon_periods: improvement 6, periods after which what a level not visited recorded
            is forgotten; None is the papers' (trust lasts until a change in load). Not applied in
            the settled state (improvement 10), whose probes refresh the neighbours.
        coarse_scan_ratio: improvement 7, geometric step of the scanned levels; None: no scan.
        load_change_scan_span: improvement 11, after a change in load scan only the coarse scan's
            levels from (level in force / span) to (level in force x span); None: all of them.
        refine: improvement 8, measure the levels between the neighbouring rungs once the rules hold.
        settle_tie_margin: improvement 8, levels within this share of the best count as equal, and
            the smallest wins (fewer threads for the same throughput).
        refine_samples: improvement 8, at most this many samples per level in the refinement's race
            (levels clearly below the leader drop out early); 1 measures each level once.
        decrease_guard_margin: improvement 9, a level counts as clearly below the epoch's best when
            the best beats it by more than this share (and the noise); such a level is not the
            target of a decrease for want of a trend (trust-trend's rule 5, the elastic operator
            staying low after peaking), and the policy moves from it towards the best. None: off.
        load_change_window: improvement 5, a change in load is also the mean of a level's last this
            many samples departing from the mean of its earlier samples (at least as many) by more
            than SENS and `load_change_mean_z` standard errors: under noise of 10 % and more, a
            drop of 30 % hides in single samples but not in a mean of four. None: off.
        load_change_mean_z: improvement 5, standard errors for that test (high: it runs every period).
        settle: improvement 10, after the refinement hold the chosen level (settled): keep sampling
            it, probe one neighbouring rung now and then, move only on a significant gain.
        settle_noise_z: improvement 10, standard errors a settled level's neighbour must beat it by
            (on top of the trend threshold) to be moved to; also the refinement's elimination test.
        probe_interval_periods: improvement 10, periods at the settled level before the first probe;
            doubled after each probe that finds nothing better, up to max_probe_interval_periods.
        probe_samples: improvement 10, periods in a row a probe may stay at a neighbour that measures
            better but not yet significantly so.
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
    smoothing_window: int = 32
    trend_noise_z: float = 0.5
    assumed_noise: float = 0.1
    load_change_confirmations: int = 2
    load_change_noise_z: float = 2.5
    elastic_operator_load_change: bool = True
    trust_horizon_periods: int | None = 40
    coarse_scan_ratio: float | None = 1.6
    load_change_scan_span: float | None = 2.0
    refine: bool = True
    settle_tie_margin: float = 0.01
    refine_samples: int = 6
    decrease_guard_margin: float | None = 0.01
    load_change_window: int | None = 4
    load_change_mean_z: float = 3.5
    settle: bool = True
    settle_noise_z: float = 2.0
    probe_interval_periods: int = 8
    max_probe_interval_periods: int = 32
    probe_samples: int = 3

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
        if self.load_change_scan_span is not None and not self.load_change_scan_span > 1:
            raise ValueError(f"load_change_scan_span must be > 1 or None, got {self.load_change_scan_span}")
        if self.smoothing_window < 1 or self.load_change_confirmations < 1 or self.refine_samples < 1:
            raise ValueError("smoothing_window, load_change_confirmations and refine_samples must be >= 1")
        if self.trust_horizon_periods is not None and self.trust_horizon_periods < 1:
            raise ValueError(f"trust_horizon_periods must be >= 1 or None, got {self.trust_horizon_periods}")
        if self.trend_noise_z < 0 or self.load_change_noise_z < 0:
            raise ValueError("trend_noise_z and load_change_noise_z must be >= 0")
        if self.decrease_guard_margin is not None and not 0 <= self.decrease_guard_margin < 1:
            raise ValueError(f"decrease_guard_margin must be in [0, 1) or None, got {self.decrease_guard_margin}")
        if self.settle_noise_z < 0:
            raise ValueError(f"settle_noise_z must be >= 0, got {self.settle_noise_z}")
        if not 1 <= self.probe_interval_periods <= self.max_probe_interval_periods:
            raise ValueError(
                "probe_interval_periods must be >= 1 and <= max_probe_interval_periods, got "
                f"{self.probe_interval_periods} and {self.max_probe_interval_periods}"
            )
        if self.load_change_window is not None and self.load_change_window < 2:
            raise ValueError(f"load_change_window must be >= 2 or None, got {self.load_change_window}")
        if self.probe_samples < 1:
            raise ValueError(f"probe_samples must be >= 1, got {self.probe_samples}")

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
            load_change_scan_span=None,
            refine=False,
            refine_samples=1,
            decrease_guard_margin=None,
            settle=False,
            load_change_window=None,
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
    """The coarse scan (improvement 7): levels still to measure, one period each, then the best."""

    purpose: str
    todo: deque[int]
    candidates: tuple[int, ...]
    local: bool = False  # improvement 11: around the level in force, extended while needed


@dataclass
class _Race:
    """The refinement (improvement 8): the levels between the rungs around `home` (and, with
    improvement 10, the rungs), sampled in rounds; see `_PolicyBase._continue_race`."""

    home: int
    candidates: list[int]
    samples: dict[int, int]  # samples taken in the race, per candidate
    target: int = 1  # samples each candidate left should have before the next round
    edge: tuple[int, ...] = ()  # the rungs at the window's ends
    extensions: int = 0  # races before this one in a row, each ending on its window's edge


@dataclass
class _Settled:
    """Improvement 10: the level held since the refinement, and when and where to probe next."""

    level: int
    interval: int  # periods at the level between two probes (doubles while probes find nothing)
    next_probe_time: int  # logical time of the next probe
    probe: int | None = None  # the neighbouring rung being probed, None while at `level`
    probe_periods: int = 0  # periods spent at `probe` in this probe
    last_probed: int | None = None  # the neighbour probed last time


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
        self._race: _Race | None = None
        self._settled: _Settled | None = None
        self._refined: dict[int, int] = {}  # level -> logical time of its last refinement
        self._deviations: dict[int, list[float]] = {}  # per level: consecutive deviating samples
        # One estimate of the relative noise per sample taken at a level already measured.
        self._noise_samples: deque[float] = deque(maxlen=48)
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
        self._note_noise(throughput)
        prefix = self._observe(throughput)
        self._records[self._level].record(throughput, self._time)
        self._after_record()
        if self._survey is not None:
            return self._continue_survey(measurement, prefix)
        if self._race is not None:
            return self._continue_race(now_s, prefix)
        if self._settled is not None:
            return self._settled_step(measurement, prefix)
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

    def _gain_threshold(self, lower_level: int, upper_level: int) -> float:
        """The relative gain between two levels that the paper's rules call significant."""
        return trend_threshold(self.config, lower_level, upper_level, self.config.sensitivity)

    # -- shared steps -------------------------------------------------------------------------
    def _move(self, level: int, now_s: float, reason: str) -> ThreadLevelDecision:
        previous, self._level = self._level, level
        if level == previous:
            return ThreadLevelDecision.hold(level, now_s, reason)
        return ThreadLevelDecision.move(previous, level, now_s, reason)

    def _value(self, level: int) -> float:
        return self._records[level].throughput

    def _smoothed_value(self, level: int) -> float:
        """The level's mean with its measured next-door levels' means at half weight (each
        counted with no more samples than the level itself has): a curve of throughput by level
        is smooth, so neighbours carry information, and a level at the edge of a plateau is not
        chosen for one lucky run."""
        own = self._records[level]
        weight_sum, total = 0.0, 0.0
        for other_level, share in ((level - 1, 0.5), (level, 1.0), (level + 1, 0.5)):
            record = self._records.get(other_level)
            if record is None or not record.trusted or not record.recent:
                continue
            weight = share * min(len(record.recent), max(1, len(own.recent)))
            weight_sum += weight
            total += weight * record.throughput
        return total / weight_sum if weight_sum else own.throughput

    def _noise(self) -> float:
        """Relative noise of one sample (improvement 4), robust: the median of the per-sample
        estimates `_note_noise` keeps, which a change in load (a few large deviations) does not
        throw. `assumed_noise` weighs as two samples."""
        prior_weight = 2.0
        estimates = sorted(self._noise_samples)
        if not estimates:
            return self.config.assumed_noise
        robust = estimates[len(estimates) // 2]
        return math.sqrt(
            (prior_weight * self.config.assumed_noise**2 + len(estimates) * robust**2) / (prior_weight + len(estimates))
        )

    def _note_noise(self, throughput: float) -> None:
        """A sample at a level measured n times before deviates from their mean by sigma x
        sqrt(1 + 1 / n) for noise sigma, and the median of |normal| is 0.6745 of its sigma; so
        every such sample gives an estimate of sigma, not only consecutive periods at one level
        (a scan or a refinement rarely stays two periods at one level)."""
        record = self._records[self._level]
        count = len(record.recent)
        if record.trusted and count and record.throughput > 0:
            deviation = abs(throughput / record.throughput - 1)
            # Capped: one absurd sample (a mean near zero) must not overflow the estimate.
            self._noise_samples.append(min(1.0, deviation / math.sqrt(1 + 1 / count) / 0.6745))

    def _significantly_greater(
        self, lower: float, upper: float, threshold: float, lower_samples: int, upper_samples: int
    ) -> bool:
        """`upper` beats `lower` by more than `threshold` and by more than the noise (improvement 4)."""
        gain = relative_gain(lower, upper)
        if gain <= threshold:
            return False
        if self.config.trend_noise_z == 0:
            return True
        return gain > self.config.trend_noise_z * self._standard_error(lower_samples, upper_samples)

    def _standard_error(self, lower_samples: int, upper_samples: int) -> float:
        """Relative standard error of the difference of two levels' means."""
        return self._noise() * math.sqrt(1 / max(1, lower_samples) + 1 / max(1, upper_samples))

    def _confidently_better(
        self, reference_level: int, level: int, threshold: float, noise_z: float | None = None
    ) -> bool:
        """Improvement 10: `level`'s mean beats `reference_level`'s by more than `threshold` plus
        `settle_noise_z` standard errors, so the true gain very likely exceeds the threshold (a
        one-sided test on the means, not on single samples)."""
        reference, candidate = self._records[reference_level], self._records[level]
        if not (reference.trusted and candidate.trusted):
            return False
        z = self.config.settle_noise_z if noise_z is None else noise_z
        margin = z * self._standard_error(len(reference.recent), len(candidate.recent))
        return relative_gain(reference.throughput, candidate.throughput) > threshold + margin

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
        if self._mean_shifted(record, throughput):
            self._deviations.clear()
            return True
        if abs(deviation) <= threshold or (streak and (streak[-1] > 0) != (deviation > 0)):
            streak.clear()
        if abs(deviation) <= threshold:
            return False
        streak.append(deviation)
        if len(streak) < self.config.load_change_confirmations:
            return False
        self._deviations.clear()
        return True

    def _mean_shifted(self, record: _Record, throughput: float) -> bool:
        """Improvement 5: the mean of the level's last `load_change_window` samples (this one
        included) departs from the mean of its earlier samples beyond SENS and the noise."""
        window = self.config.load_change_window
        if window is None or len(record.recent) + 1 < 2 * window:
            return False
        samples = [*record.recent, throughput]
        recent, earlier = samples[-window:], samples[:-window]
        earlier_mean = sum(earlier) / len(earlier)
        shift = relative_gain(earlier_mean, sum(recent) / window)
        margin = self.config.load_change_mean_z * self._noise() * math.sqrt(1 / window + 1 / len(earlier))
        return abs(shift) > max(self.config.sensitivity, margin)

    def _expire_trust(self) -> None:
        """Improvement 6: what a level not visited within the horizon recorded is forgotten."""
        horizon = self.config.trust_horizon_periods
        if horizon is None or self._settled is not None:
            return  # settled: the probes (improvement 10) refresh the neighbours instead
        for level, record in self._records.items():
            if record.trusted and level != self._level and self._time - record.last_time > horizon:
                record.forget()

    def _start_epoch(self, after_load_change: bool = False) -> None:
        """Forget every record, reset the ladder, and schedule the coarse scan (improvement 7):
        the whole range at the start, the levels around the one in force after a change in load
        (improvement 11)."""
        for record in self._records.values():
            record.forget()
        self._refined.clear()
        self._ladder.reset(self._level)
        self._survey = None
        self._race = None
        self._settled = None
        ratio = self.config.coarse_scan_ratio
        if ratio is not None:
            scan = geometric_ladder(self.config.min_threads, self.config.max_threads, ratio)
            span = self.config.load_change_scan_span
            local = after_load_change and span is not None
            purpose = f"scan around level {self._level}" if local else "coarse scan"
            if local:
                scan = tuple(level for level in scan if self._level / span <= level <= self._level * span)
            # Start with the level in force (it is measured now anyway), then climb.
            todo = [level for level in scan if level != self._level]
            self._survey = _Survey(purpose, deque(todo), tuple(sorted({self._level, *scan})), local=local)

    def _start_refinement(self, now_s: float, prefix: str) -> ThreadLevelDecision | None:
        """Improvement 8: the rules hold at a rung; race the levels between its neighbours."""
        if not self.config.refine:
            return self._settle_without_refinement(now_s, prefix)
        if self._refined_recently(self._level):
            return None
        self._refined[self._level] = self._time
        candidates = self._ladder.levels_between_neighbours(self._level)
        if self.config.settle:
            candidates = self._race_window(self._level)
        if not candidates:
            return self._settle_without_refinement(now_s, prefix)
        self._race = self._new_race(self._level, candidates)
        return self._continue_race(now_s, prefix)

    def _new_race(self, home: int, candidates: list[int], extensions: int = 0) -> _Race:
        levels = [home, *candidates]
        rungs = (self._ladder.below(home), self._ladder.above(home))
        edge = tuple(rung for rung in rungs if rung is not None)
        return _Race(home, levels, dict.fromkeys(levels, 0), edge=edge, extensions=extensions)

    def _settle_without_refinement(self, now_s: float, prefix: str) -> ThreadLevelDecision | None:
        """With nothing to refine, the level the rules hold at is the settled one."""
        if not self.config.settle:
            return None
        self._enter_settled(self._level)
        reason = prefix + f"settle on level {self._level}: the rules hold here"
        return ThreadLevelDecision.hold(self._level, now_s, reason)

    def _continue_race(self, now_s: float, prefix: str) -> ThreadLevelDecision:
        """One period of the refinement's race. Without improvement 10 (the papers' noise):
        every candidate measured once, nearest to home first, then the best. With it, rounds of
        successive halving: every level left gets `target` samples; then the better half (by
        `_smoothed_value`, at least two) stays and the target doubles, up to `refine_samples`;
        any time, a level the leader beats by `settle_tie_margin` plus `settle_noise_z` standard
        errors drops out (after two samples: the leader is the luckiest of several). Then the
        best of those left."""
        race = self._race
        assert race is not None
        if self._level in race.samples:
            race.samples[self._level] += 1
        if self.config.settle:
            self._race_eliminate(race)
        while True:
            pending = [level for level in race.candidates if race.samples[level] < race.target]
            if pending:
                level = min(
                    pending, key=lambda candidate: (race.samples[candidate], abs(candidate - self._level), candidate)
                )
                again = " again" if race.samples[level] else ""
                left = len(race.candidates)
                return self._move(level, now_s, prefix + f"refine: measure level {level}{again} ({left} left)")
            if len(race.candidates) == 1 or race.target >= self.config.refine_samples or not self.config.settle:
                break
            ranked = sorted(race.candidates, key=self._smoothed_value, reverse=True)
            race.candidates = ranked[: max(2, math.ceil(len(ranked) / 2))]
            race.target = min(2 * race.target, self.config.refine_samples)
        self._race = None
        # Under noise the smallest level within the tie margin is mostly the edge of a plateau,
        # so with the settled state the level with the highest mean wins.
        if self.config.settle:
            chosen = max(race.candidates, key=self._smoothed_value)
        else:
            chosen = self._best_of(tuple(race.candidates))
        self._refined[chosen] = self._time
        left = ", ".join(str(level) for level in sorted(race.candidates))
        if (
            self.config.settle
            and chosen in race.edge
            and race.extensions < MAX_RACE_EXTENSIONS
            and self._confidently_better(race.home, chosen, 0.0, noise_z=1.0)
        ):
            # The best is a rung at the window's end, clearly above the middle: a slope, so the
            # true best may lie beyond it. (On a plateau an end wins by chance only: no new race.)
            self._ladder.reset(chosen)
            self._race = self._new_race(chosen, self._race_window(chosen), race.extensions + 1)
            moved_on = f"refine: level {chosen} won at the window's end; race around it; "
            return self._continue_race(now_s, prefix + moved_on)
        if self.config.settle:
            self._enter_settled(chosen)
            reason = f"refine: settle on level {chosen}, the best between the rungs around {race.home} (left: {left})"
        else:
            reason = f"refine: go to level {chosen}, the best between the rungs around {race.home}"
        return self._move(chosen, now_s, prefix + reason)

    def _race_window(self, level: int) -> list[int]:
        """The levels between the rungs around `level`, and the rungs: under noise the rules may
        hold one rung off the best."""
        rungs = [self._ladder.below(level), self._ladder.above(level)]
        return self._ladder.levels_between_neighbours(level) + [rung for rung in rungs if rung is not None]

    def _race_eliminate(self, race: _Race) -> None:
        measured = [level for level in race.candidates if race.samples[level]]
        if not measured:
            return
        leader = max(measured, key=self._value)
        race.candidates = [
            level
            for level in race.candidates
            if level == leader
            or race.samples[level] < 2
            or not self._confidently_better(level, leader, self.config.settle_tie_margin)
        ]

    # -- improvement 10: the settled state ------------------------------------------------------
    def _enter_settled(self, level: int) -> None:
        self._ladder.reset(level)
        interval = self.config.probe_interval_periods
        self._settled = _Settled(level=level, interval=interval, next_probe_time=self._time + interval)

    def _settled_step(self, measurement: PeriodMeasurement, prefix: str) -> ThreadLevelDecision:
        """Hold the settled level, sampling it every period so its mean sharpens. Every
        `interval` periods probe a neighbouring rung (`_probe_target`); move there only if its
        mean beats the settled level's by the paper's threshold plus `settle_noise_z` standard
        errors; stay up to `probe_samples` periods at a neighbour that looks better but not yet
        significantly, or whose sample departs from its record (a change in load is confirmed
        there, by `_observe`); back off (interval doubles, up to `max_probe_interval_periods`)
        after each probe that finds no gain."""
        settled, now_s = self._settled, measurement.now_s
        assert settled is not None
        home = settled.level
        if settled.probe is None:
            if self._time < settled.next_probe_time:
                left = settled.next_probe_time - self._time
                held = len(self._records[home].recent)
                reason = f"settled at level {home} ({held} samples), probe in {left} periods"
                return ThreadLevelDecision.hold(home, now_s, prefix + reason)
            target = self._probe_target(home, settled.last_probed, measurement)
            if target is None:
                settled.next_probe_time = self._time + settled.interval
                return ThreadLevelDecision.hold(home, now_s, prefix + f"settled at level {home}: no neighbour to probe")
            settled.probe, settled.probe_periods = target, 0
            return self._move(target, now_s, prefix + f"settled at level {home}: probe level {target}")
        probe = settled.probe
        settled.probe_periods += 1
        lower, upper = sorted((home, probe))
        threshold = self._gain_threshold(lower, upper)
        gain = relative_gain(self._value(home), self._value(probe))
        samples = f"{len(self._records[probe].recent)} vs {len(self._records[home].recent)} samples"
        if self._confidently_better(home, probe, threshold):
            self._enter_settled(probe)
            reason = f"settled: level {probe} beats level {home} by {gain:.1%} ({samples}); settle there"
            return ThreadLevelDecision.hold(probe, now_s, prefix + reason)
        if self._deviations.get(probe) and settled.probe_periods <= self.config.probe_samples:
            # This sample departs from what the level measured before: stay to confirm a change in load.
            return ThreadLevelDecision.hold(
                probe, now_s, prefix + f"settled: level {probe} departs from its record; measure again"
            )
        if gain > 0 and settled.probe_periods < self.config.probe_samples:
            reason = f"settled: level {probe} {gain:+.1%} against level {home}, not significant yet; measure again"
            return ThreadLevelDecision.hold(probe, now_s, prefix + reason)
        if gain <= 0:
            settled.interval = min(2 * settled.interval, self.config.max_probe_interval_periods)
        settled.probe, settled.last_probed = None, probe
        settled.next_probe_time = self._time + 1 + settled.interval
        verdict = "no gain" if gain <= 0 else "gain not significant"
        return self._move(
            home,
            now_s,
            prefix + f"settled: level {probe} {gain:+.1%} against level {home} ({samples}), {verdict}; "
            f"back, next probe in {settled.interval} periods",
        )

    def _probe_target(self, home: int, last_probed: int | None, measurement: PeriodMeasurement) -> int | None:
        """The neighbouring rung not probed last time (a change that does not show at the
        settled level may show on either side); the first time, the one with the higher upper
        confidence bound (unknown: infinite). An increase only while the CPU usage is acceptable."""
        neighbours = [self._ladder.below(home)]
        if cpu_usage_acceptable(self.config, measurement):
            neighbours.append(self._ladder.above(home))
        candidates = [level for level in neighbours if level is not None]
        if not candidates:
            return None
        if last_probed is not None and len(candidates) > 1:
            return next(level for level in candidates if level != last_probed)

        def upper_bound(level: int) -> float:
            record = self._records[level]
            if not record.trusted:
                return math.inf
            spread = self.config.settle_noise_z * self._noise() / math.sqrt(len(record.recent))
            return relative_gain(self._value(home), record.throughput * (1 + spread))

        # Ties (both unknown) go to the one visited longer ago.
        return max(candidates, key=lambda level: (upper_bound(level), -self._records[level].last_time))

    def _refined_recently(self, level: int) -> bool:
        """Refined in this epoch, and (improvement 6) not longer ago than three trust horizons."""
        if level not in self._refined:
            return False
        horizon = self.config.trust_horizon_periods
        return horizon is None or self._time - self._refined[level] <= REFINEMENT_HORIZONS * horizon

    def _continue_survey(self, measurement: PeriodMeasurement, prefix: str) -> ThreadLevelDecision:
        """The scan's next level, or the rules from the best scanned. The scan climbs only while
        the CPU usage is acceptable (the Streams paper's check before any increase): levels above a
        level that already keeps the machine busy are dropped from it."""
        survey = self._survey
        assert survey is not None
        now_s = measurement.now_s
        if survey.todo and not cpu_usage_acceptable(self.config, measurement):
            dropped = [level for level in survey.todo if level > self._level]
            if dropped:
                survey.todo = deque(level for level in survey.todo if level <= self._level)
                survey.candidates = tuple(level for level in survey.candidates if level not in dropped)
                prefix += f"CPU usage {measurement.cpu_usage:.0%}: scan no higher than level {self._level}; "
        if not survey.todo and survey.local:
            prefix += self._extend_local_scan(survey, measurement)
        if survey.todo:
            level = survey.todo.popleft()
            return self._move(level, now_s, prefix + f"{survey.purpose}: measure level {level}")
        self._survey = None
        chosen = self._best_of(survey.candidates)
        self._ladder.reset(chosen)
        reason = f"{survey.purpose}: start the rules from level {chosen}, the best scanned"
        return self._move(chosen, now_s, prefix + reason)

    def _extend_local_scan(self, survey: _Survey, measurement: PeriodMeasurement) -> str:
        """Improvement 11: a local scan goes on along the coarse scan's levels, one at a time,
        beyond its lowest (highest) level while that level is the best or not clearly below the
        best (2 standard errors): the best moved farther than the span, or the scan sits on a
        plateau or a floor with no slope for the rules to follow, which may hide a peak beyond.
        Upwards only while the CPU usage is acceptable. Returns a reason prefix ("" when done)."""
        measured = [level for level in survey.candidates if self._records[level].trusted]
        if not measured:
            survey.local = False
            return ""
        ladder = geometric_ladder(self.config.min_threads, self.config.max_threads, self.config.coarse_scan_ratio)
        best = max(measured, key=self._value)

        def open_edge(edge: int) -> bool:
            return edge == best or not self._confidently_better(edge, best, 0.0, noise_z=2.0)

        lowest, highest = min(measured), max(measured)
        beyond = []
        if open_edge(lowest):
            beyond.append(next((level for level in reversed(ladder) if level < lowest), None))
        if open_edge(highest) and cpu_usage_acceptable(self.config, measurement):
            beyond.append(next((level for level in ladder if level > highest), None))
        beyond = [level for level in beyond if level is not None and level not in survey.candidates]
        if not beyond:
            survey.local = False
            return ""
        survey.todo.extend(beyond)
        survey.candidates = tuple(sorted({*survey.candidates, *beyond}))
        edges = " and ".join(str(level) for level in beyond)
        return f"best scanned level {best}, the scan's edge not clearly below it: measure {edges} too; "

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
        self._start_epoch(after_load_change=True)
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

    def _gain_threshold(self, lower_level: int, upper_level: int) -> float:
        return trend_threshold(self.config, lower_level, upper_level, self.config.tolerance)

    def _observe(self, throughput: float) -> str:
        self._expire_trust()
        if self.config.elastic_operator_load_change and self._load_changed(throughput):
            self._start_epoch(after_load_change=True)
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
            # The refinement's race and the settled state (improvements 8, 10) do their own
            # probing: invalidating the peaks above would throw their samples away.
            owned = self._race is not None or self._settled is not None
            if not owned and self._less(self._level, record.peak, self._level, current):
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


def rise_plateau_fall_curve(
    max_threads: int, knee_level: int, plateau_end_level: int, fall_per_level: float, peak_rate: float
) -> tuple[float, ...]:
    """Linear rise to peak_rate at knee_level, flat up to plateau_end_level, then a linear fall
    (fall_per_level of the peak per level, down to a floor of 30 %): an I/O-bound operator whose
    service serves a fixed number of requests at once, and whose client threads cost CPU."""
    rates = []
    for level in range(1, max_threads + 1):
        if level <= knee_level:
            share = level / knee_level
        elif level <= plateau_end_level:
            share = 1.0
        else:
            share = max(0.3, 1 - fall_per_level * (level - plateau_end_level))
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
