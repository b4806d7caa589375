"""Whether a program's graph can run (`StreamGraph.check`): every input exists, no cycle, every
node reaches a sink, every operator gets the fields it reads, a union's streams agree, a join's
sides have its key and time fields, and the time rules hold (fissure.program.time_rules). Each
refusal is a PipelineError naming the node and the fix."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from fissure.program.joins import check_join_inputs
from fissure.program.nodes import Node, NodeKind
from fissure.program.operators import RESERVED_FIELD_PREFIX, PipelineError, check_operator_fields
from fissure.program.time_rules import TimeLayout, graph_time, output_schema


@dataclass(frozen=True)
class GraphLayout:
    """A checked graph: its sources and operators (not its sinks) in topological order and the
    schema of every stream they make (None where a source's schema is not known yet); a sink's
    records are its stream's (`graph.sink_node(name).inputs[0]`)."""

    order: tuple[str, ...]
    schemas: Mapping[str, pa.Schema | None]
    time: TimeLayout = TimeLayout()  # the time-aware operators' event-time fields, lateness, horizon


def check_graph(graph, source_schemas: Mapping[str, pa.Schema] | None = None) -> GraphLayout:
    """`StreamGraph.check`: the graph's topological order and stream schemas (see its docstring)."""
    nodes = {node.name: node for node in graph.nodes if node.kind is not NodeKind.SINK}
    sinks = {node.name: node for node in graph.nodes if node.kind is NodeKind.SINK}
    _check_structure(graph, nodes, sinks)
    order = _topological_order(graph, nodes)
    _check_connected(graph, nodes, order)
    known = {name: node.schema for name, node in nodes.items() if node.kind is NodeKind.SOURCE}
    for name, schema in (source_schemas or {}).items():
        if name not in known:
            raise PipelineError(f"graph {graph.name!r} has no source {name!r}; its sources are "
                                f"{', '.join(graph.sources)}")
        for field_name in schema.names:
            if field_name.startswith(RESERVED_FIELD_PREFIX):
                raise PipelineError(f"source {name!r} has a field {field_name!r}; the prefix "
                                    f"{RESERVED_FIELD_PREFIX!r} is reserved by fissure")
        known[name] = schema
    schemas = _schemas(nodes, order, known)
    return GraphLayout(tuple(order), schemas, graph_time(graph, order, schemas))


def _check_structure(graph, nodes: Mapping[str, Node], sinks: Mapping[str, Node]) -> None:
    if not nodes:
        raise PipelineError(f"graph {graph.name!r} is empty; add a source with graph.source(...)")
    if not sinks:
        raise PipelineError(f"graph {graph.name!r} has no sink, so nothing it computes is kept; end each branch "
                            f"with stream.sink('name')")
    for node in graph.nodes:
        if node.kind is NodeKind.SINK and not node.inputs:
            raise PipelineError(f"sink {node.name!r} is fed by nothing; give it a stream: graph.sink({node.name!r}, stream)")
        for name in node.inputs:
            if name in nodes:
                continue
            if name in sinks:
                raise PipelineError(f"{node.describe()} reads sink {name!r}; a sink has no output: read the stream "
                                    f"that feeds the sink instead ({', '.join(sinks[name].inputs)})")
            raise PipelineError(f"{node.describe()} reads {name!r}, which graph {graph.name!r} does not have; "
                                f"add it, or read one of {', '.join(n for n in nodes if n != node.name)}")


def _topological_order(graph, nodes: Mapping[str, Node]) -> list[str]:
    remaining = {name: len(node.inputs) for name, node in nodes.items()}
    ready = [name for name, count in remaining.items() if count == 0]
    order = []
    while ready:
        name = ready.pop(0)
        order.append(name)
        for consumer in graph.consumers(name):
            remaining[consumer] -= nodes[consumer].inputs.count(name)
            if remaining[consumer] == 0:
                ready.append(consumer)
    if len(order) < len(nodes):
        cycle = _find_cycle(nodes, set(nodes) - set(order))
        raise PipelineError(f"graph {graph.name!r} has a cycle: {' -> '.join(cycle)}; a stream may not feed back "
                            f"into its own upstream: keep what must flow back in a stateful operator's state")
    return order


def _find_cycle(nodes: Mapping[str, Node], candidates: set[str]) -> list[str]:
    start = min(candidates, key=list(nodes).index)
    path, seen = [start], {start}
    while True:  # every unordered node has an unordered input: walk inputs until one repeats
        following = next(name for name in nodes[path[-1]].inputs if name in candidates)
        if following in seen:
            cycle = path[path.index(following):] + [following]
            return list(reversed(cycle))
        path.append(following)
        seen.add(following)


def _check_connected(graph, nodes: Mapping[str, Node], order: list[str]) -> None:
    reaches_sink: set[str] = set()
    for name in reversed(order):
        if graph.sinks_of(name) or any(consumer in reaches_sink for consumer in graph.consumers(name)):
            reaches_sink.add(name)
    for name in order:
        node = nodes[name]
        if node.kind is NodeKind.SOURCE and not graph.consumers(name) and not graph.sinks_of(name):
            raise PipelineError(f"source {name!r} is read by nothing; connect it (e.g. graph.source({name!r}).map(...)"
                                f" ... .sink(...)) or remove it")
        if name not in reaches_sink:
            raise PipelineError(f"{node.describe()} is unconnected: its output reaches no sink, so its work would "
                                f"be lost; end its branch with .sink('name') or remove it")


def _schemas(nodes: Mapping[str, Node], order: list[str],
             known: Mapping[str, pa.Schema | None]) -> dict[str, pa.Schema | None]:
    schemas: dict[str, pa.Schema | None] = {}
    for name in order:
        node = nodes[name]
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
                check_operator_fields(node.operator, upstream, f"its input {node.inputs[0]!r}")
            schemas[name] = output_schema(node.operator, upstream)
    return schemas


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
