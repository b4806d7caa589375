"""Where the adaptive loop's candidate plans and predictions come from: the `PlanSearch` seam, and
`ChainPlanSearch`, the chain planners on the paper's throughput model (the Spark model's search
lives in the spark layer)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from fissure.control.model_correction import OPERATORS_TERM, scale_operators
from fissure.control.plan_change import plan_fingerprint
from fissure.model.throughput import evaluate
from fissure.model.types import Machine, OperatorStats, Plan
from fissure.plan.exhaustive import SearchTooLarge
from fissure.plan.planners import default_max_threads, plan_chain

log = logging.getLogger(__name__)

# The paper model's correctable terms: the operators' work, delta and c_p (Machine's field names).
PAPER_MODEL_TERMS = (OPERATORS_TERM, "thread_switch_overhead_us", "replication_cost_us")


@dataclass(frozen=True)
class ScoredPlan:
    plan: Plan
    predicted_throughput_per_s: float


class PlanSearch(Protocol):
    """Where candidate plans and predictions come from (the paper's model by default)."""

    def predict_per_s(self, operators: Sequence[OperatorStats], plan: Plan, machine: Machine) -> float: ...

    def candidates(self, operators: Sequence[OperatorStats], machine: Machine) -> Sequence[ScoredPlan]: ...


@dataclass(frozen=True)
class ChainPlanSearch:
    """The chain planner at every thread budget 1..M, and the baselines of `alternatives` at M.

    The budgets below M give the rate-sized plans (fewest threads that cover a rate); those and
    the baselines (the best plan without replicas, the best without pipelines) are the fall-backs
    when the best plan's change is blacklisted, e.g. when the model underrates what an exchange
    costs. A baseline whose exhaustive search would be too large is left out.
    """

    method: str = "heuristic"
    max_threads: int | None = None
    alternatives: tuple[str, ...] = ("pipelining-only", "fission-only")
    # The learned correction (fissure.control.model_correction): (term, factor) pairs.
    factors: tuple[tuple[str, float], ...] = ()

    def predict_per_s(self, operators: Sequence[OperatorStats], plan: Plan, machine: Machine) -> float:
        operators, machine = self._corrected(operators, machine, dict(self.factors))
        return evaluate(operators, plan, machine).throughput_per_s

    def candidates(self, operators: Sequence[OperatorStats], machine: Machine) -> tuple[ScoredPlan, ...]:
        operators, machine = self._corrected(operators, machine, dict(self.factors))
        budget = self.max_threads or default_max_threads(machine.cores)
        runs = [(self.method, threads) for threads in range(1, budget + 1)]
        runs += [(method, budget) for method in self.alternatives]
        found: dict[str, ScoredPlan] = {}
        for method, threads in runs:
            try:
                result = plan_chain(operators, machine, method, max_threads=threads)
            except SearchTooLarge:
                log.info("adaptive: no %s candidate, its search is too large", method)
                continue
            found.setdefault(
                plan_fingerprint(result.plan), ScoredPlan(result.plan, result.evaluation.throughput_per_s)
            )
        return tuple(found.values())

    # -- CorrectablePlanSearch: the paper's model has three terms: work, delta, c_p -------------
    def correction_terms(self) -> tuple[str, ...]:
        return PAPER_MODEL_TERMS

    def seconds_per_record(self, operators: Sequence[OperatorStats], plan: Plan, machine: Machine,
                           factors: Mapping[str, float]) -> float:
        operators, machine = self._corrected(operators, machine, factors)
        return 1.0 / evaluate(operators, plan, machine).throughput_per_s

    def with_factors(self, factors: Mapping[str, float]) -> ChainPlanSearch:
        return replace(self, factors=tuple(sorted(factors.items())))

    @staticmethod
    def _corrected(operators: Sequence[OperatorStats], machine: Machine,
                   factors: Mapping[str, float]) -> tuple[tuple[OperatorStats, ...], Machine]:
        if not factors:
            return tuple(operators), machine
        machine = replace(
            machine,
            thread_switch_overhead_us=machine.thread_switch_overhead_us * factors.get("thread_switch_overhead_us", 1.0),
            replication_cost_us=machine.replication_cost_us * factors.get("replication_cost_us", 1.0),
        )
        return scale_operators(operators, factors), machine

