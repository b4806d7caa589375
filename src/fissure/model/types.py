"""Quantities the models and planners work on: operator statistics, machine constants, plans.

All costs are microseconds per tuple (`_us`); throughputs are tuples per second (`_per_s`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


# Up to this many state partitions, a new checkpoint's buckets (fissure.model.state_buckets) split
# as evenly over them as their count allows: their grouping key values are chosen for it
# (fissure.runtime.state.grouping_keys).
BALANCED_PARTITIONS_UP_TO = 12


class Kind(str, Enum):
    """Operator (and region) kind with respect to state, the paper's k(o) in {s, p, f}."""

    STATELESS = "stateless"
    PARTITIONED = "partitioned"  # partitioned stateful: independent state per key
    STATEFUL = "stateful"  # arbitrary state: never replicated


@dataclass(frozen=True)
class OperatorStats:
    """What the planner knows of one operator: the paper's c(o), s(o), k(o), a(o) and f<o>."""

    name: str
    kind: Kind
    cost_us: float
    selectivity: float
    key: tuple[str, ...] | None = None  # partitioning key a(o); only for PARTITIONED
    max_scale: float | None = None  # bound u of the bounded-linear scalability; None: linear
    # On Spark, its records are folded into partials before its exchange, one per key and task of
    # the stage before (a pe stage, the source's envelopes) or per key and call of a keyed stage
    # before (fissure.runtime.operators.combine): the exchange and the keyed stage see partials.
    combined: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("an operator needs a non-empty name")
        if self.cost_us < 0 or self.cost_us != self.cost_us:
            raise ValueError(f"operator {self.name!r}: cost must be a number >= 0, got {self.cost_us}")
        if self.selectivity < 0 or self.selectivity != self.selectivity:
            raise ValueError(
                f"operator {self.name!r}: selectivity must be a number >= 0, got {self.selectivity}"
            )
        if self.kind is Kind.PARTITIONED and not self.key:
            raise ValueError(f"operator {self.name!r} is partitioned but has no key")
        if self.kind is not Kind.PARTITIONED and self.key:
            raise ValueError(f"operator {self.name!r} has a key but is {self.kind.value}")
        if self.max_scale is not None and self.max_scale < 1:
            raise ValueError(f"operator {self.name!r}: max_scale must be >= 1, got {self.max_scale}")


@dataclass(frozen=True)
class Machine:
    """Machine constants of the paper's model."""

    cores: int  # C
    thread_switch_overhead_us: float = 1.0  # delta: per tuple crossing a pipeline boundary
    replication_cost_us: float = 50.0  # c_p: per tuple per log2(replicas) in a parallel region

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise ValueError(f"cores must be >= 1, got {self.cores}")
        if self.thread_switch_overhead_us < 0 or self.replication_cost_us < 0:
            raise ValueError("overheads must be >= 0")


@dataclass(frozen=True)
class RegionPlan:
    """One region: its pipelines (operator names, in chain order) and its replica count r(P_i)."""

    pipelines: tuple[tuple[str, ...], ...]
    replicas: int = 1

    @property
    def operators(self) -> tuple[str, ...]:
        return tuple(name for pipeline in self.pipelines for name in pipeline)


@dataclass(frozen=True)
class Plan:
    """A pipelined fission configuration of a chain: regions in chain order."""

    regions: tuple[RegionPlan, ...]
    method: str = "manual"
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def threads(self) -> int:
        """Total threads: sum over regions of replicas x pipelines."""
        return sum(region.replicas * len(region.pipelines) for region in self.regions)

    @property
    def operators(self) -> tuple[str, ...]:
        return tuple(name for region in self.regions for name in region.operators)
