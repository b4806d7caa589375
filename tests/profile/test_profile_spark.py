"""Profiling on the live stream: counts from Spark's workers (PE children included) reach the driver."""

from __future__ import annotations

import json

import pytest

import fissure
from fissure import Pipeline
from fissure.model.types import Plan, RegionPlan
from fissure.testing import record_files

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EVENTS = {"user": str, "i": int}


def double(record):
    return {"user": record["user"], "i": record["i"] * 2}


def not_multiple_of_three(record):
    return record["i"] % 3 != 0


def fails_on_seven_hundred(record):
    if record["i"] == 700 * 2:
        raise ValueError("seven hundred")
    return record


def count(state, record):
    state["n"] = state.get("n", 0) + 1
    return {"user": record["user"], "i": record["i"]}


def test_a_profiled_run_counts_every_operator_exactly_and_logs_each_batch(spark, tmp_path, capsys):
    records, files = 3000, 3
    source = record_files(tmp_path / "in", [{"user": f"u{i % 4}", "i": i} for i in range(records)], EVENTS,
                          records_per_file=records // files, max_files_per_trigger=1)
    pipeline = (Pipeline("profiled").map("double", double).filter("third", not_multiple_of_three)
                .map("guard", fails_on_seven_hundred).partitioned("count", count, key="user"))
    # "third" and "guard" run in a forked PE child: their counts travel through shared memory
    plan = Plan((RegionPlan((("double",), ("third", "guard")), 1), RegionPlan((("count",),), 1)))
    sink = fissure.MemorySink()
    checkpoint = tmp_path / "checkpoint"
    report = fissure.run(pipeline, source, sink, plan=plan, checkpoint=str(checkpoint),
                         config=fissure.RunnerConfig(spark=spark, progress="off"))

    kept = [i for i in range(records) if i % 3 != 0 and i != 700]
    assert len(sink.records()) == len(kept) and report.dead_letters == 1
    summary = report.profile
    assert summary.batches == files and summary.source_records == records
    by_name = {item.operator: item for item in summary.operators}
    assert (by_name["double"].records_in, by_name["double"].records_out) == (records, records)
    third = by_name["third"]
    assert (third.records_in, third.records_out) == (records, records - len(range(0, records, 3)))
    assert third.selectivity == pytest.approx(2 / 3, abs=1e-3)  # exact counts: 2000 of 3000
    assert by_name["guard"].dead_letters == 1 and by_name["guard"].records_out == len(kept)
    assert by_name["count"].records_in == len(kept) and by_name["count"].selectivity == 1.0
    assert by_name["count"].key_groups_per_batch == 4  # u0..u3 in every batch, one state partition
    for item in by_name.values():
        assert item.cost_us is not None and item.cost_us >= 0 and item.timed_records > 0
    assert {pipeline.operators for pipeline in summary.pipelines} == {("double",), ("third", "guard")}
    assert by_name["double"].utilization is not None and 0 <= by_name["double"].utilization <= 1
    assert all(batch.duration_s and batch.durations_ms for batch in summary_batches(checkpoint))

    from fissure.cli import main

    assert main(["profile", str(checkpoint), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["batches"] == files
    assert {item["operator"]: item["records_in"] for item in document["operators"]}["third"] == records


def summary_batches(checkpoint):
    from fissure.profile.log import read_profile_log, resolve_profile_log

    return read_profile_log(resolve_profile_log(checkpoint))


def test_a_combined_aggregates_profile_counts_its_partials_and_the_keys_they_hold(spark, tmp_path, capsys):
    """Two replicas each fold their share of a batch's four users: 8 partials of 4 keys a batch.
    (Users come in pairs of records: the round-robin exchange alternates, so each replica sees all.)"""
    records, files = 3000, 3
    source = record_files(tmp_path / "in", [{"user": f"u{i // 2 % 4}", "i": i} for i in range(records)], EVENTS,
                          records_per_file=records // files, max_files_per_trigger=1)
    pipeline = Pipeline("combined").map("double", double).aggregate("total", key="user", aggregate=fissure.Count())
    plan = Plan((RegionPlan((("double", "total"),), 2),))
    report = fissure.run(pipeline, source, fissure.MemorySink(), plan=plan, checkpoint=str(tmp_path / "checkpoint"),
                         config=fissure.RunnerConfig(spark=spark, progress="off"))
    total = {item.operator: item for item in report.profile.operators}["total"]
    assert total.records_in == records
    assert (total.partials_per_batch, total.combine_groups_per_batch) == (8, 4)

    from fissure.cli import main

    assert main(["profile", str(tmp_path / "checkpoint"), "--json"]) == 0
    shown = {item["operator"]: item for item in json.loads(capsys.readouterr().out)["operators"]}["total"]
    assert (shown["partials_per_batch"], shown["combine_groups_per_batch"]) == (8, 4)
