"""On Spark: an operator out of memory restarts the query, in a plain run and in an adaptive one
(no dead letter; the same record failing every time ends the run naming it); a hung operator is
reported by the watchdog with its name, and a bounded run its timeout ends with input left exits
with what is left."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest

import fissure
from fissure import Pipeline
from fissure.spark.session.create import describe_failure
from fissure.spark.io.sinks import MemorySink
from fissure.testing import record_files

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EVENTS = {"user": str, "i": int}


def greedy_on(marker: str, always: bool):
    def greedy(record):
        if record["i"] == 3 and (always or not os.path.exists(marker)):
            open(marker, "w").close()
            raise MemoryError("the operator's buffer")
        return record
    return greedy


@pytest.mark.parametrize("mode", ["once", "always"])
def test_a_memory_error_restarts_the_query_and_is_never_a_dead_letter(spark, tmp_path, mode):
    """Before: the record became a dead letter, the batch committed without it and the run ended
    with exit 0."""
    source = record_files(tmp_path / "in", [{"user": f"u{i % 2}", "i": i} for i in range(6)], EVENTS)
    marker = str(tmp_path / "failed")
    pipeline = Pipeline("greedy").map("greedy", greedy_on(marker, mode == "always"), schema=EVENTS)
    sink = MemorySink()
    config = fissure.RunnerConfig(query_restarts=1, spark=spark, progress="off")
    if mode == "once":
        report = fissure.run(pipeline, source, sink, checkpoint=str(tmp_path / "ckpt"), config=config)
        assert os.path.exists(marker)
        assert report.dead_letters == 0
        assert sorted(record["i"] for record in sink.records()) == list(range(6))
        return
    with pytest.raises(Exception) as raised:
        fissure.run(pipeline, source, sink, checkpoint=str(tmp_path / "ckpt"), config=config)
    summary = describe_failure(raised.value)
    assert "not restarted: the same failure 2 times in a row on the same record" in summary, summary
    assert "MemoryError: the operator's buffer" in summary and "in operator 'greedy'" in summary, summary
    assert '"i": 3' in summary, summary


def test_an_adaptive_run_restarts_its_query_after_a_memory_error_and_ends_with_exact_output(spark, tmp_path):
    """Before: the MemoryError ended the adaptive run. (No cost sample: it would meet record 3 first.)"""
    source = record_files(tmp_path / "in", [{"user": f"u{i % 2}", "i": i} for i in range(6)], EVENTS)
    marker = str(tmp_path / "failed")
    pipeline = Pipeline("greedy").map("greedy", greedy_on(marker, always=False), schema=EVENTS)
    sink = MemorySink()
    report = fissure.run(pipeline, source, sink, checkpoint=str(tmp_path / "ckpt"),
                         config=fissure.RunnerConfig(query_restarts=1, batch_sample_costs=False, spark=spark,
                                                     progress="off", replanning="adaptive",
                                                     run_dir=str(tmp_path / "run")))
    assert os.path.exists(marker)
    assert report.dead_letters == 0 and report.queries == 2
    assert sorted(record["i"] for record in sink.records()) == list(range(6))


def hangs_on(i_hung: int, marker: str):
    def hang(record):
        if record["i"] == i_hung:
            open(marker, "w").close()
            time.sleep(600)
        return record
    return hang


def test_a_hung_operator_is_reported_by_name_and_the_timeout_says_what_is_left(spark, tmp_path, caplog):
    """Before: no message while the operator slept, and the run ended by its timeout returned as
    if it were done, with input unprocessed."""
    source = record_files(tmp_path / "in", [{"user": "u", "i": i} for i in range(6)], EVENTS, records_per_file=2)
    source = dataclasses.replace(source, max_files_per_trigger=1)
    marker = str(tmp_path / "hung")
    pipeline = (Pipeline("hung").map("tag", lambda record: record, schema=EVENTS)
                .map("slow_lookup", hangs_on(3, marker), schema=EVENTS))
    config = fissure.RunnerConfig(stall_factor=2, stall_min_s=2, progress_interval_s=0.5, spark=spark,
                                  progress="off", timeout_s=20)
    with pytest.raises(fissure.RunTimedOut) as raised:
        fissure.run(pipeline, source, MemorySink(), checkpoint=str(tmp_path / "ckpt"), config=config)
    assert os.path.exists(marker)
    stalls = [stall for stall in raised.value.report.stalls if stall.batch_id == 1]  # batch 0 is file 0's
    assert stalls and all(stall.operator == "slow_lookup" for stall in stalls), raised.value.report.stalls
    assert any("operator 'slow_lookup' has been running for" in message for message in caplog.messages)
    assert raised.value.left.files == 2  # the hung batch's file and the one after it
    assert f"source ({tmp_path / 'in'}): 2 of 3 files not yet read" in str(raised.value)
