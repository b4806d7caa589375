"""Which candidate plan is worth a switch: the adaptive loop's planning policy.

Given the planner's scored candidates, the plan in force, the blacklist and the switch costs,
`PlanChooser` leaves out the candidates that repeat a blacklisted change and picks
- for throughput: the candidate with the most records over the payback horizon net of what its
  switch loses, if it is predicted better than the plan in force by more than the evaluation
  could tell from noise (`gain_band`, from the run's measured noise; `min_gain` a floor) and
  wins its switch back: a corrected model that still ranks an untried plan above the plan in
  force by more than the noise gets it tried, so the loop does not stop one plan short;
- for an offered rate (known, no backlog): the plan with the fewest threads predicted to process
  the rate with headroom, releasing at most `max_release_fraction` of the threads per step;
or says why none is worth it (a `Choice` with its reason, and no option).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fissure.control.adaptive.config import AdaptiveConfig, SwitchCosts
from fissure.control.adaptive.decisions import Objective, format_rate
from fissure.control.adaptive.observations import Load
from fissure.control.adaptive.search import ScoredPlan
from fissure.control.thread_level.decisions import relative_gain
from fissure.control.plan_change import PlanChange, classify_change, plan_fingerprint
from fissure.model.types import OperatorStats, Plan

# The measured/predicted calibration of absolute rates is clamped to this factor either way.
MAX_CALIBRATION_FACTOR = 4.0


@dataclass(frozen=True)
class Option:
    """A candidate plan the loop may switch to: its prediction, its change and its switch's cost."""

    scored: ScoredPlan
    change: PlanChange
    cost_s: float

    @property
    def predicted(self) -> float:
        return self.scored.predicted_throughput_per_s

    @property
    def threads(self) -> int:
        return self.scored.plan.threads


@dataclass(frozen=True)
class Choice:
    """A planning outcome: the option to switch to (with its objective) or why there is none."""

    option: Option | None
    objective: Objective
    reason: str
    required_per_s: float | None = None


