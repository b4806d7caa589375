"""The throughput model of pipelined fission (Gedik, Özsema, Öztürk, JPDC 2016, Section 3.2).

Every quantity is traceable to its equation number in the paper. Costs are microseconds per
tuple, so raw rates are tuples per microsecond; `evaluate` reports tuples per second.

Two readings of the paper are fixed here (and in the docs) so that outside checks agree:
- the sums of eq. 14 run over *all* regions and *all* pipelines (the printed bounds
  `1 <= i < |P|` and `1 <= j < |P_i|` are a typo: they would leave the last region and the last
  pipeline of every region out of the utilization);
- two adjacent unreplicated regions behave as one region holding both regions' pipelines: by the
  paper's own definition a region is the *longest* non-replicated (or replicated) sequence, so
  they are one region. `canonical_regions` merges them before anything is computed.

The backpressure recursions (eqs. 3 and 11) are evaluated in their closed form: with R_0 = inf
and R_j = s_j * min(R_{j-1}, X_j), induction gives R_n = (prod_j s_j) * min_j (X_j / sigma_j),
where sigma_j is the selectivity before stage j. Dividing by the total selectivity (eqs. 6 and 12)
leaves input throughput = min_j X_j / sigma_j, which stays defined when a selectivity is zero
(a stage that receives nothing never limits the input rate).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fissure.model.types import Kind, Machine, OperatorStats, Plan, RegionPlan

MICROSECONDS_PER_SECOND = 1e6


class InvalidPlan(ValueError):
    """A plan that breaks the rules of Section 3.1 for the given chain."""


@dataclass(frozen=True)
class PipelineFigures:
    """Model figures of one pipeline P_ij (all per tuple entering the pipeline)."""

    operators: tuple[str, ...]
    selectivity: float  # s(P_ij)
    cost_us: float  # c(P_ij), eq. 2
    switch_overhead_us: float  # h(P_ij), eq. 5
    input_capacity_per_us: float  # R(P_ij), eq. 4


@dataclass(frozen=True)
class RegionFigures:
    """Model figures of one region P_i."""

    replicas: int  # r(P_i)
    kind: Kind  # eq. 1
    key: tuple[str, ...] | None  # the key shared by its partitioned operators, if any
    pipelines: tuple[PipelineFigures, ...]
    selectivity: float  # s(P_i)
    input_capacity_per_us: float  # R(P_i), eqs. 3 and 6
    scalability: float  # f<P_i>(r(P_i)), eq. 7
    parallel_capacity_per_us: float  # R*(P_i), eq. 8
    switch_overhead_us: float  # h(P_i), eq. 10
    capacity_in_chain_per_us: float  # R+(P_i), eq. 9
    work_per_input_tuple_us: float  # the bracket of eq. 14 for this region


@dataclass(frozen=True)
class Evaluation:
    """The model's verdict on a plan: eqs. 11-14."""

    plan: Plan  # in canonical form (adjacent unreplicated regions merged)
    regions: tuple[RegionFigures, ...]
    unbounded_throughput_per_s: float  # R(P), eq. 12
    utilization: float  # U(P), eq. 14 (cores busy at the unbounded throughput)
    throughput_per_s: float  # R(P, C), eq. 13, the C/U scaling applied only when U > C
    cores: int

    @property
    def threads(self) -> int:
        return self.plan.threads


def scalability(operator: OperatorStats, replicas: int) -> float:
    """Base scalability f<o>(x): linear, or bounded linear f_b(x; u) with u = max_scale."""
    if operator.max_scale is None:
        return float(replicas)
    return float(min(replicas, operator.max_scale))


def region_kind(operators: Sequence[OperatorStats]) -> Kind:
    """Eq. 1: stateful if any operator is stateful, stateless if all are, else partitioned."""
    kinds = {operator.kind for operator in operators}
    if Kind.STATEFUL in kinds:
        return Kind.STATEFUL
    if kinds == {Kind.STATELESS}:
        return Kind.STATELESS
    return Kind.PARTITIONED


