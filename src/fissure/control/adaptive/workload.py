"""Whether the workload changed since the adaptive loop last planned: what that planning rested
on (`PlanningBasis`: the operators' statistics, the objective, the offered rate, the cores), and
what moved since (`drift_since` while a candidate is evaluated, `workload_change` at the end of a
monitoring window). A change re-opens the loop; pure, like the rest of the loop's decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

from fissure.control.adaptive.config import AdaptiveConfig
from fissure.control.adaptive.decisions import Objective, format_rate
from fissure.control.adaptive.observations import Sample, estimate_operators, load_of, operator_drift
from fissure.control.plan_change import plan_fingerprint
from fissure.control.thread_level.decisions import relative_gain
from fissure.model.types import OperatorStats, Plan


@dataclass(frozen=True)
class PlanningBasis:
    """What the last planning rested on, for telling later whether the workload changed."""

    operators: tuple[OperatorStats, ...]
    objective: Objective
    offered_rate_per_s: float | None
    cores: int


def drift_since(basis: PlanningBasis | None, chain: Sequence[OperatorStats], window: Sequence[Sample],
                config: AdaptiveConfig) -> str | None:
    """An operator's cost or selectivity that moved beyond `operator_sensitivity` between the
    last planning's profile and `window` (the evaluation's)."""
    if basis is None:
        return None
    estimate = estimate_operators(chain, window, config.min_operator_samples)
    if estimate.operators is None:
        return None
    return operator_drift(basis.operators, estimate.operators, config.operator_sensitivity)


def workload_change(basis: PlanningBasis | None, chain: Sequence[OperatorStats], window: Sequence[Sample],
                    config: AdaptiveConfig, plan: Plan, cores: int) -> str | None:
    """At the end of a monitoring window under `plan` on `cores`: what changed since the last
    planning, if anything."""
    if basis is None:
        return None
    if cores != basis.cores:
        return f"cores changed from {basis.cores} to {cores}"
    estimate = estimate_operators(chain, window, config.min_operator_samples)
    if estimate.operators is not None:
        drift = operator_drift(basis.operators, estimate.operators, config.operator_sensitivity)
        if drift is not None:
            return drift
    load = load_of(window)
    measured = fmean([sample.throughput_per_s for sample in window])
    in_force = plan_fingerprint(plan)
    if basis.objective is Objective.RATE and load.objective is Objective.THROUGHPUT:
        return f"the input saturates {in_force} again (backlog builds at {format_rate(measured)})"
    if basis.objective is Objective.THROUGHPUT and load.objective is Objective.RATE:
        offered = load.offered_rate_per_s
        if offered * (1 + config.rate_headroom) < measured and plan.threads > 1:
            return (f"the input no longer saturates {in_force}:"
                    f" offered {format_rate(offered)} of {format_rate(measured)}")
    if basis.objective is Objective.RATE and load.objective is Objective.RATE and basis.offered_rate_per_s:
        move = relative_gain(basis.offered_rate_per_s, load.offered_rate_per_s)
        if abs(move) > config.rate_change:
            return (f"offered rate {format_rate(basis.offered_rate_per_s)}"
                    f" -> {format_rate(load.offered_rate_per_s)} ({move:+.0%})")
    return None
