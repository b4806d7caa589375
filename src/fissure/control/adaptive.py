"""The adaptive loop's decisions: re-plan while running, keep what helps, roll back what does not.

A pure state machine (issue 5). The runner hands it one `BatchObservation` per micro-batch and
gets one `Decision` back, a frozen value that carries its reason; the clock and the measurements
come in as arguments, nothing here reads a clock, sleeps or touches Spark. What the loop does:

1. Profile: collect a window of batches on the plan in force (at least `profile_batches` and
   `profile_s`), the first batch after every switch discarded (start-up and restart effects).
2. Plan: estimate every operator's cost and selectivity from the window, correct the model by
   what the plans run so far measured (a factor per model term, fissure.control.model_correction),
   ask the planner for candidate plans (the corrected planner's and the plain one's, all priced
   by the corrected model), leave out those that repeat a blacklisted change, and pick
   - for throughput: the candidate with the most records over the payback horizon, counting the
     time its switch loses (`SwitchCosts`); it must be predicted `min_gain` better than the plan
     in force and pay its switch back within `payback_horizon_s`;
   - for an input that no longer saturates the plan (offered rate known, no backlog): the plan
     with the fewest threads predicted to process the offered rate with `rate_headroom`, at most
     `max_release_fraction` of the threads fewer per step (scenario d: release cores).
   Nothing worth switching to: the loop settles, and only watches the workload.
3. Apply (the driver hands the switch to a `PlanRealizer`), then evaluate for
   `evaluation_batches` and `evaluation_s`: keep when the measured throughput beats the baseline
   (the previous plan's) by `min_gain`, or reaches the prediction within `prediction_tolerance`
   without falling below the baseline (a release: when it still processes the offered rate with
   headroom); otherwise revert and blacklist the change (Tang and Gedik, TPDS 2013, Section 5).
   An operator that drifted since the planning voids the comparison: re-open, no verdict.
4. Halt when more than a share `alpha` of the planner's candidate changes repeat a blacklisted
   change (Tang and Gedik halt on the share of blacklisted input ports, the places where their
   optimizer may insert a thread; here the candidates are whole plan changes).
5. Re-open, from settled or halted, when the workload changes: the throughput of the plan in
   force departs from its reference by more than `sensitivity` (SENS) for `change_confirmations`
   batches in a row (the Streams 4.2 change-in-load test, `ChangeDetector`), an operator's cost
   or selectivity drifts by more than `operator_sensitivity`, the cores change, or the load does
   (the input starts or stops saturating the plan, the offered rate moves by `rate_change`). A
   workload change forgets the blacklist: its measurements belong to the old workload, as the
   Streams paper untrusts all its data on a change in load.

Missing or NaN measurements never crash and never switch: the decision is "observe", with a log
line. Decisions are logged at INFO by the controller itself.
"""

from __future__ import annotations

import logging
import math
from statistics import fmean
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Protocol

from fissure.control.change import ChangeDetector
from fissure.control.elasticity import relative_gain
from fissure.control.model_correction import (
    OPERATORS_TERM,
    CorrectablePlanSearch,
    Correction,
    CorrectionConfig,
    ModelCorrection,
    PlanMeasurement,
    scale_operators,
)
from fissure.control.plan_change import (
    PlanChange,
    SwitchKind,
    classify_change,
    plan_fingerprint,
)
from fissure.model.throughput import InvalidPlan, evaluate, validate_plan
from fissure.model.types import Machine, OperatorStats, Plan
from fissure.optimize.exhaustive import SearchTooLarge
from fissure.optimize.planners import METHODS, default_max_threads, plan_chain

log = logging.getLogger(__name__)

# Below these, a cost (us per tuple) or selectivity drift is measured against the floor instead:
# relative drifts of near-zero values are noise.
COST_DRIFT_FLOOR_US = 0.1
SELECTIVITY_DRIFT_FLOOR = 0.01
# A batch that leaves more than this share of its own size waiting behind it did not keep up.
SATURATION_BACKLOG_SHARE = 0.5
# The measured/predicted calibration of absolute rates is clamped to this factor either way.
MAX_CALIBRATION_FACTOR = 4.0
# Samples kept in a window at most (a window that cannot plan for want of profiles stays bounded).
MAX_WINDOW_BATCHES = 256


