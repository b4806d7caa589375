"""Adaptive execution on Spark: plan switches mid-stream lose and duplicate nothing.

Every Spark test feeds a fixed input in files (one file per micro-batch), forces switches
mid-stream, and compares the sink with the sequential program run over the same input in plain
Python (the operators' functions in chain order), record by record, and the keyed state's counts.
The loop's own decisions are kept out of the way (a profiling window that never fills, an
evaluation that never ends) so that exactly the forced switches happen.
"""

from __future__ import annotations

import json
import os
import time

import pytest

import fissure

from fissure import Pipeline
from fissure.control.adaptive.config import AdaptiveConfig
from fissure.control.plan_change import SwitchKind, plan_fingerprint
from fissure.model.types import Plan, RegionPlan
from fissure.model.types import Machine
from fissure.spark.adaptive.loop import run_adaptive_on_spark
from fissure.spark.adaptive.observations import OperatorProfiles, SparkObservations
from fissure.spark.adaptive.queries import QueryManager, canonical_plan
from fissure.spark.adaptive.realizer import SparkPlanRealizer, plan_boundaries, same_physical_plan
from fissure.config import RunnerConfig
from fissure.spark.io.sinks import ForeachBatchSink, MemorySink
from fissure.control.adaptive.spark_model_search import SparkModelSearch
from fissure.spark.state.repartition import checkpoint_status, offset_entry_state_partitions
from fissure.testing import record_files

EVENTS = {"user": str, "i": int}
FILES, PER_FILE, USERS = 5, 12, 3  # one file a batch; the forced switches come at batch 2
# The loop observes but never plans by itself, and never ends a forced switch's evaluation.
HANDS_OFF = AdaptiveConfig(profile_batches=2, profile_s=1e9, evaluation_s=1e9, min_operator_samples=1)


def hands_off(spark, tmp_path) -> RunnerConfig:
    """The run's settings for a loop that only switches where a test injects a plan."""
    return RunnerConfig(spark=spark, adaptation=HANDS_OFF, run_dir=str(tmp_path / "run"), progress="off")


def events(files=FILES):
    return [{"user": f"u{i % USERS}", "i": i} for i in range(files * PER_FILE)]


def scale(record):
    return {"user": record["user"], "i": record["i"] * 10}


def not_seven(record):
    return record["i"] % 70 != 0 or record["i"] == 0


def count(state, record):
    state["n"] = state.get("n", 0) + 1
    return {"user": record["user"], "i": record["i"], "n": state["n"]}


COUNTED = {"user": str, "i": int, "n": int}


def sequential(records):
    """The program run sequentially: scale, not_seven, then the per-user count."""
    state, out = {}, []
    for record in records:
        record = scale(record)
        if not not_seven(record):
            continue
        out.append(count(state.setdefault(record["user"], {}), record))
    return out


def keyed_pipeline():
    return (Pipeline("adaptive-keyed").map("scale", scale).filter("not_seven", not_seven)
            .partitioned("count", count, key="user", schema=COUNTED))


def canonical(records):
    return sorted(tuple(sorted(record.items())) for record in records)


def plan(*regions):
    return Plan(tuple(RegionPlan(tuple(tuple(p) for p in pipelines), replicas) for pipelines, replicas in regions))


SEQUENTIAL = plan(([["scale", "not_seven", "count"]], 1))
KEYED_X2 = plan(([["scale", "not_seven", "count"]], 2))


def source(tmp_path, files=FILES):
    return record_files(tmp_path / "in", events(files), EVENTS, records_per_file=PER_FILE, max_files_per_trigger=1)


def assert_exactly_once_keyed(records, files=FILES):
    assert canonical(records) == canonical(sequential(events(files)))
    per_user = {}
    for record in records:
        per_user.setdefault(record["user"], []).append(record["n"])
    assert {user: sorted(ns) for user, ns in per_user.items()} == {
        user: list(range(1, len(ns) + 1)) for user, ns in per_user.items()}


# -- Spark: forced switches, compared with the sequential run ----------------------------------------


