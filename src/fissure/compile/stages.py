"""A stream graph's records as envelopes, and the graph processing element that runs on them.

No pyspark here: the Spark layer (fissure.spark.query.compile_graph) ships these objects to its workers.

Envelope: one row per record of any stream of the graph. `_fissure_route` names the stream the
row belongs to (the node that produced it: a source, an operator, a union or a join); then the
sequence number and the dead-letter columns of the chain runner (fissure.runtime.records.columns); then,
per distinct stream schema i, its fields as nullable columns `_fissure_s{i}_{field}` (null on the
rows of other streams). Rows are routed by the stream they belong to, not by the node they go
to: a row of a stream with several consumers travels once and each consumer reads it where it
runs; a stage forwards a stream's rows only while a consumer after it still needs them.

A plan (fissure.model.types.Plan over the graph's execution order) cuts the graph into stages
(`plan_graph_stages`): runs of stateless nodes ("pe" stages, one mapInArrow each, replicated
where a region starts) and one stage per keyed node (a partitioned or stateful operator, or a
join: transformWithStateInPandas behind a hash exchange). Within a pe stage, pipeline boundaries
cut the subgraph into pieces (`pieces_for`), run as a chain of processes by the
ProcessingElement; a piece runs its nodes on the rows routed to them and passes every other row
through.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from fissure.graph import Pipeline
from fissure.model.types import Kind, Plan, RegionPlan
from fissure.streamgraph import Node, NodeKind, StreamGraph
from fissure.runtime.records.columns import DEAD_COLUMNS, DEAD_OPERATOR, INTERNAL_FIELDS, SEQ, carried_schema
from fissure.runtime.elastic.stage import WaitingOperator
from fissure.runtime.operators.fused import FusedStage, Step
from fissure.runtime.records.carried import assemble, conform, split_dead
from fissure.runtime.profiling.pieces import PieceProfile

ROUTE = "_fissure_route"
COLUMN_PREFIX = "_fissure_s"


# --- stages and pieces (pure decisions) --------------------------------------------------------


@dataclass(frozen=True)
class GraphStage:
    """One Spark-side step: a pe stage (stateless nodes, one mapInArrow) or a keyed node.

    `replicas`: a pe stage that starts a plan region runs in this many partitions (its input is
    spread round-robin when that changes its partitioning); None: it runs where its input is.
    `boundaries`: the nodes whose input port starts a new process of the stage's PE (the first
    node of each of the plan's pipelines after the first)."""

    position: int  # 0-based, in execution order
    kind: str  # "pe" or "keyed"
    nodes: tuple[str, ...]  # in execution order
    replicas: int | None = None
    boundaries: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"pe{self.position}" if self.kind == "pe" else self.nodes[0]


def plan_graph_stages(graph: StreamGraph, plan: Plan | None = None) -> tuple[GraphStage, ...]:
    """The stages that run `plan` (default: the sequential plan), in execution order.

    The plan lists the graph's operators in execution order (`StreamGraph.names`); each keyed
    node becomes a stage of its own, and each run of stateless nodes that no keyed node or region
    boundary interrupts becomes one pe stage, cut into processes where the plan's pipelines start.
    Runs of the sequential plan are the graph's `execution_stages`: PE_0 K_1 PE_1 K_2 ..."""
    if plan is None:
        plan = Plan(regions=(RegionPlan(pipelines=(graph.names,)),), method="sequential")
    stages: list[GraphStage] = []
    for region in plan.regions:
        pipelines: list[list[str]] = []  # the stateless parts of the pipelines of the pending pe stage
        starts_region = True

        def close_pe_stage() -> None:
            nonlocal starts_region
            if pipelines:
                nodes = tuple(name for part in pipelines for name in part)
                stages.append(GraphStage(len(stages), "pe", nodes, region.replicas if starts_region else None,
                                         tuple(part[0] for part in pipelines[1:])))
                pipelines.clear()
            starts_region = False

        for names in region.pipelines:
            part: list[str] = []
            for name in names:
                if not graph.node(name).keyed:
                    part.append(name)
                    continue
                if part:
                    pipelines.append(part)
                    part = []
                close_pe_stage()
                stages.append(GraphStage(len(stages), "keyed", (name,)))
            if part:
                pipelines.append(part)
        close_pe_stage()
    return tuple(stages)


