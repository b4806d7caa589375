"""Waiting operators: declaring them, running them on elastic threads inside a fused stage (same
results and dead letters as the sequential path, in order), the thread level they reach, the
board that carries it out of a PE child, detection from a profile, and the driver's tally."""

from __future__ import annotations

import os
import pickle
import random
import threading
import time

import pyarrow as pa
import pytest

from fissure.control.thread_level.config import ElasticityConfig
from fissure.program.chain import Pipeline
from fissure.program.operators import PipelineError, Waits
from fissure.runtime.records.columns import DEAD_OPERATOR
from fissure.runtime.elastic.stage import (
    BatchThreadLevels,
    ThreadLevelReport,
    ThreadLevelTally,
    ThreadLevelTallyParam,
    WaitingOperator,
    policy_config,
    worker_runners,
)
from fissure.control.thread_level.verdict import detect_waiting
from fissure.runtime.operators.fused import FusedStage, Step
from fissure.runtime.records.carried import live_batch
from fissure.runtime.pe.element import ProcessingElement

NUMBERS = pa.schema([("n", pa.int64())])
TAGGED = pa.schema([("n", pa.int64()), ("tag", pa.string())])
FAST = ElasticityConfig(period_s=0.02, max_threads=8, cpu_usage_limit=None)


@pytest.fixture(autouse=True)
def fresh_runners(request):
    """New runners, and boards of keys no earlier test used (boards live as long as the process)."""
    global KEY_PREFIX
    KEY_PREFIX = request.node.name
    worker_runners().reset()
    yield
    worker_runners().reset()


def batch_of(numbers, first_seq=0):
    rows = [{"n": n} for n in numbers]
    return live_batch(pa.RecordBatch.from_pylist(rows, schema=NUMBERS), list(range(first_seq, first_seq + len(rows))))


KEY_PREFIX = "test"


def waiting(operator, declared="io", config=FAST):
    return WaitingOperator.for_operator(operator, f"{KEY_PREFIX}/{operator}", declared, config=config)


# -- operators: they sleep a random few milliseconds, so threads finish out of order ---------------


def lookup(record):
    time.sleep(random.uniform(0, 0.003))
    if record["n"] % 7 == 3:
        raise LookupError(f"no entry for {record['n']}")
    if record["n"] % 11 == 5:
        return [record["n"]]  # not a dict: the map's own check makes it a dead letter
    return {"n": record["n"] * 10, "tag": f"t{record['n'] % 4}"}


def known(record):
    time.sleep(random.uniform(0, 0.002))
    if record["n"] == 130:
        raise ValueError("thirteen")
    return record["tag"] != "t2"


