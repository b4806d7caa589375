"""A stream graph compiled to ONE streaming query over envelopes (fissure.compile.stages).

- every source becomes envelopes (route = the source's stream number, a sequence number
  `source index << 56 | partition << 40 | row`, its fields in its schema's columns), and the
  sources are unioned; a single source read by a first pe stage becomes envelopes inside it,
  and when that stage is replicated over a file source, it runs on the scan's own tasks, which
  split each micro-batch over the cores (fissure.spark.io.scan_split), instead of behind a
  numbering stage and a round-robin exchange;
- between two stages an envelope carries the columns of the streams still read later only
  (fissure.compile.stages.stream_lifetimes);
- the plan (fissure.model.types.Plan over the graph's execution order; sequential by default)
  cuts the graph into stages (fissure.compile.stages.plan_graph_stages); a pe stage that starts
  a replicated region is spread round-robin over its replicas (but the first, on a spreading scan);
- every pe stage is one mapInArrow running a graph processing element (its pieces as a chain of
  processes when pipeline boundaries cut it);
- every keyed node is one transformWithStateInPandas behind a hash exchange on a grouping key.
  A partitioned or unkeyed stateful operator's input comes packed (fissure.runtime.operators.packing): the
  stage before it (a pe stage, the source's envelopes or another keyed stage) groups its
  envelopes by grouping key, a bucket of keys (crc32 of the key's text mod the checkpoint's bucket
  count, fissure.model.state_buckets; the
  handler runs a bucket's keys in one call, their states in sub-buckets of keys,
  fissure.runtime.state.key_buckets) or 0
  without key, and ships each group as one row of Arrow IPC. A join's rows get their key text in
  SQL just before it. Every other row gets one of `spread` spread keys (`-1 - seq mod spread`
  packed, `~seq mod spread` for a join), which the handler passes through without touching state;
- an `aggregate` or tumbling or sliding `window` that can merge (fissure.program.combine_policy) gets, from
  the stage before it (a pe stage's task, a keyed stage's call, or the source's envelopes for an
  aggregate reading a source), one partial per key (and window) instead of its records
  (fissure.runtime.operators.combine);
- a keyed stage whose output a pe stage reads in the same Spark stage ships it packed too, in
  order (fissure.runtime.operators.packing.pack_rows), and that pe stage unpacks it;
- the runner's foreachBatch persists each micro-batch once and writes each sink from it.
A stream used by several nodes is computed once: its rows travel once and each consumer reads
them where it runs, so nothing upstream is recomputed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from fissure.program.operators import PipelineError
from fissure.model.types import Kind, Plan
from fissure.spark.query.elastic import WorkerThreads
from fissure.plan.plans import check_plan, sequential_plan
from fissure.spark.io.sources import arrow_schema_of, spark_schema_of
from fissure.spark.state.handler import LightStateProcessor
from fissure.spark.query.stages import (
    KEY, KEY_MARK, SPREAD_PREFIX, GraphRegionFunction, SourceEnvelopeFunction, TickEnvelopeFunction,
    WorkerProfiling,
)
from fissure.spark.query.keyed_stage import GraphStateProcessor, StageTime
from fissure.program.time_rules import TimeLayout
from fissure.program.nodes import NodeKind
from fissure.program.graph import StreamGraph
from fissure.runtime.records.columns import DEAD_OPERATOR, SEQ
from fissure.runtime.profiling.pieces import ProfiledGraphRegion
from fissure.runtime.records.source_rows import LineFormat, without_corrupt_record
from fissure.runtime.state.codec import StateAccess, missing_key_message
from fissure.runtime.state.grouping_keys import BALANCED_KEYS, GroupingKeys
from fissure.runtime.records.envelopes import ROUTE, EnvelopeLayout
from fissure.compile.stages import (
    GraphStage, consumers_after, pieces_for, plan_graph_stages, state_partitions_of, stream_lifetimes,
)
from fissure.compile.pieces import StageProfiling
from fissure.runtime.operators.packing import PACKED_SCHEMA, PackSpec
from fissure.program.combine_policy import FoldSite, combine_decision
from fissure.runtime.operators.combine import CombinePlan


@dataclass(frozen=True)
class CompiledStep:
    """One Spark-side step of the compiled query, as the Spark model prices it (listings, tests)."""

    kind: str  # "pe" (mapInArrow), "state" (transformWithStateInPandas) or "sequence" (envelopes only)
    pipelines: tuple[tuple[str, ...], ...]  # operator names per PE process; one for a state step
    exchange: str  # "none", "round-robin", "hash" or "single" before this step
    partitions: int | None  # partitions after the exchange; None: the input's
    key: tuple[str, ...] | None = None
    combined: bool = False  # a state step whose input is partials folded before the exchange

    @property
    def processes(self) -> int:
        return len(self.pipelines) if self.kind == "pe" else 1


@dataclass(frozen=True)
class CompiledGraph:
    frame: DataFrame  # envelopes: every sink's rows and every dead letter
    layout: EnvelopeLayout
    stages: tuple[GraphStage, ...]
    schemas: Mapping[str, pa.Schema]
    order: tuple[str, ...]
    plan: Plan
    state_partitions: int
    steps: tuple[CompiledStep, ...] = ()
    time: TimeLayout = TimeLayout()  # the program's time-aware operators, lateness and horizon
    spread_by_scan: bool = False  # the first stage runs replicated on the scan's tasks (scan_split's settings)


def _source_envelopes(name: str, index: int, frame: DataFrame, layout: EnvelopeLayout,
                      pack_for: PackSpec | None, line_format: LineFormat | None,
                      combine: CombinePlan | None = None) -> DataFrame:
    function = SourceEnvelopeFunction(name, index, layout, layout.stream_schema(name), pack_for, line_format,
                                      combine if combine is not None and combine.stream == name else None)
    return frame.mapInArrow(function, spark_schema_of(layout.schema if pack_for is None else PACKED_SCHEMA))


def _pack_spec(graph: StreamGraph, stage: GraphStage, layout: EnvelopeLayout, spread: int,
               every_group: bool = False, grouping_keys: GroupingKeys = BALANCED_KEYS) -> PackSpec | None:
    """How the stage before a keyed stage packs its output for it (fissure.runtime.operators.packing): for a
    partitioned or an unkeyed stateful operator; a join's groups stay rows (one per key text).
    `every_group`: a row for every group, with records or not (migrating state: every bucket's
    state is read and rewritten in the first batch)."""
    if stage.kind == "pe":
        return None
    node = graph.node(stage.nodes[0])
    if node.kind is not NodeKind.OPERATOR:
        return None
    (stream,) = node.inputs
    key_columns = (tuple(layout.column(layout.index[stream], field) for field in node.key)
                   if node.operator.kind is Kind.PARTITIONED else None)
    return PackSpec(layout.route_of(stream), key_columns, max(1, spread), every_group, grouping_keys)


def fold_site(stages, stage) -> FoldSite:
    """What runs before keyed `stage` and folds a combined operator's records for it."""
    if not stage.position:
        return FoldSite.SOURCE
    return FoldSite.PE_STAGE if stages[stage.position - 1].kind == "pe" else FoldSite.KEYED_STAGE


