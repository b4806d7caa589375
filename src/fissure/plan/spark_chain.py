"""The planners over the Spark model (fissure.model.spark_model) instead of the paper's.

`SparkChainModel` is a `ChainModel` whose objective, `throughput`, is the Spark model's
prediction; everything the heuristic uses to *build* candidates (Algorithms 2-4: region seeds,
bottleneck pipelines, utilization shares) stays the paper's fast form, with delta and c_p taken
from the Spark constants. So the heuristic and its local search rank every configuration by the
Spark model. The exact search (`spark_optimal_regions`) enumerates the same configuration space
as fissure.plan.exhaustive (never two unreplicated regions side by side, at most M threads,
replicas only where the paper's L_p allows them) and evaluates each configuration with the Spark
model; the model's stage barriers make the paper search's bound invalid, and the spaces fissure
plans on Spark (a few cores) are small.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from fissure.model.spark_model import SparkConstants, SparkWorkload, evaluate_spark
from fissure.model.types import Machine, OperatorStats
from fissure.plan.chain import ChainModel, RegionShape, merge_unreplicated
from fissure.plan.exhaustive import SearchSpace, SearchTooLarge, count_configurations

# The most configurations the exact search over the Spark model evaluates (about 60 us each).
MAX_SPARK_CONFIGURATIONS = 200_000


@dataclass(frozen=True)
class SparkModelSettings:
    """What the planners need to use the Spark model: its constants and the micro-batches' shape."""

    constants: SparkConstants = field(default_factory=SparkConstants)
    workload: SparkWorkload = field(default_factory=SparkWorkload)


def construction_machine(cores: int, constants: SparkConstants) -> Machine:
    """The paper machine the heuristic builds candidates with: delta is the process boundary,
    c_p what a record pays to reach replicas (an exchange, leaving and re-entering Python)."""
    replication_us = (constants.exchange_record_us + 2 * constants.python_record_us
                      + 2 * constants.conversion_record_us)
    return Machine(cores=cores, thread_switch_overhead_us=constants.boundary_record_us,
                   replication_cost_us=replication_us)


class SparkChainModel(ChainModel):
    """A chain on Spark: the paper's fast terms to build candidates, the Spark model to rank them."""

    def __init__(self, operators: Sequence[OperatorStats], cores: int, settings: SparkModelSettings) -> None:
        super().__init__(operators, construction_machine(cores, settings.constants))
        self.settings = settings
        self._spark_throughputs: dict[tuple[RegionShape, ...], float] = {}

    def throughput(self, regions: Sequence[RegionShape]) -> float:
        """The Spark model's throughput in tuples per microsecond (the planners' unit)."""
        key = tuple(regions)
        value = self._spark_throughputs.get(key)
        if value is None:
            value = self._spark_throughputs[key] = self.evaluate(key).throughput_per_s / 1e6
        return value

    def evaluate(self, regions: Sequence[RegionShape]):
        plan = self.to_plan(merge_unreplicated(regions), "spark")
        return evaluate_spark(self.operators, plan, self.cores, self.settings.constants, self.settings.workload)


def _configurations(model: ChainModel, space: SearchSpace) -> Iterator[list[RegionShape]]:
    """Every configuration of the exhaustive search's space, each once."""
    size = model.size
    chosen: list[RegionShape] = []

    def extend(start: int, threads_left: int, after_unreplicated: bool) -> Iterator[list[RegionShape]]:
        if start == size:
            yield list(chosen)
            return
        for end in range(start + 1, size + 1):
            replicable = space.allow_replication and model.replicable(start, end)
            max_pipelines = min(end - start, threads_left) if space.allow_pipelining else 1
            for pipelines in range(1, max_pipelines + 1):
                top = min(model.useful_replicas(start, end, threads_left) if replicable else 1,
                          threads_left // pipelines)
                for replicas in range(1, top + 1):
                    if replicas == 1 and after_unreplicated:
                        continue
                    for cuts in combinations(range(start + 1, end), pipelines - 1):
                        chosen.append(RegionShape(start, end, cuts, replicas))
                        yield from extend(end, threads_left - replicas * pipelines, replicas == 1)
                        chosen.pop()

    yield from extend(0, space.max_threads, False)


def spark_optimal_regions(model: SparkChainModel, space: SearchSpace,
                          limit: int = MAX_SPARK_CONFIGURATIONS) -> list[RegionShape]:
    """The configuration in `space` with the highest Spark-model throughput."""
    if space.max_threads < 1:
        raise ValueError("max_threads must be >= 1")
    count = count_configurations(model.size, space, model.replicable)
    if count > limit:
        raise SearchTooLarge(
            f"{model.size} operators with up to {space.max_threads} threads make {count:.3g} configurations; the "
            f"exact search over the Spark model evaluates at most {limit:.0e}. Use the heuristic, or fewer threads."
        )
    best, best_value = [RegionShape(0, model.size)], -math.inf
    for regions in _configurations(model, space):
        value = model.throughput(regions)
        if value > best_value:
            best, best_value = regions, value
    return best

