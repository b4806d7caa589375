"""Exact optimum over all valid configurations with at most M threads, and the optimal baselines.

A configuration cuts the chain into regions, each region into pipelines, and gives each region a
replica count; it is valid when every replicated region is free of stateful operators and its
partitioned operators share a key field (Section 3.1). Two adjacent unreplicated regions are the
same configuration as one region holding both (the paper's longest-sequence rule), so the search
enumerates each configuration once by never placing two unreplicated regions side by side.

The search is exact but not naive:
- within a region, only the Pareto-best pipeline cuts for each pipeline count matter: the model
  depends on a region's cut only through the largest pipeline work (its bottleneck) and the sum
  of pipeline works (its utilization), both to be minimized;
- branch and bound: a partial configuration's throughput cannot exceed
  min(its smallest region capacity, C / (its work + the bare cost of the remaining operators)).
Both prunings keep the optimum's value unchanged; `count_configurations` counts what a naive
enumeration would visit (the paper's Fig. 4).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import combinations

from fissure.plan.chain import ChainModel, RegionShape

# The largest number of configurations the exact search accepts: beyond it (about 12 operators
# on 12 cores) it can take longer than a minute even with pruning.
MAX_CONFIGURATIONS = 5e11
DEFAULT_TIME_LIMIT_S = 60.0


class SearchTooLarge(ValueError):
    """The exhaustive search was asked for a size it cannot finish in time."""


@dataclass(frozen=True)
class SearchSpace:
    """Which configurations a search may visit."""

    max_threads: int
    allow_pipelining: bool = True  # more than one pipeline per region
    allow_replication: bool = True  # more than one replica per region


@dataclass(frozen=True)
class _CutOption:
    pipeline_count: int
    max_work: float
    total_work: float
    cuts: tuple[int, ...]


def _cut_options(model: ChainModel, start: int, end: int, max_pipelines: int) -> list[_CutOption]:
    """Pareto-best cuts of [start, end) into 1..max_pipelines pipelines."""
    length = end - start
    options: list[_CutOption] = []
    for count in range(1, min(length, max_pipelines) + 1):
        candidates = []
        for cuts in combinations(range(start + 1, end), count - 1):
            region = RegionShape(start, end, cuts)
            works = model.pipeline_works(region)
            candidates.append(_CutOption(count, max(works), sum(works), cuts))
        candidates.sort(key=lambda option: (option.max_work, option.total_work))
        best_total = math.inf
        for option in candidates:  # keep the Pareto front of (max_work, total_work)
            if option.total_work < best_total:
                options.append(option)
                best_total = option.total_work
    return options


def count_configurations(size: int, space: SearchSpace, replicable=lambda a, b: True) -> int:
    """How many distinct valid configurations of `size` operators use at most max_threads."""
    memo: dict[tuple[int, int, bool], int] = {}

    def count(start: int, threads_left: int, after_unreplicated: bool) -> int:
        if start == size:
            return 1
        key = (start, threads_left, after_unreplicated)
        if key in memo:
            return memo[key]
        total = 0
        for end in range(start + 1, size + 1):
            length = end - start
            max_pipelines = length if space.allow_pipelining else 1
            for pipelines in range(1, min(max_pipelines, threads_left) + 1):
                cuts = math.comb(length - 1, pipelines - 1)
                max_replicas = threads_left // pipelines
                if not (space.allow_replication and replicable(start, end)):
                    max_replicas = min(max_replicas, 1)
                for replicas in range(1, max_replicas + 1):
                    if replicas == 1 and after_unreplicated:
                        continue
                    total += cuts * count(end, threads_left - replicas * pipelines, replicas == 1)
        memo[key] = total
        return total

    return count(0, space.max_threads, False)


def optimal_regions(
    model: ChainModel, space: SearchSpace, time_limit_s: float = DEFAULT_TIME_LIMIT_S, clock=time.monotonic
) -> list[RegionShape]:
    """The configuration with the highest bounded throughput in `space`."""
    size = model.size
    if space.max_threads < 1:
        raise ValueError("max_threads must be >= 1")
    configurations = count_configurations(size, space, model.replicable)
    if configurations > MAX_CONFIGURATIONS:
        raise SearchTooLarge(
            f"{size} operators with up to {space.max_threads} threads make {configurations:.3g} "
            f"configurations; the exhaustive search takes at most {MAX_CONFIGURATIONS:.0e} "
            "(it would not finish in a minute). Use the heuristic, or fewer threads (--max-threads)."
        )
    deadline = clock() + time_limit_s
    max_pipelines = space.max_threads if space.allow_pipelining else 1
    options = {
        (start, end): _cut_options(model, start, end, max_pipelines)
        for start in range(size)
        for end in range(start + 1, size + 1)
    }
    remaining_cost = [model.weighted_cost[size] - model.weighted_cost[k] for k in range(size + 1)]
    cores = model.cores
    best_value = -1.0
    best: list[RegionShape] = []
    chosen: list[RegionShape] = []
    visits = 0

    def branches(start: int, threads_left: int, after_unreplicated: bool) -> Iterator[tuple]:
        for end in range(start + 1, size + 1):
            replicable = space.allow_replication and model.replicable(start, end)
            max_replicas = model.useful_replicas(start, end, threads_left) if replicable else 1
            for option in options[(start, end)]:
                if option.pipeline_count > threads_left:
                    break
                top = min(max_replicas, threads_left // option.pipeline_count)
                for replicas in range(top, 0, -1):
                    if replicas == 1 and after_unreplicated:
                        continue
                    yield end, replicas, option

    def search(start: int, threads_left: int, capacity: float, work: float, after_unreplicated: bool) -> None:
        nonlocal best_value, best, visits
        visits += 1
        if visits % 512 == 0 and clock() > deadline:
            raise SearchTooLarge(
                f"the exhaustive search of {size} operators with up to {space.max_threads} threads "
                f"did not finish in {time_limit_s:.0f} s; use the heuristic or fewer threads"
            )
        if start == size:
            value = min(capacity, cores / work)
            if value > best_value:
                best_value, best = value, list(chosen)
            return
        for end, replicas, option in branches(start, threads_left, after_unreplicated):
            region_capacity, region_work = model.region_terms(
                start, end, replicas, option.max_work, option.total_work, start == 0, end == size
            )
            new_capacity = min(capacity, region_capacity)
            new_work = work + region_work
            if min(new_capacity, cores / (new_work + remaining_cost[end])) <= best_value:
                continue
            chosen.append(RegionShape(start, end, option.cuts, replicas))
            search(end, threads_left - replicas * option.pipeline_count, new_capacity, new_work, replicas == 1)
            chosen.pop()

    search(0, space.max_threads, math.inf, 0.0, False)
    return best
