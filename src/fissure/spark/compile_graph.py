"""A stream graph compiled to ONE streaming query over envelopes (fissure.worker.graph_pe).

- every source becomes envelopes (route = the source's stream number, a sequence number
  `source index << 56 | partition << 40 | row`, its fields in its schema's columns), and the
  sources are unioned; a single source read by a first pe stage becomes envelopes inside it;
- between two stages an envelope carries the columns of the streams still read later only
  (fissure.worker.graph_pe.stream_lifetimes);
- the plan (fissure.model.types.Plan over the graph's execution order; sequential by default)
  cuts the graph into stages (fissure.worker.graph_pe.plan_graph_stages); a pe stage that starts
  a replicated region is spread round-robin over its replicas;
- every pe stage is one mapInArrow running a graph processing element (its pieces as a chain of
  processes when pipeline boundaries cut it);
- every keyed node is one transformWithStateInPandas behind a hash exchange on a key column
  computed in SQL just before it: the key's text for rows routed into the node, a constant for a
  stateful node without key, and one of `spread` spread keys (`~seq mod spread`) for every other
  row, which the handler passes through without touching state;
- the runner's foreachBatch persists each micro-batch once and writes each sink from it.
A stream used by several nodes is computed once: its rows travel once and each consumer reads
them where it runs, so nothing upstream is recomputed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from fissure.graph import PipelineError
from fissure.model.types import Kind, Plan
from fissure.spark.elastic import WorkerThreads
from fissure.spark.plans import check_plan, sequential_plan
from fissure.spark.sources import arrow_schema_of, spark_schema_of
from fissure.spark.stages import carried_batch_from_pandas, pandas_frame
from fissure.streamgraph import NodeKind, StreamGraph
from fissure.worker.columns import DEAD_COLUMNS, DEAD_OPERATOR, SEQ, SEQ_PARTITION_SHIFT, carried_schema
from fissure.worker.elastic_stage import WaitingOperator
from fissure.worker.fused import assemble
from fissure.worker.graph_join import LEFT, RIGHT, JoinStep, arrivals_of, joined_batch, run_join_group
from fissure.worker.graph_local import SOURCE_SHIFT
from fissure.worker.graph_profiling import ProfiledGraphRegion
from fissure.worker.graph_pe import (
    ROUTE, EnvelopeLayout, GraphStage, StageProfiling, build_pieces, consumers_after, plan_graph_stages,
    state_partitions_of, stream_lifetimes,
)
from fissure.worker.keyed import StatefulStep, run_group
from fissure.worker.profiling import ProfiledUpdate
from fissure.worker.region import processing_element

KEY = "_fissure_key"
SPREAD_PREFIX = "~"
KEY_MARK = "="
BOUNDARIES_PROPERTY = "fissure.graph.boundaries"  # JSON {graph name: [operator, ...]}, per micro-batch


@dataclass(frozen=True)
class WorkerProfiling:
    """What compiled stages need to profile themselves (fissure.worker.profiling): the run's
    profile accumulator and how much to time. `token` keeps one query's counters apart from
    another's in a worker that serves both."""

    accumulator: object
    timed_every_batches: int = 1
    timed_every_records: int = 32
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


@dataclass(frozen=True)
class CompiledGraph:
    frame: DataFrame  # envelopes: every sink's rows and every dead letter
    layout: EnvelopeLayout
    stages: tuple[GraphStage, ...]
    schemas: Mapping[str, pa.Schema]
    order: tuple[str, ...]
    plan: Plan
    state_partitions: int


def task_boundaries(graph_name: str) -> list[str] | None:
    """The boundaries the driver set for this task's micro-batch (None: unset)."""
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        text = context.getLocalProperty(BOUNDARIES_PROPERTY) if context is not None else None
        return json.loads(text).get(graph_name) if text else None
    except Exception:  # noqa: BLE001 - unreadable: run the compiled boundaries
        return None


