"""The watchdog's decision (a stuck batch, the operator it is in) and a bounded run that its
timeout ends with input left (fissure.lifecycle.watchdog, fissure.spark.run, fissure.spark.io.input_left)."""

from __future__ import annotations

import json

import pytest

from fissure import RunnerConfig
from fissure.lifecycle.progress import ProgressState
from fissure.lifecycle.watchdog import (Heartbeat, Stall, StallPolicy, judge_batch, read_heartbeat, report_due,
                                      stuck_operator)
from fissure.spark import run as run_module
from fissure.spark.io.input_left import files_left
from fissure.lifecycle.progress_output import progress_fields
from fissure.spark.io.sources import FileSource
from fissure.runtime.records import fate as records

POLICY = StallPolicy(factor=10, min_s=60)


def test_a_batch_far_beyond_the_last_ones_is_stuck_with_the_reason():
    verdict = judge_batch(130.0, [10.0, 12.0, 11.0], None, POLICY)
    assert verdict.stuck and verdict.threshold_s == 110.0 and verdict.expected_s == 11.0
    assert verdict.reason.startswith("12x the 11.0 s expected (the last batches' median); stuck after 110 s")
    assert not judge_batch(100.0, [10.0, 12.0, 11.0], None, POLICY).stuck


def test_the_models_prediction_counts_when_it_expects_longer_and_the_minimum_always():
    assert not judge_batch(130.0, [10.0], 20.0, POLICY).stuck  # the model expects 20 s: stuck after 200 s
    verdict = judge_batch(130.0, [1.0], None, POLICY)
    assert verdict.stuck and verdict.threshold_s == 60.0  # 10 x 1 s, but at least 60 s
    first = judge_batch(59.0, [], None, POLICY)
    assert not first.stuck and first.reason == "no batch time to compare with: stuck after 60 s"


def test_only_the_last_batches_count():
    slow_then_fast = [500.0] * 3 + [5.0] * 5
    assert judge_batch(70.0, slow_then_fast, None, POLICY).stuck


def test_a_stuck_batch_is_reported_once_then_each_time_its_time_doubled():
    times = [50, 61, 70, 121, 122, 250]
    reported, last = [], None
    for seconds in times:
        verdict = judge_batch(float(seconds), [], None, POLICY)
        if report_due(verdict, last):
            reported.append(seconds)
            last = verdict.elapsed_s
    assert reported == [61, 122, 250]


def test_the_stuck_operator_is_the_one_running_longest_in_this_batch():
    beats = [Heartbeat(1, "parse", 95.0),  # an earlier batch's (or a dead process's)
             Heartbeat(2, None, 101.0),  # idle now
             Heartbeat(3, "enrich", 104.0), Heartbeat(4, "count", 102.0)]
    assert stuck_operator(beats, batch_started_s=100.0) == Heartbeat(4, "count", 102.0)
    assert stuck_operator(beats[:2], batch_started_s=100.0) is None


def test_a_worker_notes_the_operator_it_enters_and_leaves(tmp_path, monkeypatch):
    monkeypatch.setenv(records.HEARTBEAT_DIR_VARIABLE, str(tmp_path))
    monkeypatch.delenv("PYTHON_FAULTHANDLER_DIR", raising=False)
    records.mark_running("parse")
    (written,) = list(tmp_path.iterdir())
    beat = read_heartbeat(written.name, written.read_text())
    assert beat.operator == "parse" and beat.pid > 0
    records.mark_idle()
    assert read_heartbeat(written.name, written.read_text()).operator is None
    assert read_heartbeat("12", '{"operator": "pa') is None  # caught mid-write


def test_heartbeats_overwrite_each_other_in_place_whatever_their_length(tmp_path, monkeypatch):
    monkeypatch.setenv(records.HEARTBEAT_DIR_VARIABLE, str(tmp_path))
    records.beat("x" * 400)  # longer than the padded width
    records.beat("parse")
    (written,) = list(tmp_path.iterdir())
    assert read_heartbeat(written.name, written.read_text()).operator == "parse"
    records.beat(None)
    assert read_heartbeat(written.name, written.read_text()).operator is None
    # a process forked from a worker (another pid) writes a file of its own
    monkeypatch.setattr(records.os, "getpid", lambda: 424242)
    records.beat("child")
    assert read_heartbeat("424242", (tmp_path / "424242").read_text()).operator == "child"
    assert read_heartbeat(written.name, written.read_text()).operator is None


