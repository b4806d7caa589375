"""Which plan a run uses: "sequential", the planner's pick, a plan file, or a Plan value.

Also checks that a plan fits its pipeline (every operator once, in chain order) and prints it
compactly for the progress line: `[parse|events]x2 -> [range]x2 -> [results]`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from fissure.graph import OperatorEstimate, Pipeline, PipelineError
from fissure.model.types import Kind, Machine, Plan, RegionPlan

PLAN_CHOICES = ("sequential", "planner")


def sequential_plan(pipeline: Pipeline) -> Plan:
    """Every operator in one pipeline of one region, one replica: the fused sequential program."""
    pipeline.check_not_empty()
    return Plan(regions=(RegionPlan(pipelines=(pipeline.names,), replicas=1),), method="sequential")


def plan_from_json(document: Mapping) -> Plan:
    """A plan from the JSON `fissure plan --json` prints (only `regions` is read)."""
    try:
        regions = tuple(
            RegionPlan(pipelines=tuple(tuple(str(name) for name in pipeline) for pipeline in region["pipelines"]),
                       replicas=int(region.get("replicas", 1)))
            for region in document["regions"]
        )
    except (KeyError, TypeError, ValueError) as error:
        raise PipelineError(f"a plan needs {{'regions': [{{'replicas': n, 'pipelines': [[names...]]}}]}}: {error}") from None
    return Plan(regions=regions, method=str(document.get("method", "file")))


def load_plan_file(path: str) -> Plan:
    with open(path, encoding="utf-8") as handle:
        return plan_from_json(json.load(handle))


def planner_plan(pipeline: Pipeline, cores: int, estimates: Mapping[str, OperatorEstimate] | None = None,
                 method: str = "heuristic") -> Plan:
    """The planner's plan from the pipeline's estimates (hints or defaults until profiles exist).

    Threads are capped at the cores: on Spark a PE's processes and the replicas share the task
    slots (see docs/spark-runner.md).
    """
    from fissure.optimize import plan_chain

    return plan_chain(pipeline.operator_stats(estimates), Machine(cores=cores), method=method,
                      max_threads=cores).plan


def resolve_plan(plan: object, pipeline: Pipeline, cores: int,
                 estimates: Mapping[str, OperatorEstimate] | None = None) -> Plan:
    """A Plan from any accepted form: Plan, "sequential", "planner", a path to a JSON plan, a dict."""
    if isinstance(plan, Plan):
        resolved = plan
    elif plan is None or plan == "sequential":
        resolved = sequential_plan(pipeline)
    elif plan == "planner":
        resolved = planner_plan(pipeline, cores, estimates)
    elif isinstance(plan, Mapping):
        resolved = plan_from_json(plan)
    elif isinstance(plan, (str, os.PathLike)) and os.path.exists(plan):
        resolved = load_plan_file(os.fspath(plan))
    else:
        raise PipelineError(f"plan {plan!r} is none of: a Plan, 'sequential', 'planner', a JSON plan file, a dict")
    check_plan(resolved, pipeline)
    return resolved


def check_plan(plan: Plan, pipeline: Pipeline) -> None:
    """Every operator exactly once, in chain order; regions and pipelines non-empty; keys compatible."""
    if plan.operators != pipeline.names:
        missing = [name for name in pipeline.names if name not in plan.operators]
        unknown = [name for name in plan.operators if name not in pipeline.names]
        problems = ([f"lacks {', '.join(missing)}"] if missing else []) + \
                   ([f"names unknown operator(s) {', '.join(unknown)}"] if unknown else [])
        if not problems:
            problems = [f"lists {' -> '.join(plan.operators)} instead of the chain order {' -> '.join(pipeline.names)}"]
        raise PipelineError(f"the plan does not fit pipeline {pipeline.name!r}: it {'; '.join(problems)}")
    for number, region in enumerate(plan.regions, start=1):
        if not region.pipelines or any(not pipeline_names for pipeline_names in region.pipelines):
            raise PipelineError(f"plan region {number} has an empty pipeline")
        if region.replicas < 1:
            raise PipelineError(f"plan region {number} has {region.replicas} replicas; it needs at least 1")
        operators = [pipeline.operator(name) for name in region.operators]
        keys = {operator.key for operator in operators if operator.kind is Kind.PARTITIONED}
        if region.replicas > 1 and any(operator.kind is Kind.STATEFUL for operator in operators):
            stateful = next(operator.name for operator in operators if operator.kind is Kind.STATEFUL)
            raise PipelineError(f"plan region {number} replicates stateful operator {stateful!r}, which has one "
                                f"state for the whole stream; give that region 1 replica")
        if region.replicas > 1 and len(keys) > 1:
            raise PipelineError(f"plan region {number} replicates operators keyed on different fields "
                                f"({', '.join(sorted('+'.join(key) for key in keys))}); split the region")


def describe_plan(plan: Plan) -> str:
    """`[a|b]x2 -> [c]` : pipelines separated by `|`, replicas after `x`."""
    regions = []
    for region in plan.regions:
        text = "[" + "|".join(",".join(pipeline) for pipeline in region.pipelines) + "]"
        regions.append(text + (f"x{region.replicas}" if region.replicas > 1 else ""))
    return " -> ".join(regions)