class GraphRegionFunction:
    """A pe stage's mapInArrow function: its pieces in one processing element."""

    def __init__(self, graph: StreamGraph, schemas, layout: EnvelopeLayout, stages, stage: GraphStage,
                 boundaries: Iterable[str], profile_prefix: str | None, query_token: str,
                 waiting: Mapping[str, WaitingOperator] | None = None,
                 output_layout: EnvelopeLayout | None = None, source_envelopes=None,
                 stage_profiling: StageProfiling | None = None) -> None:
        self.graph, self.schemas, self.layout, self.stages, self.stage = graph, schemas, layout, stages, stage
        self.source_envelopes = source_envelopes  # set: the input is the source's rows, not envelopes
        self.stage_profiling = stage_profiling
        self.output_layout = output_layout or layout  # `layout`: the pieces', with the streams made here
        self.waiting = dict(waiting or {})
        # The worker keeps a PE's processes per region id: one query's pieces never serve another.
        self.region_id = f"graph/{graph.name}/{query_token}/{stage.label}"
        self.boundaries = tuple(sorted(set(boundaries) & set(stage.nodes)))
        self.profile_prefix = profile_prefix
        self._pieces: dict[tuple[str, ...], list] = {}

    def pieces_for_call(self) -> list:
        requested = task_boundaries(self.graph.name)
        boundaries = self.boundaries if requested is None else tuple(sorted(set(requested) & set(self.stage.nodes)))
        pieces = self._pieces.get(boundaries)
        if pieces is None:
            pieces = self._pieces[boundaries] = build_pieces(self.graph, self.schemas, self.layout, self.stages,
                                                             self.stage, boundaries, self.profile_prefix, self.waiting,
                                                             self.stage_profiling)
        return pieces

    def __call__(self, batches: Iterator[pa.RecordBatch], pieces=None) -> Iterator[pa.RecordBatch]:
        pieces = pieces if pieces is not None else self.pieces_for_call()
        element = processing_element([[piece] for piece in pieces], self.region_id)
        if self.source_envelopes is not None:
            batches = self.source_envelopes(batches)
        for batch in element.process(batches):
            if batch.num_rows:
                yield self.output_layout.conform(batch)


class GraphStateProcessor(StatefulProcessor):
    """transformWithStateInPandas handler of one keyed node over envelopes."""

    STATE_NAME = "fissure_state"

    def __init__(self, graph: StreamGraph, schemas, layout: EnvelopeLayout, node_name: str,
                 forward_inputs: Sequence[str], output_layout: EnvelopeLayout | None = None,
                 profiling: WorkerProfiling | None = None) -> None:
        self.graph, self.schemas, self.layout = graph, schemas, layout
        self.profiling = profiling
        self.output_layout = output_layout or layout
        self.node = graph.node(node_name)
        self.forward_inputs = tuple(forward_inputs)
        self.input_schema = pa.schema(list(layout.schema) + [pa.field(KEY, pa.string())])
        self._state = None
        # A key group holds live rows of the node's inputs only (every other row has a spread
        # key). One input and nothing to forward: the group converts straight to the carried
        # batch the operator reads, skipping the envelope.
        self._direct = self.node.kind is not NodeKind.JOIN and not self.forward_inputs
        stream = self.node.inputs[0]
        self._direct_positions = [self.input_schema.get_field_index(name)
                                  for name in (*layout.columns_of(stream), SEQ, *DEAD_COLUMNS)]
        self._direct_schema = carried_schema(schemas[stream])
        self._step = self._stateful_step() if self.node.kind is not NodeKind.JOIN else None

    def init(self, handle) -> None:
        self._state = handle.getValueState(self.STATE_NAME, "value binary")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802 - Spark's name
        frames = list(rows)
        frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        spread = str(key[0]).startswith(SPREAD_PREFIX)
        if self._direct and not spread:
            carried = carried_batch_from_pandas(frame, self._direct_schema, self._direct_positions)
            stored = self._state.get()  # None for a new key: one state-server round trip, not two
            result = run_group(self._step, carried, stored[0] if stored is not None else None)
            if result.state is not None:
                self._state.update((result.state,))
            if result.batch.num_rows:
                yield pandas_frame(self.output_layout.wrap(result.batch, self.node.name))
            return
        batch = carried_batch_from_pandas(frame, self.input_schema)
        batch = batch.select(self.layout.schema.names)
        if spread:
            yield pandas_frame(self.output_layout.conform(batch))  # rows of other nodes: through, no state
            return
        stored = self._state.get()
        output, state = self._run(batch, stored[0] if stored is not None else None)
        if state is not None:
            self._state.update((state,))
        parts = [self.output_layout.wrap(output, self.node.name)]
        parts += [self.output_layout.conform(self._rows_of(batch, stream)) for stream in self.forward_inputs]
        result = assemble(parts, self.output_layout.schema)
        if result.num_rows:
            yield pandas_frame(result)

    def _rows_of(self, batch: pa.RecordBatch, stream: str) -> pa.RecordBatch:
        """The live envelopes of `stream` (forwarded to a later consumer)."""
        return batch.filter(pc.and_(pc.equal(batch.column(0), pa.scalar(self.layout.route_of(stream), pa.int32())),
                                    batch.column(batch.schema.get_field_index(DEAD_OPERATOR)).is_null()))

    def _run(self, batch: pa.RecordBatch, stored: bytes | None) -> tuple[pa.RecordBatch, bytes | None]:
        node, schemas = self.node, self.schemas
        if node.kind is NodeKind.JOIN:
            spec = node.join
            step = JoinStep(node.name, spec.fn, spec.window.time_field, spec.window.size, spec.window.lateness,
                            spec.schema)
            arrivals = [arrival for side, stream in ((LEFT, node.inputs[0]), (RIGHT, node.inputs[1]))
                        for arrival in arrivals_of(self.layout.extract(batch, stream), schemas[stream], side)]
            result = run_join_group(step, arrivals, stored)
            return joined_batch(step, result.records, result.seqs, result.dead), result.state
        result = run_group(self._step, self.layout.extract(batch, node.inputs[0]), stored)
        return result.batch, result.state

    def _stateful_step(self) -> StatefulStep:
        node, operator = self.node, self.node.operator
        fn = operator.fn if self.profiling is None else ProfiledUpdate(
            operator.fn, operator.name, self.profiling.accumulator, self.profiling.timed_every_records)
        return StatefulStep(name=operator.name, fn=fn, state_factory=operator.state_factory,
                            input_schema=self.schemas[node.inputs[0]], output_schema=self.schemas[node.name],
                            key=operator.key, order_by=operator.order_by)

    def close(self) -> None:
        pass


