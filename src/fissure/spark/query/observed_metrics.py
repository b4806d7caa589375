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
(fissure.runtime.profiling.report_rows); later stages forward it untouched, sinks never read it. The
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

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from fissure.runtime.records.envelopes import ROUTE
from fissure.runtime.profiling.report_rows import REPORT_ROUTE, REPORT_TEXT, REPORTED_COUNTS

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
    operators' stages emit their counts (profiling on), else `operators` is an empty list.

    The observation's expressions are SQL text, each parsed once in the JVM, and the operators'
    statistics one `transform` over their names that parses the reports once: built with
    PySpark's column functions per operator, each lambda cost several py4j round trips and the
    expression held the parsed reports 45 times for LogWatch's nine operators; building it took
    0.9 s of the driver's time and Spark's analysis of it 1.1-2.4 s before the query started
    (cProfile, 2 cores under load from other work)."""
    reports = f"collect_list(CASE WHEN `{ROUTE}` = {REPORT_ROUTE} THEN `{REPORT_TEXT}` END)"
    parsed = f"transform({reports}, report_text -> from_json(report_text, '{_REPORT_SCHEMA}'))"
    # The published text of the latest stage that has one (the query's last stage).
    published = (f"array_max(transform(filter({parsed}, report -> report.published IS NOT NULL), "
                 f"report -> named_struct('stage', report.stage, 'published', report.published))).published")
    names = (f"array({', '.join(_sql_text(name) for name in operators)})" if counted and operators
             else "filter(array(''), name -> false)")  # empty, of the same type
    zeros = ", ".join(["CAST(0 AS DOUBLE)"] * len(REPORTED_COUNTS))
    # Per operator, its counts summed over the reports that name it, in report order.
    sums = (f"transform({names}, name -> named_struct('operator', name, 'sums', aggregate({parsed}, array({zeros}), "
            f"(running, report) -> CASE WHEN try_element_at(report.operators, name) IS NULL THEN running "
            f"ELSE zip_with(running, try_element_at(report.operators, name), (sum, count) -> sum + count) END)))")
    statistics = (f"transform({sums}, operator -> named_struct('operator', operator.operator, "
                  f"'records_in', CAST(operator.sums[{_RECORDS_IN}] AS BIGINT), "
                  f"'records_out', CAST(operator.sums[{_RECORDS_OUT}] AS BIGINT), "
                  f"'selectivity', try_divide(operator.sums[{_RECORDS_OUT}], operator.sums[{_RECORDS_IN}]), "
                  f"'dead_letters', CAST(operator.sums[{_DEAD_LETTERS}] AS BIGINT), "
                  f"'cost_us', try_divide(operator.sums[{_TIMED_CPU_S}] * CAST(1000000 AS DOUBLE), "
                  f"operator.sums[{_TIMED_RECORDS_IN}])))")
    return frame.observe(
        METRIC_NAME,
        F.lit(METRIC_VERSION).alias("version"),
        F.expr(f"get_json_object({published}, '$.plan')").alias("plan"),
        F.expr(f"get_json_object({published}, '$.decision')").alias("decision"),
        F.expr(f"get_json_object({published}, '$.decision_reason')").alias("decision_reason"),
        F.expr(f"CAST(get_json_object({published}, '$.decision_batch') AS BIGINT)").alias("decision_batch"),
        F.expr(statistics).alias("operators"))


def _sql_text(value: str) -> str:
    """`value` as a SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


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
