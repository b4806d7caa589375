"""The adaptive loop's `PlanSearch` on the Spark model: `SparkModelSearch` and its corrected view.

Candidates and predictions come from `fissure.model.spark_model` (stages one after another, fixed
costs per batch, stage, task and state partition), with the stored calibration's constants
(`fissure calibrate`) or the defaults, and the micro-batches' shape the run measures.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from fissure.control.adaptive.search import ScoredPlan
from fissure.control.model_correction import OPERATORS_TERM, scale_operators
from fissure.control.plan_change import plan_fingerprint
from fissure.model.spark_model import SparkConstants, combine_folds, evaluate_spark, uniform_combine_keys
from fissure.model.types import Machine, OperatorStats, Plan
from fissure.plan.exhaustive import SearchTooLarge
from fissure.plan.planners import default_max_threads, plan_chain
from fissure.plan.spark_chain import SparkModelSettings
from fissure.plan.stored_calibration import stored_spark_model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CombinedBatch:
    """What a micro-batch's profile counted of its combined operators: per operator, (records
    in, partials its keyed stage merged, distinct keys and windows they held), and the plan in
    force with its chain and cores (the partials depend on how many folds made them)."""

    partials: Mapping[str, tuple[float, float, float]]
    operators: Sequence[OperatorStats]
    plan: Plan
    cores: int


class SparkModelSearch:
    """The controller's `PlanSearch` on Spark: candidates and predictions from the Spark model
    (fissure.model.spark_model: stages one after another, fixed costs per batch, stage, task and
    state partition), with the stored calibration's constants (`fissure calibrate`) or the
    defaults. The micro-batches' shape (records per batch, keys per batch) follows what the run
    measures (`observe_batch`), since the fixed costs per batch weigh by it.

    Candidates: the planner at every thread budget 1..M, and the pipelining-only and fission-only
    optima at M (as `fissure.control.adaptive.search.ChainPlanSearch` does with the paper's model).

    A `CorrectablePlanSearch` (fissure.control.model_correction): its terms are the operators'
    work and every Spark model constant; `with_factors` gives the same search with the constants
    (and the operators' costs) scaled by what the loop learned from the measured plans.
    """

    def __init__(self, settings: SparkModelSettings | None = None, method: str = "heuristic",
                 max_threads: int | None = None, alternatives: tuple[str, ...] = ("pipelining-only", "fission-only"),
                 window_batches: int = 20) -> None:
        self.settings = settings if settings is not None else stored_spark_model()[0]
        self.method, self.max_threads, self.alternatives = method, max_threads, alternatives
        self._records: list[int] = []
        self._keys: dict[str, list[float]] = {}
        self._combine_keys: dict[str, list[float]] = {}
        self._combine_groups: dict[str, list[float]] = {}
        self._window = window_batches

    def observe_batch(self, records_in: int, keys_per_batch: Mapping[str, float],
                      combined: CombinedBatch | None = None) -> None:
        """One batch's size, the key groups its stateful operators saw and, for its combined
        operators, the keys their partials imply at the plan in force (window of the latest)."""
        if records_in > 0:
            self._records = (self._records + [records_in])[-self._window:]
        for name, keys in keys_per_batch.items():
            self._keys[name] = (self._keys.get(name, []) + [keys])[-self._window:]
        if combined is not None and combined.partials:
            folds = combine_folds(combined.operators, combined.plan, combined.cores, self.current_settings().workload)
            for name, (records, partials, groups) in combined.partials.items():
                keys = uniform_combine_keys(records, partials, folds[name]) if name in folds else None
                if keys is not None:
                    self._combine_keys[name] = (self._combine_keys.get(name, []) + [keys])[-self._window:]
                    self._combine_groups[name] = (self._combine_groups.get(name, []) + [groups])[-self._window:]

    def current_settings(self, factors: Mapping[str, float] | None = None) -> SparkModelSettings:
        """The settings for the batches seen so far; with `factors`, its constants scaled by them."""
        workload = self.settings.workload
        if self._records:
            workload = replace(workload, batch_records=max(1, round(_median(self._records))))
        if self._keys:
            workload = replace(workload, keys_per_batch={**workload.keys_per_batch,
                                                         **{name: _median(values) for name, values in self._keys.items()}})
        if self._combine_keys:
            keys = {name: _median(values) for name, values in self._combine_keys.items()}
            groups = {name: _median(values) for name, values in self._combine_groups.items()}
            workload = replace(workload, combine_keys_per_batch={**workload.combine_keys_per_batch, **keys},
                               combine_groups_per_batch={**workload.combine_groups_per_batch, **groups})
        constants = self.settings.constants
        if factors:
            constants = constants.with_values(**{name: getattr(constants, name) * factors[name]
                                                 for name in SparkConstants.names() if name in factors})
        return replace(self.settings, workload=workload, constants=constants)

    def predict_per_s(self, operators: Sequence[OperatorStats], plan: Plan, machine: Machine,
                      factors: Mapping[str, float] | None = None) -> float:
        settings = self.current_settings(factors)
        operators = scale_operators(operators, factors or {})
        return evaluate_spark(operators, plan, machine.cores, settings.constants, settings.workload).throughput_per_s

    def candidates(self, operators: Sequence[OperatorStats], machine: Machine,
                   factors: Mapping[str, float] | None = None) -> tuple[ScoredPlan, ...]:
        settings = self.current_settings(factors)
        operators = scale_operators(operators, factors or {})
        budget = self.max_threads or default_max_threads(machine.cores)
        runs = [(self.method, threads) for threads in range(1, budget + 1)] + [(m, budget) for m in self.alternatives]
        found: dict[str, ScoredPlan] = {}
        for method, threads in runs:
            try:
                result = plan_chain(operators, machine, method, max_threads=threads, spark=settings)
            except SearchTooLarge:
                log.info("adaptive: no %s candidate, its search is too large", method)
                continue
            found.setdefault(plan_fingerprint(result.plan), ScoredPlan(result.plan, result.throughput_per_s))
        return tuple(found.values())

    # -- CorrectablePlanSearch ------------------------------------------------------------------
    def correction_terms(self) -> tuple[str, ...]:
        return (OPERATORS_TERM, *SparkConstants.names())

    def seconds_per_record(self, operators: Sequence[OperatorStats], plan: Plan, machine: Machine,
                           factors: Mapping[str, float]) -> float:
        return 1.0 / self.predict_per_s(operators, plan, machine, factors)

    def with_factors(self, factors: Mapping[str, float]) -> CorrectedSparkModelSearch:
        return CorrectedSparkModelSearch(self, dict(factors))


@dataclass(frozen=True)
class CorrectedSparkModelSearch:
    """A `SparkModelSearch` seen through the factors the loop learned (its batch shape stays live)."""

    search: SparkModelSearch
    factors: Mapping[str, float]

    def predict_per_s(self, operators: Sequence[OperatorStats], plan: Plan, machine: Machine) -> float:
        return self.search.predict_per_s(operators, plan, machine, self.factors)

    def candidates(self, operators: Sequence[OperatorStats], machine: Machine) -> tuple[ScoredPlan, ...]:
        return self.search.candidates(operators, machine, self.factors)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