class SourceEnvelopeFunction:
    """mapInArrow function turning a source's rows into envelopes routed to the source, with
    sequence numbers `source index << 56 | task partition << 40 | row in the partition`."""

    def __init__(self, name: str, index: int, layout: EnvelopeLayout, source_schema: pa.Schema) -> None:
        self.name, self.index, self.layout, self.source_schema = name, index, layout, source_schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        first_seq = (self.index << SOURCE_SHIFT) + (TaskContext.get().partitionId() << SEQ_PARTITION_SHIFT)
        schema = carried_schema(self.source_schema)
        for batch in batches:
            rows = batch.num_rows
            columns = [batch.column(batch.schema.get_field_index(name)).cast(field.type)
                       for name, field in zip(self.source_schema.names, self.source_schema)]
            columns.append(pa.array(range(first_seq, first_seq + rows), pa.int64()))
            columns += [pa.nulls(rows, pa.string())] * len(DEAD_COLUMNS)
            first_seq += rows
            yield self.layout.wrap(pa.RecordBatch.from_arrays(columns, schema=schema), self.name)


def _source_envelopes(name: str, index: int, frame: DataFrame, layout: EnvelopeLayout) -> DataFrame:
    function = SourceEnvelopeFunction(name, index, layout, layout.stream_schema(name))
    return frame.mapInArrow(function, spark_schema_of(layout.schema))


def _key_column(node, layout: EnvelopeLayout, spread: int):
    live = F.col(DEAD_OPERATOR).isNull()
    spread_key = F.concat(F.lit(SPREAD_PREFIX), F.pmod(F.col(SEQ), F.lit(max(1, spread))).cast("string"))
    expression = None
    for stream in dict.fromkeys(node.inputs):
        if node.kind is NodeKind.OPERATOR and node.operator.kind is Kind.STATEFUL:
            value = F.lit("all")
        else:
            columns = [F.col(layout.column(layout.index[stream], field)).cast("string") for field in node.key]
            # One field: its text behind a mark no spread key starts with (cheaper than JSON).
            value = F.concat(F.lit(KEY_MARK), columns[0]) if len(columns) == 1 else F.to_json(F.array(*columns))
        condition = live & (F.col(ROUTE) == F.lit(layout.route_of(stream)))
        expression = F.when(condition, value) if expression is None else expression.when(condition, value)
    return expression.otherwise(spread_key)