def state_partitions_of(program: StreamGraph | Pipeline, plan: Plan, default: int = 1) -> int:
    """State partitions of the query of any program: the most replicas of a region with a
    partitioned (keyed) operator, else `default` (Spark gives every stateful operator of a query
    the same number)."""
    keyed = [region.replicas for region in plan.regions
             if any(program.kind_of(name) is Kind.PARTITIONED for name in region.operators)]
    return max(keyed, default=default)


def pieces_for(graph: StreamGraph, nodes: Sequence[str], boundaries: Iterable[str]) -> tuple[tuple[str, ...], ...]:
    """A pe stage's nodes cut at the pipeline boundaries (operators whose input port starts a new
    process), as a chain of pieces in topological order. A boundary node opens a new piece; any
    other node runs in the latest piece of its inputs in this stage (the first if none is)."""
    cut = set(boundaries)
    piece_of: dict[str, int] = {}
    pieces: list[list[str]] = [[]]
    for name in nodes:
        if name in cut and pieces[-1]:
            pieces.append([])
            index = len(pieces) - 1
        elif name in cut:
            index = 0
        else:
            index = max((piece_of[source] for source in graph.node(name).inputs if source in piece_of), default=0)
        piece_of[name] = index
        pieces[index].append(name)
    return tuple(tuple(piece) for piece in pieces if piece)


def consumers_after(graph: StreamGraph, stream: str, done: set[str]) -> bool:
    """Whether a sink reads `stream`, or some operator that reads it is not in `done`."""
    return bool(graph.sinks_of(stream)) or any(consumer not in done for consumer in graph.consumers(stream))


# --- envelopes --------------------------------------------------------------------------------


