"""The adaptive loop's parameters: `AdaptiveConfig`, and `SwitchCosts`, what each kind of plan
switch is assumed to lose (a running estimate the realizer's measurements update)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fissure.control.model_correction import CorrectionConfig
from fissure.control.plan_change import SwitchKind
from fissure.plan.planners import METHODS


@dataclass(frozen=True)
class SwitchCosts:
    """Seconds of processing one switch of each kind loses, as the loop assumes them.

    The defaults are starting points measured with PySpark 4.3 on a 2-core machine; the realizer
    measures every switch it makes and `AdaptiveController.switch_applied` folds the measurements
    in (`with_measurement`).

    Attributes:
        in_pe_s: processes of a PE added or removed between two batches (a fork and a pipe:
            about one micro-batch floor, 0.3-0.5 s).
        restart_s: stop the query at a batch boundary and restart it on the same checkpoint with
            another physical plan (the first batch of a new streaming query: 2.5-5 s).
        restart_with_state_s: the same after repartitioning the query's state offline, when its
            state partitions change (RocksDB state repartitioner: 4-8 s more).
    """

    in_pe_s: float = 0.5
    restart_s: float = 5.0
    restart_with_state_s: float = 13.0

    def __post_init__(self) -> None:
        for name in ("in_pe_s", "restart_s", "restart_with_state_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"SwitchCosts.{name} must be a finite number of seconds >= 0, got {value}")

    def cost_s(self, kind: SwitchKind) -> float:
        if kind is SwitchKind.NONE:
            return 0.0
        if kind is SwitchKind.IN_PE:
            return self.in_pe_s
        if kind is SwitchKind.RESTART:
            return self.restart_s
        return self.restart_with_state_s

    def with_measurement(self, kind: SwitchKind, measured_s: float, weight: float, max_step: float) -> SwitchCosts:
        """Move the cost of `kind` towards `measured_s` by `weight`, at most `max_step`-fold at once."""
        field = {
            SwitchKind.IN_PE: "in_pe_s",
            SwitchKind.RESTART: "restart_s",
            SwitchKind.RESTART_WITH_STATE: "restart_with_state_s",
        }.get(kind)
        if field is None:
            return self
        current = getattr(self, field)
        target = current + weight * (measured_s - current)
        if current > 0:
            target = min(max(target, current / max_step), current * max_step)
        return replace(self, **{field: target})


@dataclass(frozen=True)
class AdaptiveConfig:
    """Every parameter of the adaptive loop, with its default.

    Attributes:
        profile_batches: batches in a profiling (and monitoring) window, at least.
        profile_s: seconds a profiling window lasts, at least (both bounds must be reached).
        evaluation_batches: batches measured after a switch before it is judged.
        evaluation_s: seconds the evaluation lasts, at least.
        discard_after_switch: batches not counted after a switch (and after the start): restart
            effects (the first batch of a restarted query pays the JVM's and workers' warm-up).
        min_gain: relative gain a switch must be predicted to bring, at least (the gain an
            evaluation could not tell from this run's noise is asked when it is more).
        keep_confidence: a switch made for throughput is kept when its measured gain is beyond
            the band this run's noise could give with this confidence, one-sided
            (fissure.control.noise); the autopipelining paper keeps any gain.
        assumed_noise: the relative spread of one batch's rate assumed until the run has
            measured its own (weighs as two batches; ±10 % is this project's 2-core machine).
        prediction_tolerance: a release must process the offered rate with headroom within
            this share.
        alpha: halt when more than this share of the last planning's candidate changes repeat
            a blacklisted change (Tang and Gedik's alpha; the paper leaves the value open).
        sensitivity: SENS, the relative departure of a plan's throughput from its reference that
            counts towards a change in load (Streams 4.2: 0.05).
        change_confirmations: departing batches in a row, in one direction, that make a change
            (1 is the Streams paper's; a micro-batch is noisier than its 10 s period).
        change_noise_z: a departure must also exceed this many standard deviations of the
            plan's measured throughput (0: SENS alone, as in the paper).
        operator_sensitivity: relative drift of an operator's cost or selectivity between the
            plan's profile and a later window that counts as a workload change.
        min_operator_samples: tuples an operator's estimate must rest on before it is used.
        payback_horizon_s: a switch must win back the processing time it loses within this
            horizon (gain x horizon > cost). It could be the evaluation window, but with a
            window of a few seconds no Spark restart (about 5 s) could ever pay, so the horizon
            is its own parameter: how long a plan is expected to stay in force.
        rate_headroom: a plan sized for the offered rate must be predicted to process the rate
            times (1 + rate_headroom).
        rate_change: relative move of the offered rate that re-opens a plan sized for the rate.
        max_release_fraction: a release removes at most this share of the threads in one step
            (a clamp like the Flink autoscaler's maximum scale-down factor).
        max_switches_per_workload: plan switches the loop tries between two workload changes
            (kept or reverted; None: no limit besides the blacklist's alpha).
        planning_method: the planner (`fissure plan --method`) the default search uses.
        max_threads: the planners' thread budget M; None: 2 C.
        forget_blacklist_on_change: a workload change empties the blacklist.
        switch_cost_weight: weight of one measured switch cost in the running estimate.
        switch_cost_max_step: one measurement moves a switch cost by at most this factor.
        correct_model: learn from measurements: fit a factor per model term to what the plans
            run so far measured, and plan with the corrected model
            (fissure.control.model_correction); needs a search that supports it.
        correction: how the correction learns (prior weight, factor bounds, plans kept).
    """

    profile_batches: int = 5
    profile_s: float = 5.0
    evaluation_batches: int = 4
    evaluation_s: float = 3.0
    discard_after_switch: int = 1
    min_gain: float = 0.02
    keep_confidence: float = 0.9
    assumed_noise: float = 0.10
    prediction_tolerance: float = 0.10
    alpha: float = 0.5
    sensitivity: float = 0.05
    change_confirmations: int = 3
    change_noise_z: float = 3.0
    operator_sensitivity: float = 0.25
    min_operator_samples: int = 100
    payback_horizon_s: float = 300.0
    rate_headroom: float = 0.3
    rate_change: float = 0.2
    max_release_fraction: float = 0.5
    max_switches_per_workload: int | None = 6
    planning_method: str = "heuristic"
    max_threads: int | None = None
    forget_blacklist_on_change: bool = True
    switch_cost_weight: float = 0.5
    switch_cost_max_step: float = 4.0
    correct_model: bool = True
    correction: CorrectionConfig = CorrectionConfig()

    def __post_init__(self) -> None:
        for name in ("profile_batches", "evaluation_batches", "change_confirmations"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.discard_after_switch < 0 or self.min_operator_samples < 0 or not self.change_noise_z >= 0:
            raise ValueError("discard_after_switch, min_operator_samples and change_noise_z must be >= 0")
        for name in ("profile_s", "evaluation_s", "payback_horizon_s", "min_gain", "rate_headroom"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        for name in ("alpha", "max_release_fraction", "switch_cost_weight"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("sensitivity", "prediction_tolerance", "operator_sensitivity", "rate_change"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name} must be in (0, 1) (0.05 means 5 %), got {getattr(self, name)}")
        if not 0.5 <= self.keep_confidence < 1:
            raise ValueError(f"keep_confidence must be in [0.5, 1) (0.9 means 90 %), got {self.keep_confidence}")
        if not (math.isfinite(self.assumed_noise) and self.assumed_noise > 0):
            raise ValueError(f"assumed_noise must be a relative spread > 0 (0.1 means 10 %), got {self.assumed_noise}")
        if self.planning_method not in METHODS:
            raise ValueError(f"unknown planning_method {self.planning_method!r}; choose one of {', '.join(METHODS)}")
        if self.max_switches_per_workload is not None and self.max_switches_per_workload < 1:
            raise ValueError(f"max_switches_per_workload must be >= 1 or None, got {self.max_switches_per_workload}")
        if self.max_threads is not None and self.max_threads < 1:
            raise ValueError(f"max_threads must be >= 1 or None, got {self.max_threads}")
        if self.switch_cost_max_step < 1:
            raise ValueError(f"switch_cost_max_step must be >= 1, got {self.switch_cost_max_step}")
