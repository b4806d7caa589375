"""A program's graph as the planner sees it: the stages one micro-batch runs (`execution_stages`),
the records each operator receives (`input_rates`) and the planner's input, the operators in
execution order as one chain of statistics (`operator_stats`). Costs and selectivities come from
estimates (profiles), else the operators' hints, else the defaults: DEFAULT_COST_US per record,
selectivity DEFAULT_SELECTIVITY (a filter without a hint counts as 1.0: the planner then
over-provisions what follows it, never under)."""

from __future__ import annotations

import typing
from collections.abc import Mapping

from fissure.model.types import Kind, OperatorStats
from fissure.program.combine_policy import combine_decision
from fissure.program.nodes import Node, NodeKind
from fissure.program.operators import DEFAULT_COST_US, DEFAULT_SELECTIVITY, OperatorEstimate, PipelineError

# A union only concatenates its inputs' batches: the planner's cost for it until profiles exist.
UNION_COST_US = 0.5
# The smallest input rate (records per record entering the graph) the planner gives an operator,
# so that a branch that receives nothing keeps a finite selectivity in the chain the planner sees.
MIN_PLANNED_RATE = 1e-6


def execution_stages(graph, order: typing.Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """`StreamGraph.execution_stages`, given the graph's topological order."""
    available: dict[str, int] = {}  # node -> the stateless stage after which its output exists
    stateless: dict[int, list[str]] = {}
    keyed: list[str] = []
    for name in order:
        node = graph.node(name)
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


def input_rates(graph, estimates: Mapping[str, OperatorEstimate] | None = None) -> dict[str, float]:
    """Records entering each operator per record entering the graph (the sources share the input
    equally until profiles say otherwise): a node's output rate is its input rate times its
    selectivity (a union passes all, a join's selectivity is per record of either side)."""
    estimates = estimates or {}
    output: dict[str, float] = {}
    rates: dict[str, float] = {}
    sources = graph.sources
    for name in graph.check().order:
        node = graph.node(name)
        if node.kind is NodeKind.SOURCE:
            output[name] = 1.0 / len(sources)
        elif node.kind is not NodeKind.SINK:
            rates[name] = sum(output[source] for source in node.inputs)
            output[name] = rates[name] * _selectivity(node, estimates)
    return rates


def operator_stats(graph, estimates: Mapping[str, OperatorEstimate] | None = None) -> list[OperatorStats]:
    """The planner's input: the operators in execution order (`graph.names`) as a chain whose
    selectivities reproduce each operator's input rate in the graph, so that the chain model's
    load of an operator, its cost times the records it receives, is the graph's. Where the next
    operator reads this one alone (every link of a chain), that is the operator's own selectivity."""
    estimates = estimates or {}
    names = graph.names
    unknown = sorted(set(estimates) - set(names))
    if unknown:
        raise PipelineError(f"estimates name operators graph {graph.name!r} does not have: {', '.join(unknown)}")
    rates = input_rates(graph, estimates)
    stats = []
    for position, name in enumerate(names):
        node = graph.node(name)
        following = graph.node(names[position + 1]) if position + 1 < len(names) else None
        if following is None or following.inputs == (name,):
            selectivity = _selectivity(node, estimates)
        else:
            selectivity = max(rates[following.name], MIN_PLANNED_RATE) / max(rates[name], MIN_PLANNED_RATE)
        max_scale = node.operator.hints.max_scale if node.operator is not None else None
        # combinable when a pe or keyed stage runs before it (which one depends on the plan)
        combined = node.operator is not None and combine_decision(
            node.operator, sole_reader=graph.consumers(node.inputs[0]) == (name,)
            and not graph.sinks_of(node.inputs[0])).combine
        stats.append(OperatorStats(name=name, kind=node.state_kind, cost_us=_cost_us(node, estimates),
                                   selectivity=selectivity, key=node.key if node.state_kind is Kind.PARTITIONED
                                   else None, max_scale=max_scale, combined=combined))
    return stats


def _cost_us(node: Node, estimates: Mapping[str, OperatorEstimate]) -> float:
    if node.name in estimates:
        return estimates[node.name].cost_us
    if node.operator is not None and node.operator.hints.cost_us is not None:
        return node.operator.hints.cost_us
    return UNION_COST_US if node.kind is NodeKind.UNION else DEFAULT_COST_US


def _selectivity(node: Node, estimates: Mapping[str, OperatorEstimate]) -> float:
    if node.name in estimates:
        return estimates[node.name].selectivity
    if node.operator is not None and node.operator.hints.selectivity is not None:
        return node.operator.hints.selectivity
    return DEFAULT_SELECTIVITY
