"""fissure's statistics, plan and adaptive decisions as Spark's own tools see them: a
StreamingQueryListener's progress events and `query.lastProgress` carry observedMetrics["fissure"]
(docs/spark-runner.md, "Watching a run with Spark's tools")."""

from __future__ import annotations

import time

import pytest

import fissure
from fissure import Pipeline, StreamGraph
from fissure.model.types import Plan, RegionPlan
from fissure.spark.adaptive.loop import run_adaptive_on_spark
from fissure.spark.query.observed_metrics import METRIC_NAME, METRIC_VERSION, fissure_metrics
from fissure.plan.plans import describe_plan
from fissure.spark.query.runner import Runner
from fissure.spark.io.sinks import MemorySink
from fissure.testing import record_files

pytestmark = pytest.mark.spark

EVENT = {"user": str, "i": int}
FILES, PER_FILE = 4, 15
RECORDS = [{"user": f"u{i % 3}", "i": i} for i in range(FILES * PER_FILE)]
KEPT = [record for record in RECORDS if record["i"] % 3 != 0]  # the filter keeps two of three
COUNTED = {"user": str, "i": int, "n": int}


def scale(record):
    return {"user": record["user"], "i": record["i"] * 10}


def not_third(record):
    return record["i"] % 30 != 0


def count(state, record):
    state["n"] = state.get("n", 0) + 1
    return {**record, "n": state["n"]}


def chain() -> Pipeline:
    return (Pipeline("channels").map("scale", scale).filter("not_third", not_third)
            .partitioned("count", count, key="user", schema=COUNTED))


def graph() -> StreamGraph:
    """A fan-out of `scaled` to a filter (then a sink) and to a keyed count (then a sink)."""
    g = StreamGraph("channels_graph")
    scaled = g.source("events", schema=EVENT).map("scale", scale)
    scaled.filter("not_third", not_third).sink("kept")
    scaled.partitioned("count", count, key="user", schema=COUNTED).sink("counts")
    return g


def plan_of(program, replicas: int) -> Plan:
    names = program.names
    return Plan((RegionPlan((tuple(names),), replicas),))


def source(tmp_path):
    return record_files(tmp_path / "in", RECORDS, EVENT, records_per_file=PER_FILE, max_files_per_trigger=1)


def sinks_of(program):
    return MemorySink() if isinstance(program, Pipeline) else {"kept": MemorySink(), "counts": MemorySink()}


class ProgressListener:
    """Keeps every progress event's observed metrics by batch (a StreamingQueryListener)."""

    def __new__(cls):
        from pyspark.sql.streaming import StreamingQueryListener

        class Listener(StreamingQueryListener):
            def __init__(self):
                self.metrics: dict[int, dict] = {}
                self.raw: dict[int, object] = {}

            def onQueryStarted(self, event):  # noqa: N802 - Spark's names
                pass

            def onQueryProgress(self, event):  # noqa: N802
                self.raw[event.progress.batchId] = event.progress.observedMetrics.get(METRIC_NAME)
                self.metrics[event.progress.batchId] = fissure_metrics(event.progress)

            def onQueryIdle(self, event):  # noqa: N802
                pass

            def onQueryTerminated(self, event):  # noqa: N802
                pass

        return Listener()


def wait_for(listener, batches: int, timeout_s: float = 30.0) -> None:
    """Listener events arrive on Spark's listener bus, after the query may have ended."""
    deadline = time.monotonic() + timeout_s
    while len(listener.metrics) < batches and time.monotonic() < deadline:
        time.sleep(0.2)


def by_operator(metrics: dict) -> dict[str, dict]:
    return {operator["operator"]: operator for operator in metrics["operators"]}


def assert_counts_over_the_run(metrics_by_batch: dict[int, dict], program) -> None:
    """Summed over the batches: every record reached `scale` once, the filter kept two of three,
    the keyed count got every scaled record (graph) or the kept ones (chain)."""
    totals: dict[str, dict[str, int]] = {}
    for metrics in metrics_by_batch.values():
        assert metrics["version"] == METRIC_VERSION
        assert [operator["operator"] for operator in metrics["operators"]] == ["scale", "not_third", "count"]
        for name, operator in by_operator(metrics).items():
            for field in ("records_in", "records_out", "dead_letters"):
                totals.setdefault(name, {}).setdefault(field, 0)
                totals[name][field] += operator[field]
            if operator["records_in"]:
                assert operator["selectivity"] == pytest.approx(operator["records_out"] / operator["records_in"])
                # Every batch of a fused operator is timed; a keyed one's every 32nd record only.
                assert (operator["cost_us"] is None and name == "count") or operator["cost_us"] > 0
    assert totals["scale"] == {"records_in": len(RECORDS), "records_out": len(RECORDS), "dead_letters": 0}
    assert totals["not_third"] == {"records_in": len(RECORDS), "records_out": len(KEPT), "dead_letters": 0}
    into_count = len(KEPT) if isinstance(program, Pipeline) else len(RECORDS)
    assert totals["count"] == {"records_in": into_count, "records_out": into_count, "dead_letters": 0}


