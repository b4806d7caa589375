"""Which plan a run uses: "sequential", the planner's pick, a plan file, or a Plan value.

A plan lists a program's operators in its order (`program.names`: a chain's order; a graph's
execution order, fissure.program.graph) cut into regions and pipelines. Also checks that a plan
fits its program (every operator once, in that order) and prints it compactly for the progress
line: `[parse|events]x2 -> [range]x2 -> [results]`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

from fissure.program.chain import Pipeline
from fissure.program.operators import OperatorEstimate, PipelineError
from fissure.model.types import Kind, Machine, Plan, RegionPlan
from fissure.program.graph import StreamGraph, as_graph

Program = Pipeline | StreamGraph

PLAN_CHOICES = ("sequential", "planner")
# One pipeline's operator names inside a described plan: between `[` or `|` and `|` or `]`.
_PIPELINE_IN_TEXT = re.compile(r"(?<=[\[|])[^\[\]|]+(?=[|\]])")


def sequential_plan(program: Program) -> Plan:
    """Every operator in one pipeline of one region, one replica: the fused sequential program."""
    if isinstance(program, Pipeline):
        program.check_not_empty()
    return Plan(regions=(RegionPlan(pipelines=(program.names,), replicas=1),), method="sequential")


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


def planned_batch_records(assumed: int, input_records: float | None) -> int:
    """The micro-batch the planner plans for: the model's assumed batch (`batch_records` of its
    workload), or the whole input when a run reads its input once and all of it is smaller."""
    if input_records is None or input_records >= assumed:
        return assumed
    return max(1, int(input_records))


def spreading_scan(program: Program) -> bool:
    """Whether a run of `program` reads its input through a scan that spreads a replicated first
    stage (fissure.spark.query.compile_graph), as the Spark model assumes by default: one source,
    taken to be a file source, and no time-aware operator (those keep the numbering stage and the
    round-robin: their first stage must read each micro-batch's clock)."""
    graph = as_graph(program)
    return len(graph.sources) == 1 and not graph.time_aware


def spark_model_for(program: Program):
    """The stored Spark model's settings (`fissure calibrate`'s, or the defaults) for runs of
    `program`: its micro-batches' shape says whether the scan spreads the first stage."""
    from dataclasses import replace

    from fissure.plan.stored_calibration import stored_spark_model

    settings, _ = stored_spark_model()
    return replace(settings, workload=replace(settings.workload, scan_spreads=spreading_scan(program)))


def planner_plan(pipeline: Program, cores: int, estimates: Mapping[str, OperatorEstimate] | None = None,
                 method: str = "heuristic", input_records: float | None = None) -> Plan:
    """The planner's plan from the pipeline's estimates (hints or defaults until profiles exist).

    Ranked by the Spark model (fissure.model.spark_model: a micro-batch's stages run one after
    another, fixed costs per batch, stage, task and state partition) with the constants `fissure
    calibrate` stored, or its defaults, on `cores` task slots. The paper's model with its default
    machine (c_p = 50 us, threads capped at the cores) gave LogWatch no replica on 2 cores.

    Ranked for the batches the run will have: first at the batch the model assumes (10,000
    records by default), then, when the batch that plan's runs would admit at the default fixed
    share (fissure.plan.batch_size) differs, again at that size. LogWatch at 10,000 records ranks
    a plan of four pipelines without a replica 3 % above replicating its parsing region; its runs
    admit 175,000-record batches, where the model ranks the replicated plan 28 % higher, and on
    250,000-record batches it ran 96,144-98,435 lines/s against 77,658-90,626.

    `input_records`: the whole input of a run that reads its input once; when it is smaller than
    the batch planned for, the plan is ranked at its size, the one batch the run will have.
    LogWatch's example (2,022 lines), read through a scan that does not spread the first stage,
    then gets one region and no replica, `[lines,parsed|raw_events|events,range,cutoff|realtime,
    breakins,results]`: one task and one state store per stateful operator in its first batch
    instead of two, and no round-robin exchange. From its files the replicated plan ranks 5 %
    higher there (`spreading_scan`).
    """
    from dataclasses import replace

    from fissure.plan.batch_size import choose_batch_records, model_batch_cost
    from fissure.plan import plan_chain

    settings = spark_model_for(pipeline)
    operators = pipeline.operator_stats(estimates)
    machine = Machine(cores=cores)

    def plan_at(records: int) -> Plan:
        at = settings if records == settings.workload.batch_records else replace(
            settings, workload=replace(settings.workload, batch_records=records))
        return plan_chain(operators, machine, method=method, spark=at).plan

    records = planned_batch_records(settings.workload.batch_records, input_records)
    plan = plan_at(records)
    admitted = planned_batch_records(
        choose_batch_records(model_batch_cost(operators, plan, cores, settings)).records, input_records)
    return plan if admitted == records else plan_at(admitted)


def resolve_plan(plan: object, pipeline: Program, cores: int,
                 estimates: Mapping[str, OperatorEstimate] | None = None, input_records: float | None = None) -> Plan:
    """A Plan from any accepted form: Plan, "sequential", "planner", a path to a JSON plan, a dict
    (`input_records`: the whole input of a run that reads it once, for the planner)."""
    if isinstance(plan, Plan):
        resolved = plan
    elif plan is None or plan == "sequential":
        resolved = sequential_plan(pipeline)
    elif plan == "planner":
        resolved = planner_plan(pipeline, cores, estimates, input_records=input_records)
    elif isinstance(plan, Mapping):
        resolved = plan_from_json(plan)
    elif isinstance(plan, (str, os.PathLike)) and os.path.exists(plan):
        resolved = load_plan_file(os.fspath(plan))
    else:
        raise PipelineError(f"plan {plan!r} is none of: a Plan, 'sequential', 'planner', a JSON plan file, a dict")
    check_plan(resolved, pipeline)
    return resolved


def check_plan(plan: Plan, pipeline: Program) -> None:
    """Every operator exactly once, in chain order; regions and pipelines non-empty; keys compatible."""
    if plan.operators != pipeline.names:
        missing = [name for name in pipeline.names if name not in plan.operators]
        unknown = [name for name in plan.operators if name not in pipeline.names]
        problems = ([f"lacks {', '.join(missing)}"] if missing else []) + \
                   ([f"names unknown operator(s) {', '.join(unknown)}"] if unknown else [])
        if not problems:
            problems = [f"lists {' -> '.join(plan.operators)} instead of the order {' -> '.join(pipeline.names)}"]
        what = "graph" if isinstance(pipeline, StreamGraph) else "pipeline"
        raise PipelineError(f"the plan does not fit {what} {pipeline.name!r}: it {'; '.join(problems)}")
    for number, region in enumerate(plan.regions, start=1):
        if not region.pipelines or any(not pipeline_names for pipeline_names in region.pipelines):
            raise PipelineError(f"plan region {number} has an empty pipeline")
        if region.replicas < 1:
            raise PipelineError(f"plan region {number} has {region.replicas} replicas; it needs at least 1")
        kinds = {name: pipeline.kind_of(name) for name in region.operators}
        keys = {pipeline.key_of(name) for name, kind in kinds.items() if kind is Kind.PARTITIONED}
        if region.replicas > 1 and Kind.STATEFUL in kinds.values():
            stateful = next(name for name, kind in kinds.items() if kind is Kind.STATEFUL)
            raise PipelineError(f"plan region {number} replicates stateful operator {stateful!r}, which has one "
                                f"state for the whole stream; give that region 1 replica")
        if region.replicas > 1 and len(keys) > 1:
            raise PipelineError(f"plan region {number} replicates operators keyed on different fields "
                                f"({', '.join(sorted('+'.join(key) for key in keys))}); split the region")


def describe_plan(plan: Plan, pipeline: Program | None = None) -> str:
    """`[a,b|c]x2 -> [d]x2(host) -> [e]`: pipelines separated by `|`, replicas after `x`, and
    (given the pipeline) the key a replicated region's state is partitioned on."""
    regions = []
    for region in plan.regions:
        text = "[" + "|".join(",".join(names) for names in region.pipelines) + "]"
        if region.replicas > 1:
            text += f"x{region.replicas}"
            key = _partition_key(region, pipeline)
            if key:
                text += f"({key})"
        regions.append(text)
    return " -> ".join(regions)


def _partition_key(region: RegionPlan, pipeline: Program | None) -> str | None:
    """The key of the region's partitioned operators (one at most in a replicated region)."""
    if pipeline is None:
        return None
    for name in region.operators:
        if name in pipeline.names and pipeline.kind_of(name) is Kind.PARTITIONED:
            return ",".join(pipeline.key_of(name))
    return None


def abbreviate_plan(text: str) -> str:
    """A described plan with every pipeline of three or more operators written `first..last`:
    `[lines..realtime]x2(host) -> [breakins|results]` (for a narrow terminal)."""
    def shorten(match: re.Match) -> str:
        names = match.group(0).split(",")
        return f"{names[0]}..{names[-1]}" if len(names) > 2 else match.group(0)

    return _PIPELINE_IN_TEXT.sub(shorten, text)


def plan_line(head: str, plan_text: str, max_chars: int | None = None) -> str:
    """`head` then the plan, within `max_chars` (a terminal's width): the plan abbreviated if
    needed, then cut with an ellipsis."""
    line = head + plan_text
    if max_chars is None or len(line) <= max_chars:
        return line
    line = head + abbreviate_plan(plan_text)
    return line if len(line) <= max_chars else line[:max(0, max_chars - 1)] + "…"
