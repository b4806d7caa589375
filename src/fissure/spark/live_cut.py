"""In-PE plan switches without a restart: a region's pipeline cut, re-read for every micro-batch.

A plan change that keeps every region and its replicas but moves pipeline boundaries inside
regions (`SwitchKind.IN_PE`) changes only how a processing element spreads its operators over
processes; the Spark query's physical plan stays the same. The driver therefore does not restart
the query: at the boundary before a micro-batch, from inside that batch's `foreachBatch` call, it
sets a Spark *local property* (`PE_CUTS_PROPERTY`) naming the cut of every PE segment, and every
task of the batch reads it (`TaskContext.getLocalProperty`). Measured on PySpark 4.3: a local
property set in the `foreachBatch` function reaches every task that function's actions start,
because PySpark pins each Python thread to one JVM thread (the query's own thread calls the
function), so the batch's tasks all see the same cut, and the next batch the next one. The
worker's PE (`fissure.worker.pe_registry.processing_element_for`) keys its processes by region and cut:
a new cut closes the old processes and forks new ones in the first task that sees it.

Keys and values: a PE segment is named by its operators in chain order, `parse,events,range`;
its cut is written like a fingerprint's region, pipelines separated by `|`: `parse|events,range`.
A segment absent from the property runs the cut it was compiled with.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence

import pyarrow as pa

from fissure.graph import Operator, Pipeline
from fissure.model.throughput import canonical_regions
from fissure.model.types import Kind, Plan, RegionPlan
from fissure.streamgraph import StreamGraph
from fissure.worker.fused import FusedStage
from fissure.worker.graph_pe import plan_graph_stages

log = logging.getLogger(__name__)

PE_CUTS_PROPERTY = "fissure.pe.cuts"


def segment_key(pipelines: Sequence[Sequence[str]]) -> str:
    """A PE segment's name: its operators in chain order, `a,b,c`."""
    return ",".join(name for names in pipelines for name in names)


def cut_text(pipelines: Sequence[Sequence[str]]) -> str:
    """A segment's cut: `a|b,c`."""
    return "|".join(",".join(names) for names in pipelines)


def region_segments(region: RegionPlan, pipeline: Pipeline) -> list[tuple[str, object]]:
    """The region cut at its stateful operators: ("pe", [[stateless ops] per pipeline]) and ("state", op)."""
    segments: list[tuple[str, object]] = []
    pending: list[list[Operator]] = []
    for names in region.pipelines:
        part: list[Operator] = []
        for name in names:
            operator = pipeline.operator(name)
            if operator.kind is Kind.STATELESS:
                part.append(operator)
                continue
            if part:
                pending.append(part)
                part = []
            if pending:
                segments.append(("pe", pending))
                pending = []
            segments.append(("state", operator))
        if part:
            pending.append(part)
    if pending:
        segments.append(("pe", pending))
    return segments


def pe_segments(plan: Plan, pipeline: Pipeline) -> list[tuple[tuple[str, ...], ...]]:
    """The PE segments the compiled query of `plan` runs (runs of stateless operators between
    stateful ones, per canonical region), each as its pipelines of operator names."""
    segments = []
    for region in canonical_regions(plan):
        for kind, content in region_segments(region, pipeline):
            if kind == "pe":
                segments.append(tuple(tuple(operator.name for operator in part) for part in content))
    return segments


def pe_cuts(plan: Plan, pipeline: Pipeline | StreamGraph) -> dict[str, str]:
    """Segment name -> cut for every PE segment of a chain's compiled query of `plan` (a graph's
    PEs are cut by boundaries instead: `plan_boundaries`)."""
    if isinstance(pipeline, StreamGraph):
        return {}
    return {segment_key(segment): cut_text(segment) for segment in pe_segments(plan, pipeline)}


def plan_boundaries(graph: StreamGraph, plan: Plan) -> tuple[str, ...]:
    """The pipeline boundaries of a graph's query under `plan`."""
    return tuple(sorted(node for stage in plan_graph_stages(graph, plan) for node in stage.boundaries))


def same_physical_plan(first: Plan, second: Plan, pipeline: Pipeline | StreamGraph) -> bool:
    """Whether the two plans compile to the same query up to the PEs' cuts: the same canonical
    regions with the same replicas (so the same exchanges) and the same PE segments (a graph's:
    the same stages, whatever their boundaries)."""
    def layout(plan: Plan):
        return [(region.operators, region.replicas) for region in canonical_regions(plan)]

    if isinstance(pipeline, StreamGraph):
        def stages(plan: Plan):
            return [(stage.kind, stage.nodes, stage.replicas)
                    for stage in plan_graph_stages(pipeline, Plan(canonical_regions(plan)))]

        return layout(first) == layout(second) and stages(first) == stages(second)
    return layout(first) == layout(second) and (
        [segment_key(s) for s in pe_segments(first, pipeline)] == [segment_key(s) for s in pe_segments(second, pipeline)])