class EnvelopeLayout:
    """The envelope schema of a graph at one point of its query, and the conversions between
    envelopes and carried batches.

    Schema groups are numbered over every stream of the graph (streams of equal schemas share
    one), so a column has the same name at every point; a layout restricted to the streams `live`
    there carries only their groups' columns. Measured on the LogWatch chain, carrying every
    group everywhere (35 columns for 7 groups) ran at 0.56-0.63 of the chain runner."""

    def __init__(self, stream_schemas: Mapping[str, pa.Schema], live: Iterable[str] | None = None) -> None:
        self.stream_schemas = dict(stream_schemas)
        self.stream_names = tuple(self.stream_schemas) if live is None else tuple(live)  # the streams it carries
        self.schemas: list[pa.Schema] = []
        self.index: dict[str, int] = {}
        for stream, schema in self.stream_schemas.items():
            for number, known in enumerate(self.schemas):
                if known.equals(schema):
                    self.index[stream] = number
                    break
            else:
                self.index[stream] = len(self.schemas)
                self.schemas.append(schema)
        self.carried = tuple(range(len(self.schemas)) if live is None else sorted({self.index[name] for name in live}))
        self.routes = {stream: number for number, stream in enumerate(self.stream_schemas)}
        fields = [pa.field(ROUTE, pa.int32()), *INTERNAL_FIELDS]
        for number in self.carried:
            fields += [pa.field(self.column(number, field.name), field.type) for field in self.schemas[number]]
        self.schema = pa.schema(fields)

    def restricted(self, live: Iterable[str]) -> EnvelopeLayout:
        """The layout carrying only the columns of the streams `live` (same column names)."""
        return EnvelopeLayout(self.stream_schemas, live)

    @staticmethod
    def column(schema_number: int, field_name: str) -> str:
        return f"{COLUMN_PREFIX}{schema_number}_{field_name}"

    def route_of(self, stream: str) -> int:
        """The route column's value for rows of `stream` (a number: cheaper than its name through
        Spark's exchanges and Arrow conversions)."""
        return self.routes[stream]

    def streams_in(self, batch: pa.RecordBatch) -> set[str]:
        """The streams that have rows in `batch`."""
        present = {route for route in pc.unique(batch.column(0)).to_pylist() if route is not None}
        return {stream for stream, number in self.routes.items() if number in present}

    def _route_column(self, stream: str, rows: int) -> pa.Array:
        return pa.repeat(pa.scalar(self.routes[stream], pa.int32()), rows)

    def carries(self, stream: str) -> bool:
        return self.index[stream] in self.carried

    def stream_schema(self, stream: str) -> pa.Schema:
        return self.schemas[self.index[stream]]

    def columns_of(self, stream: str) -> list[str]:
        number = self.index[stream]
        return [self.column(number, name) for name in self.schemas[number].names]

    def extract(self, batch: pa.RecordBatch, stream: str) -> pa.RecordBatch:
        """The live rows of `stream` in `batch`, as a carried batch (user fields, seq, dead columns)."""
        mask = pc.and_(pc.equal(batch.column(0), pa.scalar(self.routes[stream], pa.int32())),
                       batch.column(batch.schema.get_field_index(DEAD_OPERATOR)).is_null())
        rows = batch.filter(mask)
        schema = self.stream_schema(stream)
        columns = [rows.column(rows.schema.get_field_index(name)) for name in self.columns_of(stream)]
        columns += [rows.column(rows.schema.get_field_index(name)) for name in (SEQ, *DEAD_COLUMNS)]
        return pa.RecordBatch.from_arrays(columns, schema=carried_schema(schema))

    def wrap(self, carried: pa.RecordBatch, stream: str) -> pa.RecordBatch:
        """A carried batch of `stream` (live rows and dead letters) as envelopes routed to it."""
        if not self.carries(stream):
            live, dead = split_dead(carried)
            if live.num_rows:
                raise ValueError(f"envelope layout without the columns of stream {stream!r} got its live rows")
            return self.wrap_dead(carried, stream)
        rows = carried.num_rows
        own = self.index[stream]
        by_name = {name: carried.column(position) for position, name in enumerate(carried.schema.names)}
        columns = [self._route_column(stream, rows)]
        columns += [by_name[name] for name in (SEQ, *DEAD_COLUMNS)]
        for number in self.carried:
            for field in self.schemas[number]:
                if number != own:
                    columns.append(pa.nulls(rows, field.type))
                    continue
                column = by_name[field.name]
                columns.append(column if column.type == field.type else column.cast(field.type))
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def wrap_dead(self, dead: pa.RecordBatch, stream: str) -> pa.RecordBatch:
        """Dead-letter rows of `stream` (a carried batch) as envelopes: no user field set."""
        rows = dead.num_rows
        by_name = {name: dead.column(position) for position, name in enumerate(dead.schema.names)}
        columns = [self._route_column(stream, rows)] + [by_name[name] for name in (SEQ, *DEAD_COLUMNS)]
        columns += [pa.nulls(rows, field.type) for field in list(self.schema)[len(columns):]]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Envelopes of another layout of the same graph in this one: its columns kept, the columns
        this one adds null (a dropped column only ever held nulls or rows no later node reads)."""
        if batch.schema.equals(self.schema):
            return batch
        names = set(batch.schema.names)
        columns = [batch.column(batch.schema.get_field_index(field.name)) if field.name in names
                   else pa.nulls(batch.num_rows, field.type) for field in self.schema]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def empty(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist([], schema=self.schema)


def stream_lifetimes(graph: StreamGraph, stages: Sequence[GraphStage]) -> tuple[frozenset[str], ...]:
    """The streams whose rows a query carries between its stages: entry b (0 .. len(stages)) holds
    those live before stage b (entry 0: the sources; the last: the sinks' streams). A stream lives
    from the stage after the one that makes it until the last stage that reads it, or to the end
    when a sink reads it."""
    made_in = {name: -1 for name in graph.sources}
    made_in.update({name: stage.position for stage in stages for name in stage.nodes})
    end = len(stages)
    last_read = {stream: end if graph.sinks_of(stream) else max(made_in[consumer] for consumer in graph.consumers(stream))
                 for stream in made_in}
    return tuple(frozenset(stream for stream, made in made_in.items() if made < boundary <= last_read[stream])
                 for boundary in range(end + 1))


# --- running stateless nodes ------------------------------------------------------------------


@dataclass(frozen=True)
class StatelessNode:
    """Stateless nodes as a piece runs them: a union, or a run of operators fused into one
    FusedStage (one Arrow -> dicts -> Arrow conversion for a run of per-record operators, as in
    a chain's pipeline); `name` is the last one's, whose output the run gives."""

    name: str
    inputs: tuple[str, ...]
    output_schema: pa.Schema
    stage: FusedStage | None  # None: a union
    names: tuple[str, ...] = ()  # the fused operators, in order (empty: a union)

    def run(self, inputs: Sequence[pa.RecordBatch]) -> pa.RecordBatch:
        """Its carried output (live rows and new dead letters) from its inputs' live carried rows."""
        present = [batch for batch in inputs if batch is not None and batch.num_rows]
        if self.stage is None:
            schema = carried_schema(self.output_schema)
            return assemble([conform(batch, schema) for batch in present], schema)
        return assemble([self.stage(batch) for batch in present], carried_schema(self.output_schema))


def _step(node: Node, schemas: Mapping[str, pa.Schema], waiting: WaitingOperator | None) -> Step:
    operator = node.operator
    return Step(name=operator.name, action=operator.action.value, fn=operator.fn, output_schema=schemas[node.name],
                batch_format=operator.batch_format.value if operator.batch_format else None, waiting=waiting)


@dataclass(frozen=True)
class StageProfiling:
    """How a graph PE's fused operators profile themselves (fissure.runtime.profiling.profiler): counter ids
    start with `prefix` (unique per query), every `timed_every`-th batch is timed."""

    prefix: str
    timed_every: int = 1


def fused_nodes(nodes: Sequence[Node], schemas: Mapping[str, pa.Schema],
                waiting: Mapping[str, WaitingOperator] | None = None, profile_id: str | None = None,
                profile_label: str | None = None, timed_every: int = 1) -> StatelessNode:
    """A union alone, or operators each reading the one before (a run `fusion_runs` found);
    with `profile_id`, its FusedStage counts and times its operators under that id."""
    last = nodes[-1]
    if last.kind is NodeKind.UNION:
        return StatelessNode(last.name, last.inputs, schemas[last.name], None)
    waiting = waiting or {}
    steps = [_step(node, schemas, waiting.get(node.name)) for node in nodes]
    stage = FusedStage(steps, schemas[nodes[0].inputs[0]], profile_id=profile_id, timed_every=timed_every,
                       profile_label=profile_label)
    return StatelessNode(last.name, nodes[0].inputs, schemas[last.name], stage, tuple(node.name for node in nodes))


def fusion_runs(graph: StreamGraph, piece: Sequence[str]) -> list[list[str]]:
    """A piece's nodes (in order) grouped into runs to fuse: an operator joins the run of the node
    before it when it reads only that node's output and nothing else (no node, no sink) does."""
    runs: list[list[str]] = []
    for name in piece:
        node = graph.node(name)
        previous = runs[-1][-1] if runs else None
        if (previous is not None and node.kind is NodeKind.OPERATOR and node.inputs == (previous,)
                and graph.node(previous).kind is NodeKind.OPERATOR and graph.consumers(previous) == (name,) and not graph.sinks_of(previous)):
            runs[-1].append(name)
        else:
            runs.append([name])
    return runs


class GraphPiece:
    """One process's share of a pe stage: a `RecordBatch -> RecordBatch` stage over envelopes.

    Runs `nodes` (topological order) on the rows routed to them, emits the rows of the streams
    in `forward` (needed after this piece) and passes every row of other streams through. With
    `profile_id`, adds each node's thread-CPU time and records into shared counters
    (fissure.runtime.profiling.pieces) that the driver turns into mu(t) and mu(o, t).
    """

    def __init__(self, nodes: Sequence[StatelessNode], layout: EnvelopeLayout, forward: Iterable[str],
                 profile_id: str | None = None) -> None:
        self.nodes = tuple(nodes)
        self.layout = layout
        self.forward = frozenset(forward)
        produced = {node.name for node in self.nodes}
        self.consumed = frozenset(stream for node in self.nodes for stream in node.inputs if stream not in produced)
        self.profile_id = profile_id
        self._profile = None

    @property
    def name(self) -> str:
        return ",".join(node.name for node in self.nodes)

    def __repr__(self) -> str:
        return f"GraphPiece({self.name})"

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_profile"] = None
        return state

    def bind_profile(self):
        if self.profile_id is not None and self._profile is None:
            self._profile = PieceProfile(self.profile_id, tuple(node.name for node in self.nodes))
        return self._profile

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        profile = self._profile if self._profile is not None else self.bind_profile()
        started_cpu_s = time.thread_time()
        present = self.layout.streams_in(batch) & self.consumed
        if not present:
            return self.layout.conform(batch)
        live, dead = split_dead(batch)
        route = live.column(0)
        dropped = sorted(self.layout.route_of(stream) for stream in present - self.forward)
        keep = pc.invert(pc.is_in(route, value_set=pa.array(dropped, pa.int32())))
        parts = [self.layout.conform(live.filter(keep)), self.layout.conform(dead) if dead is not None else None]
        available = {stream: self.layout.extract(live, stream) for stream in present}
        for index, node in enumerate(self.nodes):
            inputs = [available.get(stream) for stream in node.inputs]
            records_in = sum(batch.num_rows for batch in inputs if batch is not None)
            if not records_in:
                continue
            node_started_s = time.thread_time()
            output = node.run(inputs)
            live_output, new_dead = split_dead(output)
            available[node.name] = live_output
            if profile is not None:
                profile.node(index, records_in, live_output.num_rows, time.thread_time() - node_started_s)
            if new_dead is not None:
                parts.append(self.layout.wrap_dead(new_dead, node.name))
            if node.name in self.forward and live_output.num_rows:
                parts.append(self.layout.wrap(live_output, node.name))
        if profile is not None:
            profile.piece(time.thread_time() - started_cpu_s)
        return assemble(parts, self.layout.schema)


def build_pieces(graph: StreamGraph, schemas: Mapping[str, pa.Schema], layout: EnvelopeLayout,
                 stages: Sequence[GraphStage], stage: GraphStage, boundaries: Iterable[str],
                 profile_prefix: str | None = None,
                 waiting: Mapping[str, WaitingOperator] | None = None,
                 stage_profiling: StageProfiling | None = None) -> list[GraphPiece]:
    """The pieces of pe `stage` under `boundaries`, each with the streams it must forward;
    `waiting`: the elastic threads of the stage's waiting operators, by name. Unprofiled, a
    piece fuses its runs of operators (`fusion_runs`); profiled, it runs node by node, so that
    each node's CPU time is its own (the autopipelining optimizer reads it per input port).
    `stage_profiling`: the operators count and time themselves as a chain's do (per fused run)."""
    waiting = waiting or {}
    done = {name for earlier in stages[:stage.position] for name in earlier.nodes}
    done |= set(graph.sources)
    pieces = []
    names = pieces_for(graph, stage.nodes, boundaries)
    for number, piece in enumerate(names):
        done |= set(piece)
        readable = set(piece) | {stream for name in piece for stream in graph.node(name).inputs}
        forward = {stream for stream in readable if consumers_after(graph, stream, done)}
        profile_id = f"{profile_prefix}/{stage.label}/{'|'.join(','.join(p) for p in names)}/p{number}" \
            if profile_prefix else None
        runs = fusion_runs(graph, piece) if profile_id is None else [[name] for name in piece]
        cut = "|".join(",".join(p) for p in names)
        units = []
        for unit, run in enumerate(runs, start=1):
            label = f"{stage.label}/p{number + 1}" + (f".{unit}" if len(runs) > 1 else "")
            units.append(fused_nodes(
                [graph.node(name) for name in run], schemas, waiting,
                f"{stage_profiling.prefix}/{stage.label}/{cut}/{label}" if stage_profiling is not None else None,
                label, stage_profiling.timed_every if stage_profiling is not None else 1))
        pieces.append(GraphPiece(units, layout, forward, profile_id))
    return pieces
