"""The three-phase pipelined fission heuristic (Algorithms 1-4 of the paper) and fissure's refinements.

`paper_heuristic` follows Algorithms 1-4 as written, with two changes that the algorithms need to
terminate and to respect the same search space as the optimum:
- a replica is kept only if it strictly raises the throughput (Algorithm 4 keeps equal ones, which
  loops forever once a bounded-linear operator stops scaling with a zero replication cost);
- no step may exceed the thread budget M (default 2 C) that the exhaustive optimum uses, and a
  configuration of more threads than M (Algorithm 2 can form more regions than that) is skipped.

`heuristic` (the default planner) adds three named steps on top, each cheap:
1. `configure_regions` forms regions over keys that *share* a field (the paper requires the next
   key to be a subset of the region's; partitioning on the common fields is just as valid), and
   the sweep tries several fusion cost thresholds alpha, not one;
2. the utilization split of Algorithm 1 is swept in steps of 1/20 instead of 1/10;
3. `local_search` climbs from the best configuration found: it tries one more or one fewer
   replica per region, adding, removing or shifting one pipeline cut, and moving, adding or
   removing one region boundary, and takes the best move until none helps.
`benchmarks/planner_model.py` measures what each step buys against the exhaustive optimum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fissure.model.types import Kind
from fissure.plan.chain import ChainModel, RegionShape, merge_unreplicated


@dataclass(frozen=True)
class RegionSeed:
    """A region formed by Algorithm 2: operators [start, end), and whether it may be replicated."""

    start: int
    end: int
    parallel: bool


# -- Algorithm 2: region configuration --------------------------------------------------------


def configure_regions(model: ChainModel, alpha_us: float, shared_keys: bool = True) -> list[RegionSeed]:
    """Algorithm 2: longest compatible sequences that cost more than alpha; the rest fused.

    With `shared_keys` a partitioned operator joins the current region when its key shares a
    field with the region's (the region is then keyed on the common fields); without it, only
    when its key is a subset of the region's, as the paper writes it.
    """
    operators = model.operators
    size = model.size
    seeds: list[RegionSeed] = []
    assigned = [False] * size
    current_start: int | None = None
    current_key: set[str] | None = None  # None: the current region is stateless so far

    def region_cost(start: int, end: int) -> float:  # cost per tuple entering the region
        entry = model.selectivity_before[start]
        spent = model.weighted_cost[end] - model.weighted_cost[start]
        return spent / entry if entry > 0 else 0.0

    def close(end: int) -> None:
        if current_start is not None and end > current_start and region_cost(current_start, end) > alpha_us:
            seeds.append(RegionSeed(current_start, end, True))
            for k in range(current_start, end):
                assigned[k] = True

    i = 0
    while i < size:
        operator = operators[i]
        if operator.kind is Kind.STATEFUL:
            close(i)
            current_start, current_key = None, None
            i += 1
            continue
        if current_start is None:
            current_start, current_key = i, None
        if operator.kind is Kind.PARTITIONED:
            key = set(operator.key or ())
            if current_key is None:
                current_key = key
            elif shared_keys and current_key & key:
                current_key = current_key & key
            elif not shared_keys and key <= current_key:
                current_key = key
            else:  # incompatible key: close the region and redo this operator in a fresh one
                close(i)
                current_start, current_key = None, None
                continue
        i += 1
    close(size)
    # second part: runs of unassigned operators become regions that are never replicated
    run_start: int | None = None
    for k in range(size + 1):
        if k < size and not assigned[k]:
            if run_start is None:
                run_start = k
        elif run_start is not None:
            seeds.append(RegionSeed(run_start, k, False))
            run_start = None
    seeds.sort(key=lambda seed: seed.start)
    return seeds


# -- Algorithm 3: pipeline configuration -------------------------------------------------------


def _bottleneck_pipeline(model: ChainModel, regions: Sequence[RegionShape]) -> tuple[int, int]:
    """(region index, pipeline index) of the pipeline that limits the throughput most (the last
    one to lower it, walking the chain)."""
    worst = (0, 0)
    worst_work = -1.0
    for i, region in enumerate(regions):
        for j, work in enumerate(model.pipeline_works(region)):
            if work >= worst_work:
                worst, worst_work = (i, j), work
    return worst


def pipeline_splits(
    model: ChainModel, seeds: Sequence[RegionSeed], utilization_budget: float, max_threads: int
) -> list[tuple[float, list[RegionShape]]]:
    """Algorithm 3's successive configurations, each with its utilization U, up to the first
    one whose U exceeds the budget (or the last, when no split helps any more)."""
    regions = [RegionShape(seed.start, seed.end) for seed in seeds]
    steps = []
    while True:
        throughput, utilization = model.unbounded(regions)
        steps.append((utilization, list(regions)))
        if utilization > utilization_budget or sum(r.threads for r in regions) >= max_threads:
            return steps
        i, j = _bottleneck_pipeline(model, regions)
        region = regions[i]
        spans = region.bounds()
        start, end = spans[j]
        if end - start < 2:
            return steps
        first, last = j == 0, j == len(spans) - 1
        before = model.pipeline_work(start, end, first, last)
        best_cut, best_work = None, math.inf
        for cut in range(start + 1, end):
            work = max(model.pipeline_work(start, cut, first, False), model.pipeline_work(cut, end, False, last))
            if work < best_work:
                best_cut, best_work = cut, work
        if best_work >= before:  # the split does not raise this pipeline's throughput
            return steps
        regions[i] = region._replace(cuts=tuple(sorted(region.cuts + (best_cut,))))


def configure_pipelines(
    model: ChainModel, seeds: Sequence[RegionSeed], utilization_budget: float, max_threads: int
) -> list[RegionShape]:
    """Algorithm 3: split the bottleneck pipeline at its best point while U <= the budget."""
    return pipeline_splits(model, seeds, utilization_budget, max_threads)[-1][1]


# -- Algorithm 4: replica configuration --------------------------------------------------------


def configure_replicas(
    model: ChainModel, seeds: Sequence[RegionSeed], regions: Sequence[RegionShape], max_threads: int
) -> list[RegionShape]:
    """Algorithm 4: add a replica to the bottleneck region while U <= C and it helps."""
    regions = list(regions)
    while True:
        throughput, utilization = model.unbounded(regions)
        if utilization > model.cores:
            return regions
        bottleneck = _bottleneck_region(model, regions)
        region = regions[bottleneck]
        threads = sum(r.threads for r in regions)
        if (
            not seeds[bottleneck].parallel
            or threads + region.pipeline_count > max_threads
            or region.replicas >= model.useful_replicas(region.start, region.end, max_threads)
        ):
            return regions
        regions[bottleneck] = region._replace(replicas=region.replicas + 1)
        if model.unbounded(regions)[0] <= throughput:
            regions[bottleneck] = region
            return regions


def _bottleneck_region(model: ChainModel, regions: Sequence[RegionShape]) -> int:
    worst, worst_capacity = 0, math.inf
    last = len(regions) - 1
    for i, region in enumerate(regions):
        capacity, _ = model.placed_region_terms(region, i == 0, i == last)
        if capacity <= worst_capacity:
            worst, worst_capacity = i, capacity
    return worst


# -- Algorithm 1 and the refinements -----------------------------------------------------------


def sweep(
    model: ChainModel, seeds: Sequence[RegionSeed], steps: int, max_threads: int
) -> tuple[float, list[RegionShape]]:
    """Algorithm 1's loop: for each share of the cores reserved for pipelining, configure
    pipelines then replicas; keep the configuration with the best bounded throughput."""
    best_value, best = -1.0, [RegionShape(0, model.size)]
    for regions in sweep_all(model, seeds, steps, max_threads):
        if sum(region.threads for region in regions) > max_threads:
            continue  # Algorithm 2 formed more regions than M threads can run
        value = model.throughput(regions)
        if value > best_value:
            best_value, best = value, regions
    return best_value, best


def default_alpha_us(model: ChainModel) -> float:
    """Fusion cost threshold: a region must cost more than what splitting it in two costs."""
    return model.replication_us + 2 * model.delta_us


def paper_heuristic(model: ChainModel, max_threads: int, alpha_us: float | None = None) -> list[RegionShape]:
    """Algorithms 1-4 as the paper writes them (see the module docstring for the two guards)."""
    alpha = default_alpha_us(model) if alpha_us is None else alpha_us
    seeds = configure_regions(model, alpha, shared_keys=False)
    return merge_unreplicated(sweep(model, seeds, 10, max_threads)[1])


def heuristic(model: ChainModel, max_threads: int, alpha_us: float | None = None) -> list[RegionShape]:
    """fissure's planner: the paper's phases with shared keys, several alphas and a finer sweep,
    then a local search from the best few configurations they found."""
    base = default_alpha_us(model) if alpha_us is None else alpha_us
    sequential = (RegionShape(0, model.size),)
    candidates: dict[tuple[RegionShape, ...], float] = {sequential: model.throughput(sequential)}
    tried: set[tuple[RegionSeed, ...]] = set()
    for alpha in (0.0, base, 4 * base):
        seeds = tuple(configure_regions(model, alpha))
        if seeds in tried:
            continue
        tried.add(seeds)
        for regions in sweep_all(model, seeds, 20, max_threads):
            shape = tuple(merge_unreplicated(regions))
            if shape not in candidates and sum(region.threads for region in shape) <= max_threads:
                candidates[shape] = model.throughput(shape)
    long_chain = model.size > LONG_CHAIN_OPERATORS
    starts = sorted(candidates, key=candidates.get, reverse=True)[: 1 if long_chain else LOCAL_SEARCH_STARTS]
    best, best_value = list(starts[0]), candidates[starts[0]]
    for start in starts:
        regions = local_search(model, list(start), max_threads, transfers=not long_chain)
        value = model.throughput(regions)
        if value > best_value:
            best, best_value = regions, value
    return best


def sweep_all(model: ChainModel, seeds: Sequence[RegionSeed], steps: int, max_threads: int) -> list[list[RegionShape]]:
    """Every configuration Algorithm 1's loop visits, one per utilization share s = k / steps.

    Algorithm 3 is deterministic and stops at the first configuration whose U exceeds s C, so
    the configurations for all shares are prefixes of one run with the largest budget."""
    splits = pipeline_splits(model, seeds, model.cores, max_threads)
    found: dict[tuple[RegionShape, ...], list[RegionShape]] = {}
    for step in range(steps + 1):
        budget = step / steps * model.cores
        pipelined = next((regions for utilization, regions in splits if utilization > budget), splits[-1][1])
        key = tuple(pipelined)
        if key not in found:
            found[key] = configure_replicas(model, seeds, pipelined, max_threads)
    return list(found.values())


# -- local search -------------------------------------------------------------------------------


def _neighbours(model: ChainModel, regions: list[RegionShape], max_threads: int):
    threads = sum(region.threads for region in regions)
    for i, region in enumerate(regions):
        head, tail = regions[:i], regions[i + 1:]
        # one more or one fewer replica
        if region.replicas > 1:
            yield head + [region._replace(replicas=region.replicas - 1)] + tail
        if (
            threads + region.pipeline_count <= max_threads
            and model.replicable(region.start, region.end)
            and region.replicas < model.useful_replicas(region.start, region.end, max_threads)
        ):
            yield head + [region._replace(replicas=region.replicas + 1)] + tail
        # add, remove or shift one pipeline cut
        cuts = region.cuts
        for k, cut in enumerate(cuts):
            yield head + [region._replace(cuts=cuts[:k] + cuts[k + 1:])] + tail
            for moved in (cut - 1, cut + 1):
                low = cuts[k - 1] if k > 0 else region.start
                high = cuts[k + 1] if k + 1 < len(cuts) else region.end
                if low < moved < high:
                    yield head + [region._replace(cuts=cuts[:k] + (moved,) + cuts[k + 1:])] + tail
        if threads + region.replicas <= max_threads:
            for cut in range(region.start + 1, region.end):
                if cut not in cuts:
                    yield head + [region._replace(cuts=tuple(sorted(cuts + (cut,))))] + tail
        # split the region in two before any of its operators: both halves keep the replicas, or
        # one half drops to one replica and the other keeps as many as the thread budget allows
        spare = max_threads - threads + region.threads
        for split in range(region.start + 1, region.end):
            left_cuts = tuple(c for c in cuts if c < split)
            right_cuts = tuple(c for c in cuts if c > split)
            left_pipelines, right_pipelines = len(left_cuts) + 1, len(right_cuts) + 1
            both = min(region.replicas, spare // (left_pipelines + right_pipelines))
            pairs = {
                (both, both),
                (1, min(region.replicas, (spare - left_pipelines) // right_pipelines)),
                (min(region.replicas, (spare - right_pipelines) // left_pipelines), 1),
            }
            for left_replicas, right_replicas in pairs:
                if left_replicas >= 1 and right_replicas >= 1 and (left_replicas, right_replicas) != (1, 1):
                    yield head + [
                        RegionShape(region.start, split, left_cuts, left_replicas),
                        RegionShape(split, region.end, right_cuts, right_replicas),
                    ] + tail
        # carve one pipeline out into a region of its own with another replica count
        if len(cuts) > 0 or region.replicas > 1:
            spans = region.bounds()
            for k, (a, b) in enumerate(spans):
                if not model.replicable(a, b):
                    continue
                left = [RegionShape(region.start, a, cuts[:k - 1] if k > 0 else (), region.replicas)] if k > 0 else []
                right = [RegionShape(b, region.end, cuts[k + 1:], region.replicas)] if k + 1 < len(spans) else []
                spare = max_threads - threads + region.replicas
                for replicas in range(2, model.useful_replicas(a, b, spare) + 1):
                    if replicas != region.replicas:
                        yield head + left + [RegionShape(a, b, (), replicas)] + right + tail
        # move the boundary with the next region by one operator, or merge with it
        if tail:
            following = tail[0]
            rest = tail[1:]
            for boundary in (region.end - 1, region.end + 1):
                if region.start < boundary < following.end:
                    left = RegionShape(region.start, boundary, tuple(c for c in cuts if c < boundary), region.replicas)
                    right = RegionShape(
                        boundary, following.end, tuple(c for c in following.cuts if c > boundary), following.replicas
                    )
                    yield head + [left, right] + rest
            for replicas in {region.replicas, following.replicas}:
                merged = RegionShape(region.start, following.end, cuts + (following.start,) + following.cuts, replicas)
                yield head + [merged] + rest


def _valid(model: ChainModel, regions: Sequence[RegionShape], max_threads: int) -> bool:
    threads = 0
    for start, end, cuts, replicas in regions:
        if replicas > 1 and not model.replicable(start, end):
            return False
        threads += replicas * (len(cuts) + 1)
    return threads <= max_threads


# Effort of the local search. Long chains (where no exhaustive optimum can be checked anyway)
# get one start and no thread transfers, to keep planning within milliseconds.
LOCAL_SEARCH_STARTS = 2
LONG_CHAIN_OPERATORS = 24
# A thread transfer frees threads with one move and spends them with another; only the least
# harmful freeing moves are followed, which keeps the cost linear in the neighbourhood.
TRANSFER_FREEING_MOVES = 4


def _best_move(model: ChainModel, candidates, max_threads: int, floor: float):
    best, best_value = None, floor
    for candidate in candidates:
        if not _valid(model, candidate, max_threads):
            continue
        value = model.throughput(candidate)
        if value > best_value * (1 + 1e-12):
            best, best_value = candidate, value
    return best, best_value


def local_search(
    model: ChainModel, regions: list[RegionShape], max_threads: int, max_rounds: int = 200, transfers: bool = True
) -> list[RegionShape]:
    """Best-improvement hill climbing over the moves of `_neighbours`; at a local optimum, one
    thread transfer (free threads with one move, spend them with another) to escape it."""
    current, current_value = regions, model.throughput(regions)
    for _ in range(max_rounds):
        neighbours = list(_neighbours(model, current, max_threads))
        best, best_value = _best_move(model, neighbours, max_threads, current_value)
        if best is None and transfers:
            threads = sum(region.threads for region in current)
            freeing = [
                candidate
                for candidate in neighbours
                if sum(region.threads for region in candidate) < threads and _valid(model, candidate, max_threads)
            ]
            freeing.sort(key=model.throughput, reverse=True)
            for freed in freeing[:TRANSFER_FREEING_MOVES]:
                freed = merge_unreplicated(freed)
                moved, value = _best_move(model, _neighbours(model, freed, max_threads), max_threads, best_value)
                if moved is not None:
                    best, best_value = moved, value
        if best is None:
            break
        current, current_value = merge_unreplicated(best), best_value
    return current