def shared_key(operators: Sequence[OperatorStats]) -> tuple[str, ...] | None:
    """The fields common to the keys of all partitioned operators (order of first appearance).

    None when there is no partitioned operator; an empty tuple when their keys share no field.
    """
    keys = [operator.key for operator in operators if operator.kind is Kind.PARTITIONED]
    if not keys:
        return None
    common = set(keys[0])
    for key in keys[1:]:
        common &= set(key)
    return tuple(field for field in keys[0] if field in common)


def replication_problem(operators: Sequence[OperatorStats]) -> str | None:
    """Why these operators cannot form a replicated region (the paper's L_p), or None."""
    stateful = [operator.name for operator in operators if operator.kind is Kind.STATEFUL]
    if stateful:
        return f"it contains the stateful operator {stateful[0]!r}, which cannot be replicated"
    if shared_key(operators) == ():
        names = [operator.name for operator in operators if operator.kind is Kind.PARTITIONED]
        return f"its partitioned operators {names} share no key field"
    return None


def pipeline_figures(
    operators: Sequence[OperatorStats], position: int, pipeline_count: int, delta_us: float
) -> PipelineFigures:
    """Eqs. 2, 4 and 5 for the pipeline at 0-based `position` among `pipeline_count`."""
    cost_us = 0.0
    selectivity = 1.0
    for operator in operators:  # eq. 2: c(P_ij) = sum_k s_k(P_ij) * c(o_k)
        cost_us += selectivity * operator.cost_us
        selectivity *= operator.selectivity
    # eq. 5: input hand-off for every pipeline but the first, output for every one but the last
    switch_us = delta_us * (
        (1.0 if position > 0 else 0.0) + (selectivity if position < pipeline_count - 1 else 0.0)
    )
    per_tuple_us = cost_us + switch_us
    capacity = math.inf if per_tuple_us == 0 else 1.0 / per_tuple_us  # eq. 4
    return PipelineFigures(
        operators=tuple(operator.name for operator in operators),
        selectivity=selectivity,
        cost_us=cost_us,
        switch_overhead_us=switch_us,
        input_capacity_per_us=capacity,
    )


def chained_input_capacity(capacities: Sequence[float], selectivities: Sequence[float]) -> float:
    """Input throughput of stages in a chain under backpressure: eqs. 3+6 (and 11+12).

    `capacities[j]` is the input rate stage j sustains alone; `selectivities[j]` its selectivity.
    Closed form of the recursion: min over stages of capacity_j / (selectivity before stage j).
    """
    best = math.inf
    before = 1.0
    for capacity, selectivity in zip(capacities, selectivities, strict=True):
        if before > 0:
            best = min(best, capacity / before)
        before *= selectivity
    return best


def region_figures(
    operators: Sequence[OperatorStats],
    region: RegionPlan,
    region_position: int,
    region_count: int,
    machine: Machine,
) -> RegionFigures:
    """Eqs. 1-10 for one region, given its operators (in chain order) and plan."""
    by_name = {operator.name: operator for operator in operators}
    delta_us = machine.thread_switch_overhead_us
    pipelines = tuple(
        pipeline_figures([by_name[name] for name in names], j, len(region.pipelines), delta_us)
        for j, names in enumerate(region.pipelines)
    )
    selectivity = math.prod(pipeline.selectivity for pipeline in pipelines)
    input_capacity = chained_input_capacity(
        [pipeline.input_capacity_per_us for pipeline in pipelines],
        [pipeline.selectivity for pipeline in pipelines],
    )  # eqs. 3 and 6
    replicas = region.replicas
    scale = min(scalability(operator, replicas) for operator in operators)  # eq. 7
    replication_us = machine.replication_cost_us * math.log2(replicas)
    # eq. 8: R* = (c_p log2 r + 1 / (R(P_i) f(r)))^-1
    parallel_capacity = _inverse(replication_us + _inverse(input_capacity * scale))
    # eq. 10: h(P_i) = delta (1(i > 1) + 1(i < |P|) s(P_i))
    region_switch_us = delta_us * (
        (1.0 if region_position > 0 else 0.0)
        + (selectivity if region_position < region_count - 1 else 0.0)
    )
    capacity_in_chain = _inverse(region_switch_us + _inverse(parallel_capacity))  # eq. 9
    # eq. 14, inner bracket: c_p log2 r + h(P_i) + sum_j s_j(P_i) (h(P_ij) + c(P_ij))
    work_us = replication_us + region_switch_us
    before = 1.0
    for pipeline in pipelines:
        work_us += before * (pipeline.switch_overhead_us + pipeline.cost_us)
        before *= pipeline.selectivity
    kind = region_kind(operators)
    return RegionFigures(
        replicas=replicas,
        kind=kind,
        key=(shared_key(operators) or None) if kind is Kind.PARTITIONED else None,
        pipelines=pipelines,
        selectivity=selectivity,
        input_capacity_per_us=input_capacity,
        scalability=scale,
        parallel_capacity_per_us=parallel_capacity,
        switch_overhead_us=region_switch_us,
        capacity_in_chain_per_us=capacity_in_chain,
        work_per_input_tuple_us=work_us,
    )


