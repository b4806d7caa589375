"""Fitting the models' machine constants to measurements (pure: numbers in, numbers out).

- The paper's replication cost factor c_p from two runs of one region with n1 and n2 replicas
  (eqs. 18-19). From eq. 18, n / T(n) = 2 delta + c + n log2(n) c_p for every n, so
      c_p = (n2 / T(n2) - n1 / T(n1)) / (n2 log2 n2 - n1 log2 n1),
  which is eq. 19 multiplied out (the printed denominator repeats n1 where n2 belongs).
  On Spark, T(n) is a *marginal* rate (records per second of batch time that grows with the
  records, fixed per-batch costs removed), else the fixed costs land in c_p.
- The Spark model's constants by non-negative least squares over measured micro-batch times:
  the model is linear in its constants (fissure.model.spark_model.batch_time_terms), so every
  measured batch is one equation  measured - operators' work = sum_k slope_k x constant_k.
  A batch whose Spark stages were measured one by one (fissure.spark.session.stage_log) gives one such
  equation per stage and one for the rest of the batch, the driver's part (batch_part_terms), so a
  stage's costs are fitted where they occur instead of inferred from batch totals.
  Constants not being fitted keep their given values; the fit is repeated at its own result
  (the model is piecewise linear: the pieces may change) until it settles.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fissure.model.spark_model import (SparkConstants, SparkWorkload, batch_part_terms, evaluate_spark,
                                       summed_terms)
from fissure.model.types import OperatorStats, Plan


def replication_cost_us(replicas_1: int, rate_1_per_s: float, replicas_2: int, rate_2_per_s: float) -> float:
    """c_p (microseconds per tuple) from eq. 19, given the rates T(n1) and T(n2) in tuples per second."""
    if replicas_1 < 1 or replicas_2 < 1 or replicas_1 == replicas_2:
        raise ValueError(f"c_p needs two different replica counts >= 1, got {replicas_1} and {replicas_2}")
    if not (rate_1_per_s > 0 and rate_2_per_s > 0):
        raise ValueError(f"c_p needs rates > 0 tuples/s, got {rate_1_per_s} and {rate_2_per_s}")

    def spread(n: int) -> float:
        return n * math.log2(n)

    numerator = replicas_2 * 1e6 / rate_2_per_s - replicas_1 * 1e6 / rate_1_per_s
    return numerator / (spread(replicas_2) - spread(replicas_1))


@dataclass(frozen=True)
class BatchObservation:
    """One measured micro-batch of a calibration run: what ran, and how long the batch took."""

    label: str  # the experiment
    operators: tuple[OperatorStats, ...]  # with their profiled costs and selectivities
    plan: Plan
    cores: int
    workload: SparkWorkload  # batch_records = the batch's records; keys per batch as measured
    measured_s: float
    # the wall time of each Spark stage of the batch's computing job, in order (None: not measured)
    stage_s: tuple[float, ...] | None = None


@dataclass(frozen=True)
class FitResidual:
    label: str
    batch_records: int
    measured_s: float
    predicted_s: float
    stage_measured_s: tuple[float, ...] | None = None  # each Spark stage, when measured
    stage_predicted_s: tuple[float, ...] = ()

    @property
    def relative_error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s

    @property
    def stage_errors_s(self) -> tuple[float, ...] | None:
        """Predicted minus measured seconds per stage (None unless the stages were measured and match)."""
        if self.stage_measured_s is None or len(self.stage_measured_s) != len(self.stage_predicted_s):
            return None
        return tuple(predicted - measured for predicted, measured in zip(self.stage_predicted_s, self.stage_measured_s))


@dataclass(frozen=True)
class SparkFit:
    """The fitted constants and how well they explain the measurements."""

    constants: SparkConstants
    fitted: tuple[str, ...]  # the constants the fit set (the others kept their values)
    residuals: tuple[FitResidual, ...]
    r_squared: float
    iterations: int
    notes: tuple[str, ...] = field(default=())

    @property
    def median_abs_relative_error(self) -> float:
        errors = sorted(abs(item.relative_error) for item in self.residuals)
        return errors[len(errors) // 2] if errors else math.nan


def nnls(matrix: np.ndarray, target: np.ndarray, max_iterations: int = 500) -> np.ndarray:
    """Non-negative least squares, min ||A x - b|| subject to x >= 0 (Lawson and Hanson)."""
    rows, columns = matrix.shape
    solution = np.zeros(columns)
    passive = np.zeros(columns, dtype=bool)
    gradient = matrix.T @ (target - matrix @ solution)
    tolerance = 1e-10 * max(1.0, float(np.abs(gradient).max(initial=0.0)))
    for _ in range(max_iterations):
        if passive.all() or gradient[~passive].max(initial=-np.inf) <= tolerance:
            break
        candidate = np.where(~passive, gradient, -np.inf).argmax()
        passive[candidate] = True
        while True:
            trial = np.zeros(columns)
            trial[passive] = np.linalg.lstsq(matrix[:, passive], target, rcond=None)[0]
            if (trial[passive] > 0).all():
                solution = trial
                break
            blocking = passive & (trial <= 0)
            steps = solution[blocking] / (solution[blocking] - trial[blocking])
            alpha = float(steps.min()) if steps.size else 0.0
            solution = solution + alpha * (trial - solution)
            passive &= solution > tolerance
            solution[~passive] = 0.0
        gradient = matrix.T @ (target - matrix @ solution)
    return solution


def fit_spark_constants(observations: Sequence[BatchObservation], start: SparkConstants = SparkConstants(),
                        fitted: Sequence[str] | None = None, max_iterations: int = 5) -> SparkFit:
    """Fit `fitted` constants (default: all) to the observed batch times, by relative error
    (each equation divided by its measured time, so short and long batches count alike)."""
    if not observations:
        raise ValueError("fit_spark_constants needs at least one observed batch")
    names = tuple(fitted) if fitted is not None else SparkConstants.names()
    unknown = set(names) - set(SparkConstants.names())
    if unknown:
        raise ValueError(f"cannot fit unknown constants {sorted(unknown)}; known: {', '.join(SparkConstants.names())}")
    notes = []
    constants = start
    iterations = 0
    unmatched = 0
    for iterations in range(1, max_iterations + 1):
        rows, targets = [], []
        unmatched = 0
        for item in observations:
            weight = 1.0 / item.measured_s  # each batch counts by its relative error, long or short
            equations, matched = _equations(item, constants)
            unmatched += item.stage_s is not None and not matched
            for (slopes, operators_s), measured_s in equations:
                kept_s = operators_s + sum(slopes[name] * getattr(constants, name)
                                           for name in SparkConstants.names() if name not in names)
                rows.append([slopes[name] * weight for name in names])
                targets.append((measured_s - kept_s) * weight)
        matrix, target = np.array(rows), np.array(targets)
        identifiable = np.abs(matrix).max(axis=0) > 0
        values = np.zeros(len(names))
        values[identifiable] = nnls(matrix[:, identifiable], target)
        updated = constants.with_values(**{name: float(values[k]) for k, name in enumerate(names) if identifiable[k]})
        for k, name in enumerate(names):
            if not identifiable[k] and iterations == 1:
                notes.append(f"{name}: no measurement depends on it; kept at {getattr(constants, name):g}")
        settled = all(math.isclose(getattr(updated, name), getattr(constants, name), rel_tol=1e-6, abs_tol=1e-9)
                      for name in names)
        constants = updated
        if settled:
            break
    if unmatched:
        notes.append(f"{unmatched} batches had a different number of Spark stages than the model: "
                     "fitted by their batch time only")
    residuals = []
    for item in observations:
        evaluation = evaluate_spark(item.operators, item.plan, item.cores, constants, item.workload)
        residuals.append(FitResidual(item.label, item.workload.batch_records, item.measured_s,
                                     evaluation.batch_time_s, item.stage_s,
                                     tuple(stage.time_s for stage in evaluation.stages)))
    measured = np.array([item.measured_s for item in residuals])
    predicted = np.array([item.predicted_s for item in residuals])
    total = float(((measured - measured.mean()) ** 2).sum())
    r_squared = 1.0 - float(((measured - predicted) ** 2).sum()) / total if total > 0 else math.nan
    return SparkFit(constants, tuple(names), tuple(residuals), r_squared, iterations, tuple(notes))


def _equations(item: BatchObservation, constants: SparkConstants):
    """The equations ((slopes, seconds no constant scales), measured seconds) of one batch, and
    whether its measured stages matched the model's: then one per stage and one for the rest of
    the batch, else one for the whole batch."""
    parts = batch_part_terms(item.operators, item.plan, item.cores, constants, item.workload)
    *stages, rest = parts
    if item.stage_s is not None and len(stages) == len(item.stage_s):
        return [*zip(stages, item.stage_s), (rest, item.measured_s - sum(item.stage_s))], True
    return [(summed_terms(parts), item.measured_s)], False


@dataclass(frozen=True)
class Calibration:
    """What `fissure calibrate` stores: both models' constants, measured on one deployment."""

    spark: SparkConstants
    thread_switch_overhead_us: float  # delta of the paper's model, small records
    thread_switch_overhead_large_us: float | None  # delta for large records (2 KB)
    replication_cost_us: float | None  # c_p of the paper's model (eq. 19 on Spark)
    batch_records: int  # the micro-batch size the planner assumes with --model spark
    cores: int
    master: str
    measured_at: str  # ISO date
    fit: Mapping[str, object] = field(default_factory=dict)  # r_squared, residuals: for the record

    def to_dict(self) -> dict:
        return {"spark": self.spark.to_dict(), "thread_switch_overhead_us": self.thread_switch_overhead_us,
                "thread_switch_overhead_large_us": self.thread_switch_overhead_large_us,
                "replication_cost_us": self.replication_cost_us, "batch_records": self.batch_records,
                "cores": self.cores, "master": self.master, "measured_at": self.measured_at, "fit": dict(self.fit)}

    @classmethod
    def from_dict(cls, values: Mapping) -> Calibration:
        try:
            return cls(spark=SparkConstants.from_dict(values["spark"]),
                       thread_switch_overhead_us=float(values["thread_switch_overhead_us"]),
                       thread_switch_overhead_large_us=values.get("thread_switch_overhead_large_us"),
                       replication_cost_us=values.get("replication_cost_us"),
                       batch_records=int(values.get("batch_records", SparkWorkload().batch_records)),
                       cores=int(values.get("cores", 0)), master=str(values.get("master", "")),
                       measured_at=str(values.get("measured_at", "")), fit=dict(values.get("fit") or {}))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"not a fissure calibration ({error}); rerun `fissure calibrate`") from None
