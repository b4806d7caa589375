"""Learning from measurements: correct the model's terms by what the evaluated plans measured.

Every plan the adaptive loop runs gives a pair (predicted, measured) throughput. A model's time
per record is a sum of terms, each the product of a machine constant and what the plan makes of
it (on Spark: `fissure.model.spark_model`'s batch time, a sum over stages of fixed costs and
per-record costs; in the paper's model: the operators' work, delta per boundary, c_p per
replication). When the model ranks plans wrongly, it is because some of those terms are off: on
one machine an exchange costs 20 times what the constant says, on another a process boundary.
So the correction is one multiplicative factor per term ("operators" scales every operator's
cost, the others one constant each), fitted to the seconds per record the plans measured. A
factor is an overall scale g, common to all terms, times the term's own factor h_k:

    f_k = g * h_k
    minimise   sum over plans p ((t_p(f) - m_p) / m_p)^2  +  prior_weight * sum over terms k |ln h_k|
                                                         +  scale_prior_weight * (ln g)^2

t_p(f) the model's seconds per record of plan p with every term k scaled by f_k, m_p the measured
ones. Relative residuals weigh every plan alike whatever its speed. Why this prior:

- The overall scale g is nearly free (scale_prior_weight is small). One measured plan says only
  how far the model is off as a whole, not which term is off: g absorbs it, every h_k stays 1,
  and the ranking of the plans does not change (a uniform factor scales every prediction alike;
  it is the measured/predicted calibration the loop's judge and rate sizing already make).
- The term factors h_k keep to 1 until the measurements say otherwise: only plans that are off
  by *different* ratios move them, towards the terms in which those plans differ. The prior on
  them is |ln h| (a Laplace prior, smoothed near 0): it prefers a few terms that are far off to
  many that are a little off, which is how models mispredict (an exchange 20 times dearer than
  its constant says, not everything 30 % dearer), so a term the measurements barely touch stays
  with the overall scale instead of being dragged along by the one that is off. It is on ln h
  so that a factor of 20 costs as much as one of 1/20 and a term that is truly 20 times dearer
  gets there from one clear measurement (prior_weight 0.0036: doubling a term's factor costs
  what a 5 % misfit of one plan costs). A term no measured plan has gets no factor of its own.
- With two plans, the median of the factors is not unique (the |.| prior is flat between
  them); the small (ln g)^2 breaks the tie towards the overall scale nearest 1.

The model is piecewise linear in its constants (a bottleneck, a stage's critical or shared work
decides), so t_p is linearised around the current factors (numerical slopes), the weighted least
squares solved (Levenberg-Marquardt steps in ln g and ln h, the |.| prior reweighted at each
step, every ln f clamped to +-ln(max_factor)), and the linearisation redone at the new factors a
few times. Pure: no clock, no I/O; the plan search supplies `seconds_per_record` under given
factors (`CorrectablePlanSearch`).

Limits: a factor is only as identifiable as the measured plans differ in that term; with fewer
plans than terms the prior decides how a misfit is split. The terms are the model's: a cost the
model has no term for (say, a restart's warm-up lasting several batches) lands on whichever term
correlates with it. Noise in the measurements moves a term's factor by up to the noise over the
term's share of the time (the |.| prior ignores the smallest misfits); the loop's `min_gain`
keeps such moves from making switches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from fissure.control.plan_change import plan_fingerprint
from fissure.model.types import Machine, OperatorStats, Plan

OPERATORS_TERM = "operators"  # the factor on every operator's cost (a profiler's bias, instrumentation)
# Relative step of a factor for the numerical slopes.
SLOPE_STEP = 1e-3


@runtime_checkable
class CorrectablePlanSearch(Protocol):
    """A plan search whose model the loop can correct by one factor per term."""

    def correction_terms(self) -> tuple[str, ...]:
        """The names of the terms a factor may scale (OPERATORS_TERM and the model's constants)."""
        ...

    def seconds_per_record(self, operators: Sequence[OperatorStats], plan: Plan, machine: Machine,
                           factors: Mapping[str, float]) -> float:
        """The model's seconds per record of `plan` with every term scaled by its factor (absent: 1)."""
        ...

    def with_factors(self, factors: Mapping[str, float]):
        """The same search (a `PlanSearch`) with its model's terms scaled by `factors`."""
        ...


@dataclass(frozen=True)
class CorrectionConfig:
    """How the correction learns.

    Attributes:
        prior_weight: weight of |ln h| per term factor against the squared relative misfit of
            one plan; 0.0036 makes doubling a term's factor cost what a 5 % misfit costs.
        scale_prior_weight: weight of (ln g)^2 for the overall scale g (small: one plan is enough
            to set it; not 0, to break ties towards 1).
        max_factor: every factor stays within [1 / max_factor, max_factor].
        max_plans: measured plans kept (the most recent; one measurement per plan).
        linearizations: times the model is linearised around the current factors.
    """

    prior_weight: float = 0.0036
    scale_prior_weight: float = 0.001
    max_factor: float = 50.0
    max_plans: int = 12
    linearizations: int = 4

    def __post_init__(self) -> None:
        for name in ("prior_weight", "scale_prior_weight"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        if not (math.isfinite(self.max_factor) and self.max_factor > 1):
            raise ValueError(f"max_factor must be a finite number > 1, got {self.max_factor}")
        if self.max_plans < 1 or self.linearizations < 1:
            raise ValueError("max_plans and linearizations must be >= 1")


@dataclass(frozen=True)
class PlanMeasurement:
    """A plan that ran, the operator statistics it ran on, and its measured throughput."""

    plan: Plan
    operators: tuple[OperatorStats, ...]
    machine: Machine
    measured_per_s: float

    @property
    def fingerprint(self) -> str:
        return plan_fingerprint(self.plan)


@dataclass(frozen=True)
class Correction:
    """Fitted factors per term, and how well the model fits the measured plans with and without them."""

    factors: tuple[tuple[str, float], ...] = ()  # (term, factor f = scale x its own), every term of the search
    scale: float = 1.0  # the overall scale g common to all factors
    plans: int = 0  # measured plans the fit rests on
    error_before: float | None = None  # root mean square relative error of seconds per record, factors 1
    error_after: float | None = None  # the same with the factors

    @property
    def as_dict(self) -> dict[str, float]:
        return dict(self.factors)

    def factor(self, term: str) -> float:
        return self.as_dict.get(term, 1.0)

    def relative(self, term: str) -> float:
        """The term's own factor h: its factor over the overall scale."""
        return self.factor(term) / self.scale

    def is_identity(self, tolerance: float = 0.01) -> bool:
        return all(abs(math.log(value)) <= tolerance for _, value in self.factors)

    def reranks(self, tolerance: float = 0.01) -> bool:
        """Whether some term moved apart from the overall scale (only that can change a ranking)."""
        return any(abs(math.log(value / self.scale)) > tolerance for _, value in self.factors)

    def describe(self, tolerance: float = 0.01) -> str:
        """e.g. `replication_cost_us x19.6, operators x0.99; the others x1.1 (3 plan(s) measured,
        model error 52% -> 2%)`: the factors apart from the overall scale, then the scale."""
        apart = sorted(((term, value) for term, value in self.factors
                        if abs(math.log(value / self.scale)) > tolerance),
                       key=lambda item: -abs(math.log(item[1] / self.scale)))
        parts = [", ".join(f"{term} x{value:.3g}" for term, value in apart)] if apart else []
        if abs(math.log(self.scale)) > tolerance and len(apart) < len(self.factors):
            parts.append(f"{'the others' if apart else 'every term'} x{self.scale:.3g}")
        fit = ""
        if self.error_before is not None and self.error_after is not None:
            fit = f", model error {self.error_before:.0%} -> {self.error_after:.0%}"
        return f"{'; '.join(parts) or 'no factor moved'} ({self.plans} plan(s) measured{fit})"


@dataclass(frozen=True)
class _Linearised:
    """One measurement's seconds per record around the current factors: rest + sum slopes_k f_k."""

    slopes: tuple[float, ...]
    rest: float
    measured: float  # seconds per record measured


def _linearise(time_of: Callable[[Mapping[str, float]], float], terms: Sequence[str],
               factors: Mapping[str, float]) -> tuple[tuple[float, ...], float]:
    """Numerical slopes of seconds per record in each factor, and the part no factor scales."""
    base = time_of(factors)
    slopes = []
    for term in terms:
        value = factors[term]
        step = SLOPE_STEP * value
        slopes.append((time_of({**factors, term: value + step}) - base) / step)
    rest = base - sum(slope * factors[term] for slope, term in zip(slopes, terms))
    return tuple(slopes), rest


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (small, symmetric positive definite systems)."""
    size = len(vector)
    rows = [row[:] + [vector[i]] for i, row in enumerate(matrix)]
    for column in range(size):
        pivot = max(range(column, size), key=lambda r: abs(rows[r][column]))
        rows[column], rows[pivot] = rows[pivot], rows[column]
        lead = rows[column][column]
        if lead == 0:
            continue
        for r in range(column + 1, size):
            ratio = rows[r][column] / lead
            if ratio:
                for c in range(column, size + 1):
                    rows[r][c] -= ratio * rows[column][c]
    solution = [0.0] * size
    for r in range(size - 1, -1, -1):
        lead = rows[r][r]
        total = rows[r][size] - sum(rows[r][c] * solution[c] for c in range(r + 1, size))
        solution[r] = total / lead if lead else 0.0
    return solution


# |ln h| is smoothed to sqrt(ln h^2 + SMOOTHING^2) - SMOOTHING so that Newton steps apply.
SMOOTHING = 0.01


def _sparse_prior(log: float) -> tuple[float, float, float]:
    """The smoothed |log|, its derivative, and the curvature of its iteratively reweighted form."""
    root = math.sqrt(log * log + SMOOTHING * SMOOTHING)
    return root - SMOOTHING, log / root, 1.0 / root


def _objective(points: Sequence[_Linearised], logs: Sequence[float], config: CorrectionConfig) -> float:
    """logs = [ln g, ln h_1, ..., ln h_K]."""
    scale, own = logs[0], logs[1:]
    misfit = 0.0
    for point in points:
        predicted = point.rest + sum(slope * math.exp(scale + log) for slope, log in zip(point.slopes, own))
        misfit += ((predicted - point.measured) / point.measured) ** 2
    return (misfit + config.scale_prior_weight * scale * scale
            + config.prior_weight * sum(_sparse_prior(log)[0] for log in own))


def _clamped(logs: Sequence[float], bound: float) -> list[float]:
    """ln g within +-bound, and every ln f = ln g + ln h too."""
    scale = min(max(logs[0], -bound), bound)
    return [scale] + [min(max(log, -bound - scale), bound - scale) for log in logs[1:]]


def _fit_logs(points: Sequence[_Linearised], logs: list[float], config: CorrectionConfig) -> list[float]:
    """Levenberg-Marquardt in (ln g, ln h) on the linearised model."""
    bound = math.log(config.max_factor)
    damping = 1e-3
    current = _objective(points, logs, config)
    size = len(logs)
    for _ in range(200):
        normal = [[0.0] * size for _ in range(size)]
        # the priors' gradients and curvatures: (ln g)^2 for the scale, the smoothed |ln h| for the terms
        gradient = [2 * config.scale_prior_weight * logs[0]]
        curvature = [2 * config.scale_prior_weight]
        for log in logs[1:]:
            _, slope, weight = _sparse_prior(log)
            gradient.append(config.prior_weight * slope)
            curvature.append(config.prior_weight * weight)
        for point in points:
            own = [slope * math.exp(logs[0] + log) / point.measured for slope, log in zip(point.slopes, logs[1:])]
            jacobian = [sum(own)] + own  # d residual / d ln g, d ln h_k
            residual = point.rest / point.measured + sum(own) - 1.0
            for i in range(size):
                if jacobian[i] == 0:
                    continue
                gradient[i] += 2 * jacobian[i] * residual
                for j in range(size):
                    normal[i][j] += 2 * jacobian[i] * jacobian[j]
        for i in range(size):
            normal[i][i] += curvature[i] + damping * (1 + normal[i][i])
        step = _solve(normal, [-g for g in gradient])
        trial = _clamped([log + delta for log, delta in zip(logs, step)], bound)
        value = _objective(points, trial, config)
        if value < current:
            converged = current - value < 1e-12
            logs, current = trial, value
            damping = max(damping / 3, 1e-9)
            if converged:
                break
        else:
            damping *= 10
            if damping > 1e6:
                break
    return logs


def fit_correction(
    measurements: Sequence[PlanMeasurement], terms: Sequence[str],
    seconds_per_record: Callable[[PlanMeasurement, Mapping[str, float]], float],
    config: CorrectionConfig = CorrectionConfig(),
) -> Correction:
    """The factors that best explain `measurements` (see the module docstring).

    `seconds_per_record(measurement, factors)` is the model's time per record of the measured
    plan, on the operators it ran on, with every term scaled by its factor.
    """
    terms = tuple(terms)
    identity = tuple((term, 1.0) for term in terms)
    usable = [m for m in measurements if math.isfinite(m.measured_per_s) and m.measured_per_s > 0]
    if not usable or not terms:
        return Correction(identity)
    logs = [0.0] * (len(terms) + 1)
    for _ in range(config.linearizations):
        factors = {term: math.exp(logs[0] + log) for term, log in zip(terms, logs[1:])}
        points = []
        for measurement in usable:
            time_of = lambda values, m=measurement: seconds_per_record(m, values)  # noqa: E731
            slopes, rest = _linearise(time_of, terms, factors)
            points.append(_Linearised(slopes, rest, 1.0 / measurement.measured_per_s))
        fitted = _fit_logs(points, logs, config)
        moved = max(abs(a - b) for a, b in zip(fitted, logs))
        logs = fitted
        if moved < 1e-4:
            break
    factors = {term: math.exp(logs[0] + log) for term, log in zip(terms, logs[1:])}
    return Correction(tuple(factors.items()), math.exp(logs[0]), len(usable),
                      _rms_error(usable, dict(identity), seconds_per_record),
                      _rms_error(usable, factors, seconds_per_record))


def _rms_error(measurements: Sequence[PlanMeasurement], factors: Mapping[str, float],
               seconds_per_record: Callable[[PlanMeasurement, Mapping[str, float]], float]) -> float:
    errors = []
    for measurement in measurements:
        measured = 1.0 / measurement.measured_per_s
        errors.append((seconds_per_record(measurement, factors) - measured) / measured)
    return math.sqrt(sum(error * error for error in errors) / len(errors))


@dataclass
class ModelCorrection:
    """The loop's memory of measured plans (one per plan, the latest) and the fit over them."""

    config: CorrectionConfig = field(default_factory=CorrectionConfig)
    _measurements: dict[str, PlanMeasurement] = field(default_factory=dict)

    @property
    def measurements(self) -> tuple[PlanMeasurement, ...]:
        return tuple(self._measurements.values())

    def record(self, measurement: PlanMeasurement) -> None:
        """Remember what a plan measured (replacing that plan's earlier measurement)."""
        if not (math.isfinite(measurement.measured_per_s) and measurement.measured_per_s > 0):
            return
        self._measurements.pop(measurement.fingerprint, None)
        self._measurements[measurement.fingerprint] = measurement
        while len(self._measurements) > self.config.max_plans:
            self._measurements.pop(next(iter(self._measurements)))

    def fit(self, search: CorrectablePlanSearch) -> Correction:
        def seconds(measurement: PlanMeasurement, factors: Mapping[str, float]) -> float:
            return search.seconds_per_record(measurement.operators, measurement.plan, measurement.machine, factors)

        return fit_correction(self.measurements, search.correction_terms(), seconds, self.config)


def scale_operators(operators: Sequence[OperatorStats], factors: Mapping[str, float]) -> tuple[OperatorStats, ...]:
    """The operators with their costs times the OPERATORS_TERM factor."""
    factor = factors.get(OPERATORS_TERM, 1.0)
    if factor == 1.0:
        return tuple(operators)
    return tuple(replace(operator, cost_us=operator.cost_us * factor) for operator in operators)
