"""A fast form of the pipelined fission model for the planners' inner loops.

`fissure.model.throughput.evaluate` is the readable, equation-by-equation model. Planners call
the model thousands of times, so this module evaluates the same equations over prefix sums, in
units of one tuple entering the *program*:

- S[k], the selectivity before operator k; CW[k] = sum_{l<k} S[l] c_l, the selectivity-weighted
  cost of the first k operators (eq. 2 summed over a span is CW[b] - CW[a]);
- a pipeline spanning operators [a, b) that is the j-th of its region does, per program input
  tuple, w = CW[b] - CW[a] + delta (S[a] 1(j > first) + S[b] 1(j < last)) microseconds of work
  (eqs. 2, 4, 5 multiplied by S[a]); its capacity in program tuples is 1 / w;
- a region [a, b) with r replicas, scalability f and pipelines of work w_j sustains, in program
  tuples, 1 / (S[a] h_i + S[a] c_p log2 r + max_j w_j / f) (eqs. 3, 6, 8, 9, 10 divided by S[a]),
  and does S[a] (c_p log2 r + h_i) + sum_j w_j of work (eq. 14's bracket times S[a]);
- the program's bounded throughput is min(min_i capacity_i, C / sum_i work_i) (eqs. 11-13: when
  U > C, R C / U = C / W since U = R W).

`tests/plan/test_optimize.py` checks it against the reference model on random plans.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from fissure.model.throughput import replication_problem
from fissure.model.types import Machine, OperatorStats, Plan, RegionPlan


class RegionShape(NamedTuple):
    """A region in the planners' index form: operators [start, end), cut before each `cuts`.

    A named tuple rather than a dataclass: planners hash millions of them."""

    start: int
    end: int
    cuts: tuple[int, ...] = ()  # operator indexes that begin a new pipeline (start < cut < end)
    replicas: int = 1

    @property
    def pipeline_count(self) -> int:
        return len(self.cuts) + 1

    @property
    def threads(self) -> int:
        return self.replicas * self.pipeline_count

    def bounds(self) -> list[tuple[int, int]]:
        edges = [self.start, *self.cuts, self.end]
        return list(zip(edges[:-1], edges[1:]))


class ChainModel:
    """Precomputed prefix sums of one chain on one machine; evaluates configurations fast."""

    def __init__(self, operators: Sequence[OperatorStats], machine: Machine):
        if not operators:
            raise ValueError("a chain needs at least one operator")
        self.operators = tuple(operators)
        self.machine = machine
        self.size = len(operators)
        self.delta_us = machine.thread_switch_overhead_us
        self.replication_us = machine.replication_cost_us
        self.cores = machine.cores
        before = [1.0]
        weighted = [0.0]
        for operator in operators:
            weighted.append(weighted[-1] + before[-1] * operator.cost_us)
            before.append(before[-1] * operator.selectivity)
        self.selectivity_before = before  # S
        self.weighted_cost = weighted  # CW
        if weighted[-1] <= 0:
            raise ValueError("the chain costs nothing per tuple: there is nothing to plan")
        self._replicable: dict[tuple[int, int], bool] = {}
        self._scale_bound: dict[tuple[int, int], float] = {}
        # planners revisit the same regions thousands of times: memoize per region and position
        self._pipeline_works: dict[RegionShape, tuple[float, ...]] = {}
        self._region_terms: dict[tuple[RegionShape, bool, bool], tuple[float, float]] = {}
        self._throughputs: dict[tuple[RegionShape, ...], float] = {}

    # -- segment properties -------------------------------------------------------------------

    def replicable(self, start: int, end: int) -> bool:
        """Whether operators [start, end) may form a replicated region (the paper's L_p)."""
        span = (start, end)
        if span not in self._replicable:
            self._replicable[span] = replication_problem(self.operators[start:end]) is None
        return self._replicable[span]

    def scale_bound(self, start: int, end: int) -> float:
        """min over the span of max_scale (inf when all scale linearly): eq. 7's bound."""
        span = (start, end)
        if span not in self._scale_bound:
            bounds = [op.max_scale for op in self.operators[start:end] if op.max_scale is not None]
            self._scale_bound[span] = min(bounds) if bounds else math.inf
        return self._scale_bound[span]

    def useful_replicas(self, start: int, end: int, limit: int) -> int:
        """The most replicas worth trying: past ceil(max_scale) a replica only adds overhead."""
        bound = self.scale_bound(start, end)
        return limit if math.isinf(bound) else max(1, min(limit, math.ceil(bound)))

    def pipeline_work(self, start: int, end: int, first: bool, last: bool) -> float:
        """Work per program tuple of a pipeline [start, end): eqs. 2, 4, 5 times S[start]."""
        before = self.selectivity_before
        work = self.weighted_cost[end] - self.weighted_cost[start]
        if not first:
            work += self.delta_us * before[start]
        if not last:
            work += self.delta_us * before[end]
        return work

    def region_terms(
        self, start: int, end: int, replicas: int, max_pipeline_work: float, pipelines_work: float,
        first_region: bool, last_region: bool,
    ) -> tuple[float, float]:
        """(capacity in program tuples per us, work per program tuple) of one region."""
        entry = self.selectivity_before[start]
        overhead = 0.0
        if not first_region:
            overhead += self.delta_us * entry
        if not last_region:
            overhead += self.delta_us * self.selectivity_before[end]
        if replicas > 1:
            overhead += entry * self.replication_us * math.log2(replicas)
            scale = min(float(replicas), self.scale_bound(start, end))
        else:
            scale = 1.0
        per_tuple = overhead + max_pipeline_work / scale
        capacity = math.inf if per_tuple <= 0 else 1.0 / per_tuple
        return capacity, overhead + pipelines_work

    # -- whole configurations -----------------------------------------------------------------

    def pipeline_works(self, region: RegionShape) -> tuple[float, ...]:
        works = self._pipeline_works.get(region)
        if works is None:
            spans = region.bounds()
            works = tuple(
                self.pipeline_work(a, b, j == 0, j == len(spans) - 1) for j, (a, b) in enumerate(spans)
            )
            self._pipeline_works[region] = works
        return works

    def placed_region_terms(self, region: RegionShape, first: bool, last: bool) -> tuple[float, float]:
        """`region_terms` of a region at a place in the chain (first and/or last region)."""
        key = (region, first, last)
        terms = self._region_terms.get(key)
        if terms is None:
            works = self.pipeline_works(region)
            terms = self.region_terms(region.start, region.end, region.replicas, max(works), sum(works), first, last)
            self._region_terms[key] = terms
        return terms

    def terms(self, regions: Sequence[RegionShape]) -> tuple[float, float]:
        """(unbounded throughput, total work), both per microsecond and per program tuple."""
        capacity = math.inf
        work = 0.0
        last = len(regions) - 1
        for i, region in enumerate(regions):
            region_capacity, region_work = self.placed_region_terms(region, i == 0, i == last)
            if region_capacity < capacity:
                capacity = region_capacity
            work += region_work
        return capacity, work

    def throughput(self, regions: Sequence[RegionShape]) -> float:
        """Bounded throughput R(P, C) in tuples per microsecond (eq. 13)."""
        key = tuple(regions)
        value = self._throughputs.get(key)
        if value is None:
            capacity, work = self.terms(key)
            value = self._throughputs[key] = min(capacity, self.cores / work)
        return value

    def unbounded(self, regions: Sequence[RegionShape]) -> tuple[float, float]:
        """(unbounded throughput R(P), utilization U(P)) per microsecond (eqs. 12, 14)."""
        capacity, work = self.terms(regions)
        return capacity, capacity * work

    # -- conversions ----------------------------------------------------------------------------

    def to_plan(self, regions: Sequence[RegionShape], method: str) -> Plan:
        names = [operator.name for operator in self.operators]
        return Plan(
            regions=tuple(
                RegionPlan(
                    pipelines=tuple(tuple(names[a:b]) for a, b in region.bounds()),
                    replicas=region.replicas,
                )
                for region in regions
            ),
            method=method,
        )

    def from_plan(self, plan: Plan) -> list[RegionShape]:
        """The plan's regions in index form, adjacent unreplicated ones merged as the reference
        model merges them (`canonical_regions`)."""
        index = {operator.name: i for i, operator in enumerate(self.operators)}
        shapes = []
        for region in plan.regions:
            starts = [index[pipeline[0]] for pipeline in region.pipelines]
            end = index[region.pipelines[-1][-1]] + 1
            shapes.append(RegionShape(starts[0], end, tuple(starts[1:]), region.replicas))
        return merge_unreplicated(shapes)


def merge_unreplicated(regions: Sequence[RegionShape]) -> list[RegionShape]:
    """Adjacent unreplicated regions are one region (see fissure.model.throughput)."""
    merged: list[RegionShape] = []
    for region in regions:
        if merged and region.replicas == 1 and merged[-1].replicas == 1:
            previous = merged[-1]
            merged[-1] = RegionShape(previous.start, region.end, previous.cuts + (region.start,) + region.cuts, 1)
        else:
            merged.append(region)
    return merged
