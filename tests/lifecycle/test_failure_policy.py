"""Whose fault a failure is, and when the run starts its query again: a resource error is never a
record's dead letter, the restart budget is per window of time, the same record failing the same
way stops the run naming it (fissure.lifecycle.failures, fissure.runtime.records.fate, fissure.spark.run)."""

from __future__ import annotations

import errno

import pytest

from fissure import Pipeline, RunnerConfig
from fissure.lifecycle.failures import (CRASH, RESOURCE, Failure, Restart, RestartPolicy, decide_restart,
                                      restartable_failure)
from fissure.spark import run as run_module
from fissure.spark.session.create import describe_failure
from fissure.local.executor import DeadLettersWarning, run_local
from fissure.runtime.records.fate import ResourceExhausted, is_resource_error, record_failed

CRASH_TEXT = ("org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times\n"
              "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed). Consider setting "
              "'spark.sql.execution.pyspark.udf.faulthandler.enabled' ...: fissure: operator 'tag' was running\n"
              "fissure: operator 'tag' was running\n")


# --- which failures are the machine's ------------------------------------------------------------

def test_a_worker_crash_is_the_machines_and_names_the_operator_it_was_running():
    failure = restartable_failure(CRASH_TEXT)
    assert failure == Failure(CRASH, "Python worker exited unexpectedly (crashed)", "tag")


def test_fissures_resource_fault_is_read_back_with_its_operator_cause_and_record():
    try:
        record_failed("load", MemoryError("cannot allocate 8 GiB"), {"id": 7, "note": "two\nlines"}, 3)
    except ResourceExhausted as raised:
        text = f"pyspark.errors.PythonException: ...\nfissure.runtime.records.fate.ResourceExhausted: {raised}\n"
    failure = restartable_failure(text)
    assert failure.kind == RESOURCE and failure.operator == "load"
    assert failure.cause.startswith("MemoryError: cannot allocate 8 GiB")
    assert failure.record == '{"id": 7, "note": "two\\nlines"}'


@pytest.mark.parametrize("line", ["MemoryError", "OSError: [Errno 28] No space left on device",
                                  "OSError: [Errno 24] Too many open files",
                                  "Caused by: java.io.IOException: No space left on device",
                                  "java.lang.OutOfMemoryError: Java heap space"])
def test_resource_errors_outside_operators_and_on_the_jvm_are_the_machines(line):
    failure = restartable_failure(f"org.apache.spark.SparkException: Job aborted\n{line}\n\tat a.b.C(C.java:1)\n")
    assert failure is not None and failure.kind == RESOURCE and failure.cause.endswith(line.split(": ", 1)[-1])


@pytest.mark.parametrize("line", ["ValueError: bad record", "FileNotFoundError: [Errno 2] No such file or directory: 'x'",
                                  "fissure.runtime.records.fate.OperatorFailedError: operator 'quitter' raised SystemExit: 3"])
def test_the_programs_own_failures_are_not_restarted(line):
    assert restartable_failure(f"org.apache.spark.SparkException: Job aborted\n{line}\n") is None


# --- resource errors in the workers ----------------------------------------------------------------

@pytest.mark.parametrize("error", [MemoryError(), OSError(errno.ENOMEM, "Cannot allocate memory"),
                                   OSError(errno.ENOSPC, "No space left on device"),
                                   OSError(errno.EMFILE, "Too many open files")])
def test_resource_errors_are_the_machines(error):
    assert is_resource_error(error)


def test_an_error_raised_from_a_memory_error_is_the_machines_too_but_a_missing_file_is_the_records():
    try:
        try:
            raise MemoryError
        except MemoryError as cause:
            raise ValueError("could not decode") from cause
    except ValueError as wrapped:
        assert is_resource_error(wrapped)
    assert not is_resource_error(FileNotFoundError(errno.ENOENT, "No such file or directory"))
    assert not is_resource_error(ValueError("bad"))


def greedy(record):
    if record["n"] == 3:
        raise MemoryError("the operator's buffer")
    if record["n"] == 5:
        raise ValueError("5 is bad")
    return record


def greedy_count(state, record):
    greedy(record)
    state["n"] = state.get("n", 0) + 1
    return {"n": record["n"], "count": state["n"]}