@pytest.mark.parametrize("make, replicas", [(chain, 1), (graph, 2)], ids=["chain-sequential", "graph-keyed-x2"])
def test_a_listener_reads_operator_statistics_and_the_plan_from_progress_events(spark, tmp_path, make, replicas):
    program = make()
    plan = plan_of(program, replicas)
    listener = ProgressListener()
    spark.streams.addListener(listener)
    try:
        report = fissure.run(program, source(tmp_path), sinks_of(program), plan=plan,
                             config=fissure.RunnerConfig(spark=spark, progress="off"))
        wait_for(listener, report.batches)
    finally:
        spark.streams.removeListener(listener)

    assert sorted(listener.metrics) == list(range(FILES))  # one batch per file, each with fissure's metrics
    assert_counts_over_the_run(listener.metrics, program)
    expected_plan = describe_plan(plan, program)
    assert {metrics["plan"] for metrics in listener.metrics.values()} == {expected_plan}
    assert {metrics["decision"] for metrics in listener.metrics.values()} == {None}  # no adaptive loop
    # Each file's 15 records: the filter passes exactly those not divisible by 3 in every batch.
    for batch_id, metrics in listener.metrics.items():
        kept = sum(1 for record in RECORDS[batch_id * PER_FILE:(batch_id + 1) * PER_FILE] if record["i"] % 3)
        assert by_operator(metrics)["not_third"]["records_out"] == kept
        assert by_operator(metrics)["not_third"]["selectivity"] == pytest.approx(kept / PER_FILE)
    # The raw event is Spark's Row, as any listener gets it.
    assert listener.raw[0]["plan"] == expected_plan


@pytest.mark.parametrize("make, replicas", [(chain, 2), (graph, 1)], ids=["chain-keyed-x2", "graph-sequential"])
def test_last_progress_carries_the_last_batchs_statistics_and_plan(spark, tmp_path, make, replicas):
    program = make()
    plan = plan_of(program, replicas)
    runner = Runner(program, source(tmp_path), sinks_of(program), plan=plan,
                    config=fissure.RunnerConfig(spark=spark, progress="off"))
    runner.start(available_now=True)
    try:
        runner.await_termination(300)
        last = runner.query.lastProgress
        recent = runner.query.recentProgress
    finally:
        runner.stop()

    metrics = fissure_metrics(last)
    assert last.batchId == FILES - 1 and metrics is not None
    assert metrics["plan"] == describe_plan(plan, program)
    last_file = RECORDS[-PER_FILE:]
    operators = by_operator(metrics)
    assert operators["scale"]["records_in"] == PER_FILE
    assert operators["not_third"]["records_out"] == sum(1 for record in last_file if record["i"] % 3)
    assert_counts_over_the_run({progress.batchId: fissure_metrics(progress) for progress in recent}, program)


def test_without_profiling_the_plan_is_still_published(spark, tmp_path):
    program = chain()
    runner = Runner(program, source(tmp_path), MemorySink(),
                    config=fissure.RunnerConfig(spark=spark, progress="off", profiling=None))
    runner.start(available_now=True)
    try:
        runner.await_termination(300)
        metrics = fissure_metrics(runner.query.lastProgress)
    finally:
        runner.stop()
    assert metrics["operators"] == [] and metrics["plan"] == "[scale,not_third,count]"


@pytest.mark.slow
def test_an_adaptive_decision_and_the_plan_it_puts_in_force_reach_the_listener(spark, tmp_path):
    from fissure.control.adaptive.config import AdaptiveConfig

    hands_off = AdaptiveConfig(profile_batches=2, profile_s=1e9, evaluation_s=1e9, min_operator_samples=1)
    program = Pipeline("channels-adaptive").map("scale", scale).filter("not_third", not_third)
    replicated = Plan((RegionPlan((("scale", "not_third"),), 2),))
    listener, decisions = ProgressListener(), []
    spark.streams.addListener(listener)
    try:
        report = run_adaptive_on_spark(
            program, source(tmp_path), MemorySink(), checkpoint=str(tmp_path / "ckpt"),
            config=fissure.RunnerConfig(spark=spark, run_dir=str(tmp_path / "run"), adaptation=hands_off,
                                        progress="off"),
            injections={1: replicated}, on_decision=lambda decision, entry: decisions.append(decision))
        wait_for(listener, report.batches)
    finally:
        spark.streams.removeListener(listener)

    [apply] = [decision for decision in decisions if decision.action.value == "apply"]
    after = {batch_id: metrics for batch_id, metrics in listener.metrics.items() if batch_id > apply.batch_id}
    assert after, "no batch ran after the switch"
    first = after[min(after)]
    # The batch after the decision (in the restarted query) publishes it, with its reason.
    assert (first["decision"], first["decision_batch"]) == ("apply", apply.batch_id)
    assert first["decision_reason"] == apply.reason and "injected" in first["decision_reason"]
    assert first["plan"] == "[scale,not_third]x2"
    assert {metrics["plan"] for metrics in after.values()} == {"[scale,not_third]x2"}
    before = [metrics for batch_id, metrics in listener.metrics.items() if batch_id <= apply.batch_id]
    assert before and {metrics["plan"] for metrics in before} == {"[scale,not_third]"}
    # The statistics stay exact across the restart: every record once through `scale`.
    assert sum(by_operator(metrics)["scale"]["records_in"] for metrics in listener.metrics.values()) == len(RECORDS)
