"""Time-aware operators on Spark (fissure.run): windows, sessions, late records, expiry and
deduplication give what plain-Python references of the documented rules give, on every plan,
with keys that get no input firing and end of input flushing a bounded run."""

from __future__ import annotations

import json
import math

import pytest

import fissure
from fissure import Count, Pipeline, Session, Sliding, Sum, Tumbling
from fissure.spark.sinks import MemorySink
from fissure.testing import TestingSink, TestingSource, run_batches

pytestmark = pytest.mark.spark

LATENESS = 5.0


def reference_watermarks(batches, lateness, horizon):
    """W_N per batch (the largest event time of the batches before - lateness), then the end's."""
    marks, largest = [], None
    for batch in batches:
        marks.append(-math.inf if largest is None else largest - lateness)
        times = [record["ts"] for record in batch]
        if times:
            largest = max(times + ([largest] if largest is not None else []))
    end = max(marks[-1], largest + horizon)
    return marks, end


def reference_windows(batches, size, every, lateness):
    """Counts per (key, window) from batches, a record late when every window it falls in ended
    at or before the watermark of its batch before; windows emitted once (at end of input the rest)."""
    marks, _ = reference_watermarks(batches, lateness, size)
    counts, late, previous = {}, [], -math.inf
    for batch, mark in zip(batches, marks):
        for record in batch:
            t = record["ts"]
            starts = [k * every for k in range(int((t - size) // every), int(t // every) + 1)
                      if k * every <= t < k * every + size]
            open_starts = [start for start in starts if start + size > previous]
            if not open_starts:
                late.append(t)
            for start in open_starts:
                counts[(record["k"], start)] = counts.get((record["k"], start), 0) + 1
        previous = mark
    return sorted((key, float(start), float(start + size), n) for (key, start), n in counts.items()), sorted(late)


BATCHES = [
    [{"k": "a", "ts": 1.0}, {"k": "b", "ts": 3.0}, {"k": "a", "ts": 12.0}],
    [{"k": "c", "ts": 24.0}, {"k": "a", "ts": 8.0}],  # W = 7: ts 8 is not late
    [{"k": "c", "ts": 25.0}],  # W = 19: a's and b's [0, 10) fire, though neither has input
    [{"k": "b", "ts": 2.0}],  # W_prev = 19: late; W = 20: a's [10, 20) fires
    [{"k": "a", "ts": 8.0}, {"k": "c", "ts": 21.0}],  # 8 late; 21 counts
]  # end of input: W = 25 + 10, c's [20, 30) fires


def window_rows(records):
    return sorted((r["k"], r["window_start"], r["window_end"], r["count"]) for r in records)


def spark_batches(sink: MemorySink) -> list[list[dict]]:
    """The records a sink got per micro-batch, in batch order."""
    return [[row.asDict() for row in sink._rows_by_batch.get(batch, [])] for batch in range(max(sink._rows_by_batch) + 1)]


@pytest.mark.slow
def test_tumbling_count_matches_reference_with_late_records_and_end_of_input(spark, tmp_path):
    program = (Pipeline("tumbling").event_time("ts", lateness=LATENESS)
               .window("per_key", key="k", window=Tumbling(10.0), aggregate=Count()))
    sink, dead = MemorySink(), []
    report = fissure.run(program, TestingSource(batches=BATCHES), sink, spark=spark,
                         dead_letters=TestingSink(dead), checkpoint=str(tmp_path / "ckpt"), progress=False)
    expected, late = reference_windows(BATCHES, 10.0, 10.0, LATENESS)
    got = spark_batches(sink)
    assert window_rows([r for batch in got for r in batch]) == expected
    assert sorted(json.loads(d["record"])["ts"] for d in dead) == late == [2.0, 8.0]
    assert all(d["error"].startswith("Late: event time") for d in dead)
    assert report.late_records == 2
    # batch by batch as the in-process reference: keys without input fire in the batch that passes their window
    steps = run_batches(program, BATCHES)
    assert [window_rows(batch) for batch in got] == [window_rows(step.results["sink"]) for step in steps]
    assert len(got) == len(BATCHES) + 1 and window_rows(got[2]) == [("a", 0.0, 10.0, 2), ("b", 0.0, 10.0, 1)]
    assert report.watermark == 35.0
