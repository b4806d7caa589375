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

The switch kind follows from the edits (docs/spark-runner.md, how a plan becomes a query):
- same regions with the same replicas, other pipeline boundaries: the PE's processes change
  between two micro-batches, live, no restart (`SwitchKind.IN_PE`);
- other regions or replicas: a new physical plan, so the query stops at a batch boundary and
  restarts on the same checkpoint (`SwitchKind.RESTART`), and when a partitioned operator's
  replica count or exchange key changes, its state is repartitioned offline first
  (`SwitchKind.RESTART_WITH_STATE`, with one `StateRepartition` per such operator).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from fissure.model.throughput import canonical_regions, shared_key
from fissure.model.types import Kind, OperatorStats, Plan, RegionPlan


class SwitchKind(str, Enum):
    """How a plan change is applied, from cheapest to dearest."""

    NONE = "none"  # the same plan: nothing to do
    IN_PE = "in-pe"  # pipeline boundaries inside PEs: processes added or removed between batches
    RESTART = "restart"  # replicas or exchanges: stop at a batch boundary, restart on the checkpoint
    RESTART_WITH_STATE = "restart-with-state"  # ... after repartitioning a keyed region's state


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
    """A partitioned operator whose state must be repartitioned before the restart."""

    operator: str
    replicas_before: int
    replicas_after: int
    key_before: tuple[str, ...] | None  # the exchange key of its region (None: one partition)
    key_after: tuple[str, ...] | None


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


@dataclass(frozen=True)
class _Placement:
    """Where an operator's state lives: its region's replicas and exchange key (None: one partition)."""

    replicas: int
    key: tuple[str, ...] | None


def _placements(regions: Sequence[RegionPlan], by_name: dict[str, OperatorStats]) -> dict[str, _Placement]:
    placements = {}
    for region in regions:
        key = None
        if region.replicas > 1:
            key = shared_key([by_name[name] for name in region.operators]) or None
        for name in region.operators:
            placements[name] = _Placement(region.replicas, key)
    return placements


def classify_change(before: Plan, after: Plan, operators: Sequence[OperatorStats]) -> PlanChange:
    """The canonical change from `before` to `after` for the chain `operators`, and its kind."""
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

    old_place, new_place = _placements(old_regions, by_name), _placements(new_regions, by_name)
    repartitions = tuple(
        StateRepartition(name, old_place[name].replicas, new_place[name].replicas, old_place[name].key, new_place[name].key)
        for name in names
        if by_name[name].kind is Kind.PARTITIONED and old_place[name] != new_place[name]
    )
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
