"""Stream programs that are graphs, not chains: several sources, fan-out, fan-in, joins, several sinks.

    g = StreamGraph("logwatch2")
    lines = g.source("lines", schema={"value": str})
    parsed = lines.map("parse", parse, schema=PARSED)            # a Stream handle
    failures = parsed.filter("failures", is_failure)              # fan-out: `parsed` used twice
    per_host = parsed.partitioned("per_host", count, key="host", schema=COUNTS)
    both = g.union("events", failures, other)                     # fan-in; schemas must agree
    joined = g.join("enrich", failures, hosts, key="host", window=TumblingWindow("ts", 60),
                    fn=lambda left, right: {...}, schema=ENRICHED)
    failures.sink("alerts"); per_host.sink("per_host")

A `Stream` has the builder methods of the chain API (`fissure.Pipeline`: map, filter, flat_map,
map_batches, filter_batches, partitioned, stateful, and for time event_time, window, aggregate,
deduplicate) with the same arguments and checks; each returns the new operator's output stream.
Using one handle in several places is fan-out. Sources are bound to data by name at run time
(`run_local`, `fissure.run_graph`).

`StreamGraph.add(...)` is the low-level form: a node with its inputs named, possibly before they
exist, so any graph (cycles included) can be written down; `check()` refuses what cannot run.

Join semantics (`join`): an inner equi-join on `key` of two streams, in tumbling event-time
windows of `window.size` units of the numeric field `window.time_field` (`window=Tumbling(size)`:
the event-time field and lateness declared upstream of both inputs; window w holds
w * size <= t < (w + 1) * size). A left and a right record join when their keys are equal and
they fall in the same window; `fn(left, right)` runs once per such pair, when the later of the
two arrives (a symmetric hash join), and returns a record, several, or None. State is kept per
key: each key has a watermark, the largest event time it has seen on either side; window w of
that key closes, and its records are evicted, once the watermark reaches
(w + 1) * size + window.lateness. A record that arrives for a closed window is not joined: it
becomes a dead letter ("Late: ..."). Records of one key are taken in event-time order within
a micro-batch (then source order), so a key's records that arrive in time order across
micro-batches give the same pairs however the stream is cut into micro-batches.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import pyarrow as pa

from fissure.program.chain import (
    _NAME_PATTERN,
    DEFAULT_COST_US,
    DEFAULT_SELECTIVITY,
    RESERVED_FIELD_PREFIX,
    Operator,
    OperatorEstimate,
    check_operator_fields,
    check_state_version,
    Pipeline,
    PipelineError,
    SchemaSpec,
    _normalize_key,
    to_arrow_schema,
)
from fissure.program.joins import JoinSpec, TumblingWindow, check_join_fn, check_join_inputs
from fissure.model.types import Kind, OperatorStats
from fissure.program.time_rules import (TimeLayout, check_time_operator, free_name, graph_time, join_window, output_schema,
                                  upstream_declaration)
from fissure.program.windows import Tumbling

# A union only concatenates its inputs' batches: the planner's cost for it until profiles exist.
UNION_COST_US = 0.5
# The smallest input rate (records per record entering the graph) the planner gives an operator,
# so that a branch that receives nothing keeps a finite selectivity in the chain the planner sees.
MIN_PLANNED_RATE = 1e-6

# The chain API's builder methods a Stream offers, with the same arguments.
OPERATOR_METHODS = ("map", "filter", "flat_map", "map_batches", "filter_batches", "partitioned", "stateful",
                    "event_time", "window", "aggregate", "deduplicate")
# Those of them that take no function: their arguments are all keywords (docs/pipeline-api.md, Time).
FUNCTIONLESS_METHODS = ("event_time", "window", "aggregate", "deduplicate")


class NodeKind(str, Enum):
    SOURCE = "source"
    OPERATOR = "operator"
    UNION = "union"
    JOIN = "join"
    SINK = "sink"


@dataclass(frozen=True)
class Node:
    """A source, an operator, a union, a join or a sink, and the names of the nodes it reads."""

    name: str
    kind: NodeKind
    inputs: tuple[str, ...] = ()
    operator: Operator | None = None  # NodeKind.OPERATOR
    join: JoinSpec | None = None  # NodeKind.JOIN
    schema: pa.Schema | None = None  # NodeKind.SOURCE: the declared schema, if any

    @property
    def keyed(self) -> bool:
        """Runs behind a hash exchange with state: a partitioned or stateful operator, or a join."""
        return self.kind is NodeKind.JOIN or (self.operator is not None and self.operator.kind is not Kind.STATELESS)

    @property
    def stateless(self) -> bool:
        return self.kind is NodeKind.UNION or (self.kind is NodeKind.OPERATOR and not self.keyed)

    @property
    def state_kind(self) -> Kind:
        """The paper's k(o) of an operator, union (stateless) or join (partitioned on its key)."""
        if self.kind is NodeKind.JOIN:
            return Kind.PARTITIONED
        return self.operator.kind if self.operator is not None else Kind.STATELESS

    @property
    def key(self) -> tuple[str, ...] | None:
        if self.join is not None:
            return self.join.key
        return self.operator.key if self.operator is not None else None

    def describe(self) -> str:
        if self.operator is not None:
            return f"operator {self.operator.describe()}"
        if self.join is not None:
            return f"join {self.name!r} ({self.join.callable_name} key={','.join(self.join.key)})"
        return f"{self.kind.value} {self.name!r}"