def test_a_stall_names_the_operator_and_shows_on_the_progress_line():
    stall = Stall(3, 130.0, 11.0, "enrich", 128.0, 4242, "12x the 11.0 s expected (the last batches' median)")
    assert stall.describe() == ("micro-batch 3 has run for 130 s, 12x the 11.0 s expected (the last batches' median); "
                                "operator 'enrich' has been running for 128 s (Python worker pid 4242)")
    state = ProgressState(batch_id=2, records_per_s=10.0, input_records=20, dead_letters=0, plan="p",
                          stall="batch 3 stuck 130 s in 'enrich'")
    assert "batch 3 stuck 130 s in 'enrich' | " in progress_fields(state, 0.0)


def test_the_watchdog_thresholds_are_configured_in_the_runner_config():
    assert RunnerConfig().stall_policy() == StallPolicy(10.0, 60.0)
    with pytest.raises(ValueError, match="stall factor must be > 1"):
        RunnerConfig(stall_factor=1)


# --- a bounded run ended by its timeout ----------------------------------------------------------

def test_files_left_counts_what_no_committed_batch_read():
    left = files_left("logs", [("/in/a", 100), ("/in/b", 200), ("/in/c", 300)], {"/in/a"}, bytes_per_record=50)
    assert (left.files, left.total_files, left.bytes, left.records) == (2, 3, 500, 10)
    assert left.describe() == "logs: 2 of 3 files not yet read (500 bytes, about 10 records)"


class StalledRunner:
    """A Runner whose query never ends within the timeout."""

    def __init__(self, program, source, sink, *, checkpoint, config, **options) -> None:
        self.sources, self.checkpoint, self.spark = {"logs": source}, checkpoint, None

    def start(self, available_now=False):
        pass

    def await_termination(self, timeout_s=None):
        return False

    def stop(self):
        return run_module.RunReport(plan=None, batches=1, input_records=3, dead_letters=0, elapsed_s=5.0,
                                    checkpoint=self.checkpoint)


def run_until_timeout(monkeypatch, tmp_path, available_now):
    monkeypatch.setattr(run_module, "Runner", StalledRunner)
    logs = tmp_path / "logs"
    logs.mkdir()
    for index in range(3):
        (logs / f"part-{index}.json").write_text('{"i": 1}\n' * 4)
    checkpoint = tmp_path / "ckpt"
    (checkpoint / "commits").mkdir(parents=True)
    (checkpoint / "commits" / "0").write_text("v1\n{}\n")
    (checkpoint / "sources" / "0").mkdir(parents=True)
    (checkpoint / "sources" / "0" / "0").write_text(
        "v1\n" + json.dumps({"path": (logs / "part-0.json").as_uri(), "timestamp": 1, "batchId": 0}) + "\n")
    (checkpoint / "sources" / "0" / "1").write_text(  # planned, not committed
        "v1\n" + json.dumps({"path": (logs / "part-1.json").as_uri(), "timestamp": 1, "batchId": 1}) + "\n")
    source = FileSource(str(logs), format="json", schema={"i": int})
    return run_module._run_to_end(None, source, None, plan=None, checkpoint=str(checkpoint), spark=None,
                                  config=RunnerConfig(available_now=available_now, timeout_s=90), lock=None)


def test_a_bounded_run_ended_by_its_timeout_with_input_left_fails_saying_how_much(monkeypatch, tmp_path):
    """Before: the run returned its report as if done ("done, 3 batches"), half the input unread."""
    with pytest.raises(run_module.RunTimedOut) as raised:
        run_until_timeout(monkeypatch, tmp_path, available_now=True)
    message = str(raised.value)
    assert message.startswith(f"the run's timeout (90 s) ended it with input left: logs ({tmp_path / 'logs'}): 2 of 3 "
                              f"files not yet read (72 bytes, about 8 records); 1 batch committed"), message
    assert raised.value.left.files == 2 and raised.value.report.batches == 1


def test_a_follow_run_ended_by_its_timeout_is_not_a_failure(monkeypatch, tmp_path):
    assert run_until_timeout(monkeypatch, tmp_path, available_now=False).batches == 1
