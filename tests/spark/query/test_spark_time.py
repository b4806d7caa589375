"""Time-aware operators on Spark (fissure.run): windows, sessions, late records, expiry and
deduplication give what plain-Python references of the documented rules give, on every plan,
with keys that get no input firing and end of input flushing a bounded run."""

from __future__ import annotations

import json
import math

import pytest

import fissure
from fissure import Count, Pipeline, Session, Sliding, StreamGraph, Sum, Tumbling
from fissure.model.types import Plan, RegionPlan
from fissure.spark.io.sinks import MemorySink
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
    report = fissure.run(program, TestingSource(batches=BATCHES), sink, checkpoint=str(tmp_path / "ckpt"),
                         config=fissure.RunnerConfig(spark=spark, dead_letters=TestingSink(dead), progress="off"))
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
    # keys holding windows: a, b, c after batch 1; none once the end of input fired every window
    assert (report.state_keys, report.state_keys_peak) == (0, 3)
    summary = report.summary()
    assert (summary["state_keys"], summary["state_keys_peak"], summary["late_records"]) == (0, 3, 2)
    # the end of input ran as a query of its own after the input's batches: not in the steady rate
    assert report.end_of_input_from == len(BATCHES) and summary["end_of_input_s"] > 0


def on_expire(state, key):
    return {"k": key, "n": state["n"], "what": "expired"}


def count_records(state, record):
    state["n"] = state.get("n", 0) + 1
    return {"k": record["k"], "n": state["n"], "what": "seen"}


def time_graph() -> StreamGraph:
    """Sliding and session windows, deduplication, expiry with on_expire and an expiring aggregate
    on one event-time stream."""
    graph = StreamGraph("time_graph")
    events = graph.source("events", schema={"k": str, "ts": float}).event_time("ts", lateness=LATENESS)
    events.window("slide", key="k", window=Sliding(10.0, 5.0), aggregate=Count()).sink("slide")
    events.window("sessions", key="k", window=Session(4.0), aggregate=Sum("ts")).sink("sessions")
    events.deduplicate("dedup", key="k", within=3.0).sink("dedup")
    events.partitioned("expiring", count_records, key="k", expire_after=6.0, on_expire=on_expire,
                       schema={"k": str, "n": int, "what": str}).sink("expiring")
    events.aggregate("totals", key="k", aggregate=Count(), expire_after=6.0).sink("totals")
    return graph


GRAPH_BATCHES = [
    [{"k": "a", "ts": 1.0}, {"k": "a", "ts": 2.0}, {"k": "b", "ts": 4.0}, {"k": "a", "ts": 3.5}],
    [{"k": "a", "ts": 9.0}, {"k": "b", "ts": 6.0}, {"k": "c", "ts": 14.0}],
    [{"k": "c", "ts": 15.5}, {"k": "a", "ts": 1.5}, {"k": "b", "ts": 30.0}],  # a 1.5: late for dedup only
    [{"k": "c", "ts": 16.0}, {"k": "a", "ts": 2.0}],  # a 2.0: late for its emitted session and dedup
    [{"k": "a", "ts": 33.0}, {"k": "c", "ts": 40.0}],
]


def reference_sessions(batches, gap):
    """Sessions per key when no record is late: event times less than `gap` apart, [first, last + gap)."""
    times: dict[str, list[float]] = {}
    for batch in batches:
        for record in batch:
            times.setdefault(record["k"], []).append(record["ts"])
    sessions = []
    for key, stamps in times.items():
        stamps.sort()
        start = last = stamps[0]
        total = stamps[0]
        for t in stamps[1:]:
            if t - last < gap:
                total += t
            else:
                sessions.append((key, start, last + gap, total))
                start, total = t, t
            last = t
        sessions.append((key, start, last + gap, total))
    return sorted(sessions)


def graph_results(sinks: dict, name: str) -> list[list]:
    return [sorted(sorted(record.items()) for record in batch) for batch in spark_batches(sinks[name])]