@pytest.mark.parametrize("kind", ["map", "partitioned"])
def test_a_memory_error_raised_by_an_operator_fails_the_batch_instead_of_making_a_dead_letter(kind):
    """Before: the record became a dead letter and the batch committed without it."""
    pipeline = (Pipeline("p").map("greedy", greedy, schema={"n": int}) if kind == "map" else
                Pipeline("p").partitioned("greedy", greedy_count, key="n", schema={"n": int, "count": int}))
    with pytest.raises(ResourceExhausted, match=r"operator 'greedy' ran out of resources \(MemoryError: the "
                                                r"operator's buffer .*\) on record \{\"n\": 3\}"):
        run_local(pipeline, [{"n": n} for n in range(6)])
    # A record's own error is still its dead letter.
    with pytest.warns(DeadLettersWarning):
        assert len(run_local(pipeline, [{"n": 5}, {"n": 6}]).dead_letters) == 1


# --- the restart policy ---------------------------------------------------------------------------

def crash(operator="tag"):
    return Failure(CRASH, "Python worker exited unexpectedly (crashed)", operator)


def test_four_unrelated_crashes_spread_over_a_long_run_all_recover():
    """Before: three restarts a run, never reset, so the fourth crash ended the run."""
    policy = RestartPolicy(max_restarts=3, window_s=600)
    restarts = []
    for minute in (5, 25, 45, 65, 85):
        decision = decide_restart(crash(), restarts, minute * 60.0, policy)
        assert decision.restart, decision.reason
        restarts.append(Restart(minute * 60.0, crash()))


def test_a_crash_loop_ends_once_the_window_holds_the_budget():
    policy = RestartPolicy(max_restarts=3, window_s=600)
    restarts = [Restart(at, crash(operator)) for at, operator in ((0.0, "a"), (100.0, "b"), (200.0, "c"))]
    decision = decide_restart(crash("d"), restarts, 300.0, policy)
    assert not decision.restart
    assert "3 restarts in the last 600 s already (at most 3 in 600 s)" in decision.reason
    assert "operator 'd'" in decision.reason
    assert decide_restart(crash("d"), restarts, 601.0, policy).restart  # the first one left the window


def test_the_same_record_failing_the_same_way_after_the_restarts_stops_the_run_naming_it():
    policy = RestartPolicy(max_restarts=3, window_s=60)
    failure = Failure(RESOURCE, "MemoryError: big (at app.py:3 in load)", "load", '{"id": 7}')
    restarts = [Restart(hours * 3600.0, failure) for hours in range(3)]  # far apart: the window allows it
    decision = decide_restart(failure, restarts, 4 * 3600.0, policy)
    assert not decision.restart
    assert decision.reason.startswith("the same failure 4 times in a row on the same record: MemoryError: big")
    assert "in operator 'load' on record {\"id\": 7}" in decision.reason
    other = Failure(RESOURCE, "MemoryError: big (at app.py:3 in load)", "load", '{"id": 8}')
    assert decide_restart(other, restarts, 4 * 3600.0, policy).restart


def test_the_restart_budget_is_configured_in_the_runner_config():
    assert RunnerConfig().restart_policy() == RestartPolicy(3, 600.0)
    assert RunnerConfig(query_restarts=5, query_restart_window_s=60).restart_policy() == RestartPolicy(5, 60.0)
    with pytest.raises(ValueError, match="window_s must be > 0"):
        RunnerConfig(query_restart_window_s=0)
    with pytest.raises(ValueError, match="max_restarts must be >= 0"):
        RunnerConfig(query_restarts=-1)


# --- the restart loop of fissure.run ------------------------------------------------------------

class FakeRunner:
    """Stands in for Runner in fissure.run's loop: each start fails with the next scripted error
    (None: runs to its end), and the fake clock moves on by `step_s`."""

    script: list = []
    clock = None
    starts = 0
    finished = 0

    def __init__(self, *args, **kwargs) -> None:
        self.spark = None

    def start(self, available_now=False):
        FakeRunner.starts += 1
        FakeRunner.clock.now += FakeRunner.clock.step_s
        error = FakeRunner.script.pop(0)
        if error is not None:
            raise error

    def await_termination(self, timeout_s=None):
        return True

    def finish_input(self):  # the end of input of a bounded run (time-aware operators fire)
        FakeRunner.finished += 1

    def stop(self):
        return "report"


