"""A run that fails says which operator failed and why: in the exception fissure.run raises and
in its summary (`describe_failure`, what `fissure run` prints before exiting with 1)."""

from __future__ import annotations

import os
import sys
import threading

import pytest

import fissure
from fissure import Pipeline
from fissure.program.operators import PipelineError
from fissure.spark.session.create import describe_failure
from fissure.spark.io.sinks import MemorySink
from fissure.testing import record_files

EVENTS = {"user": str, "i": int}
COUNTED = {"user": str, "i": int, "n": int}


def count(state, record):
    state["n"] = state.get("n", 0) + 1
    return {"user": record["user"], "i": record["i"], "n": state["n"]}


def calls_sys_exit(record):
    if record["i"] == 2:
        sys.exit(3)
    return record


def interrupts(record):
    if record["i"] == 2:
        raise KeyboardInterrupt
    return record


def crashes_worker(record):
    if record["i"] == 2:
        os._exit(1)
    return record


def crashing_count(state, record):
    if record["i"] == 2:
        os._exit(1)
    return count(state, record)


def unpicklable_count(state, record):
    state["lock"] = threading.Lock()
    return count(state, record)


def broken_factory():
    raise ValueError("no initial state today")


def with_count(name, fn):
    return Pipeline("failing").map(name, fn).partitioned("count", count, key="user", schema=COUNTED)


CASES = {
    "sys-exit": (lambda: with_count("quitter", calls_sys_exit),
                 ["OperatorFailedError: operator 'quitter' raised SystemExit: 3"]),
    "keyboard-interrupt": (lambda: with_count("interrupter", interrupts),
                           ["OperatorFailedError: operator 'interrupter' raised KeyboardInterrupt"]),
    "worker-crash": (lambda: with_count("crasher", crashes_worker),
                     ["Python worker exited unexpectedly (crashed) while operator 'crasher' was running"]),
    "keyed-worker-crash": (lambda: Pipeline("failing").partitioned("crashing_count", crashing_count, key="user",
                                                                   schema=COUNTED),
                           ["Python worker exited unexpectedly (crashed) while operator 'crashing_count' was running"]),
    "unpicklable-state": (lambda: Pipeline("failing").partitioned("locker", unpicklable_count, key="user",
                                                                  schema=COUNTED),
                          ["operator 'locker': the state of key", "_thread.lock at state['lock']",
                           "keep the state plain data", 'state_codec="pickle"']),
    "state-factory-raises": (lambda: Pipeline("failing").partitioned("count", count, key="user", schema=COUNTED,
                                                                      state_factory=broken_factory),
                             ["operator 'count': its state_factory raised ValueError: no initial state today"]),
}


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_failed_run_names_the_operator_and_the_cause(spark, tmp_path, case):
    build, expected = CASES[case]
    source = record_files(tmp_path / "in", [{"user": f"u{i % 2}", "i": i} for i in range(5)], EVENTS)
    with pytest.raises(Exception) as raised:
        fissure.run(build(), source, MemorySink(),
                    config=fissure.RunnerConfig(query_restarts=0, spark=spark, progress="off"))
    summary = describe_failure(raised.value)
    assert "caused by" in summary, summary
    for text in expected:
        assert text in summary, summary


def test_a_closure_that_cannot_be_serialized_is_named_before_the_query_starts(spark, tmp_path):
    lock = threading.Lock()

    def guarded(record):
        with lock:
            return record

    source = record_files(tmp_path / "in", [{"user": "u", "i": 1}], EVENTS)
    with pytest.raises(PipelineError, match="operator 'guarded': its function cannot be serialized") as raised:
        fissure.run(with_count("guarded", guarded), source, MemorySink(),
                    config=fissure.RunnerConfig(spark=spark, progress="off"))
    assert "lock" in str(raised.value)
