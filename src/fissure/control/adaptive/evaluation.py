"""Judging a plan switch after its evaluation window: the `Trial` under evaluation, the `judge`
that keeps or reverts it (a `Verdict` with its reason), and the `BlacklistShare` that decides a
halt (Tang and Gedik, "Autopipelining for Data Stream Processing", IEEE TPDS 2013, Section 5)."""

from __future__ import annotations

from dataclasses import dataclass

from fissure.control.adaptive.config import AdaptiveConfig
from fissure.control.adaptive.decisions import Objective, PlanSwitch, format_rate
from fissure.control.thread_level.decisions import relative_gain
from fissure.model.types import Plan


@dataclass(frozen=True)
class Trial:
    """A switch under evaluation: what it replaced and what it must show."""

    switch: PlanSwitch
    previous: Plan
    objective: Objective
    baseline_per_s: float  # measured under the previous plan
    required_per_s: float | None  # RATE: the offered rate x (1 + headroom)


@dataclass(frozen=True)
class Verdict:
    """Keep the switch under evaluation, or revert it; and why."""

    keep: bool
    reason: str


def judge(trial: Trial, measured_per_s: float, config: AdaptiveConfig) -> Verdict:
    """Keep or revert a switch after its evaluation window."""
    baseline = trial.baseline_per_s
    change = relative_gain(baseline, measured_per_s)
    figures = f"measured {format_rate(measured_per_s)} vs {format_rate(baseline)} before ({change:+.0%})"
    if trial.objective is Objective.RATE and trial.required_per_s is not None:
        floor = trial.required_per_s * (1 - config.prediction_tolerance)
        if measured_per_s >= floor:
            return Verdict(True,
                           f"{figures}, enough for the {format_rate(trial.required_per_s)} the offered rate needs")
        return Verdict(False, f"{figures}, short of the {format_rate(trial.required_per_s)} the offered rate needs")
    if measured_per_s >= baseline * (1 + config.min_gain):
        return Verdict(True, f"{figures}, at least the {config.min_gain:.0%} gain asked")
    gain = trial.switch.expected_gain
    if gain is not None and measured_per_s >= baseline:
        expected = baseline * (1 + gain)
        if measured_per_s >= expected * (1 - config.prediction_tolerance):
            return Verdict(True, f"{figures}, as predicted ({format_rate(expected)} expected)")
    expected = "" if gain is None else f", {format_rate(baseline * (1 + gain))} expected"
    return Verdict(False, f"{figures}{expected}: no gain of {config.min_gain:.0%}")


@dataclass(frozen=True)
class BlacklistShare:
    """How many of the planner's candidate changes repeat a blacklisted change."""

    blocked: int
    candidates: int

    @property
    def share(self) -> float:
        return self.blocked / self.candidates if self.candidates else 0.0
