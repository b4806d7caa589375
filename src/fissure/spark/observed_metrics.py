"""fissure's statistics, plan and latest adaptive decision in Spark's own progress reports.

Every query fissure starts carries one observation, `observedMetrics["fissure"]`, that Spark
puts into each micro-batch's `StreamingQueryProgress`: `query.lastProgress`, `recentProgress`,
a `StreamingQueryListener`'s `QueryProgressEvent` and the UI see it. Its fields
(docs/spark-runner.md, "Watching a run with Spark's tools"; a contract, `version` 1):

    version          1
    plan             the plan the micro-batch ran under (`[a,b|c]x2(key) -> [d]`)
    decision         the adaptive loop's latest decision before the batch (apply, keep, revert, ...), or null
    decision_reason  its reason
    decision_batch   the batch it was decided on
    operators        per operator, in execution order: operator, records_in, records_out,
                     selectivity, dead_letters, cost_us (this batch's CPU us per timed record)

How the values get there: Spark's observation is an aggregate over the rows that reach the end of
the query, so what the Python workers count travels as rows. Each profiled task (a pe stage's,
a keyed stage's group call) emits one report row on a route no stream has
(fissure.worker.report_rows); later stages forward it untouched, sinks never read it. The
driver's values (plan, decision) are a local property the tasks of the query's last stage read
and copy into their report rows (those tasks read their own batch's properties; measured on Spark
4.3, a mapInArrow before the query's round-robin repartition read the previous batch's). An
observation made inside `foreachBatch` would not do: Spark reports only the observations of the
streaming query's own plan (measured). The observation collects
the few report rows (one `collect_list` over a `CASE` on the route: the only per-row work) and
sums them once per batch, in the same job as the batch's write: no extra Spark job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from fissure.worker.graph_pe import ROUTE
from fissure.worker.report_rows import REPORT_ROUTE, REPORT_TEXT, REPORTED_COUNTS

METRIC_NAME = "fissure"
METRIC_VERSION = 1
_REPORT_SCHEMA = "stage int, published string, operators map<string, array<double>>"
(_RECORDS_IN, _RECORDS_OUT, _DEAD_LETTERS, _TIMED_RECORDS_IN, _TIMED_CPU_S) = range(len(REPORTED_COUNTS))


@dataclass(frozen=True)
class Publication:
    """What the driver publishes for the micro-batches that start from now on."""

    plan: str
    decision: str | None = None
    decision_reason: str | None = None
    decision_batch: int | None = None

    def text(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


def observe_run(frame: DataFrame, operators: Sequence[str], counted: bool) -> DataFrame:
    """`frame` (a compiled query's envelopes) with the observation "fissure"; `counted`: the
    operators' stages emit their counts (profiling on), else `operators` is an empty list."""
    reports = F.collect_list(F.when(F.col(ROUTE) == F.lit(REPORT_ROUTE), F.col(REPORT_TEXT)))
    parsed = F.transform(reports, lambda text: F.from_json(text, _REPORT_SCHEMA))
    # The published text of the latest stage that has one (the query's last stage).
    latest = F.array_max(F.transform(F.filter(parsed, lambda report: report["published"].isNotNull()),
                                     lambda report: F.struct(report["stage"].alias("stage"),
                                                             report["published"].alias("published"))))
    published = latest["published"]
    statistics = F.array(*[_operator_statistics(parsed, name) for name in operators])
    if not counted:
        statistics = F.filter(statistics, lambda operator: F.lit(False))  # empty, of the same type
    return frame.observe(
        METRIC_NAME,
        F.lit(METRIC_VERSION).alias("version"),
        F.get_json_object(published, "$.plan").alias("plan"),
        F.get_json_object(published, "$.decision").alias("decision"),
        F.get_json_object(published, "$.decision_reason").alias("decision_reason"),
        F.get_json_object(published, "$.decision_batch").cast("long").alias("decision_batch"),
        statistics.alias("operators"))


def _operator_statistics(parsed: Column, name: str) -> Column:
    counts = F.filter(F.transform(parsed, lambda report: F.try_element_at(report["operators"], F.lit(name))),
                      lambda values: values.isNotNull())

    def total(position: int) -> Column:
        return F.aggregate(counts, F.lit(0.0), lambda sum_, values: sum_ + values[position])

    records_in, records_out = total(_RECORDS_IN), total(_RECORDS_OUT)
    return F.struct(F.lit(name).alias("operator"),
                    records_in.cast("long").alias("records_in"),
                    records_out.cast("long").alias("records_out"),
                    F.try_divide(records_out, records_in).alias("selectivity"),
                    total(_DEAD_LETTERS).cast("long").alias("dead_letters"),
                    F.try_divide(total(_TIMED_CPU_S) * F.lit(1e6), total(_TIMED_RECORDS_IN)).alias("cost_us"))


def fissure_metrics(progress) -> dict | None:
    """fissure's observation in a progress report (a listener's `event.progress`, or
    `query.lastProgress`) as plain dicts; None when the batch has none."""
    observed = getattr(progress, "observedMetrics", None)
    if observed is None and isinstance(progress, Mapping):
        observed = progress.get("observedMetrics")
    row = (observed or {}).get(METRIC_NAME)
    return _plain(row) if row is not None else None


def _plain(value):
    if hasattr(value, "asDict"):
        return {name: _plain(item) for name, item in value.asDict().items()}
    if isinstance(value, Mapping):
        return {name: _plain(item) for name, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value