@dataclass(frozen=True)
class SwitchCosts:
    """Seconds of processing one switch of each kind loses, as the loop assumes them.

    The defaults are starting points from DESIGN.md's measurements (PySpark 4.3, this machine);
    the realizer measures every switch it makes and `AdaptiveController.record_switch_cost`
    folds the measurements in.

    Attributes:
        in_pe_s: processes of a PE added or removed between two batches (a fork and a pipe:
            about one micro-batch floor, 0.3-0.5 s).
        restart_s: stop the query at a batch boundary and restart it on the same checkpoint with
            another physical plan (the first batch of a new streaming query: 2.5-5 s).
        restart_with_state_s: the same after repartitioning a keyed region's state offline
            (RocksDB state repartitioner: 4-8 s more).
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
        min_gain: relative gain a switch must be predicted to bring, and a measured gain over
            the baseline that keeps it (the autopipelining paper keeps any gain: 0).
        prediction_tolerance: a switch that reaches its prediction within this share, without
            falling below the baseline, is kept too; a release must process the offered rate
            with headroom within this share.
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
            horizon (gain x horizon > cost). The issue's wording takes the evaluation window;
            with a window of a few seconds no Spark restart (about 5 s) could ever pay, so the
            horizon is its own parameter: how long a plan is expected to stay in force.
        rate_headroom: a plan sized for the offered rate must be predicted to process the rate
            times (1 + rate_headroom).
        rate_change: relative move of the offered rate that re-opens a plan sized for the rate.
        max_release_fraction: a release removes at most this share of the threads in one step
            (a clamp like the Flink autoscaler's maximum scale-down factor).
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
    min_gain: float = 0.05
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
        if self.planning_method not in METHODS:
            raise ValueError(f"unknown planning_method {self.planning_method!r}; choose one of {', '.join(METHODS)}")
        if self.max_threads is not None and self.max_threads < 1:
            raise ValueError(f"max_threads must be >= 1 or None, got {self.max_threads}")
        if self.switch_cost_max_step < 1:
            raise ValueError(f"switch_cost_max_step must be >= 1, got {self.switch_cost_max_step}")


# -- what comes in ------------------------------------------------------------------------------


@dataclass(frozen=True)
class OperatorProfile:
    """A profiler's estimate of one operator's statistics and how many tuples it rests on."""

    stats: OperatorStats
    samples: int


@dataclass(frozen=True)
class BatchObservation:
    """What the runner measured in one micro-batch.

    Attributes:
        batch_id: the micro-batch's id.
        now_s: the injected clock at the end of the batch.
        records_in: records the batch took from the source.
        duration_s: seconds the batch took to process.
        throughput_per_s: records processed per second of processing (Spark's
            processedRowsPerSecond); None or NaN when it could not be measured.
        operators: per-operator estimates from the profiler (may be empty).
        offered_rate_per_s: the source's arrival rate (Spark's inputRowsPerSecond), when known.
        backlog_records: records still waiting after this batch took its share, when known.
        cores: cores (task slots) the query may use now; None: the controller's machine's.
        plan_in_force: fingerprint of the plan the runner ran this batch with; None: trusted to
            be the controller's.
        thread_levels: operators on elastic threads -> their thread level in each worker after
            the batch (docs/elastic-scheduler.md); for the timeline, not for decisions.
    """

    batch_id: int
    now_s: float
    records_in: int
    duration_s: float
    throughput_per_s: float | None
    operators: tuple[OperatorProfile, ...] = ()
    offered_rate_per_s: float | None = None
    backlog_records: int | None = None
    cores: int | None = None
    plan_in_force: str | None = None
    thread_levels: Mapping[str, tuple[int, ...]] | None = None


# -- what goes out ------------------------------------------------------------------------------


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


# -- planning: a seam for the model that predicts Spark -------------------------------------------


@dataclass(frozen=True)
class ScoredPlan:
    plan: Plan
    predicted_throughput_per_s: float


class PlanSearch(Protocol):
    """Where candidate plans and predictions come from (the paper's model by default)."""

    def predict_per_s(self, operators: Sequence[OperatorStats], plan: Plan, machine: Machine) -> float: ...

    def candidates(self, operators: Sequence[OperatorStats], machine: Machine) -> Sequence[ScoredPlan]: ...


@dataclass(frozen=True)
class ChainPlanSearch:
    """The chain planner at every thread budget 1..M, and the baselines of `alternatives` at M.

    The budgets below M give the rate-sized plans (fewest threads that cover a rate); those and
    the baselines (the best plan without replicas, the best without pipelines) are the fall-backs
    when the best plan's change is blacklisted, e.g. when the model underrates what an exchange
    costs. A baseline whose exhaustive search would be too large is left out.
    """

    method: str = "heuristic"
    max_threads: int | None = None
    alternatives: tuple[str, ...] = ("pipelining-only", "fission-only")
    # The learned correction (fissure.control.model_correction): (term, factor) pairs.
    factors: tuple[tuple[str, float], ...] = ()

    def predict_per_s(self, operators: Sequence[OperatorStats], plan: Plan, machine: Machine) -> float:
        operators, machine = self._corrected(operators, machine, dict(self.factors))
        return evaluate(operators, plan, machine).throughput_per_s

    def candidates(self, operators: Sequence[OperatorStats], machine: Machine) -> tuple[ScoredPlan, ...]:
        operators, machine = self._corrected(operators, machine, dict(self.factors))
        budget = self.max_threads or default_max_threads(machine.cores)
        runs = [(self.method, threads) for threads in range(1, budget + 1)]
        runs += [(method, budget) for method in self.alternatives]
        found: dict[str, ScoredPlan] = {}
        for method, threads in runs:
            try:
                result = plan_chain(operators, machine, method, max_threads=threads)
            except SearchTooLarge:
                log.info("adaptive: no %s candidate, its search is too large", method)
                continue
            found.setdefault(
                plan_fingerprint(result.plan), ScoredPlan(result.plan, result.evaluation.throughput_per_s)
            )
        return tuple(found.values())

    # -- CorrectablePlanSearch: the paper's model has three terms: work, delta, c_p -------------
    def correction_terms(self) -> tuple[str, ...]:
        return PAPER_MODEL_TERMS

    def seconds_per_record(self, operators: Sequence[OperatorStats], plan: Plan, machine: Machine,
                           factors: Mapping[str, float]) -> float:
        operators, machine = self._corrected(operators, machine, factors)
        return 1.0 / evaluate(operators, plan, machine).throughput_per_s

    def with_factors(self, factors: Mapping[str, float]) -> ChainPlanSearch:
        return replace(self, factors=tuple(sorted(factors.items())))

    @staticmethod
    def _corrected(operators: Sequence[OperatorStats], machine: Machine,
                   factors: Mapping[str, float]) -> tuple[tuple[OperatorStats, ...], Machine]:
        if not factors:
            return tuple(operators), machine
        machine = replace(
            machine,
            thread_switch_overhead_us=machine.thread_switch_overhead_us * factors.get("thread_switch_overhead_us", 1.0),
            replication_cost_us=machine.replication_cost_us * factors.get("replication_cost_us", 1.0),
        )
        return scale_operators(operators, factors), machine


# The paper model's correctable terms: the operators' work, delta and c_p (Machine's field names).
PAPER_MODEL_TERMS = (OPERATORS_TERM, "thread_switch_overhead_us", "replication_cost_us")


# -- evaluation: pure functions of the collected samples -----------------------------------------


@dataclass(frozen=True)
class Sample:
    """One accepted batch in a window (usable throughput, not discarded)."""

    batch_id: int
    now_s: float
    duration_s: float
    throughput_per_s: float
    records_in: int
    operators: tuple[OperatorProfile, ...]
    offered_rate_per_s: float | None
    backlog_records: int | None


@dataclass(frozen=True)
class ProfileEstimate:
    """The chain's statistics estimated from a window; `operators` is None when some are missing."""

    operators: tuple[OperatorStats, ...] | None
    missing: tuple[str, ...]


@dataclass(frozen=True)
class Load:
    """How the input loads the plan in force."""

    offered_rate_per_s: float | None
    saturated: bool  # the plan does not keep up (backlog builds), or the rate is unknown

    @property
    def objective(self) -> Objective:
        return Objective.RATE if self.offered_rate_per_s is not None and not self.saturated else Objective.THROUGHPUT


@dataclass(frozen=True)
class Verdict:
    keep: bool
    reason: str


def usable(value: float | None) -> float | None:
    """A finite measurement >= 0, or None."""
    if value is None or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def estimate_operators(
    chain: Sequence[OperatorStats], samples: Sequence[Sample], min_samples: int
) -> ProfileEstimate:
    """Sample-weighted means of each operator's cost and selectivity over the window."""
    tuples = {operator.name: 0 for operator in chain}
    cost_sum = dict.fromkeys(tuples, 0.0)  # cost x tuples
    selectivity_sum = dict.fromkeys(tuples, 0.0)  # selectivity x tuples
    for sample in samples:
        for profile in sample.operators:
            stats, name = profile.stats, profile.stats.name
            if name not in tuples or profile.samples <= 0:
                continue
            if not (math.isfinite(stats.cost_us) and math.isfinite(stats.selectivity)):
                continue
            tuples[name] += profile.samples
            cost_sum[name] += stats.cost_us * profile.samples
            selectivity_sum[name] += stats.selectivity * profile.samples
    missing = tuple(name for name, count in tuples.items() if count == 0 or count < min_samples)
    if missing:
        return ProfileEstimate(None, missing)
    operators = tuple(
        replace(operator, cost_us=cost_sum[operator.name] / tuples[operator.name],
                selectivity=selectivity_sum[operator.name] / tuples[operator.name])
        for operator in chain
    )
    return ProfileEstimate(operators, ())


def load_of(samples: Sequence[Sample], recent: int = 3) -> Load:
    """The load of the last samples: mean offered rate, and whether the last batch kept up."""
    tail = samples[-recent:]
    rates = [sample.offered_rate_per_s for sample in tail]
    offered = fmean(rates) if rates and all(usable(rate) is not None for rate in rates) else None
    last = tail[-1]
    saturated = offered is None or (
        last.backlog_records is not None and last.backlog_records > SATURATION_BACKLOG_SHARE * last.records_in
    ) or offered >= fmean([sample.throughput_per_s for sample in tail])
    return Load(offered, saturated)


def operator_drift(
    before: Sequence[OperatorStats], now: Sequence[OperatorStats], threshold: float
) -> str | None:
    """The first operator whose cost or selectivity moved by more than `threshold`, described."""
    for old, new in zip(before, now, strict=True):
        if abs(new.cost_us - old.cost_us) > threshold * max(old.cost_us, COST_DRIFT_FLOOR_US):
            return f"operator {old.name}: cost {old.cost_us:.3g} -> {new.cost_us:.3g} us per tuple"
        if abs(new.selectivity - old.selectivity) > threshold * max(old.selectivity, SELECTIVITY_DRIFT_FLOOR):
            return f"operator {old.name}: selectivity {old.selectivity:.3g} -> {new.selectivity:.3g}"
    return None


def _rate(value: float) -> str:
    return f"{value:,.0f}/s"


@dataclass(frozen=True)
class Trial:
    """A switch under evaluation: what it replaced and what it must show."""

    switch: PlanSwitch
    previous: Plan
    objective: Objective
    baseline_per_s: float  # measured under the previous plan
    required_per_s: float | None  # RATE: the offered rate x (1 + headroom)


def judge(trial: Trial, measured_per_s: float, config: AdaptiveConfig) -> Verdict:
    """Keep or revert a switch after its evaluation window."""
    baseline = trial.baseline_per_s
    change = relative_gain(baseline, measured_per_s)
    figures = f"measured {_rate(measured_per_s)} vs {_rate(baseline)} before ({change:+.0%})"
    if trial.objective is Objective.RATE and trial.required_per_s is not None:
        floor = trial.required_per_s * (1 - config.prediction_tolerance)
        if measured_per_s >= floor:
            return Verdict(True, f"{figures}, enough for the {_rate(trial.required_per_s)} the offered rate needs")
        return Verdict(False, f"{figures}, short of the {_rate(trial.required_per_s)} the offered rate needs")
    if measured_per_s >= baseline * (1 + config.min_gain):
        return Verdict(True, f"{figures}, at least the {config.min_gain:.0%} gain asked")
    gain = trial.switch.expected_gain
    if gain is not None and measured_per_s >= baseline:
        expected = baseline * (1 + gain)
        if measured_per_s >= expected * (1 - config.prediction_tolerance):
            return Verdict(True, f"{figures}, as predicted ({_rate(expected)} expected)")
    expected = "" if gain is None else f", {_rate(baseline * (1 + gain))} expected"
    return Verdict(False, f"{figures}{expected}: no gain of {config.min_gain:.0%}")


@dataclass(frozen=True)
class BlacklistShare:
    """How many of the planner's candidate changes repeat a blacklisted change."""

    blocked: int
    candidates: int

    @property
    def share(self) -> float:
        return self.blocked / self.candidates if self.candidates else 0.0


@dataclass(frozen=True)
class _Option:
    scored: ScoredPlan
    change: PlanChange
    cost_s: float

    @property
    def predicted(self) -> float:
        return self.scored.predicted_throughput_per_s

    @property
    def threads(self) -> int:
        return self.scored.plan.threads


@dataclass(frozen=True)
class _Choice:
    """A planning outcome: the option to switch to (with its objective) or why there is none."""

    option: _Option | None
    objective: Objective
    reason: str
    required_per_s: float | None = None


@dataclass(frozen=True)
class _Basis:
    """What the last planning rested on, for telling later whether the workload changed."""

    operators: tuple[OperatorStats, ...]
    objective: Objective
    offered_rate_per_s: float | None
    cores: int


# -- the controller -------------------------------------------------------------------------------


class AdaptiveController:
    """Profile, plan, apply, evaluate, keep or revert and blacklist, halt, re-open."""

    def __init__(
        self,
        operators: Sequence[OperatorStats],
        machine: Machine,
        initial_plan: Plan,
        config: AdaptiveConfig | None = None,
        switch_costs: SwitchCosts | None = None,
        search: PlanSearch | None = None,
    ) -> None:
        self._chain = tuple(operators)
        validate_plan(self._chain, initial_plan)
        self._machine = machine
        self.config = config or AdaptiveConfig()
        self._costs = switch_costs or SwitchCosts()
        self._search = search or ChainPlanSearch(self.config.planning_method, self.config.max_threads)
        self._plan = initial_plan
        self._phase = Phase.PROFILING
        self._window: list[Sample] = []
        self._discard = self.config.discard_after_switch  # the first batch of a run is a start too
        self._trial: Trial | None = None
        self._origin: Plan | None = None  # the plan before the last switch handed out
        self._blacklist: list[PlanChange] = []
        self._detectors: dict[str, ChangeDetector] = {}
        self._basis: _Basis | None = None
        self._last_candidates: tuple[ScoredPlan, ...] = ()  # of the last planning
        self._reference_per_s: float | None = None  # last baseline measured for the plan in force
        # Learning from measurements: what every plan run so far measured, and the last fit.
        correctable = self.config.correct_model and isinstance(self._search, CorrectablePlanSearch)
        self._measured = ModelCorrection(self.config.correction) if correctable else None
        self._correction: Correction | None = None

    # -- read-only views ----------------------------------------------------------------------
    @property
    def plan(self) -> Plan:
        return self._plan

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def blacklist(self) -> tuple[PlanChange, ...]:
        return tuple(self._blacklist)

    @property
    def switch_costs(self) -> SwitchCosts:
        return self._costs

    @property
    def correction(self) -> Correction | None:
        """The model correction of the last planning (None: none learned, or not supported)."""
        return self._correction

    @property
    def measured_plans(self) -> tuple[PlanMeasurement, ...]:
        return self._measured.measurements if self._measured is not None else ()

    def blacklisted_share(self) -> BlacklistShare:
        """The last planning's candidate changes (from the plan in force) that are blacklisted."""
        changes = [classify_change(self._plan, scored.plan, self._chain) for scored in self._last_candidates]
        changes = [change for change in changes if not change.is_empty]
        blocked = sum(any(change.repeats(bad) for bad in self._blacklist) for change in changes)
        return BlacklistShare(blocked, len(changes))

    # -- inputs ---------------------------------------------------------------------------------
    def observe(self, observation: BatchObservation) -> Decision:
        """Take one batch's measurements and decide."""
        return self._logged(self._observe(observation))

    def inject(self, plan: Plan, batch_id: int, now_s: float, reason: str = "injected") -> Decision:
        """Try `plan` now (an operator's request, an experiment): evaluated, kept or reverted and
        blacklisted like any candidate, but never if it repeats a blacklisted change."""
        return self._logged(self._inject(plan, batch_id, now_s, reason))

    def switch_applied(self, kind: SwitchKind, cost_s: float | None) -> None:
        """The realizer made the last switch; fold in what it measured the switch to cost."""
        self._origin = None
        measured = usable(cost_s)
        if measured is None:
            log.info("adaptive: no usable switch cost for %s (%r): estimate unchanged", kind.value, cost_s)
            return
        config = self.config
        self._costs = self._costs.with_measurement(kind, measured, config.switch_cost_weight, config.switch_cost_max_step)

    def switch_failed(self, batch_id: int, now_s: float, error: str) -> Decision:
        """The realizer could not make the last switch and left the previous plan in force."""
        return self._logged(self._switch_failed(batch_id, now_s, error))

    # -- the state machine ----------------------------------------------------------------------
    def _observe(self, observation: BatchObservation) -> Decision:
        batch_id, now_s = observation.batch_id, observation.now_s
        in_force = plan_fingerprint(self._plan)
        if observation.plan_in_force is not None and observation.plan_in_force != in_force:
            return Decision.observe(
                batch_id, now_s, in_force,
                f"no change: plan {in_force} not in force yet (the runner reports {observation.plan_in_force})",
            )
        if self._discard > 0:
            self._discard -= 1
            return Decision.observe(batch_id, now_s, in_force, f"first batch under {in_force} discarded (restart effects)")
        throughput = usable(observation.throughput_per_s)
        if throughput is None:
            log.info("adaptive: batch %d: no usable throughput (%r): no change", batch_id, observation.throughput_per_s)
            return Decision.observe(
                batch_id, now_s, in_force, f"no change: no usable throughput measured ({observation.throughput_per_s!r})"
            )
        duration = usable(observation.duration_s) or 0.0
        self._window.append(
            Sample(batch_id, now_s, duration, throughput, max(0, observation.records_in), observation.operators,
                   usable(observation.offered_rate_per_s), observation.backlog_records)
        )
        del self._window[:-MAX_WINDOW_BATCHES]
        if self._phase is Phase.EVALUATING:
            return self._evaluate(batch_id, now_s)
        detector = self._detectors.setdefault(
            in_force,
            ChangeDetector(self.config.sensitivity, self.config.change_confirmations, self.config.change_noise_z,
                           min_reference=self.config.profile_batches),
        )
        change = detector.update(throughput)
        if change is not None:
            return self._reopen(
                batch_id, now_s,
                f"throughput under {in_force} {change.relative_change:+.0%} from its reference"
                f" {_rate(change.reference)} for {len(change.confirming)} batches",
            )
        if self._phase is Phase.PROFILING:
            if not self._window_ready(self.config.profile_batches, self.config.profile_s):
                return Decision.observe(batch_id, now_s, in_force, f"profiling {in_force}: {self._progress()}")
            return self._plan_next(batch_id, now_s, observation.cores)
        if not self._window_ready(self.config.profile_batches, self.config.profile_s):
            return Decision.observe(batch_id, now_s, in_force, f"{self._phase.value}: {in_force} in force")
        workload = self._workload_change(observation.cores)
        if workload is not None:
            return self._reopen(batch_id, now_s, workload)
        self._reference_per_s = fmean([sample.throughput_per_s for sample in self._window])
        self._remember(self._plan, self._reference_per_s, self._basis.cores if self._basis else observation.cores)
        self._window = []
        return Decision.observe(
            batch_id, now_s, in_force,
            f"{self._phase.value}: {in_force} in force at {_rate(self._reference_per_s)}, workload unchanged",
        )

    def _window_ready(self, batches: int, seconds: float) -> bool:
        if len(self._window) < batches:
            return False
        first = self._window[0]
        return self._window[-1].now_s - (first.now_s - first.duration_s) >= seconds

    def _progress(self) -> str:
        first = self._window[0]
        span_s = self._window[-1].now_s - (first.now_s - first.duration_s)
        return (f"{len(self._window)} of {self.config.profile_batches} batches,"
                f" {span_s:.1f} of {self.config.profile_s:.1f} s")

    def _planning_machine(self, cores: int | None) -> Machine:
        if cores is None or cores < 1 or cores == self._machine.cores:
            return self._machine
        return replace(self._machine, cores=cores)

    def _plan_next(self, batch_id: int, now_s: float, cores: int | None) -> Decision:
        in_force = plan_fingerprint(self._plan)
        estimate = estimate_operators(self._chain, self._window, self.config.min_operator_samples)
        if estimate.operators is None:
            log.info("adaptive: no profile yet for %s: no change", ", ".join(estimate.missing))
            return Decision.observe(
                batch_id, now_s, in_force,
                f"no change: no profile of {self.config.min_operator_samples} tuples yet for"
                f" {', '.join(estimate.missing)}",
            )
        machine = self._planning_machine(cores)
        baseline = fmean([sample.throughput_per_s for sample in self._window])
        self._remember(self._plan, baseline, machine.cores, estimate.operators)
        correction = self._fit_correction()
        search = self._corrected_search()
        load = load_of(self._window)
        try:
            current = search.predict_per_s(estimate.operators, self._plan, machine)
            options = tuple(search.candidates(estimate.operators, machine))
            plain = None
            if search is not self._search:  # also the uncorrected planner's candidates, re-ranked
                plain_current = self._search.predict_per_s(estimate.operators, self._plan, machine)
                plain_options = tuple(self._search.candidates(estimate.operators, machine))
                known = {plan_fingerprint(scored.plan) for scored in options}
                options += tuple(ScoredPlan(scored.plan, search.predict_per_s(estimate.operators, scored.plan, machine))
                                 for scored in plain_options if plan_fingerprint(scored.plan) not in known)
                plain = self._choose(estimate.operators, plain_options, plain_current, baseline, load)
        except ValueError as error:  # InvalidPlan, a chain that costs nothing, a search too large
            log.warning("adaptive: cannot plan: %s", error)
            return Decision.observe(batch_id, now_s, in_force, f"no change: cannot plan: {error}")
        self._reference_per_s = baseline
        self._last_candidates = tuple(options)
        choice = self._choose(estimate.operators, options, current, baseline, load)
        self._basis = _Basis(estimate.operators, choice.objective, load.offered_rate_per_s, machine.cores)
        reason = choice.reason + self._correction_note(choice, plain)
        used = correction if search is not self._search else None
        if choice.option is None:
            self._phase = Phase.SETTLED
            self._window = []
            return replace(Decision.observe(batch_id, now_s, in_force, f"settled: {reason}"), correction=used)
        option = choice.option
        switch = PlanSwitch(option.scored.plan, option.change, option.predicted,
                            relative_gain(current, option.predicted), option.cost_s)
        trial = Trial(switch, self._plan, choice.objective, baseline, choice.required_per_s)
        release = choice.objective is Objective.RATE and option.threads < self._plan.threads
        decision = self._start(trial, batch_id, now_s, reason, Action.RELEASE if release else Action.APPLY)
        return replace(decision, correction=used)

    # -- learning from measurements ---------------------------------------------------------------
    def _remember(self, plan: Plan, measured_per_s: float, cores: int | None,
                  operators: Sequence[OperatorStats] | None = None) -> None:
        """Keep what `plan` measured, with the operator statistics it ran on, for the correction."""
        if self._measured is None:
            return
        if operators is None:
            estimate = estimate_operators(self._chain, self._window, self.config.min_operator_samples)
            operators = estimate.operators or (self._basis.operators if self._basis is not None else None)
        if operators is None:
            return
        self._measured.record(PlanMeasurement(plan, tuple(operators), self._planning_machine(cores), measured_per_s))

    def _fit_correction(self) -> Correction | None:
        if self._measured is None:
            return None
        try:
            self._correction = self._measured.fit(self._search)  # type: ignore[arg-type]
        except ValueError as error:  # a measured plan the model cannot evaluate any more
            log.info("adaptive: no model correction: %s", error)
            self._correction = None
        return self._correction

    def _corrected_search(self) -> PlanSearch:
        """The search with the learned factors; the plain one while nothing was learned."""
        correction = self._correction
        if self._measured is None or correction is None or correction.is_identity():
            return self._search
        return self._search.with_factors(correction.as_dict)  # type: ignore[attr-defined]

    def _correction_note(self, choice: _Choice, plain: _Choice | None) -> str:
        """What the correction is, and whether it changed the choice, for the reason."""
        if plain is None or self._correction is None:
            return ""
        note = f"; model corrected by the measurements: {self._correction.describe()}"
        chosen = choice.option.change.after if choice.option is not None else None
        uncorrected = plain.option.change.after if plain.option is not None else None
        if chosen == uncorrected:
            return note
        if uncorrected is None:
            return note + "; the correction changed the ranking: uncorrected, no plan would be worth a switch"
        return note + f"; the correction changed the ranking: uncorrected, the model would pick {uncorrected}"

    def _options(self, options: Sequence[ScoredPlan]) -> tuple[list[_Option], int]:
        """Candidates other than the plan in force that repeat no blacklisted change."""
        usable_options, blocked = [], 0
        for scored in options:
            change = classify_change(self._plan, scored.plan, self._chain)
            if change.is_empty:
                continue
            if any(change.repeats(bad) for bad in self._blacklist):
                blocked += 1
                continue
            usable_options.append(_Option(scored, change, self._costs.cost_s(change.kind)))
        return usable_options, blocked

    def _choose(
        self, operators: Sequence[OperatorStats], scored: Sequence[ScoredPlan], current: float,
        baseline: float, load: Load,
    ) -> _Choice:
        options, blocked = self._options(scored)
        skipped = f" ({blocked} candidate(s) repeat a blacklisted change)" if blocked else ""
        if load.objective is Objective.RATE:
            choice = self._choose_for_rate(options, current, baseline, load.offered_rate_per_s, skipped)
            if choice is not None:
                return choice
        return self._choose_for_throughput(options, current, skipped)

    def _choose_for_throughput(self, options: Sequence[_Option], current: float, skipped: str) -> _Choice:
        config, in_force = self.config, plan_fingerprint(self._plan)
        horizon = config.payback_horizon_s
        gaining = [option for option in options if relative_gain(current, option.predicted) >= config.min_gain]
        if not gaining:
            return _Choice(None, Objective.THROUGHPUT,
                           f"no plan is predicted {config.min_gain:.0%} better than {in_force}"
                           f" ({_rate(current)}){skipped}")

        def net_records(option: _Option) -> float:  # over the horizon, minus what the switch loses
            return (option.predicted - current) * horizon - option.predicted * option.cost_s

        best = max(gaining, key=lambda option: (net_records(option), -option.threads))
        gain = relative_gain(current, best.predicted)
        figures = (f"{best.change.after} predicted {_rate(best.predicted)} vs {_rate(current)} ({gain:+.0%});"
                   f" its {best.change.kind.value} switch loses {best.cost_s:.1f} s")
        if net_records(best) <= 0:
            return _Choice(None, Objective.THROUGHPUT, f"{figures}, not won back within {horizon:.0f} s{skipped}")
        payback_s = best.predicted * best.cost_s / (best.predicted - current)
        return _Choice(best, Objective.THROUGHPUT, f"{figures}, won back in {payback_s:.1f} s{skipped}")

    def _choose_for_rate(
        self, options: Sequence[_Option], current: float, baseline: float, offered: float, skipped: str
    ) -> _Choice | None:
        """The fewest threads that cover the offered rate; None: no plan covers it (throughput)."""
        config, in_force = self.config, plan_fingerprint(self._plan)
        # Predictions are absolute here: calibrate them by what the plan in force measured.
        calibration = baseline / current if current > 0 else 1.0
        calibration = min(max(calibration, 1 / MAX_CALIBRATION_FACTOR), MAX_CALIBRATION_FACTOR)
        required = offered * (1 + config.rate_headroom)
        covering = [option for option in options if option.predicted * calibration >= required]
        threads = self._plan.threads
        need = f"offered {_rate(offered)} needs {_rate(required)} with {config.rate_headroom:.0%} headroom"
        if current * calibration >= required:
            fewest = max(1, math.ceil(threads * (1 - config.max_release_fraction)))
            smaller = [option for option in covering if fewest <= option.threads < threads]
            if not smaller:
                return _Choice(None, Objective.RATE,
                               f"{need}; {in_force} ({threads} threads) covers it and no plan with"
                               f" {fewest}..{threads - 1} threads does{skipped}", required)
            best = min(smaller, key=lambda option: (option.threads, -option.predicted, option.cost_s))
            capacity = best.predicted * calibration
            lost = offered * best.cost_s  # records that pile up while the switch runs
            figures = (f"{need}; {best.change.after} ({best.threads} instead of {threads} threads)"
                       f" is predicted {_rate(capacity)}; its {best.change.kind.value} switch loses {best.cost_s:.1f} s")
            if lost > (capacity - offered) * config.payback_horizon_s:
                return _Choice(None, Objective.RATE,
                               f"{figures}, its backlog not drained within {config.payback_horizon_s:.0f} s{skipped}",
                               required)
            return _Choice(best, Objective.RATE, f"{figures}{skipped}", required)
        if not covering:
            return None
        best = min(covering, key=lambda option: (option.threads, -option.predicted, option.cost_s))
        gain = relative_gain(current, best.predicted)
        if (best.predicted - current) * config.payback_horizon_s <= best.predicted * best.cost_s:
            return _Choice(None, Objective.RATE,
                           f"{need}; {best.change.after} would cover it ({gain:+.0%}) but its"
                           f" {best.change.kind.value} switch is not won back{skipped}", required)
        return _Choice(best, Objective.RATE,
                       f"{need}; {in_force} is predicted {_rate(current * calibration)},"
                       f" {best.change.after} ({best.threads} of them) {_rate(best.predicted * calibration)}{skipped}",
                       required)

    def _start(self, trial: Trial, batch_id: int, now_s: float, reason: str, action: Action) -> Decision:
        self._trial = trial
        self._origin = self._plan
        self._plan = trial.switch.plan
        self._phase = Phase.EVALUATING
        self._window = []
        self._discard = self.config.discard_after_switch
        if action is Action.RELEASE:
            return Decision.release(batch_id, now_s, trial.switch, f"release: {reason}")
        return Decision.apply(batch_id, now_s, trial.switch, f"apply: {reason}")

    def _evaluate(self, batch_id: int, now_s: float) -> Decision:
        trial, config = self._trial, self.config
        assert trial is not None
        measured = fmean([sample.throughput_per_s for sample in self._window])
        candidate = trial.switch.change.after
        if not self._window_ready(config.evaluation_batches, config.evaluation_s):
            return Decision.observe(
                batch_id, now_s, candidate,
                f"evaluating {candidate}: {len(self._window)} of {config.evaluation_batches} batches,"
                f" {_rate(measured)} so far vs {_rate(trial.baseline_per_s)} before",
            )
        self._remember(self._plan, measured, self._basis.cores if self._basis is not None else None)
        drift = self._drift_since_planning()
        if drift is not None:
            # The baseline was measured on another workload: comparing with it would blacklist
            # (or keep) the candidate for the workload's doing. No verdict; plan afresh from here.
            self._trial = None
            return self._reopen(batch_id, now_s, f"{drift} while {candidate} was evaluated: no verdict on it")
        verdict = judge(trial, measured, config)
        if verdict.keep:
            self._trial = None
            self._phase = Phase.PROFILING
            self._reference_per_s = measured
            return Decision.keep(batch_id, now_s, candidate, f"keep {candidate}: {verdict.reason}")
        return self._revert(batch_id, now_s, measured, verdict.reason)

    def _revert(self, batch_id: int, now_s: float, measured: float, why: str) -> Decision:
        trial = self._trial
        assert trial is not None
        change = trial.switch.change
        self._blacklist.append(change)
        back = classify_change(self._plan, trial.previous, self._chain)
        switch = PlanSwitch(trial.previous, back, trial.baseline_per_s,
                            relative_gain(measured, trial.baseline_per_s), self._costs.cost_s(back.kind))
        self._trial = None
        self._origin = self._plan
        self._plan = trial.previous
        self._window = []
        self._discard = self.config.discard_after_switch
        share = self.blacklisted_share()
        reason = (f"revert {change.after} to {back.after} and blacklist {change.describe()}: {why};"
                  f" {share.blocked} of {share.candidates} candidate changes blacklisted"
                  f" ({share.share:.0%}, alpha {self.config.alpha:.0%})")
        if share.share > self.config.alpha:
            self._phase = Phase.HALTED
            return Decision.halt(batch_id, now_s, back.after, reason + ": halt", switch, change)
        self._phase = Phase.PROFILING
        return Decision.revert(batch_id, now_s, back.after, change, reason, switch)

    def _drift_since_planning(self) -> str | None:
        """An operator's cost or selectivity that moved beyond `operator_sensitivity` between the
        last planning's profile and the window (the evaluation's)."""
        if self._basis is None:
            return None
        estimate = estimate_operators(self._chain, self._window, self.config.min_operator_samples)
        if estimate.operators is None:
            return None
        return operator_drift(self._basis.operators, estimate.operators, self.config.operator_sensitivity)

    def _workload_change(self, cores: int | None) -> str | None:
        """At the end of a monitoring window: what changed since the last planning, if anything."""
        basis = self._basis
        if basis is None:
            return None
        machine = self._planning_machine(cores)
        if machine.cores != basis.cores:
            return f"cores changed from {basis.cores} to {machine.cores}"
        estimate = estimate_operators(self._chain, self._window, self.config.min_operator_samples)
        if estimate.operators is not None:
            drift = operator_drift(basis.operators, estimate.operators, self.config.operator_sensitivity)
            if drift is not None:
                return drift
        load = load_of(self._window)
        measured = fmean([sample.throughput_per_s for sample in self._window])
        in_force = plan_fingerprint(self._plan)
        if basis.objective is Objective.RATE and load.objective is Objective.THROUGHPUT:
            return f"the input saturates {in_force} again (backlog builds at {_rate(measured)})"
        if basis.objective is Objective.THROUGHPUT and load.objective is Objective.RATE:
            offered = load.offered_rate_per_s
            if offered * (1 + self.config.rate_headroom) < measured and self._plan.threads > 1:
                return f"the input no longer saturates {in_force}: offered {_rate(offered)} of {_rate(measured)}"
        if basis.objective is Objective.RATE and load.objective is Objective.RATE and basis.offered_rate_per_s:
            move = relative_gain(basis.offered_rate_per_s, load.offered_rate_per_s)
            if abs(move) > self.config.rate_change:
                return f"offered rate {_rate(basis.offered_rate_per_s)} -> {_rate(load.offered_rate_per_s)} ({move:+.0%})"
        return None

    def _reopen(self, batch_id: int, now_s: float, why: str) -> Decision:
        self._phase = Phase.PROFILING
        self._window = []
        self._detectors.clear()
        self._basis = None
        self._last_candidates = ()
        reason = f"workload changed: {why}"
        if self.config.forget_blacklist_on_change and self._blacklist:
            reason += f"; {len(self._blacklist)} blacklisted change(s) forgotten"
            self._blacklist.clear()
        return Decision.reopen(batch_id, now_s, plan_fingerprint(self._plan), reason)

    def _inject(self, plan: Plan, batch_id: int, now_s: float, reason: str) -> Decision:
        in_force = plan_fingerprint(self._plan)
        try:
            change = classify_change(self._plan, plan, self._chain)
            validate_plan(self._chain, plan)
        except (InvalidPlan, ValueError) as error:
            return Decision.observe(batch_id, now_s, in_force, f"{reason}: plan refused: {error}")
        if self._phase is Phase.EVALUATING:
            return Decision.observe(batch_id, now_s, in_force, f"{reason}: refused while {in_force} is evaluated")
        if change.is_empty:
            return Decision.observe(batch_id, now_s, in_force, f"{reason}: {in_force} is in force already")
        blocked = next((bad for bad in self._blacklist if change.repeats(bad)), None)
        if blocked is not None:
            return Decision.observe(
                batch_id, now_s, in_force, f"{reason}: {change.after} refused, it repeats the blacklisted {blocked.describe()}"
            )
        measured = [sample.throughput_per_s for sample in self._window]
        baseline = fmean(measured) if measured else self._reference_per_s
        if baseline is None:
            return Decision.observe(batch_id, now_s, in_force, f"{reason}: refused, no baseline measured for {in_force} yet")
        predicted = gain = None
        estimate = estimate_operators(self._chain, self._window, self.config.min_operator_samples)
        if estimate.operators is not None:
            machine = self._machine
            try:
                search = self._corrected_search()
                current = search.predict_per_s(estimate.operators, self._plan, machine)
                predicted = search.predict_per_s(estimate.operators, plan, machine)
                gain = relative_gain(current, predicted)
            except ValueError as error:
                log.info("adaptive: no prediction for the injected plan: %s", error)
                predicted = gain = None
        switch = PlanSwitch(plan, change, predicted, gain, self._costs.cost_s(change.kind))
        trial = Trial(switch, self._plan, Objective.THROUGHPUT, baseline, None)
        expected = "" if gain is None else f" (predicted {gain:+.0%})"
        return self._start(trial, batch_id, now_s, f"{reason}: {change.after}{expected}", Action.APPLY)

    def _switch_failed(self, batch_id: int, now_s: float, error: str) -> Decision:
        origin = self._origin
        if origin is None:
            log.warning("adaptive: realizer error with no switch pending: %s", error)
            return Decision.observe(batch_id, now_s, plan_fingerprint(self._plan), f"no switch pending; realizer said: {error}")
        failed, back = plan_fingerprint(self._plan), plan_fingerprint(origin)
        self._plan, self._origin = origin, None
        self._window = []
        self._discard = 0
        trial, self._trial = self._trial, None
        if trial is not None:
            self._blacklist.append(trial.switch.change)
            self._phase = Phase.PROFILING
            return Decision.revert(
                batch_id, now_s, back, trial.switch.change,
                f"the realizer could not apply {failed} ({error}): {back} stays, {trial.switch.change.describe()} blacklisted",
            )
        self._phase = Phase.HALTED
        return Decision.halt(batch_id, now_s, back, f"the realizer could not switch to {failed} ({error}): halted with {back}")

    def _logged(self, decision: Decision) -> Decision:
        log.info("adaptive: batch %d %s: %s", decision.batch_id, decision.action.value, decision.reason)
        return decision