@pytest.mark.spark
@pytest.mark.slow
def test_switch_to_replicas_of_a_stateless_region_is_exactly_once(spark, tmp_path):
    pipeline = Pipeline("adaptive-stateless").map("scale", scale).filter("not_seven", not_seven)
    replicated = plan(([["scale", "not_seven"]], 2))
    sink, decisions = MemorySink(), []
    report = run_adaptive_on_spark(
        pipeline, source(tmp_path), sink, checkpoint=str(tmp_path / "ckpt"), config=hands_off(spark, tmp_path),
        injections={2: replicated}, on_decision=lambda decision, entry: decisions.append(decision))

    expected = [scale(record) for record in events() if not_seven(scale(record))]
    assert canonical(sink.records()) == canonical(expected)
    assert report.input_records == len(events())
    [switch] = report.switches
    assert (switch.applied_as, switch.error, switch.plan_after) == ("restart", None, "[scale,not_seven]x2")
    assert switch.total_s > 0 and switch.first_batch is not None
    assert report.queries == 2 and plan_fingerprint(report.plan) == "[scale,not_seven]x2"
    # The batches after the switch ran under the new plan, and the loop saw every decision.
    assert any(decision.action.value == "apply" for decision in decisions)
    assert report.timeline.batches()[-1].plan == "[scale,not_seven]x2"
    document = json.loads((tmp_path / "run" / "timeline.json").read_text())
    assert document["switches"][0]["applied_as"] == "restart"
    assert [entry["action"] for entry in document["entries"]].count("apply") == 1
    if report.timeline_png is not None:
        assert os.path.getsize(report.timeline_png) > 0


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("target, applied_as, queries", [
    (plan(([["scale", "not_seven"]], 1), ([["count"]], 2)), "restart-with-state", 2),
    (plan(([["scale"], ["not_seven"], ["count"]], 1)), "in-pe", 1),
], ids=["keyed-region-x2", "in-pe-boundary"])
def test_a_graph_with_a_fan_out_switches_plans_exactly_once(spark, tmp_path, target, applied_as, queries):
    """Adaptive on a graph: `scale` feeds a per-user count and a filtered sink. The loop switches
    to the count in two state partitions (the state repartitioned offline, the query restarted)
    or to `scale` and `not_seven` in two processes (an in-PE switch: new boundaries from the next
    batch, no restart); both sinks hold every result once."""
    graph = fissure.StreamGraph("adaptive-fan-out")
    scaled = graph.source("events", schema=EVENTS).map("scale", scale)
    scaled.partitioned("count", count, key="user", schema=COUNTED).sink("counts")
    scaled.filter("not_seven", not_seven).sink("kept")
    assert graph.names == ("scale", "not_seven", "count")
    counts, kept = MemorySink(), MemorySink()
    report = run_adaptive_on_spark(
        graph, {"events": source(tmp_path)}, {"counts": counts, "kept": kept}, checkpoint=str(tmp_path / "ckpt"),
        config=hands_off(spark, tmp_path), injections={2: target})

    assert [(switch.applied_as, switch.error) for switch in report.switches] == [(applied_as, None)]
    assert report.queries == queries and plan_fingerprint(report.plan) == plan_fingerprint(canonical_plan(target))
    per_user = {}
    for record in counts.records():
        per_user.setdefault(record["user"], []).append(record["n"])
    scaled_events = [scale(record) for record in events()]
    assert sorted(r["i"] for r in counts.records()) == sorted(r["i"] for r in scaled_events)
    assert {user: sorted(ns) for user, ns in per_user.items()} == {
        user: list(range(1, len(ns) + 1)) for user, ns in per_user.items()}
    assert canonical(kept.records()) == canonical([r for r in scaled_events if not_seven(r)])


@pytest.mark.spark
@pytest.mark.slow
def test_keyed_region_rescaled_up_and_down_repartitions_state_exactly_once(spark, tmp_path):
    """Scripted realizer calls: x1 -> x2 (state 1 -> 2 partitions) -> x1 (2 -> 1). Seven files: each
    switch's state repartition takes a batch id of its own, and the stream must outlast both."""
    pipeline, sink = keyed_pipeline(), MemorySink()
    checkpoint = str(tmp_path / "ckpt")
    queries = QueryManager(pipeline, source(tmp_path, files=7), sink, spark=spark, checkpoint=checkpoint, dead_letters=None,
                           config=RunnerConfig(), available_now=True, clock=time.monotonic)
    realizer = SparkPlanRealizer(queries)
    observations = SparkObservations(queries, OperatorProfiles(pipeline.operator_stats()), cores=2)
    queries.start(SEQUENTIAL)
    partitions_seen = []
    try:
        script = [(1, KEYED_X2), (4, SEQUENTIAL)]  # after the first switch, the batch ids jump
        while (observation := observations.next_batch()) is not None:
            if script and observation.batch_id >= script[0][0]:
                _, target = script.pop(0)
                realizer.apply(target, SwitchKind.RESTART_WITH_STATE)
                partitions_seen.append(checkpoint_status(spark, checkpoint).state_partitions)
    finally:
        queries.close()

    assert not script
    assert [(s.applied_as, s.state_partitions_before, s.state_partitions_after, s.error) for s in realizer.switches] == [
        ("restart-with-state", 1, 2, None), ("restart-with-state", 2, 1, None)]
    assert partitions_seen == [2, 1]
    assert all(s.repartition_s > 0 for s in realizer.switches)
    assert_exactly_once_keyed(sink.records(), files=7)