def compile_graph(graph: StreamGraph, source_frames: Mapping[str, DataFrame], *, plan: Plan | None = None,
                  boundaries: Iterable[str] | None = None, state_partitions: int | None = None,
                  profile_accumulator=None, threads: WorkerThreads | None = None,
                  profiling: WorkerProfiling | None = None) -> CompiledGraph:
    """The query of `graph` under `plan` (default: sequential) over the streaming DataFrames of its
    sources (by source name).

    `boundaries`: stateless operators whose input port starts a new process of their graph PE,
    instead of the plan's pipeline starts (a task may override them per micro-batch:
    BOUNDARIES_PROPERTY). `state_partitions`: instead of the plan's (the most replicas of a keyed
    region, 1 without). `profile_accumulator`: a Spark accumulator of GraphProfileTally the graph
    PEs report into, node by node, for autopipelining (None: not profiled). `profiling`: every
    operator counts and times itself into that ProfileTally accumulator, as a chain's do (None:
    not profiled). `threads`: how waiting operators run on elastic threads and report their levels
    (None: declared ones still do, with the default policy, unreported)."""
    threads = threads or WorkerThreads()
    query_token = uuid.uuid4().hex[:12]
    profile_prefix = f"{graph.name}.{query_token}"
    bound = {name: arrow_schema_of(frame) for name, frame in source_frames.items()}
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
    schemas = {name: schema for name, schema in checked.schemas.items() if graph.node(name).kind is not NodeKind.SINK}
    every_stream = EnvelopeLayout(schemas)
    layouts = [every_stream.restricted(live) for live in stream_lifetimes(graph, stages)]  # between stages
    # One source read by a first pe stage: its records become envelopes inside that stage's PE, not
    # in a Python stage of their own (one Arrow round trip less), unless sequence numbers must be
    # drawn before the stage spreads its input over replicas (a keyed node later orders by them).
    first = stages[0]
    enveloped_in_first_stage = (len(graph.sources) == 1 and first.kind == "pe"
                                and ((first.replicas or 1) == 1 or all(stage.kind == "pe" for stage in stages)))
    if enveloped_in_first_stage:
        frame = source_frames[graph.sources[0]]
        source_envelopes = SourceEnvelopeFunction(graph.sources[0], 0, layouts[0], layouts[0].stream_schema(graph.sources[0]))
    else:
        frames = [_source_envelopes(name, index, source_frames[name], layouts[0])
                  for index, name in enumerate(graph.sources)]
        frame = frames[0]
        for other in frames[1:]:
            frame = frame.unionByName(other)
        source_envelopes = None
    done = set(graph.sources)
    partitions: int | None = None  # None: the sources' partitioning
    for stage in stages:
        done |= set(stage.nodes)
        if stage.kind == "pe":
            if stage.replicas is not None and (stage.replicas > 1 or partitions not in (None, 1)):
                frame = frame.repartition(stage.replicas)  # round-robin: the replicas share the records
                partitions = stage.replicas
            waiting = {name: threads.waiting_for(graph.node(name).operator, graph.name) for name in stage.nodes
                       if graph.node(name).operator is not None}
            waiting = {name: value for name, value in waiting.items() if value is not None}
            working = every_stream.restricted(set(layouts[stage.position].stream_names) | set(stage.nodes))
            function = GraphRegionFunction(graph, schemas, working, stages, stage,
                                           stage.boundaries if boundaries is None else boundaries,
                                           profile_prefix if profile_accumulator is not None else None, query_token,
                                           waiting, layouts[stage.position + 1],
                                           source_envelopes if stage.position == 0 else None,
                                           StageProfiling(f"{profiling.token}", profiling.timed_every_batches)
                                           if profiling is not None else None)
            if profile_accumulator is not None or profiling is not None:
                function = ProfiledGraphRegion(function, profile_accumulator,
                                               profiling.accumulator if profiling is not None else None, stage.label)
            function = threads.wrap_waiting(function, list(waiting.values()))
            frame = frame.mapInArrow(function, spark_schema_of(layouts[stage.position + 1].schema))
            continue
        node = graph.node(stage.nodes[0])
        forward = [stream for stream in dict.fromkeys(node.inputs) if consumers_after(graph, stream, done)]
        entering, leaving = layouts[stage.position], layouts[stage.position + 1]
        processor = GraphStateProcessor(graph, schemas, entering, node.name, forward, leaving, profiling)
        frame = (frame.withColumn(KEY, _key_column(node, entering, state_partitions))
                 .groupBy(KEY).transformWithStateInPandas(processor, spark_schema_of(leaving.schema), "Append", "None"))
        partitions = state_partitions
    return CompiledGraph(frame, layouts[-1], stages, schemas, checked.order, plan, state_partitions)


def sink_frame(compiled: CompiledGraph, graph: StreamGraph, sink: str, frame: DataFrame) -> DataFrame:
    """The live rows of `sink`'s stream in an envelope frame, under the stream's field names."""
    stream = graph.node(sink).inputs[0]
    columns = compiled.layout.columns_of(stream)
    names = compiled.layout.stream_schema(stream).names
    return (frame.filter((F.col(ROUTE) == F.lit(compiled.layout.route_of(stream))) & F.col(DEAD_OPERATOR).isNull())
            .select(*[F.col(column).alias(name) for column, name in zip(columns, names)]))