class Stream:
    """The output of a source, operator, union or join; use it as the input of what follows."""

    def __init__(self, graph: StreamGraph, name: str) -> None:
        self.graph = graph
        self.name = name

    def __repr__(self) -> str:
        return f"Stream({self.graph.name!r}.{self.name})"

    def map(self, name: str, fn, **options) -> Stream:
        """As `Pipeline.map`: one record in, one out."""
        return self.graph.add("map", name, fn, inputs=[self], **options)

    def filter(self, name: str, fn, **options) -> Stream:
        """As `Pipeline.filter`."""
        return self.graph.add("filter", name, fn, inputs=[self], **options)

    def flat_map(self, name: str, fn, **options) -> Stream:
        """As `Pipeline.flat_map`."""
        return self.graph.add("flat_map", name, fn, inputs=[self], **options)

    def map_batches(self, name: str, fn, **options) -> Stream:
        """As `Pipeline.map_batches`."""
        return self.graph.add("map_batches", name, fn, inputs=[self], **options)

    def filter_batches(self, name: str, fn, **options) -> Stream:
        """As `Pipeline.filter_batches`."""
        return self.graph.add("filter_batches", name, fn, inputs=[self], **options)

    def partitioned(self, name: str, fn, **options) -> Stream:
        """As `Pipeline.partitioned`: fn(state, record), one state per value of `key`."""
        return self.graph.add("partitioned", name, fn, inputs=[self], **options)

    def stateful(self, name: str, fn, **options) -> Stream:
        """As `Pipeline.stateful`: fn(state, record), one state for the stream."""
        return self.graph.add("stateful", name, fn, inputs=[self], **options)

    def event_time(self, field: str, *, lateness: float = 0.0, name: str | None = None) -> Stream:
        """As `Pipeline.event_time`: the stream's event-time field from here on (an operator,
        `name` or `event_time`, `event_time_2`, ... in the graph's namespace)."""
        name = free_name(self.graph._nodes, "event_time") if name is None else name
        return self.graph.add("event_time", name, inputs=[self], field=field, lateness=lateness)

    def window(self, name: str, **options) -> Stream:
        """As `Pipeline.window`: key=, window=, aggregate=."""
        return self.graph.add("window", name, inputs=[self], **options)

    def aggregate(self, name: str, **options) -> Stream:
        """As `Pipeline.aggregate`: key=, aggregate=, expire_after=."""
        return self.graph.add("aggregate", name, inputs=[self], **options)

    def deduplicate(self, name: str, **options) -> Stream:
        """As `Pipeline.deduplicate`: key=, within=."""
        return self.graph.add("deduplicate", name, inputs=[self], **options)

    def sink(self, name: str) -> StreamGraph:
        """A named sink fed by this stream; bound to a real sink by name at run time."""
        return self.graph.sink(name, self)


