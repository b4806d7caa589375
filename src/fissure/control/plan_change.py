"""What a switch from one plan to another changes, and what applying it takes on Spark.

A plan change is described canonically, as a set of edits between the two plans' canonical
forms (adjacent unreplicated regions merged, `fissure.model.throughput.canonical_regions`):

- a *region edit* says "these operators run as one region with r replicas" for every region of
  the new plan that the old plan does not have (same operators and replicas);
- a *boundary edit* says that a thread boundary (a pipeline or region boundary: a process
  hand-off inside a PE, or an exchange) before an operator was added or removed.

The edits depend on the two plans only, not on how a planner named or ordered them, so a later
plan that makes the same edits again is recognised (`PlanChange.repeats`): the adaptive loop's
blacklist holds changes, not plans.

The switch kind follows from the edits and from how fissure builds a query on Spark
(docs/spark-runner.md, how a plan becomes a query; docs/adaptive.md, "How a switch is applied"):
- same regions with the same replicas, other pipeline boundaries: the PE's processes change
  between two micro-batches, live, no restart (`SwitchKind.IN_PE`): the boundaries are a Spark
  local property the next batch's tasks read;
- other regions or replicas: a new physical plan, so the query stops at a batch boundary and
  restarts on the same checkpoint (`SwitchKind.RESTART`);
- when the query's state partitions change as well, the state is repartitioned offline before
  the restart (`SwitchKind.RESTART_WITH_STATE`, with one `StateRepartition` per stateful
  operator: every one of them is rewritten).

Why a stateless region's replica change is a restart and not a live switch: a region's
replicas are the partitions of a round-robin `repartition(r)` exchange inside the streaming
plan (fissure.spark.query.compile_graph), before the region's `mapInArrow`. A streaming query
analyses its logical plan once, when it starts; every micro-batch is planned from that plan
(`IncrementalExecution`), with only the sources' new offsets substituted, so the exchange's
partition count `r` is fixed for the query's life. Adaptive query execution, which could
change a shuffle's partition count per batch, is turned off for streaming queries
(`StreamExecution` sets `spark.sql.adaptive.enabled` to false in the query's session). Nothing
of the region's width is decided in the `foreachBatch` function (it only writes the sinks) or
inside the workers (a task's PE runs the pieces of one partition). So only the pipeline cuts,
which the workers read per batch, change live.

What a state repartition rewrites: Spark gives every stateful operator of a query the same
number of state partitions, `spark.sql.shuffle.partitions`, recorded in the checkpoint's offset
log and restored at every restart; fissure sets it to the most replicas of a region with a
partitioned operator (`state_partitions`). Each keyed operator's state is hashed on the
operator's own key into those partitions, whatever its region's exchange key, so its state
moves only when that count changes: then Spark's offline repartitioner
(`StreamingCheckpointManager.repartition(checkpoint, partitions)`, which takes no list of
operators) rewrites every stateful operator's state, and `state_repartitions` names them all.
A partitioned operator whose replicas or region key change while the count stays (another
keyed region keeps the largest width) needs a plain restart: its state is neither read nor
rewritten.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from fissure.model.throughput import canonical_regions
from fissure.model.types import Kind, OperatorStats, Plan, RegionPlan


class SwitchKind(str, Enum):
    """How a plan change is applied, from cheapest to dearest."""

    NONE = "none"  # the same plan: nothing to do
    IN_PE = "in-pe"  # pipeline boundaries inside PEs: processes added or removed between batches
    RESTART = "restart"  # replicas or exchanges: stop at a batch boundary, restart on the checkpoint
    RESTART_WITH_STATE = "restart-with-state"  # ... after repartitioning the query's state partitions


class EditKind(str, Enum):
    REGION = "region"  # the new plan runs `operators` as one region with `replicas` replicas
    BOUNDARY_ADDED = "boundary-added"  # a thread boundary before operators[0] appears
    BOUNDARY_REMOVED = "boundary-removed"  # the thread boundary before operators[0] goes


@dataclass(frozen=True, order=True)
class PlanEdit:
    """One element of a canonical plan change."""

    kind: EditKind
    operators: tuple[str, ...]
    replicas: int = 0  # region edits only

    @classmethod
    def region(cls, operators: tuple[str, ...], replicas: int) -> PlanEdit:
        return cls(EditKind.REGION, operators, replicas)

    @classmethod
    def boundary(cls, before: str, added: bool) -> PlanEdit:
        return cls(EditKind.BOUNDARY_ADDED if added else EditKind.BOUNDARY_REMOVED, (before,))

    def describe(self) -> str:
        if self.kind is EditKind.REGION:
            return f"[{','.join(self.operators)}]x{self.replicas}"
        sign = "+" if self.kind is EditKind.BOUNDARY_ADDED else "-"
        return f"{sign}boundary before {self.operators[0]}"


@dataclass(frozen=True)
class StateRepartition:
    """A stateful operator whose state is rewritten into another number of partitions before the restart."""

    operator: str
    partitions_before: int  # the query's state partitions (Spark: one count for every stateful operator)
    partitions_after: int


@dataclass(frozen=True)
class PlanChange:
    """The canonical difference between two plans and what applying it takes."""

    before: str  # fingerprint of the old plan
    after: str  # fingerprint of the new plan
    kind: SwitchKind
    edits: frozenset[PlanEdit]
    state_repartitions: tuple[StateRepartition, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.edits

    def repeats(self, blacklisted: PlanChange) -> bool:
        """Whether this change makes every edit of `blacklisted` again (so it would be a retry)."""
        return bool(blacklisted.edits) and blacklisted.edits <= self.edits

    def describe(self) -> str:
        if not self.edits:
            return "no change"
        return ", ".join(edit.describe() for edit in sorted(self.edits))


def plan_fingerprint(plan: Plan) -> str:
    """The canonical plan as text, `[a|b]x2 -> [c]`: the same notation as `fissure run`."""
    texts = []
    for region in canonical_regions(plan):
        text = "[" + "|".join(",".join(pipeline) for pipeline in region.pipelines) + "]"
        texts.append(text + (f"x{region.replicas}" if region.replicas > 1 else ""))
    return " -> ".join(texts)


def parse_fingerprint(text: str) -> Plan:
    """The plan a fingerprint describes (`[a|b,c]x2 -> [d]`): the inverse of `plan_fingerprint`."""
    regions = []
    for part in text.split(" -> "):
        body, _, replicas = part.strip().partition("]x")
        if not (body.startswith("[") and (replicas or body.endswith("]"))):
            raise ValueError(f"{part!r} is no region: write [a,b|c] or [a,b|c]x2, regions joined by ' -> '")
        pipelines = tuple(tuple(pipeline.split(",")) for pipeline in body.strip("[]").split("|"))
        regions.append(RegionPlan(pipelines, int(replicas) if replicas else 1))
    return Plan(tuple(regions), method="fingerprint")


def same_plan(first: Plan, second: Plan) -> bool:
    """Equal canonical layouts (a Plan's `method` and `notes` do not matter)."""
    return canonical_regions(first) == canonical_regions(second)


def _boundaries(regions: Sequence[RegionPlan]) -> frozenset[str]:
    """Operators that begin a pipeline or a region, except the chain's first operator."""
    starts = {pipeline[0] for region in regions for pipeline in region.pipelines}
    return frozenset(starts - {regions[0].pipelines[0][0]})


def state_partitions(regions: Sequence[RegionPlan], by_name: dict[str, OperatorStats], default: int = 1) -> int:
    """The state partitions of a plan's query on Spark: the most replicas of a region with a
    partitioned operator, else `default` (fissure.compile.stages.state_partitions_of, the rule the
    query is compiled with)."""
    keyed = [region.replicas for region in regions
             if any(by_name[name].kind is Kind.PARTITIONED for name in region.operators)]
    return max(keyed, default=default)


def classify_change(before: Plan, after: Plan, operators: Sequence[OperatorStats]) -> PlanChange:
    """The canonical change from `before` to `after` for the chain `operators`, and its kind.

    The state partitions depend on RunnerConfig.default_state_partitions only for a chain without
    a partitioned operator, and then equally for both plans: the kind does not."""
    names = tuple(operator.name for operator in operators)
    for label, plan in (("before", before), ("after", after)):
        if plan.operators != names:
            raise ValueError(
                f"classify_change: the {label} plan covers {list(plan.operators)}, not the chain's"
                f" {list(names)}; both plans must list every operator once, in chain order"
            )
    by_name = {operator.name: operator for operator in operators}
    old_regions, new_regions = canonical_regions(before), canonical_regions(after)
    old_layout = {(region.operators, region.replicas) for region in old_regions}
    new_layout = {(region.operators, region.replicas) for region in new_regions}
    old_bounds, new_bounds = _boundaries(old_regions), _boundaries(new_regions)
    edits = {PlanEdit.region(ops, replicas) for ops, replicas in new_layout - old_layout}
    edits |= {PlanEdit.boundary(name, True) for name in new_bounds - old_bounds}
    edits |= {PlanEdit.boundary(name, False) for name in old_bounds - new_bounds}

    partitions_before = state_partitions(old_regions, by_name)
    partitions_after = state_partitions(new_regions, by_name)
    repartitions = ()
    if partitions_before != partitions_after:
        repartitions = tuple(StateRepartition(name, partitions_before, partitions_after)
                             for name in names if by_name[name].kind is not Kind.STATELESS)
    if old_layout != new_layout:
        kind = SwitchKind.RESTART_WITH_STATE if repartitions else SwitchKind.RESTART
    elif old_bounds != new_bounds:
        kind = SwitchKind.IN_PE
    else:
        kind = SwitchKind.NONE
    return PlanChange(
        before=plan_fingerprint(before),
        after=plan_fingerprint(after),
        kind=kind,
        edits=frozenset(edits),
        state_repartitions=repartitions,
    )