def combine_plans(graph: StreamGraph, stages, schemas: Mapping[str, pa.Schema],
                  time_fields: Mapping[str, str | None]) -> dict[str, CombinePlan]:
    """The keyed nodes whose records are combined before their exchange, by name
    (fissure.program.combine_policy decides which, given what runs before them)."""
    plans = {}
    for stage in stages:
        if stage.kind == "pe":
            continue
        node = graph.node(stage.nodes[0])
        if node.kind is not NodeKind.OPERATOR:
            continue
        (stream,) = node.inputs
        sole_reader = graph.consumers(stream) == (node.name,) and not graph.sinks_of(stream)
        if combine_decision(node.operator, sole_reader, fold_site(stages, stage)).combine:
            plans[node.name] = CombinePlan.of(node.operator, schemas[stream], time_fields.get(node.name), stream)
    return plans


def _join_key_column(node, layout: EnvelopeLayout, spread: int):
    """The grouping column of a join's stage: see the module docstring."""
    live = F.col(DEAD_OPERATOR).isNull()
    spread_key = F.concat(F.lit(SPREAD_PREFIX), F.pmod(F.col(SEQ), F.lit(max(1, spread))).cast("string"))
    expression = None
    for stream in dict.fromkeys(node.inputs):
        columns = [F.col(layout.column(layout.index[stream], field)).cast("string") for field in node.key]
        # One field: its text behind a mark no spread key starts with (cheaper than JSON).
        value = F.concat(F.lit(KEY_MARK), columns[0]) if len(columns) == 1 else F.to_json(F.array(*columns))
        condition = live & (F.col(ROUTE) == F.lit(layout.route_of(stream)))
        expression = F.when(condition, value) if expression is None else expression.when(condition, value)
    return expression.otherwise(spread_key)


