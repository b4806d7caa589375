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

This graph is the one program model: a chain (`fissure.Pipeline`) is a face over a graph of one
source, its operators one after the other and one sink, and every runner takes the graph
(`as_graph`). A `Stream` has the same builder methods as the chain (fissure.program.builder_methods:
map, filter, flat_map, map_batches, filter_batches, partitioned, stateful, and for time
event_time, window, aggregate, deduplicate) with the same arguments and checks; each returns the
new operator's output stream. Using one handle in several places is fan-out. Sources are bound to
data by name at run time (`run_local`, `fissure.run`). How a graph is checked:
fissure.program.graph_checks; how the planner sees it: fissure.program.planner_view.

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

import pyarrow as pa

from fissure.model.types import Kind, OperatorStats
from fissure.program.builder_methods import OperatorMethods
from fissure.program.graph_checks import GraphLayout, check_graph
from fissure.program.joins import JoinSpec, TumblingWindow, check_join_fn
from fissure.program.nodes import Node, NodeKind
from fissure.program.operators import (NAME_PATTERN, RESERVED_FIELD_PREFIX, Operator, OperatorEstimate, PipelineError,
                                       SchemaSpec, check_state_version, normalize_key, to_arrow_schema)
from fissure.program.planner_view import execution_stages, input_rates, operator_stats
from fissure.program.time_rules import check_time_operator, join_window, upstream_declaration
from fissure.program.windows import Tumbling

# The builder methods `StreamGraph.add` takes by name, with the same arguments.
OPERATOR_METHODS = ("map", "filter", "flat_map", "map_batches", "filter_batches", "partitioned", "stateful",
                    "event_time", "window", "aggregate", "deduplicate")
# Those of them that take no function: their arguments are all keywords (docs/pipeline-api.md, Time).
FUNCTIONLESS_METHODS = ("event_time", "window", "aggregate", "deduplicate")


class Stream(OperatorMethods):
    """The output of a source, operator, union or join; use it as the input of what follows. Its
    builder methods (fissure.program.builder_methods) each return the new operator's stream."""

    def __init__(self, graph: StreamGraph, name: str) -> None:
        self.graph = graph
        self.name = name

    def __repr__(self) -> str:
        return f"Stream({self.graph.name!r}.{self.name})"

    def _check_unique(self, name: str) -> None:
        pass  # the graph refuses a taken name, in its namespace's words, as it registers the node

    def _names_taken(self) -> Iterable[str]:
        return self.graph._nodes  # `event_time` picks its default name in the graph's namespace

    def _place(self, operator: Operator) -> Stream:
        return self.graph._add_built(operator, [self], operator.action.value)

    def sink(self, name: str) -> StreamGraph:
        """A named sink fed by this stream; bound to a real sink by name at run time."""
        return self.graph.sink(name, self)


StreamLike = typing.Union[Stream, str]