@pytest.mark.slow
@pytest.mark.parametrize("plan", ["sequential", "fission"])
def test_windows_sessions_dedup_and_expiry_in_a_graph_match_the_reference(spark, tmp_path, plan):
    graph = time_graph()
    names = ("slide", "sessions", "dedup", "expiring", "totals")
    sinks = {name: MemorySink() for name in names}
    dead = []
    chosen = "sequential" if plan == "sequential" else Plan(tuple(
        RegionPlan(((name,),), replicas=2 if graph.node(name).keyed else 1) for name in graph.check().order
        if graph.node(name).operator is not None))
    fissure.run(graph, {"events": TestingSource(batches=GRAPH_BATCHES)}, sinks, plan=chosen,
                checkpoint=str(tmp_path / "ckpt"),
                config=fissure.RunnerConfig(spark=spark, dead_letters=TestingSink(dead), progress="off"))
    steps = run_batches(graph, [{"events": batch} for batch in GRAPH_BATCHES])
    for name in names:  # batch by batch as in process
        assert graph_results(sinks, name) == [sorted(sorted(record.items()) for record in step.results[name])
                                              for step in steps], name
    sessions = sorted((r["k"], r["window_start"], r["window_end"], r["sum"])
                      for batch in spark_batches(sinks["sessions"]) for r in batch)
    # a's 1.5 joins a session not emitted yet; its 2.0 comes after that session was emitted: late
    without_late = GRAPH_BATCHES[:3] + [[{"k": "c", "ts": 16.0}]] + GRAPH_BATCHES[4:]
    assert sessions == reference_sessions(without_late, 4.0)
    expired = sorted((r["k"], r["n"]) for batch in spark_batches(sinks["expiring"]) for r in batch
                     if r["what"] == "expired")
    assert {key for key, _ in expired} == {"a", "b", "c"}  # every key's state expired, with on_expire's record
    in_process_dead = sorted((letter.node, letter.error) for step in steps for letter in step.dead_letters)
    assert sorted((d["operator"], d["error"]) for d in dead) == in_process_dead
    assert sorted(operator for operator, error in in_process_dead if error.startswith("Late:")) == ["dedup", "sessions"]


ADAPTIVE_BATCHES = [[{"k": f"k{(i * 7 + j) % 5}", "ts": float(i * 4 + j % 3)} for j in range(4)] for i in range(7)] + [
    [{"k": "k1", "ts": 2.0}]]  # late: [0, 10) closed long before


@pytest.mark.slow
def test_windows_survive_an_adaptive_switch_that_repartitions_their_state(spark, tmp_path):
    from fissure.spark.adaptive.loop import run_adaptive_on_spark
    from fissure.control.adaptive.config import AdaptiveConfig

    program = (Pipeline("adaptive_windows").map("parse", lambda r: r, schema={"k": str, "ts": float})
               .event_time("ts", lateness=2.0)
               .window("per_key", key="k", window=Tumbling(10.0), aggregate=Count()))
    keyed_x2 = Plan((RegionPlan((("parse", "event_time", "per_key"),), replicas=2),))
    sink, dead = MemorySink(), []
    report = run_adaptive_on_spark(
        program, TestingSource(batches=ADAPTIVE_BATCHES), sink, checkpoint=str(tmp_path / "ckpt"),
        injections={2: keyed_x2},
        config=fissure.RunnerConfig(
            spark=spark, dead_letters=TestingSink(dead), run_dir=str(tmp_path / "run"), progress="off",
            adaptation=AdaptiveConfig(profile_batches=2, profile_s=1e9, evaluation_s=1e9, min_operator_samples=1)))
    assert report.queries == 2 and report.switches  # the state was repartitioned to 2 partitions
    expected, late = reference_windows(ADAPTIVE_BATCHES, 10.0, 10.0, 2.0)
    assert window_rows(sink.records()) == expected
    assert sorted(json.loads(d["record"])["ts"] for d in dead) == late == [2.0]
    assert report.late_records == 1