@dataclass(frozen=True)
class PlanChooser:
    """Chooses among candidates for the plan in force, given the blacklist and the switch costs."""

    config: AdaptiveConfig
    plan: Plan  # in force
    chain: tuple[OperatorStats, ...]
    blacklist: tuple[PlanChange, ...]
    costs: SwitchCosts
    gain_band: float = 0.0  # the relative gain an evaluation window could not tell from noise

    def choose(self, scored: Sequence[ScoredPlan], current: float, baseline: float, load: Load) -> Choice:
        """`current`: the plan in force's predicted throughput; `baseline`: its measured one."""
        options, blocked = self.options(scored)
        skipped = f" ({blocked} candidate(s) repeat a blacklisted change)" if blocked else ""
        if load.objective is Objective.RATE:
            choice = self._for_rate(options, current, baseline, load.offered_rate_per_s, skipped)
            if choice is not None:
                return choice
        return self._for_throughput(options, current, skipped)

    def options(self, scored_plans: Sequence[ScoredPlan]) -> tuple[list[Option], int]:
        """Candidates other than the plan in force that repeat no blacklisted change, and how many do."""
        usable_options, blocked = [], 0
        for scored in scored_plans:
            change = classify_change(self.plan, scored.plan, self.chain)
            if change.is_empty:
                continue
            if any(change.repeats(bad) for bad in self.blacklist):
                blocked += 1
                continue
            usable_options.append(Option(scored, change, self.costs.cost_s(change.kind)))
        return usable_options, blocked


    def _for_throughput(self, options: Sequence[Option], current: float, skipped: str) -> Choice:
        config, in_force = self.config, plan_fingerprint(self.plan)
        horizon = config.payback_horizon_s
        needed = max(config.min_gain, self.gain_band)
        gaining = [option for option in options if relative_gain(current, option.predicted) > needed]
        if not gaining:
            if config.min_gain >= self.gain_band:
                why = f"{config.min_gain:.0%} better than {in_force} ({format_rate(current)})"
            else:
                why = (f"better than {in_force} ({format_rate(current)}) by more than the {self.gain_band:.1%}"
                       f" an evaluation could tell from noise")
            return Choice(None, Objective.THROUGHPUT, f"no plan is predicted {why}{skipped}")

        def net_records(option: Option) -> float:  # over the horizon, minus what the switch loses
            return (option.predicted - current) * horizon - option.predicted * option.cost_s

        best = max(gaining, key=lambda option: (net_records(option), -option.threads))
        gain = relative_gain(current, best.predicted)
        figures = (f"{best.change.after} predicted {format_rate(best.predicted)} vs {format_rate(current)}"
                   f" ({gain:+.0%});"
                   f" its {best.change.kind.value} switch loses {best.cost_s:.1f} s")
        if net_records(best) <= 0:
            return Choice(None, Objective.THROUGHPUT, f"{figures}, not won back within {horizon:.0f} s{skipped}")
        payback_s = best.predicted * best.cost_s / (best.predicted - current)
        return Choice(best, Objective.THROUGHPUT, f"{figures}, won back in {payback_s:.1f} s{skipped}")

    def _for_rate(
        self, options: Sequence[Option], current: float, baseline: float, offered: float, skipped: str
    ) -> Choice | None:
        """The fewest threads that cover the offered rate; None: no plan covers it (throughput)."""
        config, in_force = self.config, plan_fingerprint(self.plan)
        # Predictions are absolute here: calibrate them by what the plan in force measured.
        calibration = baseline / current if current > 0 else 1.0
        calibration = min(max(calibration, 1 / MAX_CALIBRATION_FACTOR), MAX_CALIBRATION_FACTOR)
        required = offered * (1 + config.rate_headroom)
        covering = [option for option in options if option.predicted * calibration >= required]
        threads = self.plan.threads
        need = f"offered {format_rate(offered)} needs {format_rate(required)} with {config.rate_headroom:.0%} headroom"
        if current * calibration >= required:
            fewest = max(1, math.ceil(threads * (1 - config.max_release_fraction)))
            smaller = [option for option in covering if fewest <= option.threads < threads]
            if not smaller:
                return Choice(None, Objective.RATE,
                              f"{need}; {in_force} ({threads} threads) covers it and no plan with"
                              f" {fewest}..{threads - 1} threads does{skipped}", required)
            best = min(smaller, key=lambda option: (option.threads, -option.predicted, option.cost_s))
            capacity = best.predicted * calibration
            lost = offered * best.cost_s  # records that pile up while the switch runs
            figures = (f"{need}; {best.change.after} ({best.threads} instead of {threads} threads)"
                       f" is predicted {format_rate(capacity)}; its {best.change.kind.value} switch loses"
                       f" {best.cost_s:.1f} s")
            if lost > (capacity - offered) * config.payback_horizon_s:
                return Choice(None, Objective.RATE,
                              f"{figures}, its backlog not drained within {config.payback_horizon_s:.0f} s{skipped}",
                              required)
            return Choice(best, Objective.RATE, f"{figures}{skipped}", required)
        if not covering:
            return None
        best = min(covering, key=lambda option: (option.threads, -option.predicted, option.cost_s))
        gain = relative_gain(current, best.predicted)
        if (best.predicted - current) * config.payback_horizon_s <= best.predicted * best.cost_s:
            return Choice(None, Objective.RATE,
                          f"{need}; {best.change.after} would cover it ({gain:+.0%}) but its"
                          f" {best.change.kind.value} switch is not won back{skipped}", required)
        return Choice(best, Objective.RATE,
                      f"{need}; {in_force} is predicted {format_rate(current * calibration)},"
                      f" {best.change.after} ({best.threads} of them)"
                      f" {format_rate(best.predicted * calibration)}{skipped}",
                      required)
