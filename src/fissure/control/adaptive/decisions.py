"""What the adaptive loop hands out: one `Decision` per batch, a frozen value with its reason, and
the `PlanSwitch` a decision asks the realizer to make; the loop's `Phase` and `Objective`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from fissure.control.model_correction import Correction
from fissure.control.plan_change import PlanChange, SwitchKind
from fissure.model.types import Plan


class Action(str, Enum):
    OBSERVE = "observe"  # keep observing: profiling, evaluating, settled, halted, or no data
    APPLY = "apply"  # switch to a candidate plan (then evaluate it)
    RELEASE = "release"  # switch to a plan with fewer threads: the offered rate needs fewer
    KEEP = "keep"  # the candidate in force stays
    REVERT = "revert"  # back to the previous plan; the change is blacklisted
    HALT = "halt"  # too much blacklisted (or a switch back failed): stop adapting until re-opened
    REOPEN = "reopen"  # the workload changed: profile and plan afresh


class Phase(str, Enum):
    PROFILING = "profiling"
    EVALUATING = "evaluating"
    SETTLED = "settled"  # nothing worth switching to: watching the workload
    HALTED = "halted"  # blacklist beyond alpha: watching the workload


class Objective(str, Enum):
    THROUGHPUT = "throughput"  # as much throughput as the cores give
    RATE = "rate"  # the fewest threads that process the offered rate with headroom


@dataclass(frozen=True)
class PlanSwitch:
    """A switch for the realizer to make, and what the loop expects of it."""

    plan: Plan
    change: PlanChange
    predicted_throughput_per_s: float | None  # model (or, for a revert, the baseline measured)
    expected_gain: float | None  # relative to the plan in force (model), None: unknown
    switch_cost_s: float  # the loop's estimate of the seconds this kind of switch loses

    @property
    def kind(self) -> SwitchKind:
        return self.change.kind


@dataclass(frozen=True)
class Decision:
    """One decision of the loop, for one batch.

    `switch` is what the realizer must apply before the next batch (APPLY, RELEASE, REVERT, and
    HALT when it reverts); `plan_in_force` is the fingerprint of the plan in force once it is.
    """

    action: Action
    reason: str
    batch_id: int
    now_s: float
    plan_in_force: str
    switch: PlanSwitch | None = None
    blacklisted: PlanChange | None = None
    correction: Correction | None = None  # the model correction a planning decision used, if any

    def summary(self) -> str:
        """One line for a loop's timeline: the action and the plan in force after it."""
        return f"{self.action.value} {self.plan_in_force}"

    @classmethod
    def observe(cls, batch_id: int, now_s: float, plan_in_force: str, reason: str) -> Decision:
        return cls(Action.OBSERVE, reason, batch_id, now_s, plan_in_force)

    @classmethod
    def apply(cls, batch_id: int, now_s: float, switch: PlanSwitch, reason: str) -> Decision:
        return cls(Action.APPLY, reason, batch_id, now_s, switch.change.after, switch)

    @classmethod
    def release(cls, batch_id: int, now_s: float, switch: PlanSwitch, reason: str) -> Decision:
        return cls(Action.RELEASE, reason, batch_id, now_s, switch.change.after, switch)

    @classmethod
    def keep(cls, batch_id: int, now_s: float, plan_in_force: str, reason: str) -> Decision:
        return cls(Action.KEEP, reason, batch_id, now_s, plan_in_force)

    @classmethod
    def revert(
        cls, batch_id: int, now_s: float, plan_in_force: str, blacklisted: PlanChange, reason: str,
        switch: PlanSwitch | None = None,
    ) -> Decision:
        return cls(Action.REVERT, reason, batch_id, now_s, plan_in_force, switch, blacklisted)

    @classmethod
    def halt(
        cls, batch_id: int, now_s: float, plan_in_force: str, reason: str,
        switch: PlanSwitch | None = None, blacklisted: PlanChange | None = None,
    ) -> Decision:
        return cls(Action.HALT, reason, batch_id, now_s, plan_in_force, switch, blacklisted)

    @classmethod
    def reopen(cls, batch_id: int, now_s: float, plan_in_force: str, reason: str) -> Decision:
        return cls(Action.REOPEN, reason, batch_id, now_s, plan_in_force)


def format_rate(value: float) -> str:
    """A rate as the decisions' reasons write it: `12,593/s`."""
    return f"{value:,.0f}/s"