def cuts_property(cuts: Mapping[str, str]) -> str:
    return json.dumps(dict(sorted(cuts.items())), separators=(",", ":"))


# -- in the worker -----------------------------------------------------------------------------


def _task_cuts() -> dict[str, str]:
    """The cuts the driver set for this task's micro-batch (empty outside Spark or when unset)."""
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        text = context.getLocalProperty(PE_CUTS_PROPERTY) if context is not None else None
    except Exception:  # noqa: BLE001 - no task context: run the compiled cut
        return {}
    if not text:
        return {}
    try:
        cuts = json.loads(text)
    except ValueError:
        log.warning("live cut: unreadable %s property %r: running the compiled cut", PE_CUTS_PROPERTY, text)
        return {}
    return cuts if isinstance(cuts, dict) else {}


def recut_stages(stages: Sequence, cut: str, suffix: str) -> list[list]:
    """The fused stages of one PE segment re-fused along `cut` (`a|b,c`).

    `stages` are the segment's `FusedStage`s in order (their steps cover the segment); the new
    stages keep the originals' profiling (their counters get new ids, one per new pipeline).
    """
    steps = [step for stage in stages for step in stage.steps]
    parts = [part.split(",") for part in cut.split("|")]
    if [name for part in parts for name in part] != [step.name for step in steps] or any(not p for p in parts):
        raise ValueError(f"cut {cut!r} does not cover the segment {[step.name for step in steps]} in order")
    first = stages[0]
    profile_id = getattr(first, "profile_id", None)
    prefix = profile_id.rsplit("/", 1)[0] if profile_id else None
    label = getattr(first, "profile_label", None)
    label_prefix = label.rsplit("/", 1)[0] if label else prefix
    schema, position, pipelines = first.input_schema, 0, []
    for number, part in enumerate(parts, start=1):
        chunk = steps[position:position + len(part)]
        position += len(part)
        if prefix is None:
            stage = FusedStage(chunk, schema)
        else:
            stage = FusedStage(chunk, schema, profile_id=f"{prefix}/{suffix}/p{number}",
                               timed_every=getattr(first, "timed_every", 1),
                               profile_label=f"{label_prefix}/p{number}({cut})")
        pipelines.append([stage])
        schema = chunk[-1].output_schema
    return pipelines


class LiveCut:
    """A compiled PE stage's mapInArrow function that runs the cut the driver set for the batch.

    Wraps a `RegionFunction`, or a profiling wrapper of one (an object with `function` (the
    RegionFunction) and `stages` (its fused stages), e.g. `fissure.worker.profiling.ProfiledRegion`).
    A cut it cannot apply is logged in the worker and the compiled cut runs: the records are the
    same under every cut, only the processes differ.
    """

    def __init__(self, function: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]) -> None:
        self.function = function
        region = self._region(function)
        self.stages = [stage for pipeline in region.pipelines for stage in pipeline]
        names = [[name for stage in pipeline for name in stage.names] for pipeline in region.pipelines]
        self.segment = segment_key(names)
        self.compiled_cut = cut_text(names)
        self._functions: dict[str, Callable] = {}

    @staticmethod
    def _region(function):
        return getattr(function, "function", function)  # the RegionFunction inside a wrapper

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        cut = _task_cuts().get(self.segment) if self.stages else None
        function = self.function if cut is None or cut == self.compiled_cut else self._for_cut(cut)
        return function(batches)

    def _for_cut(self, cut: str) -> Callable:
        function = self._functions.get(cut)
        if function is not None:
            return function
        try:
            function = self._build(cut)
        except Exception as error:  # noqa: BLE001 - a cut that does not fit: keep the compiled one
            log.warning("live cut: cannot run %s as %r (%s): running the compiled cut %r",
                        self.segment, cut, error, self.compiled_cut)
            function = self.function
        self._functions[cut] = function
        return function

    def _build(self, cut: str) -> Callable:
        region = self._region(self.function)
        suffix = "cut-" + "-".join(str(len(part.split(","))) for part in cut.split("|"))
        pipelines = recut_stages(self.stages, cut, suffix)
        new_region = copy.copy(region)
        new_region.pipelines = pipelines
        if region is self.function:
            return new_region
        wrapper = copy.copy(self.function)  # e.g. ProfiledRegion: the same accumulator, new stages
        wrapper.function = new_region
        wrapper.stages = [stage for pipeline in pipelines for stage in pipeline]
        return wrapper
