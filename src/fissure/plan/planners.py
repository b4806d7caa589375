"""The planners behind `fissure plan`: one entry point, one method name each."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from fissure.model.spark_model import SparkEvaluation, evaluate_spark
from fissure.model.throughput import Evaluation, evaluate
from fissure.model.types import Machine, OperatorStats, Plan
from fissure.plan.chain import ChainModel, RegionShape
from fissure.plan.exhaustive import SearchSpace, optimal_regions
from fissure.plan.heuristic import heuristic, paper_heuristic
from fissure.plan.spark_chain import SparkChainModel, SparkModelSettings, spark_optimal_regions

METHODS = ("heuristic", "paper-heuristic", "optimal", "fission-only", "pipelining-only", "sequential")


@dataclass(frozen=True)
class PlanResult:
    """A plan, the model's verdict on it, and how long planning took."""

    plan: Plan
    evaluation: Evaluation  # the paper model's figures (regions, kinds, keys) in every case
    solve_ms: float
    max_threads: int
    spark: SparkEvaluation | None = None  # the Spark model's verdict when it planned

    @property
    def throughput_per_s(self) -> float:
        """The throughput predicted by the model that planned."""
        return self.spark.throughput_per_s if self.spark is not None else self.evaluation.throughput_per_s


def default_max_threads(cores: int) -> int:
    """M of the paper: the thread budget of every planner, 2 C by default."""
    return 2 * cores


def plan_regions(model: ChainModel, method: str, max_threads: int) -> list[RegionShape]:
    """The regions `method` picks for the chain in `model`."""
    if method == "heuristic":
        return heuristic(model, max_threads)
    if method == "paper-heuristic":
        return paper_heuristic(model, max_threads)
    exact = spark_optimal_regions if isinstance(model, SparkChainModel) else optimal_regions
    if method == "optimal":
        return exact(model, SearchSpace(max_threads))
    if method == "fission-only":
        return exact(model, SearchSpace(max_threads, allow_pipelining=False))
    if method == "pipelining-only":
        return exact(model, SearchSpace(max_threads, allow_replication=False))
    if method == "sequential":
        return [RegionShape(0, model.size)]
    raise ValueError(f"unknown planning method {method!r}; choose one of {', '.join(METHODS)}")


def plan_chain(
    operators: Sequence[OperatorStats],
    machine: Machine,
    method: str = "heuristic",
    max_threads: int | None = None,
    clock=time.perf_counter,
    spark: SparkModelSettings | None = None,
) -> PlanResult:
    """Plan the chain `operators` on `machine` with `method`; M defaults to 2 C.

    With `spark`, every method ranks configurations by the Spark model (fissure.model.spark_model)
    with those constants and micro-batches, on `machine.cores` task slots; the machine's delta and
    c_p are then not used. Without it, the paper's model, as the `fissure plan` contract says.
    """
    threads = default_max_threads(machine.cores) if max_threads is None else max_threads
    if threads < 1:
        raise ValueError(f"max_threads must be >= 1, got {threads}")
    started = clock()
    model = ChainModel(operators, machine) if spark is None else SparkChainModel(operators, machine.cores, spark)
    regions = plan_regions(model, method, threads)
    solve_ms = (clock() - started) * 1e3
    plan = model.to_plan(regions, method)
    spark_evaluation = None
    if spark is not None:
        spark_evaluation = evaluate_spark(operators, plan, machine.cores, spark.constants, spark.workload)
    return PlanResult(plan, evaluate(operators, plan, machine), solve_ms, threads, spark_evaluation)