@pytest.mark.spark
@pytest.mark.slow
def test_in_pe_cut_switch_applies_between_batches_without_restart(spark, tmp_path):
    import os as _os

    def stamp_a(record):
        return {**record, "pid_a": _os.getpid()}

    def stamp_b(record):
        return {**record, "pid_b": _os.getpid()}

    def count_stamped(state, record):
        return {**record, "n": count(state, record)["n"]}

    stamped = {**EVENTS, "pid_a": int, "pid_b": int}
    pipeline = (Pipeline("adaptive-in-pe").map("scale", scale).map("stamp_a", stamp_a, schema={**EVENTS, "pid_a": int})
                .map("stamp_b", stamp_b, schema=stamped)
                .partitioned("count", count_stamped, key="user", schema={**stamped, "n": int}))
    fused = plan(([["scale", "stamp_a", "stamp_b", "count"]], 1))
    cut = plan(([["scale", "stamp_a"], ["stamp_b", "count"]], 1))
    batches = {}
    sink = ForeachBatchSink(lambda frame, batch_id: batches.__setitem__(batch_id, frame.collect()))
    report = run_adaptive_on_spark(
        pipeline, source(tmp_path), sink, plan=fused, checkpoint=str(tmp_path / "ckpt"),
        config=hands_off(spark, tmp_path), injections={2: cut})

    [switch] = report.switches
    assert (switch.requested_kind, switch.applied_as, switch.error) == ("in-pe", "in-pe", None)
    assert report.queries == 1  # no restart
    # Before the switch stamp_a and stamp_b ran in one process; from the next batch on, stamp_b in another.
    same_process = {batch_id: {row.pid_a == row.pid_b for row in rows} for batch_id, rows in batches.items() if rows}
    assert same_process[0] == {True} and same_process[2] == {True}
    assert all(same_process[batch_id] == {False} for batch_id in same_process if batch_id >= 3)
    records = [{"user": row.user, "i": row.i, "n": row.n} for rows in batches.values() for row in rows]
    expected = [count(state, scale(r)) for state, r in _with_states(events())]
    assert canonical(records) == canonical(expected)


@pytest.mark.spark
@pytest.mark.slow
def test_failed_state_repartition_keeps_the_old_plan_and_the_loop_running(spark, tmp_path):
    def broken_repartitioner(session, checkpoint, partitions):
        raise RuntimeError("injected repartition failure")

    sink, decisions = MemorySink(), []
    report = run_adaptive_on_spark(
        keyed_pipeline(), source(tmp_path), sink, checkpoint=str(tmp_path / "ckpt"),
        config=hands_off(spark, tmp_path), injections={2: KEYED_X2}, repartition=broken_repartitioner,
        on_decision=lambda decision, entry: decisions.append(decision))

    [switch] = report.switches
    assert "injected repartition failure" in switch.error and switch.applied_as == "restart-with-state"
    assert plan_fingerprint(report.plan) == "[scale,not_seven,count]"
    reverts = [decision for decision in decisions if decision.action.value == "revert"]
    assert len(reverts) == 1 and "could not apply" in reverts[0].reason
    assert reverts[0].blacklisted is not None
    # The loop went on observing batches under the old plan after the failure.
    after = [d for d in decisions if d.batch_id > reverts[0].batch_id]
    assert after and all(d.plan_in_force == "[scale,not_seven,count]" for d in after)
    assert report.queries == 2 and checkpoint_status(spark, report.checkpoint).state_partitions == 1
    assert_exactly_once_keyed(sink.records())


def _with_states(records):
    states = {}
    for record in records:
        yield states.setdefault(record["user"], {}), record


# -- pure: cuts, plans, checkpoint entries --------------------------------------------------------------


def test_same_physical_plan_differs_only_in_pipeline_boundaries():
    pipeline = keyed_pipeline()
    two = plan(([["scale"]], 1), ([["not_seven", "count"]], 1))  # adjacent unreplicated regions: one region
    assert plan_boundaries(pipeline, SEQUENTIAL) == () and plan_boundaries(pipeline, two) == ("not_seven",)
    assert same_physical_plan(SEQUENTIAL, two, pipeline)
    assert not same_physical_plan(SEQUENTIAL, KEYED_X2, pipeline)


def test_state_partitions_are_read_from_an_offset_log_entry():
    entry = "v1\n" + json.dumps({"batchWatermarkMs": 0, "conf": {"spark.sql.shuffle.partitions": "4"}}) + "\n{}"
    assert offset_entry_state_partitions(entry) == 4
    assert offset_entry_state_partitions("v1\n{not json") is None
    assert offset_entry_state_partitions("v1") is None