class FakeClock:
    def __init__(self, step_s):
        self.now, self.step_s = 0.0, step_s

    def __call__(self):
        return self.now


def run_loop(monkeypatch, script, step_s, config=RunnerConfig()):
    monkeypatch.setattr(run_module, "Runner", FakeRunner)
    FakeRunner.script, FakeRunner.clock, FakeRunner.starts = list(script), FakeClock(step_s), 0
    return run_module._run_to_end(None, None, None, plan=None, checkpoint="ckpt", spark=None, config=config,
                                  lock=None, clock=FakeRunner.clock)


def test_the_run_recovers_from_four_crashes_twenty_minutes_apart(monkeypatch, caplog):
    assert run_loop(monkeypatch, [RuntimeError(CRASH_TEXT)] * 4 + [None], step_s=20 * 60) == "report"
    assert FakeRunner.starts == 5
    assert sum("starting it again on the checkpoint" in message for message in caplog.messages) == 4


def test_four_crashes_within_the_window_end_the_run_saying_why(monkeypatch):
    with pytest.raises(RuntimeError) as raised:
        run_loop(monkeypatch, [RuntimeError(CRASH_TEXT)] * 4 + [None], step_s=10)
    assert FakeRunner.starts == 4
    assert any("not restarted: 3 restarts in the last 600 s" in note for note in raised.value.__notes__)


def test_a_failure_of_the_program_is_not_restarted(monkeypatch):
    with pytest.raises(ValueError, match="a bug"):
        run_loop(monkeypatch, [ValueError("a bug"), None], step_s=10)
    assert FakeRunner.starts == 1


# --- failure summaries ----------------------------------------------------------------------------

DISK_FULL = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: Job aborted due to stage failure: "
    "Task 0 in stage 7.0 failed 1 times, most recent failure: Lost task 0.0 in stage 7.0 (TID 12) (localhost "
    "executor driver): java.io.IOException: No space left on device\n"
    "\tat java.base/java.io.FileOutputStream.writeBytes(Native Method)\n")
TRUNCATED = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: [CANNOT_LOAD_STATE_STORE.UNCATEGORIZED] "
    "An error occurred during loading state.\n"
    "Caused by: java.lang.IllegalStateException: Error reading streaming state file "
    "file:/data/ckpt/state/0/1/3.changelog of RocksDBStateStoreProvider[id = (op=0,part=1)]: the file is "
    "truncated or corrupt\n"
    "Caused by: java.io.EOFException\n"
    "Caused by: java.io.EOFException: \n")


def test_a_summary_carries_the_jvm_error_spark_wrote_inside_its_wrapper_whole(tmp_path):
    """Before: the first line was cut at 160 characters and the disk-full cause in it lost."""
    summary = describe_failure(RuntimeError(DISK_FULL), spark_log=str(tmp_path / "spark.log"))
    assert "\n  caused by IOException: No space left on device\n" in summary, summary


def test_a_summary_names_the_file_an_enclosing_error_names_when_the_innermost_names_none(tmp_path):
    summary = describe_failure(RuntimeError(TRUNCATED), spark_log=str(tmp_path / "spark.log"))
    assert "caused by EOFException" in summary
    assert ("\n  in IllegalStateException: Error reading streaming state file file:/data/ckpt/state/0/1/3.changelog "
            "of RocksDBStateStoreProvider[id = (op=0,part=1)]: the file is truncated or corrupt\n") in summary, summary


def test_a_long_cause_is_not_cut_at_300_characters(tmp_path):
    record = '{"text": "' + "x" * 1000 + '"}'
    message = (f"fissure.runtime.records.fate.ResourceExhausted: operator 'load' ran out of resources (MemoryError) on "
               f"record {record}; not the record's fault: the task fails and the query starts again on its checkpoint")
    summary = describe_failure(RuntimeError("Job aborted\n" + message), spark_log=str(tmp_path / "spark.log"))
    assert record in summary