def canonical_regions(plan: Plan) -> tuple[RegionPlan, ...]:
    """Merge adjacent unreplicated regions: by the paper's definition they are one region."""
    merged: list[RegionPlan] = []
    for region in plan.regions:
        if merged and region.replicas == 1 and merged[-1].replicas == 1:
            merged[-1] = RegionPlan(merged[-1].pipelines + region.pipelines, 1)
        else:
            merged.append(region)
    return tuple(merged)


def validate_plan(operators: Sequence[OperatorStats], plan: Plan) -> None:
    """Raise InvalidPlan unless every operator appears once, in chain order, in a valid region."""
    expected = tuple(operator.name for operator in operators)
    if plan.operators != expected:
        raise InvalidPlan(
            f"the plan's operators {list(plan.operators)} must be the chain's {list(expected)}, "
            "each once and in chain order"
        )
    by_name = {operator.name: operator for operator in operators}
    for index, region in enumerate(plan.regions):
        if region.replicas < 1:
            raise InvalidPlan(f"region {index} has {region.replicas} replicas; at least 1 is needed")
        if not region.pipelines or any(not pipeline for pipeline in region.pipelines):
            raise InvalidPlan(f"region {index} has an empty pipeline")
        if region.replicas > 1:
            problem = replication_problem([by_name[name] for name in region.operators])
            if problem:
                raise InvalidPlan(f"region {index} has {region.replicas} replicas but {problem}")


def evaluate(operators: Sequence[OperatorStats], plan: Plan, machine: Machine) -> Evaluation:
    """Model throughput and utilization of `plan` for the chain `operators`: eqs. 1-14."""
    validate_plan(operators, plan)
    regions = canonical_regions(plan)
    canonical = Plan(regions, method=plan.method, notes=plan.notes)
    by_name = {operator.name: operator for operator in operators}
    figures = tuple(
        region_figures([by_name[name] for name in region.operators], region, i, len(regions), machine)
        for i, region in enumerate(regions)
    )
    # eqs. 11 and 12 (closed form, see the module docstring)
    rate_per_us = chained_input_capacity(
        [region.capacity_in_chain_per_us for region in figures],
        [region.selectivity for region in figures],
    )
    if math.isinf(rate_per_us):
        raise InvalidPlan("the chain costs nothing per tuple: its throughput is unbounded")
    # eq. 14 (sums over all regions and pipelines)
    work_us = 0.0
    before = 1.0
    for region in figures:
        work_us += before * region.work_per_input_tuple_us
        before *= region.selectivity
    utilization = rate_per_us * work_us
    bounded_per_us = rate_per_us * machine.cores / utilization if utilization > machine.cores else rate_per_us
    return Evaluation(
        plan=canonical,
        regions=figures,
        unbounded_throughput_per_s=rate_per_us * MICROSECONDS_PER_SECOND,
        utilization=utilization,
        throughput_per_s=bounded_per_us * MICROSECONDS_PER_SECOND,  # eq. 13
        cores=machine.cores,
    )


def _inverse(value: float) -> float:
    if value == 0:
        return math.inf
    if math.isinf(value):
        return 0.0
    return 1.0 / value
