"""What comes into the adaptive loop, and what a window of it tells: one `BatchObservation` per
micro-batch, the accepted `Sample`s of a window, and the pure functions that read a window (the
operators' estimated statistics, the load on the plan, an operator's drift)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import fmean

from fissure.control.adaptive.decisions import Objective
from fissure.model.types import OperatorStats

# Below these, a cost (us per tuple) or selectivity drift is measured against the floor instead:
# relative drifts of near-zero values are noise.
COST_DRIFT_FLOOR_US = 0.1
SELECTIVITY_DRIFT_FLOOR = 0.01
# A batch that leaves more than this share of its own size waiting behind it did not keep up.
SATURATION_BACKLOG_SHARE = 0.5


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
        query_start: the first batch with input of a query (re)started just before it (the run's
            start, a plan switch's restart, a restart after the machine's failure, the previous
            plan restarted after a failed switch): it pays the query's start-up, so the
            controller never measures it.
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
    query_start: bool = False

    def summary(self) -> str:
        """One line for a loop's timeline: `batch 7: 1000 records at 12,593/s`."""
        throughput = usable(self.throughput_per_s)
        rate = "no usable throughput" if throughput is None else f"{throughput:,.0f}/s"
        return f"batch {self.batch_id}: {self.records_in} records at {rate}"


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
