"""Judging a plan switch after its evaluation window: the `Trial` under evaluation, the `judge`
that keeps or reverts it (a `Verdict` with its reason), and the `BlacklistShare` that decides a
halt (Tang and Gedik, "Autopipelining for Data Stream Processing", IEEE TPDS 2013, Section 5).
A switch made for throughput is kept only when its gain is beyond this run's measured noise
(fissure.control.noise), the model's prediction joining the measurement."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

from fissure.control.adaptive.config import AdaptiveConfig
from fissure.control.adaptive.decisions import Objective, PlanSwitch, format_rate
from fissure.control.noise import NoiseEstimate, judge_gain
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
    baseline_samples: tuple[float, ...] = ()  # the per-batch rates behind baseline_per_s


@dataclass(frozen=True)
class Verdict:
    """Keep the switch under evaluation, or revert it; and why."""

    keep: bool
    reason: str


def judge(trial: Trial, measured: Sequence[float], config: AdaptiveConfig,
          noise: NoiseEstimate = NoiseEstimate()) -> Verdict:
    """Keep or revert a switch after its evaluation window of per-batch rates `measured`."""
    measured_per_s = fmean(measured)
    baseline = trial.baseline_per_s
    if trial.objective is Objective.RATE and trial.required_per_s is not None:
        change = relative_gain(baseline, measured_per_s)
        figures = f"measured {format_rate(measured_per_s)} vs {format_rate(baseline)} before ({change:+.0%})"
        floor = trial.required_per_s * (1 - config.prediction_tolerance)
        if measured_per_s >= floor:
            return Verdict(True,
                           f"{figures}, enough for the {format_rate(trial.required_per_s)} the offered rate needs")
        return Verdict(False, f"{figures}, short of the {format_rate(trial.required_per_s)} the offered rate needs")
    before = trial.baseline_samples or (baseline,)
    verdict = judge_gain(before, measured, noise, confidence=config.keep_confidence, assumed_sd=config.assumed_noise,
                         predicted_gain=trial.switch.expected_gain, unit=" records/s")
    return Verdict(verdict.keep, verdict.reason)


@dataclass(frozen=True)
class BlacklistShare:
    """How many of the planner's candidate changes repeat a blacklisted change."""

    blocked: int
    candidates: int

    @property
    def share(self) -> float:
        return self.blocked / self.candidates if self.candidates else 0.0
