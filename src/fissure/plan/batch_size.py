"""How many records one micro-batch admits when the user gives no size (pure policy, no Spark).

A micro-batch of R records takes about F + R * c seconds: F the fixed cost every batch pays
(Spark's planning and checkpoint logs, each stage's tasks, each state store's commit) and c the
cost per record of the plan's busiest path. Its rate R / (F + R * c) approaches 1 / c only as R
grows: the fixed cost's share of the batch, F / (F + R * c), is the throughput given up. The
policy admits the smallest batch whose fixed share is at most `fixed_share` (by default 10 %:
90 % of the plan's asymptotic rate), so a batch stays as small, as quick to recover and as light
on memory as that rate allows; a latency bound caps it (F + R * c <= bound).

Measured on 2 cores (local[2], docs/spark-runner.md): LogWatch's fixed cost was 1-2 s a batch
with three stateful operators; at 10,000-line batches it took half of each batch, at 300,000
lines a few percent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fissure.model.spark_model import evaluate_spark
from fissure.model.types import Plan

DEFAULT_FIXED_SHARE = 0.1
# Bounds whatever the model says: a batch of fewer records is all overhead, and one of more
# holds too much in a Python worker's memory at once.
MIN_RECORDS = 1_000
MAX_RECORDS = 2_000_000
# The two batch sizes the model is evaluated at to read off its fixed cost and cost per record.
_SMALL, _LARGE = 10_000, 100_000


@dataclass(frozen=True)
class BatchCost:
    """A batch's predicted time as F + R * c (from the Spark model, or fitted to measured batches)."""

    fixed_s: float
    per_record_s: float

    def __post_init__(self) -> None:
        if not (self.fixed_s >= 0 and self.per_record_s > 0 and math.isfinite(self.fixed_s)
                and math.isfinite(self.per_record_s)):
            raise ValueError(f"a batch cost needs fixed_s >= 0 and per_record_s > 0, got {self}")

    def batch_s(self, records: float) -> float:
        return self.fixed_s + records * self.per_record_s


@dataclass(frozen=True)
class BatchSizeDecision:
    """Records per micro-batch, with the predicted batch time and why."""

    records: int
    predicted_batch_s: float
    fixed_share: float  # the fixed cost's share of the predicted batch
    reason: str


def choose_batch_records(cost: BatchCost, *, fixed_share: float = DEFAULT_FIXED_SHARE,
                         latency_bound_s: float | None = None) -> BatchSizeDecision:
    """The records one micro-batch admits under `cost` (see the module docstring)."""
    if not 0 < fixed_share < 1:
        raise ValueError(f"fixed_share must be between 0 and 1, got {fixed_share!r}")
    if latency_bound_s is not None and latency_bound_s <= 0:
        raise ValueError(f"latency_bound_s must be positive, got {latency_bound_s!r}")
    fixed, per_record = cost.fixed_s, cost.per_record_s
    # F / (F + R c) <= s  <=>  R >= F (1 - s) / (s c)
    wanted = math.ceil(fixed * (1 - fixed_share) / (fixed_share * per_record))
    records = min(MAX_RECORDS, max(MIN_RECORDS, wanted))
    reason = (f"fixed cost {fixed:.2f} s a batch, {per_record * 1e6:.1f} us a record: "
              f"{records:,} records keep the fixed cost at {100 * fixed_share:.0f} % of a batch or less")
    if latency_bound_s is not None and cost.batch_s(records) > latency_bound_s:
        fitting = math.floor((latency_bound_s - fixed) / per_record + 1e-6)  # 1e-6: float division
        if fitting < MIN_RECORDS:
            records = MIN_RECORDS
            reason = (f"the latency bound {latency_bound_s:g} s is below what a batch of {MIN_RECORDS:,} records "
                      f"takes ({cost.batch_s(MIN_RECORDS):.2f} s, of which {fixed:.2f} s fixed): admitting "
                      f"{MIN_RECORDS:,}")
        else:
            records = fitting
            reason = (f"latency bound {latency_bound_s:g} s: {records:,} records a batch "
                      f"(fixed cost {fixed:.2f} s, {per_record * 1e6:.1f} us a record)")
    predicted = cost.batch_s(records)
    return BatchSizeDecision(records, predicted, fixed / predicted if predicted else 0.0, reason)


# How many times costlier than declared the operators would have to be for a sample to change
# a decision that already admits the whole input in one batch.
SAMPLE_MARGIN = 10.0


@dataclass(frozen=True)
class SampleDecision:
    """Whether to measure the operators' costs on a sample before sizing the batches, and why."""

    needed: bool
    reason: str


def sample_needed(input_records: float | None, declared_records: int, reads_input_once: bool,
                  margin: float = SAMPLE_MARGIN) -> SampleDecision:
    """A run that reads only what its sources hold now (`reads_input_once`), and holds
    `input_records`, needs no sample when that input fits in one batch even with operators
    `margin` times costlier than declared (a batch of `declared_records` at the declared costs):
    whatever the sample measured, the input would run in one batch. The sample runs the
    operators over up to 5,000 records in a forked process before the query starts (0.1-0.5 s);
    on the LogWatch example's 2,022 lines at the declared costs' 392,675-record batch it could
    only have confirmed one batch."""
    if not reads_input_once or input_records is None:
        return SampleDecision(True, "more input may come" if not reads_input_once else "the input's size is unknown")
    fits = max(MIN_RECORDS, declared_records / margin)
    if input_records <= fits:
        return SampleDecision(False, f"the whole input, about {input_records:,.0f} records, runs in one batch even "
                                     f"with operators {margin:g} times costlier than declared")
    return SampleDecision(True, f"the input, about {input_records:,.0f} records, may take more than one batch")


def model_batch_cost(operators, plan: Plan, cores: int, settings) -> BatchCost:
    """The Spark model's batch time of `plan` as F + R * c, read off at two batch sizes
    (`settings`: a SparkModelSettings, its constants and workload)."""
    def batch_s(records: int) -> float:
        workload = replace(settings.workload, batch_records=records)
        return evaluate_spark(operators, plan, cores, settings.constants, workload).batch_time_s

    small, large = batch_s(_SMALL), batch_s(_LARGE)
    per_record = max((large - small) / (_LARGE - _SMALL), 1e-9)
    return BatchCost(max(0.0, small - per_record * _SMALL), per_record)
