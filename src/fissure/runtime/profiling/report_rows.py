"""Report rows: what a query's Python stages tell Spark's observed metrics (no pyspark here).

At the end of each task (a pe stage) or group call (a keyed stage) a stage may emit one extra
envelope on a route no stream has, `REPORT_ROUTE`, whose text is JSON:

    {"stage": 3, "published": "<the driver's text for the batch>" or null,
     "operators": {"name": [records_in, records_out, dead_letters, timed_records_in, timed_cpu_s]}}

Every later stage forwards such a row untouched (a piece passes rows of routes it does not read;
a keyed stage gets them under a spread key), no sink reads its route and it is no dead letter, so
it reaches the end of the query, where one observation (fissure.spark.query.observed_metrics) sums the
reports of the micro-batch into `StreamingQueryProgress.observedMetrics["fissure"]`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import pyarrow as pa

from fissure.runtime.records.columns import DEAD_RECORD, SEQ
from fissure.runtime.profiling.profiler import DEAD_LETTERS, RECORDS_IN, RECORDS_OUT, TIMED_CPU_S, TIMED_RECORDS_IN

REPORT_ROUTE = -1  # no stream's route: streams are numbered from 0
# A report's JSON rides in the dead-record column, which is null on every live row and which a
# row counts as a dead letter only with a dead operator set: no column is added to every envelope.
REPORT_TEXT = DEAD_RECORD
# The counts a report carries per operator, in this order.
REPORTED_COUNTS = ("records_in", "records_out", "dead_letters", "timed_records_in", "timed_cpu_s")
_TALLY_POSITIONS = (RECORDS_IN, RECORDS_OUT, DEAD_LETTERS, TIMED_RECORDS_IN, TIMED_CPU_S)


def reported_counts(tally_values: Sequence[float]) -> list[float]:
    """An operator's counts in report order from its ProfileTally values (OPERATOR_FIELDS order)."""
    return [tally_values[position] for position in _TALLY_POSITIONS]


def report_text(stage: int, published: str | None, operators: Mapping[str, Sequence[float]] | None) -> str:
    return json.dumps({"stage": stage, "published": published,
                       "operators": {name: list(values) for name, values in (operators or {}).items()}},
                      separators=(",", ":"))


def report_envelope(schema: pa.Schema, text: str) -> pa.RecordBatch:
    """One envelope of `schema` (an EnvelopeLayout's) carrying `text` on REPORT_ROUTE."""
    columns = []
    for position, field in enumerate(schema):
        if position == 0:  # the route
            columns.append(pa.array([REPORT_ROUTE], field.type))
        elif field.name == SEQ:  # a spread key for keyed stages (fissure.runtime.operators.packing)
            columns.append(pa.array([0], field.type))
        elif field.name == REPORT_TEXT:
            columns.append(pa.array([text], field.type))
        else:
            columns.append(pa.nulls(1, field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