class StreamGraph:
    """A stream program as a directed acyclic graph of named nodes. See the module docstring."""

    def __init__(self, name: str = "graph") -> None:
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise PipelineError(f"graph name {name!r} is not valid; use letters, digits, '_' or '-'")
        self.name = name
        self._nodes: dict[str, Node] = {}  # sources and operators (unions and joins too): one namespace
        # Sinks have their own: a sink may take the name of the stream that feeds it.
        self._sinks: dict[str, Node] = {}

    @classmethod
    def from_pipeline(cls, pipeline) -> StreamGraph:
        """The chain `pipeline` (a fissure.Pipeline) as a graph of its own: a copy of the graph it
        builds, one source, its operators in order, one sink (named `source` and `sink`; an end
        named like an operator gets `_` appended)."""
        return pipeline.as_graph().copy()

    def copy(self) -> StreamGraph:
        """A graph of the same nodes (which are immutable) that grows apart from this one."""
        graph = StreamGraph(self.name)
        graph._nodes, graph._sinks = dict(self._nodes), dict(self._sinks)
        return graph

    # --- building ----------------------------------------------------------------------------
    def source(self, name: str, schema: SchemaSpec = None) -> Stream:
        """A named input stream. `schema` lets `check()` verify fields before any data is bound;
        without it the fields are checked when the source is bound at run time."""
        self._register(Node(name, NodeKind.SOURCE, schema=to_arrow_schema(schema, f"source {name!r}")))
        return Stream(self, name)

    def add(self, method: str, name: str, fn=None, *, inputs: Sequence[StreamLike], **options) -> Stream:
        """Low level: an operator built as `Stream.<method>(name, fn, **options)` would build it
        (`event_time(field=..., lateness=..., name=name)`; window, aggregate and deduplicate take
        no fn), reading the named nodes `inputs` (exactly one; they may be added later: then its
        event time is checked by `check()`)."""
        if method not in OPERATOR_METHODS:
            raise PipelineError(f"operator {name!r}: unknown method {method!r}; use one of {', '.join(OPERATOR_METHODS)}")
        builder = _OperatorCapture(self)
        if method in FUNCTIONLESS_METHODS:
            if fn is not None:
                raise PipelineError(f"operator {name!r} ({method}) takes no function; pass its keyword arguments "
                                    f"(docs/pipeline-api.md, Time)")
            if method == "event_time":
                operator = builder.event_time(options.pop("field", None), name=name, **options)
            else:
                operator = getattr(builder, method)(name, **options)
        else:
            operator = getattr(builder, method)(name, fn, **options)  # every check of the builder methods
        return self._add_built(operator, inputs, method)

    def add_operator(self, operator: Operator, *, inputs: Sequence[StreamLike]) -> Stream:
        """An operator already built (by a `Pipeline`), reading the one stream in `inputs`."""
        names = self._input_names(operator.name, inputs)
        if len(names) != 1:
            raise PipelineError(f"operator {operator.name!r} reads {len(names)} streams; an operator reads exactly one")
        self._register(Node(operator.name, NodeKind.OPERATOR, names, operator=operator))
        return Stream(self, operator.name)

    def _add_built(self, operator: Operator, inputs: Sequence[StreamLike], method: str) -> Stream:
        """A checked operator reading the one stream in `inputs`, its event time checked against
        what is upstream as far as the graph is built."""
        name = operator.name
        inputs = self._input_names(name, inputs)
        if len(inputs) != 1:
            raise PipelineError(
                f"operator {name!r} ({method}) reads {len(inputs)} streams ({', '.join(inputs) or 'none'}); an "
                f"operator reads exactly one: merge streams first with graph.union(...) or graph.join(...)")
        if operator.time is not None:
            upstream = upstream_declaration(self, inputs[0])
            if upstream != "unknown":
                check_time_operator(operator, upstream, None, f"its input {inputs[0]!r}")
        self._register(Node(name, NodeKind.OPERATOR, inputs, operator=operator))
        return Stream(self, name)

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
        fields = normalize_key(name, key)
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
        if not isinstance(node.name, str) or not NAME_PATTERN.match(node.name):
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

    def _rename_end(self, old: str, new: str) -> None:
        """Rename a source or a sink, in place (the chain builder's ends, when an operator takes an
        end's name); what reads or is fed by it follows."""
        if old in self._sinks:
            self._sinks = {(new if name == old else name): Node(new, NodeKind.SINK, node.inputs) if name == old
                           else node for name, node in self._sinks.items()}
            return
        renamed = {}
        for name, node in self._nodes.items():
            if name == old:
                node = Node(new, node.kind, node.inputs, schema=node.schema)
            elif old in node.inputs:
                node = Node(node.name, node.kind, tuple(new if item == old else item for item in node.inputs),
                            operator=node.operator, join=node.join, schema=node.schema)
            renamed[node.name] = node
        self._nodes = renamed
        self._sinks = {name: Node(name, NodeKind.SINK, tuple(new if item == old else item for item in node.inputs))
                       for name, node in self._sinks.items()}

    def _feed_sink(self, sink: str, stream: str) -> None:
        """Let the sink `sink` read `stream` instead (the chain builder's sink follows its last operator)."""
        self._sinks[sink] = Node(sink, NodeKind.SINK, (stream,))

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

    # --- the program as the planner sees it (fissure.program.planner_view) -----------------------
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
        return execution_stages(self, self.check().order)

    @property
    def operators(self) -> tuple[Operator, ...]:
        """The user's operators (not unions or joins), in execution order."""
        return tuple(self._nodes[name].operator for name in self.names if self._nodes[name].operator is not None)

    @property
    def time_aware(self) -> bool:
        """Whether an operator of the graph is time-aware (a window, an expiring state, ...)."""
        return any(getattr(operator.time, "time_aware", False) for operator in self.operators)

    def chain_operators(self) -> tuple[Operator, ...] | None:
        """The operators in order when the graph is a chain (one source, one sink, operators one
        after the other, no union or join), else None (`fissure.Pipeline.from_graph`)."""
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
        return tuple(operators) or None

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
        """Records entering each operator per record entering the graph (planner_view.input_rates)."""
        return input_rates(self, estimates)

    def operator_stats(self, estimates: Mapping[str, OperatorEstimate] | None = None) -> list[OperatorStats]:
        """The planner's input: the operators in execution order as one chain of statistics whose
        loads are the graph's (planner_view.operator_stats). Costs and selectivities come from
        `estimates`, else the operators' hints, else the defaults."""
        return operator_stats(self, estimates)

    # --- checking (fissure.program.graph_checks) -------------------------------------------------
    def check(self, source_schemas: Mapping[str, pa.Schema] | None = None) -> GraphLayout:
        """Check the graph (and, where source schemas are known, every field it uses); returns its
        topological order and stream schemas. Raises PipelineError naming the node and the fix.

        `source_schemas` gives (or overrides) source schemas, e.g. those of the bound data.
        """
        return check_graph(self, source_schemas)


def _sink_namesake_error(graph: str, sink: Node, namesake: Node) -> PipelineError:
    fed_by = sink.inputs[0]
    return PipelineError(
        f"sink {sink.name!r} of graph {graph!r} is fed by {fed_by!r}, but {sink.name!r} is the name of "
        f"{namesake.describe()}; a sink may take the name of the stream that feeds it and no other node's: name it "
        f"{fed_by!r} or give it a name of its own (e.g. {fed_by + '_out'!r})")


def _article(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


class _OperatorCapture(OperatorMethods):
    """Builds one operator for `StreamGraph.add` with every check of the builder methods, and
    returns it: the graph places it."""

    def __init__(self, graph: StreamGraph) -> None:
        self.graph = graph

    def _check_unique(self, name: str) -> None:
        pass

    def _names_taken(self) -> Iterable[str]:
        return self.graph._nodes

    def _place(self, operator: Operator) -> Operator:
        return operator


def as_graph(program) -> StreamGraph:
    """Any program as its graph, the one model every runner takes: a StreamGraph as it is; a
    chain (fissure.Pipeline: a face over a graph) the graph it built (`program.as_graph()`)."""
    if isinstance(program, StreamGraph):
        return program
    face = getattr(type(program), "as_graph", None)
    if callable(face):
        graph = program.as_graph()
        if isinstance(graph, StreamGraph):
            return graph
    raise PipelineError(f"a program is a fissure.Pipeline or a fissure.StreamGraph, got {type(program).__name__}")
