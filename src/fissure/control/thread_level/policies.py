"""The two thread-level policies: `TrustTrendPolicy` (updateThreadLevel of the Streams 4.2 elastic
scheduler) and `ElasticOperatorPolicy` (the elastic operator of the IPDPS 2009 paper), and
`make_policy` by name; `StaticThreadLevel`, the baseline that never moves.
"""

from __future__ import annotations


from fissure.control.thread_level.config import ElasticityConfig, POLICY_NAMES
from fissure.control.thread_level.decisions import (
    PeriodMeasurement, ThreadLevelDecision, ThreadLevelPolicy, cpu_usage_acceptable, trend_threshold,
)
from fissure.control.thread_level.policy_base import PolicyBase


class TrustTrendPolicy(PolicyBase):
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


class ElasticOperatorPolicy(PolicyBase):
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


class StaticThreadLevel:
    """No elasticity: the same level every period (a baseline, `static_threads`)."""

    name = "static"

    def __init__(self, level: int) -> None:
        if level < 1:
            raise ValueError(f"a static thread level must be >= 1, got {level}")
        self._level = level

    @property
    def level(self) -> int:
        return self._level

    def decide(self, measurement: PeriodMeasurement) -> ThreadLevelDecision:
        return ThreadLevelDecision.hold(self._level, measurement.now_s, f"static thread level {self._level}")


def make_policy(name: str, config: ElasticityConfig | None = None) -> ThreadLevelPolicy:
    """The policy called `name` (one of POLICY_NAMES)."""
    if name == "trust-trend":
        return TrustTrendPolicy(config)
    if name == "elastic-operator":
        return ElasticOperatorPolicy(config)
    raise ValueError(f"unknown thread-level policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