StreamLike = typing.Union[Stream, str]


@dataclass(frozen=True)
class GraphLayout:
    """A checked graph: its sources and operators (not its sinks) in topological order and the
    schema of every stream they make (None where a source's schema is not known yet); a sink's
    records are its stream's (`graph.sink_node(name).inputs[0]`)."""

    order: tuple[str, ...]
    schemas: Mapping[str, pa.Schema | None]
    time: TimeLayout = TimeLayout()  # the time-aware operators' event-time fields, lateness, horizon


class StreamGraph:
    """A stream program as a directed acyclic graph of named nodes. See the module docstring."""

    def __init__(self, name: str = "graph") -> None:
        if not isinstance(name, str) or not _NAME_PATTERN.match(name):
            raise PipelineError(f"graph name {name!r} is not valid; use letters, digits, '_' or '-'")
        self.name = name
        self._nodes: dict[str, Node] = {}  # sources and operators (unions and joins too): one namespace
        # Sinks have their own: a sink may take the name of the stream that feeds it.
        self._sinks: dict[str, Node] = {}

    @classmethod
    def from_pipeline(cls, pipeline: Pipeline, source: str = "source", sink: str = "sink") -> StreamGraph:
        """The chain `pipeline` as a graph: one source, its operators in order, one sink. An
        operator named like an end gets that end's name followed by `_`."""
        pipeline.check_not_empty()
        graph = cls(pipeline.name if _NAME_PATTERN.match(pipeline.name) else "pipeline")
        while source in pipeline.names:
            source += "_"
        while sink in pipeline.names or sink == source:
            sink += "_"
        stream = graph.source(source)
        for operator in pipeline.operators:
            stream = graph.add_operator(operator, inputs=[stream])
        stream.sink(sink)
        return graph

    # --- building ----------------------------------------------------------------------------
    def source(self, name: str, schema: SchemaSpec = None) -> Stream:
        """A named input stream. `schema` lets `check()` verify fields before any data is bound;
        without it the fields are checked when the source is bound at run time."""
        self._register(Node(name, NodeKind.SOURCE, schema=to_arrow_schema(schema, f"source {name!r}")))
        return Stream(self, name)

    def add(self, method: str, name: str, fn=None, *, inputs: Sequence[StreamLike], **options) -> Stream:
        """Low level: an operator built as `Pipeline.<method>(name, fn, **options)` would build it
        (`Pipeline.event_time(field=..., lateness=..., name=name)`; window, aggregate and
        deduplicate take no fn), reading the named nodes `inputs` (exactly one; they may be added
        later: then its event time is checked by `check()`)."""
        if method not in OPERATOR_METHODS:
            raise PipelineError(f"operator {name!r}: unknown method {method!r}; use one of {', '.join(OPERATOR_METHODS)}")
        scratch = _OperatorBuilder(self.name)
        if method in FUNCTIONLESS_METHODS:
            if fn is not None:
                raise PipelineError(f"operator {name!r} ({method}) takes no function; pass its keyword arguments "
                                    f"(docs/pipeline-api.md, Time)")
            if method == "event_time":
                scratch.event_time(options.pop("field", None), name=name, **options)
            else:
                getattr(scratch, method)(name, **options)
        else:
            getattr(scratch, method)(name, fn, **options)  # every check of the chain API, same messages
        inputs = self._input_names(name, inputs)
        if len(inputs) != 1:
            raise PipelineError(
                f"operator {name!r} ({method}) reads {len(inputs)} streams ({', '.join(inputs) or 'none'}); an "
                f"operator reads exactly one: merge streams first with graph.union(...) or graph.join(...)")
        operator = scratch.operators[0]
        if operator.time is not None:
            upstream = upstream_declaration(self, inputs[0])
            if upstream != "unknown":
                check_time_operator(operator, upstream, None, f"its input {inputs[0]!r}")
        self._register(Node(name, NodeKind.OPERATOR, inputs, operator=operator))
        return Stream(self, name)

    def add_operator(self, operator: Operator, *, inputs: Sequence[StreamLike]) -> Stream:
        """An operator already built (by a `Pipeline`), reading the one stream in `inputs`."""
        names = self._input_names(operator.name, inputs)
        if len(names) != 1:
            raise PipelineError(f"operator {operator.name!r} reads {len(names)} streams; an operator reads exactly one")
        self._register(Node(operator.name, NodeKind.OPERATOR, names, operator=operator))
        return Stream(self, operator.name)

    def union(self, name: str, *streams: StreamLike) -> Stream:
        """The records of all `streams` as one stream (fan-in); their schemas must agree."""
        inputs = self._input_names(name, streams)
        if len(inputs) < 2:
            raise PipelineError(f"union {name!r} merges {len(inputs)} stream(s); give it two or more")
        if len(set(inputs)) != len(inputs):
            raise PipelineError(f"union {name!r} names a stream twice ({', '.join(inputs)}); each record would "
                                f"come out twice: name every stream once")
        self._register(Node(name, NodeKind.UNION, inputs))
        return Stream(self, name)

    def join(self, name: str, left: StreamLike, right: StreamLike, *, key: str | Sequence[str],
             window: TumblingWindow, fn: Callable[[dict, dict], typing.Any], schema: SchemaSpec,
             state_version: int = 1) -> Stream:
        """Keyed windowed inner join of two streams (see the module docstring for its semantics).

        `fn(left_record, right_record)` returns the joined record (a dict of `schema`), several
        (an iterable) or None; `key` names fields both sides have, with the same types.
        `state_version`: as for `Pipeline.partitioned`.
        """
        fields = _normalize_key(name, key)
        if not isinstance(window, (TumblingWindow, Tumbling)):
            raise PipelineError(f"join {name!r}: window must be Tumbling(size) (with the event time declared "
                                f"upstream) or TumblingWindow(time_field, size, lateness), got {window!r}")
        check_join_fn(name, fn)
        check_state_version(f"join {name!r}", state_version)
        declared = to_arrow_schema(schema, f"join {name!r}")
        if declared is None:
            raise PipelineError(f"join {name!r}: declare the schema= of the records fn returns")
        inputs = self._input_names(name, (left, right))
        if isinstance(window, Tumbling):
            window = join_window(self, name, window, inputs)
        if inputs[0] == inputs[1]:
            raise PipelineError(f"join {name!r} joins stream {inputs[0]!r} with itself; self-joins are not "
                                f"supported: fan the stream out through two operators (e.g. two maps) and join those")
        self._register(Node(name, NodeKind.JOIN, inputs, join=JoinSpec(fields, window, fn, declared, state_version)))
        return Stream(self, name)

    def sink(self, name: str, stream: StreamLike | None) -> StreamGraph:
        """A named output fed by `stream`; bound to a real sink by name at run time. Its name may
        be the name of the stream that feeds it (`counts.sink("counts")`), no other node's."""
        inputs = self._input_names(name, [] if stream is None else [stream])
        self._register(Node(name, NodeKind.SINK, inputs))
        return self

    def _input_names(self, name: str, streams: Iterable[StreamLike]) -> tuple[str, ...]:
        names = []
        for stream in streams:
            if isinstance(stream, Stream):
                if stream.graph is not self:
                    raise PipelineError(f"{name!r}: stream {stream.name!r} belongs to graph {stream.graph.name!r}, "
                                        f"not {self.name!r}; build both in one StreamGraph")
                names.append(stream.name)
            elif isinstance(stream, str) and stream:
                names.append(stream)
            else:
                raise PipelineError(f"{name!r}: inputs must be Stream handles or node names, got {stream!r}")
        return tuple(names)

    def _register(self, node: Node) -> None:
        if not isinstance(node.name, str) or not _NAME_PATTERN.match(node.name):
            raise PipelineError(f"{node.kind.value} name {node.name!r} is not valid; use letters, digits, '_' or '-', "
                                f"starting with a letter or '_'")
        if node.name.startswith(RESERVED_FIELD_PREFIX):
            raise PipelineError(f"{node.kind.value} name {node.name!r} uses the prefix {RESERVED_FIELD_PREFIX!r} "
                                f"that fissure reserves")
        if node.kind is NodeKind.SINK:
            if node.name in self._sinks:
                raise PipelineError(f"sink name {node.name!r} is used twice in graph {self.name!r}; give each sink "
                                    f"its own name")
            namesake = self._nodes.get(node.name)
            if namesake is not None and node.inputs and node.inputs != (node.name,):
                raise _sink_namesake_error(self.name, node, namesake)
            self._sinks[node.name] = node
            return
        existing = self._nodes.get(node.name)
        if existing is not None:
            raise PipelineError(f"name {node.name!r} is used twice in graph {self.name!r} ({_article(existing.kind.value)} "
                                f"and {_article(node.kind.value)}); sources and operators (unions and joins too) "
                                f"share one namespace: give each its own name (a sink may share the name of the "
                                f"stream that feeds it)")
        sink = self._sinks.get(node.name)
        if sink is not None and sink.inputs and sink.inputs != (node.name,):
            raise _sink_namesake_error(self.name, sink, node)
        self._nodes[node.name] = node

    # --- reading -----------------------------------------------------------------------------
    @property
    def nodes(self) -> tuple[Node, ...]:
        """Every node: the sources and operators, then the sinks (a sink may share the name of the
        stream that feeds it)."""
        return tuple(self._nodes.values()) + tuple(self._sinks.values())

    def node(self, name: str) -> Node:
        """The source or operator `name`, else the sink `name` (a sink's own: `sink_node`)."""
        node = self._nodes.get(name) or self._sinks.get(name)
        if node is None:
            raise PipelineError(f"graph {self.name!r} has no node {name!r}; it has "
                                f"{', '.join(dict.fromkeys([*self._nodes, *self._sinks]))}")
        return node

    def sink_node(self, name: str) -> Node:
        """The sink `name` (its input: the stream whose records it receives)."""
        try:
            return self._sinks[name]
        except KeyError:
            raise PipelineError(f"graph {self.name!r} has no sink {name!r}; its sinks are "
                                f"{', '.join(self._sinks) or 'none'}") from None

    def _of_kind(self, kind: NodeKind) -> tuple[str, ...]:
        return tuple(node.name for node in self._nodes.values() if node.kind is kind)

    @property
    def sources(self) -> tuple[str, ...]:
        return self._of_kind(NodeKind.SOURCE)

    @property
    def sinks(self) -> tuple[str, ...]:
        return tuple(self._sinks)

    def consumers(self, name: str) -> tuple[str, ...]:
        """The operators (unions and joins too) that read `name`'s output, in the order they were
        added; the sinks it feeds are `sinks_of(name)`."""
        return tuple(node.name for node in self._nodes.values() if name in node.inputs)

    def sinks_of(self, name: str) -> tuple[str, ...]:
        """The sinks `name`'s output feeds."""
        return tuple(sink.name for sink in self._sinks.values() if sink.inputs == (name,))

    def __repr__(self) -> str:
        return f"StreamGraph({self.name!r}: {len(self.nodes)} nodes, sinks {', '.join(self.sinks) or 'none'})"

    # --- the program as the planner sees it --------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        """The operators (operator, union and join nodes) in execution order: the order in which a
        plan lists them. A micro-batch runs the graph's stateless operators in the earliest
        stateless stage after their inputs exist and each keyed operator in a stage of its own
        (`execution_stages`); this order lists the stages one after the other."""
        return tuple(name for stage in self.execution_stages() for name in stage)

    def execution_stages(self) -> tuple[tuple[str, ...], ...]:
        """The operators grouped as one micro-batch runs them, in order: S_0 K_1 S_1 K_2 ..., where
        K_i is the i-th keyed node in topological order and S_i holds every stateless node whose
        inputs all exist once K_i has run (a source's records exist at once). Empty stages are left
        out. Raises PipelineError if the graph cannot run (`check`)."""
        order = self.check().order
        available: dict[str, int] = {}  # node -> the stateless stage after which its output exists
        stateless: dict[int, list[str]] = {}
        keyed: list[str] = []
        for name in order:
            node = self._nodes[name]
            if node.kind is NodeKind.SOURCE:
                available[name] = 0
            elif node.kind is NodeKind.SINK:
                continue
            elif node.keyed:
                keyed.append(name)
                available[name] = len(keyed)
            else:
                available[name] = max(available[source] for source in node.inputs)
                stateless.setdefault(available[name], []).append(name)
        stages: list[tuple[str, ...]] = []
        for index in range(len(keyed) + 1):
            if index > 0:
                stages.append((keyed[index - 1],))
            if stateless.get(index):
                stages.append(tuple(stateless[index]))
        return tuple(stages)

    @property
    def operators(self) -> tuple[Operator, ...]:
        """The user's operators (not unions or joins), in execution order, as a Pipeline lists its own."""
        return tuple(self._nodes[name].operator for name in self.names if self._nodes[name].operator is not None)

    def as_chain(self) -> Pipeline | None:
        """The graph as a Pipeline when it is a chain (one source, one sink, operators one after
        the other, no union or join), else None: what runs a chain runs it."""
        if len(self.sources) != 1 or len(self.sinks) != 1:
            return None
        operators, stream = [], self.sources[0]
        while True:
            consumers, sinks = self.consumers(stream), self.sinks_of(stream)
            if len(consumers) + len(sinks) != 1:
                return None
            if sinks:
                break
            node = self._nodes[consumers[0]]
            if node.kind is not NodeKind.OPERATOR:
                return None
            operators.append(node.operator)
            stream = node.name
        if not operators:
            return None
        return Pipeline.of_operators(self.name, operators)

    def operator(self, name: str) -> Node:
        """The operator, union or join node `name` (a source or sink is not an operator)."""
        node = self.node(name)
        if node.kind in (NodeKind.SOURCE, NodeKind.SINK):
            raise PipelineError(f"{node.describe()} is not an operator of graph {self.name!r}")
        return node

    def kind_of(self, name: str) -> Kind:
        return self.operator(name).state_kind

    def key_of(self, name: str) -> tuple[str, ...] | None:
        return self.operator(name).key

    def input_rates(self, estimates: Mapping[str, OperatorEstimate] | None = None) -> dict[str, float]:
        """Records entering each operator per record entering the graph (the sources share the
        input equally until profiles say otherwise): a node's output rate is its input rate times
        its selectivity (a union passes all, a join's selectivity is per record of either side)."""
        estimates = estimates or {}
        output: dict[str, float] = {}
        rates: dict[str, float] = {}
        order = self.check().order
        sources = self.sources
        for name in order:
            node = self._nodes[name]
            if node.kind is NodeKind.SOURCE:
                output[name] = 1.0 / len(sources)
            elif node.kind is not NodeKind.SINK:
                rates[name] = sum(output[source] for source in node.inputs)
                output[name] = rates[name] * self._selectivity(node, estimates)
        return rates

    def operator_stats(self, estimates: Mapping[str, OperatorEstimate] | None = None) -> list[OperatorStats]:
        """The planner's input: the operators in execution order (`names`) as a chain whose
        selectivities reproduce each operator's input rate in the graph, so that the chain model's
        load of an operator, its cost times the records it receives, is the graph's. Costs and
        selectivities come from `estimates`, else the operators' hints, else the defaults."""
        estimates = estimates or {}
        unknown = sorted(set(estimates) - set(self.names))
        if unknown:
            raise PipelineError(f"estimates name operators graph {self.name!r} does not have: {', '.join(unknown)}")
        from fissure.program.combine_policy import combine_decision  # it imports aggregates, which import fissure.program.chain

        names = self.names
        rates = self.input_rates(estimates)
        stats = []
        for position, name in enumerate(names):
            node = self._nodes[name]
            if position + 1 < len(names):
                selectivity = max(rates[names[position + 1]], MIN_PLANNED_RATE) / max(rates[name], MIN_PLANNED_RATE)
            else:
                selectivity = self._selectivity(node, estimates)
            max_scale = node.operator.hints.max_scale if node.operator is not None else None
            combined = node.operator is not None and combine_decision(
                node.operator, sole_reader=self.consumers(node.inputs[0]) == (name,)
                and not self.sinks_of(node.inputs[0])).combine
            stats.append(OperatorStats(name=name, kind=node.state_kind, cost_us=self._cost_us(node, estimates),
                                       selectivity=selectivity, key=node.key if node.state_kind is Kind.PARTITIONED
                                       else None, max_scale=max_scale, combined=combined))
        return stats

    @staticmethod
    def _cost_us(node: Node, estimates: Mapping[str, OperatorEstimate]) -> float:
        if node.name in estimates:
            return estimates[node.name].cost_us
        if node.operator is not None and node.operator.hints.cost_us is not None:
            return node.operator.hints.cost_us
        return UNION_COST_US if node.kind is NodeKind.UNION else DEFAULT_COST_US

    @staticmethod
    def _selectivity(node: Node, estimates: Mapping[str, OperatorEstimate]) -> float:
        if node.name in estimates:
            return estimates[node.name].selectivity
        if node.operator is not None and node.operator.hints.selectivity is not None:
            return node.operator.hints.selectivity
        return DEFAULT_SELECTIVITY

    # --- checking ----------------------------------------------------------------------------
    def check(self, source_schemas: Mapping[str, pa.Schema] | None = None) -> GraphLayout:
        """Check the graph (and, where source schemas are known, every field it uses); returns its
        topological order and stream schemas. Raises PipelineError naming the node and the fix.

        `source_schemas` gives (or overrides) source schemas, e.g. those of the bound data.
        """
        self._check_structure()
        order = self._topological_order()
        self._check_connected(order)
        known = {name: node.schema for name, node in self._nodes.items() if node.kind is NodeKind.SOURCE}
        for name, schema in (source_schemas or {}).items():
            if name not in known:
                raise PipelineError(f"graph {self.name!r} has no source {name!r}; its sources are "
                                    f"{', '.join(self.sources)}")
            for field_name in schema.names:
                if field_name.startswith(RESERVED_FIELD_PREFIX):
                    raise PipelineError(f"source {name!r} has a field {field_name!r}; the prefix "
                                        f"{RESERVED_FIELD_PREFIX!r} is reserved by fissure")
            known[name] = schema
        schemas = self._schemas(order, known)
        return GraphLayout(tuple(order), schemas, graph_time(self, order, schemas))

    def _check_structure(self) -> None:
        if not self._nodes:
            raise PipelineError(f"graph {self.name!r} is empty; add a source with graph.source(...)")
        if not self._sinks:
            raise PipelineError(f"graph {self.name!r} has no sink, so nothing it computes is kept; end each branch "
                                f"with stream.sink('name')")
        for node in self.nodes:
            if node.kind is NodeKind.SINK and not node.inputs:
                raise PipelineError(f"sink {node.name!r} is fed by nothing; give it a stream: graph.sink({node.name!r}, stream)")
            for name in node.inputs:
                if name in self._nodes:
                    continue
                if name in self._sinks:
                    raise PipelineError(f"{node.describe()} reads sink {name!r}; a sink has no output: read the stream "
                                        f"that feeds the sink instead ({', '.join(self._sinks[name].inputs)})")
                raise PipelineError(f"{node.describe()} reads {name!r}, which graph {self.name!r} does not have; "
                                    f"add it, or read one of {', '.join(n for n in self._nodes if n != node.name)}")

    def _topological_order(self) -> list[str]:
        remaining = {name: len(node.inputs) for name, node in self._nodes.items()}
        ready = [name for name, count in remaining.items() if count == 0]
        order = []
        while ready:
            name = ready.pop(0)
            order.append(name)
            for consumer in self.consumers(name):
                remaining[consumer] -= self._nodes[consumer].inputs.count(name)
                if remaining[consumer] == 0:
                    ready.append(consumer)
        if len(order) < len(self._nodes):
            cycle = self._find_cycle(set(self._nodes) - set(order))
            raise PipelineError(f"graph {self.name!r} has a cycle: {' -> '.join(cycle)}; a stream may not feed back "
                                f"into its own upstream: keep what must flow back in a stateful operator's state")
        return order

    def _find_cycle(self, candidates: set[str]) -> list[str]:
        start = min(candidates, key=list(self._nodes).index)
        path, seen = [start], {start}
        while True:  # every unordered node has an unordered input: walk inputs until one repeats
            following = next(name for name in self._nodes[path[-1]].inputs if name in candidates)
            if following in seen:
                cycle = path[path.index(following):] + [following]
                return list(reversed(cycle))
            path.append(following)
            seen.add(following)

    def _check_connected(self, order: list[str]) -> None:
        reaches_sink: set[str] = set()
        for name in reversed(order):
            if self.sinks_of(name) or any(consumer in reaches_sink for consumer in self.consumers(name)):
                reaches_sink.add(name)
        for name in order:
            node = self._nodes[name]
            if node.kind is NodeKind.SOURCE and not self.consumers(name) and not self.sinks_of(name):
                raise PipelineError(f"source {name!r} is read by nothing; connect it (e.g. graph.source({name!r}).map(...)"
                                    f" ... .sink(...)) or remove it")
            if name not in reaches_sink:
                raise PipelineError(f"{node.describe()} is unconnected: its output reaches no sink, so its work would "
                                    f"be lost; end its branch with .sink('name') or remove it")

    def _schemas(self, order: list[str], known: Mapping[str, pa.Schema | None]) -> dict[str, pa.Schema | None]:
        schemas: dict[str, pa.Schema | None] = {}
        for name in order:
            node = self._nodes[name]
            if node.kind is NodeKind.SOURCE:
                schemas[name] = known[name]
            elif node.kind is NodeKind.UNION:
                schemas[name] = _union_schema(node, [(source, schemas[source]) for source in node.inputs])
            elif node.kind is NodeKind.JOIN:
                check_join_inputs(node.name, node.join, schemas[node.inputs[0]], schemas[node.inputs[1]], node.inputs)
                schemas[name] = node.join.schema
            else:
                upstream = schemas[node.inputs[0]]
                if upstream is not None:
                    _check_operator_fields(node.operator, upstream, node.inputs[0])
                schemas[name] = output_schema(node.operator, upstream)
        return schemas


def _sink_namesake_error(graph: str, sink: Node, namesake: Node) -> PipelineError:
    fed_by = sink.inputs[0]
    return PipelineError(
        f"sink {sink.name!r} of graph {graph!r} is fed by {fed_by!r}, but {sink.name!r} is the name of "
        f"{namesake.describe()}; a sink may take the name of the stream that feeds it and no other node's: name it "
        f"{fed_by!r} or give it a name of its own (e.g. {fed_by + '_out'!r})")


def _article(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _check_operator_fields(operator: Operator, upstream: pa.Schema, upstream_name: str) -> None:
    check_operator_fields(operator, upstream, f"its input {upstream_name!r}")


def _union_schema(node: Node, inputs: list[tuple[str, pa.Schema | None]]) -> pa.Schema | None:
    known = [(name, schema) for name, schema in inputs if schema is not None]
    if len(known) < len(inputs):
        return None
    first_name, first = known[0]
    for name, schema in known[1:]:
        if not _same_fields(first, schema):
            raise PipelineError(
                f"union {node.name!r}: stream {name!r} has fields ({_fields_text(schema)}) but {first_name!r} has "
                f"({_fields_text(first)}); every stream of a union needs the same field names and types: map them "
                f"to one schema before the union")
    return first


def _same_fields(first: pa.Schema, second: pa.Schema) -> bool:
    return sorted((f.name, str(f.type)) for f in first) == sorted((f.name, str(f.type)) for f in second)


def _fields_text(schema: pa.Schema) -> str:
    return ", ".join(f"{field.name}: {field.type}" for field in schema)


class _OperatorBuilder(Pipeline):
    """A Pipeline that builds one operator for a graph: the graph checks its event time."""

    def _check_time(self, operator: Operator) -> None:
        pass


def as_graph(program: Pipeline | StreamGraph) -> StreamGraph:
    """Any program as a graph: a StreamGraph as it is, a Pipeline through `from_pipeline`."""
    if isinstance(program, StreamGraph):
        return program
    if isinstance(program, Pipeline):
        return StreamGraph.from_pipeline(program)
    raise PipelineError(f"a program is a fissure.Pipeline or a fissure.StreamGraph, got {type(program).__name__}")
