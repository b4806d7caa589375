"""The chain builder users write: a chain of named operators, each a plain Python function.

    pipeline = (
        Pipeline("logwatch")
        .map("parse", parse_line, schema={"host": str, "user": str, "ts": float}, reads=["value"])
        .filter("failures", lambda record: record["failed"])
        .partitioned("per_host", count_failures, key="host", schema={...})
        .stateful("results", keep_totals)
    )

A Pipeline is a face over the one program model, a StreamGraph (fissure.program.graph): a linear
flow is just a graph, of one source (`source`), the operators one after the other and one sink
(`sink`), as bytewax's Dataflow holds a linear Stream. `pipeline.graph` is that graph, built as
the methods are called, and what every runner takes (`as_graph`). The builder methods, their
arguments and checks are the graph's streams' own (fissure.program.builder_methods); a chain
checks each operator's event time as it is added, knowing everything upstream of it.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable, Mapping

import pyarrow as pa

from fissure.model.types import Kind, OperatorStats
from fissure.program.builder_methods import OperatorMethods
from fissure.program.graph import StreamGraph
from fissure.program.operators import (NAME_PATTERN, RESERVED_FIELD_PREFIX, Operator, OperatorEstimate,
                                       PipelineError, check_operator_fields)
from fissure.program.time_rules import chain_time, check_chain_declarations, output_schema

SOURCE, SINK = "source", "sink"  # a chain's ends in its graph, unless an operator takes the name


class Pipeline(OperatorMethods):
    """A chain of named operators, in the order records flow through them.

    Every builder method returns the pipeline itself, so calls chain; a definition error raises
    PipelineError at once, naming the operator and what to change.
    """

    def __init__(self, name: str = "pipeline") -> None:
        self.name = name
        self.graph = StreamGraph(name if isinstance(name, str) and NAME_PATTERN.match(name) else "pipeline")
        self._source, self._sink = SOURCE, SINK
        self._tail = self.graph.source(SOURCE).name  # the stream the next operator reads
        self.graph.sink(SINK, SOURCE)

    @classmethod
    def of_operators(cls, name: str, operators: Iterable[Operator]) -> Pipeline:
        """A pipeline of operators already built (by a Pipeline or a StreamGraph), in this order."""
        pipeline = cls(name)
        for operator in operators:
            pipeline._check_unique(operator.name)
            pipeline._append(operator)
        return pipeline

    @classmethod
    def from_graph(cls, graph: StreamGraph) -> Pipeline:
        """A chain-shaped graph (one source, one sink, operators one after the other, no union or
        join) as a Pipeline of the same operators; PipelineError for any other graph."""
        operators = graph.chain_operators()
        if operators is None:
            raise PipelineError(f"graph {graph.name!r} is not a chain (one source, operators one after the other, "
                                f"one sink; no fan-out, union or join): run it as the graph it is")
        return cls.of_operators(graph.name, operators)

    # --- the face's part of the builder methods ------------------------------------------------
    def _check_unique(self, name: str) -> None:
        if name in self.names:
            raise PipelineError(f"operator name {name!r} is used twice in pipeline {self.name!r}; give each operator "
                                f"its own name")

    def _names_taken(self) -> Iterable[str]:
        return self.names

    def _place(self, operator: Operator) -> Pipeline:
        if operator.time is not None:  # a chain knows everything upstream of what it adds
            check_chain_declarations(self.name, self.operators, operator)
        self._append(operator)
        return self

    def _append(self, operator: Operator) -> None:
        """Add `operator` after the last one, moving an end its name takes (`source_`, `sink_`)."""
        taken = {*self.names, operator.name}
        if self._source in taken:
            renamed = self._source
            while renamed in taken:
                renamed += "_"
            self.graph._rename_end(self._source, renamed)
            self._tail = renamed if self._tail == self._source else self._tail
            self._source = renamed
        if self._sink in taken:
            renamed = self._sink
            while renamed in taken or renamed == self._source:
                renamed += "_"
            self.graph._rename_end(self._sink, renamed)
            self._sink = renamed
        self.graph.add_operator(operator, inputs=[self._tail])
        self._tail = operator.name
        self.graph._feed_sink(self._sink, self._tail)

    # --- reading the definition ------------------------------------------------------------
    @property
    def operators(self) -> tuple[Operator, ...]:
        return tuple(node.operator for node in self.graph.nodes if node.operator is not None)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(operator.name for operator in self.operators)

    def operator(self, name: str) -> Operator:
        for operator in self.operators:
            if operator.name == name:
                return operator
        raise PipelineError(f"pipeline {self.name!r} has no operator {name!r}; it has {', '.join(self.names)}")

    def kind_of(self, name: str) -> Kind:
        return self.operator(name).kind

    def key_of(self, name: str) -> tuple[str, ...] | None:
        return self.operator(name).key

    def __len__(self) -> int:
        return len(self.operators)

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r}: {' -> '.join(self.names) or 'empty'})"

    def check_not_empty(self) -> None:
        if not self.operators:
            raise PipelineError(f"pipeline {self.name!r} has no operator; add one with .map(...), .filter(...), ...")

    def as_graph(self) -> StreamGraph:
        """The graph this chain is (`graph`), for a runner: PipelineError while it has no operator."""
        self.check_not_empty()
        return self.graph

    def operator_stats(self, estimates: Mapping[str, OperatorEstimate] | None = None) -> list[OperatorStats]:
        """The planner's input, its graph's (StreamGraph.operator_stats): per operator, the estimate
        if given, else the hints, else the defaults."""
        self.check_not_empty()
        unknown = sorted(set(estimates or {}) - set(self.names))
        if unknown:
            raise PipelineError(f"estimates name operators the pipeline does not have: {', '.join(unknown)}")
        return self.graph.operator_stats(estimates)


def output_schemas(pipeline: Pipeline, source_schema: pa.Schema) -> dict[str, pa.Schema]:
    """Each operator's output schema, checking that every operator gets the fields it reads.

    Raises PipelineError naming the operator and the missing or reserved field.
    """
    pipeline.check_not_empty()
    for name in source_schema.names:
        if name.startswith(RESERVED_FIELD_PREFIX):
            raise PipelineError(f"the source has a field {name!r}; the prefix {RESERVED_FIELD_PREFIX!r} is reserved by fissure")
    schemas: dict[str, pa.Schema] = {}
    upstream, upstream_label = source_schema, "the source"
    operators: typing.Sequence[Operator] = pipeline.operators
    for operator in operators:
        check_operator_fields(operator, upstream, f"its input from {upstream_label}")
        schemas[operator.name] = output_schema(operator, upstream)
        upstream, upstream_label = schemas[operator.name], f"operator {operator.name!r}"
    chain_time(operators, schemas, source_schema)
    return schemas
