"""Waiting operators on Spark: a declared one and a detected one run on elastic threads in their
Python workers, give what the sequential run gives (results in order, dead letters), and their
thread levels reach the driver per micro-batch; the driver's switch and the worker-side wrapper
with fakes in place of Spark."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace

import pyarrow as pa
import pytest

import fissure
from fissure import Pipeline
from fissure.control.adaptive.decisions import Decision
from fissure.control.adaptive.observations import BatchObservation
from fissure.control.driver import Timeline, plot_timeline
from fissure.control.thread_level.config import ElasticityConfig
from fissure.model.types import Plan, RegionPlan
from fissure.spark.query import elastic as spark_elastic
from fissure.config import RunnerConfig
from fissure.spark.query.elastic import ELASTIC_SWITCHED_PROPERTY, ThreadLevels, WorkerThreads
from fissure.spark.io.sinks import MemorySink
from fissure.testing import record_files
from fissure.runtime.elastic.stage import ThreadLevelTally, ThreadLevelTallyParam, WorkerRunners, worker_runners
from fissure.runtime.operators.fused import FusedStage, Step
from fissure.runtime.records.carried import live_batch

EVENTS = {"user": str, "i": int}
SCORED = {"user": str, "i": int, "score": int}


def enrich(record):
    """A lookup in a slow service."""
    time.sleep(0.001)
    if record["i"] % 50 == 13:
        raise LookupError(f"no score for {record['i']}")
    return {"user": record["user"], "i": record["i"], "score": record["i"] % 17}


def known_user(record):
    """Another lookup, not declared: its profile shows it waiting."""
    time.sleep(0.001)
    return record["user"] != "u2"


def pipeline(declare: bool) -> Pipeline:
    return (Pipeline("scores").map("enrich", enrich, schema=SCORED, waits="io" if declare else None)
            .filter("known_user", known_user))


def run(spark, tmp_path, name: str, declare: bool, config: RunnerConfig):
    records = [{"user": f"u{i % 5}", "i": i} for i in range(750)]
    source = record_files(tmp_path / name / "in", records, EVENTS, records_per_file=250, max_files_per_trigger=1)
    sink = MemorySink()
    runner = fissure.Runner(pipeline(declare), source, sink, plan="sequential",
                            config=replace(config, spark=spark, progress="off"),
                            checkpoint=str(tmp_path / name / "ckpt"))
    runner.start(available_now=True)
    runner.await_termination(120)
    report = runner.stop()
    return runner, report, sink.records()


@pytest.mark.spark
@pytest.mark.slow
def test_waiting_operators_run_on_threads_with_the_sequential_results_and_report_levels(spark, tmp_path):
    sequential, sequential_report, expected = run(spark, tmp_path, "sequential", declare=False, config=RunnerConfig())
    threaded = RunnerConfig(thread_elasticity=ElasticityConfig(period_s=0.05, max_threads=8, cpu_usage_limit=None),
                            detect_waiting_operators=True, progress_interval_s=0.2)
    runner, report, records = run(spark, tmp_path, "threaded", declare=True, config=threaded)

    assert records == expected  # the same records in the same order
    assert len(expected) == 750 - 15 - 150  # 15 dead letters (none of user u2), 150 records of u2 filtered out
    assert report.dead_letters == sequential_report.dead_letters == 15
    assert runner.dead_letter_log.recent == sequential.dead_letter_log.recent  # operator, error, record, seq
    assert sequential_report.thread_levels == () and sequential.threads.switched == {}

    assert report.batches == 3 and [batch.batch_id for batch in report.thread_levels] == [0, 1, 2]
    enrich_levels = [level for batch in report.thread_levels for level in batch.levels().get("enrich", ())]
    assert len(enrich_levels) >= 3 and max(enrich_levels) > 1
    assert "enrich" in runner.progress.threads
    # Detected from its profile (wall time far above CPU time), then switched on for later batches.
    assert "known_user" in runner.threads.switched
    assert any("known_user" in batch.levels() for batch in report.thread_levels[1:])


@pytest.mark.spark
def test_a_waiting_operator_of_a_graph_runs_on_threads_in_its_graph_pe(spark, tmp_path):
    """Fan-out: the waiting lookup feeds a sink and a keyed count; it runs on elastic threads in
    its PE, its levels reach the driver, and every sink holds what run_local gives."""
    graph = fissure.StreamGraph("scores_graph")
    scored = graph.source("events", schema=EVENTS).map("enrich", enrich, schema=SCORED, waits="io")
    scored.sink("scored")
    scored.partitioned("per_user", lambda state, r: state.update(n=state.get("n", 0) + 1) or
                       {"user": r["user"], "n": state["n"]}, key="user", schema={"user": str, "n": int}).sink("counts")
    records = [{"user": f"u{i % 5}", "i": i} for i in range(500)]
    source = record_files(tmp_path / "in", records, EVENTS, records_per_file=250, max_files_per_trigger=1)
    sinks = {"scored": MemorySink(), "counts": MemorySink()}
    config = RunnerConfig(thread_elasticity=ElasticityConfig(period_s=0.05, max_threads=8, cpu_usage_limit=None),
                          spark=spark)
    report = fissure.run(graph, {"events": source}, sinks,
                         plan=Plan(regions=(RegionPlan((("enrich",),)), RegionPlan((("per_user",),), replicas=2))),
                         config=config)
    local = fissure.run_local(graph, {"events": records})
    assert sorted(r["i"] for r in sinks["scored"].records()) == sorted(r["i"] for r in local["scored"])
    assert sorted(map(str, sinks["counts"].records())) == sorted(map(str, local["counts"]))
    assert report.dead_letters == len(local.dead_letters) == 10
    levels = [level for batch in report.thread_levels for level in batch.levels().get("enrich", ())]
    assert [batch.batch_id for batch in report.thread_levels] == [0, 1] and levels and max(levels) > 1


# -- the driver's and the worker's side, with fakes in place of Spark ---------------------------------


class FakeAccumulator:
    def __init__(self) -> None:
        self.value, self.param = ThreadLevelTally(), ThreadLevelTallyParam()

    def add(self, term) -> None:
        self.value = self.param.addInPlace(self.value, term)


class FakeSpark:
    def __init__(self) -> None:
        self.properties: dict[str, str] = {}
        self.sparkContext = self

    def accumulator(self, value, param):
        return FakeAccumulator()

    def setLocalProperty(self, name: str, value: str) -> None:  # noqa: N802 - Spark's name
        self.properties[name] = value


@dataclass(frozen=True)
class Estimate:
    wall_us: float | None
    cpu_us: float | None
    timed_records: int


class Summary:
    def __init__(self, estimates) -> None:
        self.estimates = estimates

    def operator(self, name):
        return self.estimates.get(name)


EVENTS_SCHEMA = pa.schema([("user", pa.string()), ("i", pa.int64())])
SCORED_SCHEMA = pa.schema([("user", pa.string()), ("i", pa.int64()), ("score", pa.int64())])


def test_the_driver_switches_on_what_the_profile_shows_waiting_and_keeps_each_batchs_levels(monkeypatch):
    worker_runners().reset()
    spark, summary = FakeSpark(), Summary({})
    levels = ThreadLevels(spark, pipeline(declare=True), config=ElasticityConfig(period_s=0.01, max_threads=4),
                          detect=True, profile_summary=lambda: summary)
    assert levels.candidates == ("known_user",)
    operators = pipeline(declare=True).operators
    steps = [Step(operator.name, operator.action.value, operator.fn, SCORED_SCHEMA,
                  waiting=levels.worker.waiting_for(operator, "switch-test")) for operator in operators]
    assert [step.waiting.declared for step in steps] == ["io", None]
    stage = FusedStage(steps, EVENTS_SCHEMA)
    switched: set[str] = set()
    monkeypatch.setattr(spark_elastic, "_task_switched_operators", lambda: set(switched))
    region = levels.worker.wrap_waiting(lambda batches: (stage(batch) for batch in batches),
                                        [step.waiting for step in steps if step.waiting is not None])

    def write(frame, batch_id):  # the foreachBatch function: the batch's tasks run inside it
        switched.update(json.loads(spark.properties[ELASTIC_SWITCHED_PROPERTY]))
        rows = [{"user": f"u{i % 5}", "i": i} for i in range(batch_id * 20, batch_id * 20 + 20)]
        list(region(iter([live_batch(pa.RecordBatch.from_pylist(rows, schema=EVENTS_SCHEMA), list(range(20)))])))

    wrapped = levels.wrap(write)
    wrapped(None, 0)
    summary.estimates = {"known_user": Estimate(wall_us=1100.0, cpu_us=30.0, timed_records=150)}
    wrapped(None, 1)  # too few timed records yet
    summary.estimates = {"known_user": Estimate(wall_us=1100.0, cpu_us=30.0, timed_records=300),
                         "enrich": Estimate(wall_us=float("nan"), cpu_us=None, timed_records=0)}
    wrapped(None, 2)
    summary.estimates = {}  # profiles gone: the switch stays
    wrapped(None, 3)
    assert list(levels.switched) == ["known_user"] and "waits" in levels.switched["known_user"]
    assert spark.properties[ELASTIC_SWITCHED_PROPERTY] == '["known_user"]'
    assert [sorted(batch.levels()) for batch in levels.batches] == [["enrich"], ["enrich"], ["enrich", "known_user"],
                                                                   ["enrich", "known_user"]]
    assert levels.latest_text().startswith("enrich ")
    assert levels.levels_of(2)["known_user"][0] >= 1 and "known_user" not in levels.levels_of(0)
    assert levels.levels_of(99) is None
    worker_runners().reset()


def test_the_adaptive_timeline_carries_and_plots_the_thread_levels(tmp_path):
    plan = Plan((RegionPlan((("enrich", "known_user"),)),), method="sequential")
    timeline = Timeline()
    for batch_id, levels in enumerate([None, {"enrich": (2,)}, {"enrich": (5, 3)}]):
        observation = BatchObservation(batch_id, float(batch_id), 100, 0.5, 200.0, thread_levels=levels)
        timeline.record(observation, plan, Decision.observe(batch_id, float(batch_id), "p", "steady"), None)
    assert [entry.thread_levels for entry in timeline.entries] == [None, {"enrich": [2]}, {"enrich": [5, 3]}]
    timeline.write_json(tmp_path / "timeline.json")
    assert json.loads((tmp_path / "timeline.json").read_text())["entries"][2]["thread_levels"] == {"enrich": [5, 3]}
    plot_timeline(timeline, tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").stat().st_size > 0


def test_without_waiting_operators_nothing_is_wrapped_or_reported():
    spark = FakeSpark()
    levels = ThreadLevels(spark, pipeline(declare=False), detect=False)
    write = object()
    assert levels.wrap(write) is write and levels.worker == WorkerThreads()
    assert levels.latest_text() == "" and levels.batches == ()
    assert all(levels.worker.waiting_for(operator, "p") is None for operator in pipeline(declare=False).operators)


def test_a_new_run_gets_new_runners_in_workers_that_outlive_the_last_run():
    # Python workers outlive a run: under one key, a second run's first batch would report the
    # thread level the first run ended on. The run's checkpoint is part of every runner key.
    operator = pipeline(declare=True).operators[0]
    first, again = WorkerThreads(run="run-a"), WorkerThreads(run="run-a")
    other = WorkerThreads(run="run-b")
    key = first.waiting_for(operator, "p0").runner_key
    assert key == again.waiting_for(operator, "p0").runner_key  # the same run's restarts keep it
    assert key != other.waiting_for(operator, "p0").runner_key
    runners = WorkerRunners()
    waiting_a, waiting_b = first.waiting_for(operator, "p0"), other.waiting_for(operator, "p0")
    with runners.lease(waiting_a, waiting_a.board()) as runner_a, runners.lease(waiting_b, waiting_b.board()) as runner_b:
        assert runner_a is not None and runner_b is not None and runner_a is not runner_b