def copies(record):
    time.sleep(random.uniform(0, 0.002))
    return [dict(record) for _ in range(record["n"] // 10 % 3)]


def chain(wait: bool) -> FusedStage:
    def maybe(name, declared="io"):
        return waiting(name, declared) if wait else None

    return FusedStage([
        Step("lookup", "map", lookup, TAGGED, waiting=maybe("lookup")),
        Step("known", "filter", known, TAGGED, waiting=maybe("known", "gil-free")),
        Step("copies", "flat_map", copies, TAGGED, waiting=maybe("copies")),
    ], NUMBERS)


# -- declaring -------------------------------------------------------------------------------------


def test_waits_is_declared_on_stateless_per_record_operators():
    pipeline = (Pipeline("p").map("fetch", lambda r: r, waits="io")
                .filter("check", lambda r: True, waits="gil-free").flat_map("split", lambda r: [r])
                .flat_map("more", lambda r: [r], waits=Waits.IO))
    assert [operator.hints.waits for operator in pipeline.operators] == [Waits.IO, Waits.GIL_FREE, None, Waits.IO]
    assert "waits=io" in pipeline.operator("fetch").describe()
    assert "waits=" not in pipeline.operator("split").describe()


def test_waits_on_a_stateful_operator_is_refused_with_the_reason():
    with pytest.raises(PipelineError) as keyed:
        Pipeline("p").partitioned("count", lambda state, r: r, key="host", waits="io")
    message = str(keyed.value)
    assert "'count' is partitioned stateful" in message and "order" in message and "state" in message
    assert "stateless map, filter or flat_map before it" in message
    with pytest.raises(PipelineError, match="'total' is stateful"):
        Pipeline("p").stateful("total", lambda state, r: r, waits="gil-free")


def test_waits_on_a_batch_operator_or_with_an_unknown_value_is_refused():
    with pytest.raises(PipelineError, match="'vector' \\(map_batches\\): waits= is for per-record operators"):
        Pipeline("p").map_batches("vector", lambda batch: batch, waits="gil-free")
    with pytest.raises(PipelineError, match="'mask' \\(filter_batches\\)"):
        Pipeline("p").filter_batches("mask", lambda batch: [True], waits="io")
    with pytest.raises(PipelineError, match="'fetch': waits must be 'io' .* or 'gil-free' .* got 'network'"):
        Pipeline("p").map("fetch", lambda r: r, waits="network")
    with pytest.raises(PipelineError, match="got True"):
        Pipeline("p").map("fetch", lambda r: r, waits=True)


def test_policy_config_keeps_the_cpu_check_only_for_gil_free_code():
    assert policy_config("io").cpu_usage_limit is None
    assert policy_config(None).cpu_usage_limit is None  # detected: it waits
    assert policy_config("gil-free").cpu_usage_limit == ElasticityConfig().cpu_usage_limit
    assert policy_config("io", FAST) is FAST
    with pytest.raises(ValueError, match="'fetch'.*waits must be one of io, gil-free"):
        WaitingOperator("fetch", "p/fetch", declared="disk")
    with pytest.raises(ValueError, match="'fetch'.*unknown thread-level policy 'fastest'"):
        WaitingOperator("fetch", "p/fetch", "io", policy="fastest")


# -- running -----------------------------------------------------------------------------------


def test_waiting_steps_give_the_sequential_results_and_dead_letters_in_order():
    elastic, sequential = chain(wait=True), chain(wait=False)
    for number in range(6):
        batch = batch_of(range(number * 50, number * 50 + 50), first_seq=number * 50)
        threaded, expected = elastic(batch), sequential(batch)
        assert threaded.equals(expected), (threaded.to_pylist()[:4], expected.to_pylist()[:4])
        dead = [row for row in threaded.to_pylist() if row[DEAD_OPERATOR] is not None]
        assert {row[DEAD_OPERATOR] for row in dead} >= {"lookup"}
    assert any("a map must return a dict" in row["_fissure_dead_error"] for row in dead)
    runner = worker_runners().runner(waiting("lookup"))
    assert runner is not None and runner.thread_level == 0  # parked between batches


def test_the_runner_is_kept_across_batches_and_its_level_carries_over():
    stage = FusedStage([Step("lookup", "map", lookup, TAGGED, waiting=waiting("lookup"))], NUMBERS)
    stage(batch_of(range(40)))
    first = worker_runners().runner(waiting("lookup"))
    stage(batch_of(range(40, 80)))
    assert worker_runners().runner(waiting("lookup")) is first
    copy = pickle.loads(pickle.dumps(stage))  # a new task's copy of the stage finds the same runner
    copy(batch_of(range(80, 120)))
    assert worker_runners().runner(waiting("lookup")) is first
    assert waiting("lookup").board().report("lookup", "here").records == 120


def test_a_runner_busy_in_another_thread_leaves_the_batch_to_the_sequential_path():
    operator = waiting("lookup")
    stage = FusedStage([Step("lookup", "map", lookup, TAGGED, waiting=operator)], NUMBERS)
    reference = FusedStage([Step("lookup", "map", lookup, TAGGED)], NUMBERS)
    batch = batch_of(range(30))
    with worker_runners().lease(operator, operator.board()) as runner:
        assert runner is not None
        assert stage(batch).equals(reference(batch))
    assert operator.board().report("lookup", "h") is None  # the runner never ran
    assert stage(batch).equals(reference(batch)) and operator.board().report("lookup", "h").records == 30


class ServiceClock:
    """A fake clock advanced by a simulated service: a call takes `call_s` of service time and the
    service answers up to `capacity` calls at once, so the rate is min(threads, capacity) / call_s."""

    def __init__(self, call_s: float, capacity: int) -> None:
        self.call_s, self.capacity = call_s, capacity
        self.now_s = 0.0
        self.threads = lambda: 1
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.now_s

    def serve(self) -> None:
        with self._lock:
            self.now_s += self.call_s / min(max(1, self.threads()), self.capacity)


def test_thread_level_rises_above_one_within_a_few_batches_and_settles_high():
    clock = ServiceClock(call_s=0.1, capacity=6)
    worker_runners().reset(clock=clock, cpu_usage=lambda: None)
    operator = waiting("enrich", config=ElasticityConfig(period_s=1.0, max_threads=12))
    runner = lambda: worker_runners().runner(operator)  # noqa: E731
    clock.threads = lambda: runner().thread_level

    def enrich(record):
        clock.serve()
        return {"n": record["n"] + 1}

    stage = FusedStage([Step("enrich", "map", enrich, NUMBERS, waiting=operator)], NUMBERS)
    levels = []
    for number in range(80):
        out = stage(batch_of(range(number * 24, number * 24 + 24)))
        assert out.column("n").to_pylist() == list(range(number * 24 + 1, number * 24 + 25))
        levels.append(operator.board().report("enrich", "here").level)
    assert max(levels[:3]) > 1
    assert 5 <= levels[-1] <= 12  # at or near the service's capacity: 1..4 threads get clearly less
    assert runner().timeline[-1].throughput_per_s > 2.5 / 0.1


def test_an_undeclared_operator_runs_sequentially_until_switched_on():
    operator = waiting("lookup", declared=None)
    stage = FusedStage([Step("lookup", "map", lookup, TAGGED, waiting=operator)], NUMBERS)
    expected = chain(wait=False).steps[0]
    reference = FusedStage([expected], NUMBERS)
    batch = batch_of(range(30))
    assert stage(batch).equals(reference(batch))
    assert worker_runners().runner(operator) is None and operator.board().report("lookup", "h") is None
    operator.board().engaged = True
    assert stage(batch).equals(reference(batch))
    assert worker_runners().runner(operator) is not None
    assert operator.board().report("lookup", "h").records == 30


def add_one(batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.compute.add(batch.column(0), 1)] + batch.columns[1:], schema=batch.schema)


def test_a_runner_in_a_pe_child_reports_through_the_board_its_parent_bound():
    operator = waiting("lookup")
    board = operator.board()  # bound before the fork, as fissure.spark.query.elastic.ElasticRegion does
    child_stage = FusedStage([Step("lookup", "map", lookup, TAGGED, waiting=operator)], NUMBERS)
    reference = FusedStage([Step("lookup", "map", lookup, TAGGED)], NUMBERS)
    batches = [batch_of(range(n * 40, n * 40 + 40), first_seq=n * 40) for n in range(4)]
    with ProcessingElement([[add_one], [child_stage]]) as element:
        outputs = list(element.process(iter(batches)))
    assert pa.Table.from_batches(outputs).equals(pa.Table.from_batches([reference(add_one(b)) for b in batches]))
    report = board.report("lookup", "host")
    assert report.records == 160 and report.worker != f"host:{os.getpid()}" and report.level >= 1
    assert worker_runners().runner(operator) is None  # the child ran it, not this process


# -- detection -----------------------------------------------------------------------------------


def test_detect_waiting_needs_wall_time_twice_the_cpu_time_over_enough_records():
    waits = detect_waiting("fetch", wall_us_per_record=3000.0, cpu_us_per_record=40.0, timed_records=500)
    assert waits.run_threaded and "'fetch' waits" in waits.reason
    busy = detect_waiting("parse", wall_us_per_record=30.0, cpu_us_per_record=20.0, timed_records=500)
    assert not busy.run_threaded and "CPU-bound" in busy.reason
    few = detect_waiting("fetch", wall_us_per_record=3000.0, cpu_us_per_record=40.0, timed_records=12)
    assert not few.run_threaded and "12 timed records" in few.reason
    unknown = detect_waiting("fetch", wall_us_per_record=float("nan"), cpu_us_per_record=40.0, timed_records=500)
    assert not unknown.run_threaded and "no wall/CPU time" in unknown.reason
    missing = detect_waiting("fetch", wall_us_per_record=None, cpu_us_per_record=None, timed_records=500)
    assert not missing.run_threaded


# -- what reaches the driver -----------------------------------------------------------------------


def report(worker, operator, level, updates):
    return ThreadLevelReport(operator, worker, level, 100.0 * level, None, updates, 10 * updates, updates)


def test_tally_keeps_the_newest_report_per_worker_and_operator():
    param = ThreadLevelTallyParam()
    driver = param.zero(ThreadLevelTally())
    first_task = ThreadLevelTally([report("h:1", "enrich", 2, 3), report("h:2", "enrich", 1, 1)])
    later_task = ThreadLevelTally([report("h:1", "enrich", 5, 9), report("h:1", "check", 3, 2)])
    stale_task = ThreadLevelTally([report("h:1", "enrich", 4, 7)])
    before = param.addInPlace(driver, pickle.loads(pickle.dumps(first_task))).copy()
    for term in (later_task, stale_task):
        driver = param.addInPlace(driver, term)
    assert driver.reports[("h:1", "enrich")].level == 5
    newer = driver.newer_than(before)
    assert [(item.operator, item.worker, item.level) for item in newer] == [("check", "h:1", 3), ("enrich", "h:1", 5)]
    levels = BatchThreadLevels(7, newer + (report("h:2", "enrich", 2, 4),))
    assert levels.levels() == {"check": (3,), "enrich": (5, 2)}
    assert levels.text() == "check 3 enrich 5,2"