def test_spark_model_search_prices_plans_for_the_batches_the_run_measures():
    chain = keyed_pipeline().operator_stats()
    search = SparkModelSearch()
    machine = Machine(cores=2)
    candidates = search.candidates(chain, machine)
    assert candidates and all(scored.predicted_throughput_per_s > 0 for scored in candidates)
    assert len({plan_fingerprint(scored.plan) for scored in candidates}) == len(candidates)
    small = search.predict_per_s(chain, SEQUENTIAL, machine)
    for _ in range(5):
        search.observe_batch(100_000, {"count": 20.0})
    assert search.current_settings().workload.batch_records == 100_000
    assert search.current_settings().workload.keys_per_batch["count"] == 20.0
    assert search.current_settings().workload.combine_keys_per_batch == {}
    # Fixed costs per batch weigh less in bigger batches: the same plan is predicted faster.
    assert search.predict_per_s(chain, SEQUENTIAL, machine) > small


def test_spark_model_search_takes_a_combined_operators_keys_from_the_partials_counted_at_the_plan_in_force():
    from fissure.control.adaptive.spark_model_search import CombinedBatch
    from fissure.model.spark_model import combine_folds, combined_partials
    from fissure.model.types import Kind, OperatorStats

    words = OperatorStats("words", Kind.STATELESS, 2.0, 12.0)
    count = OperatorStats("count", Kind.PARTITIONED, 1.0, 0.01, key=("word",), combined=True)
    chain, search = [words, count], SparkModelSearch()
    plan = Plan((RegionPlan((("words", "count"),), 2),))
    search.observe_batch(10_000, {"count": 1_000.0},
                         CombinedBatch({"count": (120_000, 1_500.0, 1_000.0)}, chain, plan, 2))
    workload = search.current_settings().workload
    assert combine_folds(chain, plan, 2, workload) == {"count": 2}
    assert combined_partials(120_000, workload.combine_keys_per_batch["count"], 2) == pytest.approx(1_500, rel=1e-5)
    assert workload.combine_groups_per_batch == {"count": 1_000.0}
    search.observe_batch(10_000, {"count": 1_000.0}, CombinedBatch({"words": (10_000, 9_000.0, 10.0)}, chain, plan, 2))
    assert set(search.current_settings().workload.combine_keys_per_batch) == {"count"}  # not a combined operator


def test_operator_profiles_hand_the_search_a_combined_operators_records_and_partials():
    from types import SimpleNamespace

    from fissure.profile.records import OperatorCounts
    from fissure.profile.window import BatchProfile

    chain = keyed_pipeline().operator_stats()
    name = chain[-1].name
    counts = OperatorCounts(name, calls=4, records_in=1_000, records_out=4, timed_calls=1, timed_records_in=250,
                            timed_cpu_s=0.001, timed_wall_s=0.001, key_groups=4, partials=8, combine_groups=4)
    runner = SimpleNamespace(profiler=SimpleNamespace(on_progress=lambda updates: None),
                             batch_profiles=[BatchProfile(7, "plan", 1_000, 1.0, operators=(counts,))])
    profiles = OperatorProfiles(chain)
    profiles.for_batch(runner, {"batchId": 7}, 1_000)
    assert profiles.last_partials == {name: (1_000, 8, 4)} and profiles.last_keys_per_batch == {name: 4}


def test_the_timeline_records_the_model_correction_the_loop_learned(tmp_path):
    from fissure.control.driver import Timeline
    from fissure.control.model_correction import ModelCorrection, PlanMeasurement
    from fissure.spark.adaptive.loop import write_timeline

    chain = keyed_pipeline().operator_stats()
    search, machine = SparkModelSearch(), Machine(cores=2)
    store = ModelCorrection()
    for measured_plan, off_by in ((SEQUENTIAL, 1.0), (KEYED_X2, 3.0)):  # the keyed plan 3x slower than predicted
        store.record(PlanMeasurement(measured_plan, chain, machine,
                                     search.predict_per_s(chain, measured_plan, machine) / off_by))
    correction = store.fit(search)
    assert correction.reranks()
    json_path, _ = write_timeline(Timeline(), [], str(tmp_path), SEQUENTIAL, KEYED_X2, correction)
    document = json.loads(open(json_path, encoding="utf-8").read())
    assert document["model_correction"]["plans"] == 2
    assert document["model_correction"]["factors"] == dict(correction.factors)
    assert document["model_correction"]["error_after"] < document["model_correction"]["error_before"]