def compile_graph(graph: StreamGraph, source_frames: Mapping[str, DataFrame], *, plan: Plan | None = None,
                  boundaries: Iterable[str] | None = None, state_partitions: int | None = None,
                  threads: WorkerThreads | None = None, profiling: WorkerProfiling | None = None,
                  resource_profile_for=lambda processes: None,
                  line_formats: Mapping[str, LineFormat] | None = None,
                  state_access: StateAccess = StateAccess(), control_frame: DataFrame | None = None,
                  time_tally=None, combine: bool = True,
                  grouping_keys: GroupingKeys = BALANCED_KEYS, scan_spreads: bool = False) -> CompiledGraph:
    """The query of `graph` under `plan` (default: sequential) over the streaming DataFrames of its
    sources (by source name).

    `boundaries`: stateless operators whose input port starts a new process of their graph PE,
    instead of the plan's pipeline starts (a task may override them per micro-batch:
    BOUNDARIES_PROPERTY). `state_partitions`: instead of the plan's (the most replicas of a keyed
    region, 1 without). `profiling`: what the stages count into the run's profile accumulator
    (None: not profiled). `threads`: how waiting operators run on elastic threads and report their levels
    (None: declared ones still do, with the default policy, unreported). `resource_profile_for(n)`
    may return a ResourceProfile for a pe stage of n processes (None: Spark's default).
    `line_formats`: how the JSON and CSV sources' lines are written (by source name), so that an
    unreadable line's dead letter says what is wrong with it. `state_access`: the key that signs
    pickled state, and whether an earlier fissure's pickled state may be migrated
    (fissure.runtime.state.codec). `control_frame`: the end-of-input control source of a program
    with time-aware operators (fissure.spark.query.time_log), unioned with the sources; `time_tally`:
    the accumulator the keyed stages report event times and key counts into
    (fissure.runtime.operators.time_tally). `combine`: fold the records of aggregates and windows that can
    merge into partials before their exchange (fissure.runtime.operators.combine); False ships every record.
    `grouping_keys`: the values a keyed stage's buckets and spread keys travel as, the checkpoint's
    scheme and bucket count (fissure.runtime.state.grouping_keys; the runner gives a new checkpoint the
    balanced scheme of the count chosen for its cores, fissure.model.state_buckets). `scan_spreads`:
    the single source's scan splits each micro-batch over the cores (a file source under
    fissure.spark.io.scan_split's settings), so a replicated first pe stage runs on the scan's tasks."""
    line_formats = line_formats or {}
    threads = threads or WorkerThreads()
    for operator in graph.operators:
        if operator.state_codec == "pickle" and operator.kind is not Kind.STATELESS and not state_access.key:
            raise PipelineError(missing_key_message(operator.name))
    query_token = uuid.uuid4().hex[:12]
    piece_prefix = f"{graph.name}.{query_token}" if profiling is not None and profiling.pieces else None
    operator_profiling = profiling if profiling is not None and profiling.operators else None
    bound = {name: without_corrupt_record(arrow_schema_of(frame)) for name, frame in source_frames.items()}
    checked = graph.check(bound)
    missing = [name for name in graph.sources if name not in source_frames]
    if missing:
        raise PipelineError(f"no source bound to {', '.join(map(repr, missing))} of graph {graph.name!r}; pass "
                            f"sources={{name: FileSource(...), ...}} for every source")
    plan = plan if plan is not None else sequential_plan(graph)
    check_plan(plan, graph)
    stages = plan_graph_stages(graph, plan)
    if boundaries is not None:
        boundaries = set(boundaries)
        unknown = sorted(boundaries - {node.name for node in graph.nodes if node.stateless})
        if unknown:
            raise PipelineError(f"pipeline boundaries {', '.join(map(repr, unknown))} name no stateless operator of "
                                f"graph {graph.name!r}; a boundary is the input port of a stateless operator or union")
    if state_partitions is None:
        state_partitions = state_partitions_of(graph, plan)
    schemas = dict(checked.schemas)  # every stream's (a sink's records are its stream's)
    every_stream = EnvelopeLayout(schemas)
    layouts = [every_stream.restricted(live) for live in stream_lifetimes(graph, stages)]  # between stages
    # One source read by a first pe stage: its records become envelopes inside that stage's PE, not
    # in a Python stage of their own (one Arrow round trip less), unless sequence numbers must be
    # drawn before a round-robin spreads the stage's input over replicas (a keyed node later orders
    # by them). A spreading scan needs no round-robin: the stage runs on the scan's tasks.
    first = stages[0]
    source_into_first_pe = len(graph.sources) == 1 and first.kind == "pe" and control_frame is None
    spread_by_scan = source_into_first_pe and scan_spreads and (first.replicas or 1) > 1
    enveloped_in_first_stage = source_into_first_pe and ((first.replicas or 1) == 1 or spread_by_scan
                                                         or all(stage.kind == "pe" for stage in stages))
    # A keyed stage's input comes packed by the stage before it (fissure.runtime.operators.packing).
    # A time-aware stage runs every bucket in every batch: its keys due without records fire.
    time_aware = checked.time.fields
    combined = combine_plans(graph, stages, schemas, time_aware) if combine else {}

    def combine_before(stage) -> CombinePlan | None:
        """The combine a stage (pe or keyed) does for the keyed stage right after it."""
        after = stages[stage.position + 1] if stage.position + 1 < len(stages) else None
        return combined.get(after.nodes[0]) if after is not None and after.kind != "pe" else None

    packs = [_pack_spec(graph, stage, layouts[stage.position], state_partitions,
                        state_access.trust_legacy_pickle or (stage.kind != "pe" and stage.nodes[0] in time_aware),
                        grouping_keys)
             for stage in stages] + [None]
    if enveloped_in_first_stage:
        frame = source_frames[graph.sources[0]]
        source = graph.sources[0]
        source_envelopes = SourceEnvelopeFunction(source, 0, layouts[0], layouts[0].stream_schema(source),
                                                  line_format=line_formats.get(source))
    else:
        first_combine = combined.get(stages[0].nodes[0]) if stages[0].kind != "pe" else None
        frames = [_source_envelopes(name, index, source_frames[name], layouts[0], packs[0], line_formats.get(name),
                                    first_combine)
                  for index, name in enumerate(graph.sources)]
        if control_frame is not None:
            frames.append(control_frame.mapInArrow(TickEnvelopeFunction(layouts[0], packs[0]),
                                                   spark_schema_of(layouts[0].schema if packs[0] is None
                                                                   else PACKED_SCHEMA)))
        frame = frames[0]
        for other in frames[1:]:
            frame = frame.unionByName(other)
        source_envelopes = None
    steps = [] if enveloped_in_first_stage else [CompiledStep("sequence", (), "none", None)]

    def packs_through(stage) -> bool:
        """Whether keyed `stage` packs its output in order for the pe stage after it, which runs in
        the same Spark stage (no exchange between them: fissure.runtime.operators.packing.pack_rows)."""
        after = stages[stage.position + 1] if stage.position + 1 < len(stages) else None
        return (stage.kind != "pe" and packs[stage.position + 1] is None and after is not None and after.kind == "pe"
                and (after.replicas is None or (after.replicas == 1 and state_partitions == 1)))

    done = set(graph.sources)
    partitions: int | None = None  # None: the sources' partitioning
    for stage in stages:
        done |= set(stage.nodes)
        if stage.kind == "pe":
            exchange, spread = "none", None
            if stage.position == 0 and spread_by_scan:
                partitions = stage.replicas  # the scan's tasks, about one a core, spread the replicas' work
            elif stage.replicas is not None and (stage.replicas > 1 or partitions not in (None, 1)):
                frame = frame.repartition(stage.replicas)  # round-robin: the replicas share the records
                exchange, spread = "round-robin", stage.replicas
                partitions = stage.replicas
            waiting = {name: threads.waiting_for(graph.node(name).operator, graph.name) for name in stage.nodes
                       if graph.node(name).operator is not None}
            waiting = {name: value for name, value in waiting.items() if value is not None}
            working = every_stream.restricted(set(layouts[stage.position].stream_names) | set(stage.nodes))
            function = GraphRegionFunction(graph, schemas, working, stages, stage,
                                           stage.boundaries if boundaries is None else boundaries,
                                           piece_prefix, query_token, waiting, layouts[stage.position + 1],
                                           source_envelopes if stage.position == 0 else None,
                                           StageProfiling(operator_profiling.token, operator_profiling.timed_every_batches)
                                           if operator_profiling is not None else None, packs[stage.position + 1],
                                           publishes=stage is stages[-1], combine=combine_before(stage),
                                           packed_input=(layouts[stage.position].schema if stage.position
                                                         and packs_through(stages[stage.position - 1]) else None))
            if profiling is not None:
                function = ProfiledGraphRegion(function, profiling.accumulator, stage.label,
                                               operators=profiling.operators, pieces=profiling.pieces)
            function = threads.wrap_waiting(function, list(waiting.values()))
            processes = pieces_for(graph, stage.nodes, stage.boundaries if boundaries is None else boundaries)
            steps.append(CompiledStep("pe", processes, exchange, spread))
            profile = resource_profile_for(len(processes))
            output_schema = spark_schema_of(layouts[stage.position + 1].schema if packs[stage.position + 1] is None
                                            else PACKED_SCHEMA)
            frame = (frame.mapInArrow(function, output_schema, profile=profile) if profile is not None
                     else frame.mapInArrow(function, output_schema))
            continue
        node = graph.node(stage.nodes[0])
        forward = [stream for stream in dict.fromkeys(node.inputs) if consumers_after(graph, stream, done)]
        entering, leaving = layouts[stage.position], layouts[stage.position + 1]
        packed, pack_next = packs[stage.position] is not None, packs[stage.position + 1]
        processor = GraphStateProcessor(graph, schemas, entering, node.name, forward, leaving, operator_profiling,
                                        packed_input=packed, pack_for=pack_next, stage_position=stage.position,
                                        publishes=stage is stages[-1], state_access=state_access,
                                        time=StageTime(time_tally, node.name in time_aware, time_aware.get(node.name)),
                                        combine=combined.get(node.name), fold_for=combine_before(stage),
                                        pack_through=packs_through(stage), grouping_keys=grouping_keys)
        if not packed:
            frame = frame.withColumn(KEY, _join_key_column(node, entering, state_partitions))
        output_schema = spark_schema_of(leaving.schema if pack_next is None and not packs_through(stage)
                                        else PACKED_SCHEMA)
        # Light to unpickle in PySpark's state-schema processes (fissure.spark.state.handler).
        frame = frame.groupBy(KEY).transformWithStateInPandas(LightStateProcessor(processor), output_schema,
                                                               "Append", "None")
        partitions = state_partitions
        partitioned = node.kind is not NodeKind.OPERATOR or node.operator.kind is Kind.PARTITIONED
        steps.append(CompiledStep("state", ((node.name,),), "hash" if partitioned else "single", state_partitions,
                                  tuple(node.key) if partitioned else None,
                                  combined=node.name in combined))
    return CompiledGraph(frame, layouts[-1], stages, schemas, checked.order, plan, state_partitions, tuple(steps),
                         checked.time, spread_by_scan)


def sink_frame(compiled: CompiledGraph, graph: StreamGraph, sink: str, frame: DataFrame) -> DataFrame:
    """The live rows of `sink`'s stream in an envelope frame, under the stream's field names."""
    stream = graph.sink_node(sink).inputs[0]
    columns = compiled.layout.columns_of(stream)
    names = compiled.layout.stream_schema(stream).names
    return (frame.filter((F.col(ROUTE) == F.lit(compiled.layout.route_of(stream))) & F.col(DEAD_OPERATOR).isNull())
            .select(*[F.col(column).alias(name) for column, name in zip(columns, names)]))
