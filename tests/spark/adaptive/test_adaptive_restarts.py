"""An adaptive run ends as a plain run does: after the machine's failure the same policy
(fissure.lifecycle.failures) starts the plan in force again on the checkpoint through the
QueryManager, with the same warning and the same `not restarted` note, and a bounded run its
timeout ends with input left raises RunTimedOut (fissure.spark.query.run_end). Fakes stand in for Spark."""

from __future__ import annotations

import os

import pytest

from fissure import Pipeline, RunnerConfig
from fissure.model.types import Plan, RegionPlan
from fissure.spark.adaptive import loop as adaptive
from fissure.spark.adaptive import queries as adaptive_queries
from fissure.spark.adaptive.observations import OperatorProfiles, SparkObservations
from fissure.spark.adaptive.queries import QueryManager
from fissure.spark.query.progress_feed import ProgressFeed
from fissure.spark.query.run_end import RunTimedOut
from fissure.spark.io.sources import FileSource
from fissure.spark.state.repartition import CheckpointStatus

CRASH_TEXT = ("org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times\n"
              "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed)\n")
SEQUENTIAL = Plan((RegionPlan((("a", "b"),)),))
SPLIT = Plan((RegionPlan((("a",), ("b",))),))  # a pipeline boundary: an in-PE switch away


class FakeQuery:
    def __init__(self, progress: list[dict], error: Exception | None) -> None:
        self.recentProgress, self.error, self.isActive = progress, error, False

    @property
    def lastProgress(self):
        return self.recentProgress[-1] if self.recentProgress else None

    def exception(self):
        return self.error

    def stop(self):
        self.isActive = False


class FakeRunner:
    """Stands in for Runner in the QueryManager: each start takes the next scripted outcome, a
    number of batches it runs and the error it then fails with (None: it ends there)."""

    script: list = []
    plans: list[Plan] = []
    next_batch = 0

    def __init__(self, pipeline, source, sink, *, plan, **options) -> None:
        FakeRunner.plans.append(plan)
        self.query, self.threads, self.admissions, self.wrap_batch = None, None, (), None
        self.progress_feed = ProgressFeed(lambda: self.query)

    def publish(self, publication) -> None:
        pass

    def start(self, available_now=False) -> None:
        batches, error = FakeRunner.script.pop(0)
        first, FakeRunner.next_batch = FakeRunner.next_batch, FakeRunner.next_batch + batches
        self.query = FakeQuery([{"batchId": batch, "numInputRows": 10, "durationMs": {"triggerExecution": 100},
                                 "processedRowsPerSecond": 100.0} for batch in range(first, first + batches)], error)

    def stop(self):
        return None


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def observe(monkeypatch, tmp_path, script, *, in_force: Plan | None = None, config=RunnerConfig(), seen=None):
    """Run the loop's observation side to its end over the scripted queries; the batch ids observed
    (and the observations, appended to `seen`)."""
    monkeypatch.setattr(adaptive_queries, "Runner", FakeRunner)
    monkeypatch.setattr(adaptive_queries, "checkpoint_status", lambda spark, checkpoint: CheckpointStatus(None, None, None))
    FakeRunner.script, FakeRunner.plans, FakeRunner.next_batch = list(script), [], 0
    clock = FakeClock()
    pipeline = Pipeline("p").map("a", lambda record: record).map("b", lambda record: record)
    checkpoint = str(tmp_path / "ckpt")
    os.makedirs(checkpoint, exist_ok=True)
    queries = QueryManager(pipeline, None, None, spark=None, checkpoint=checkpoint, dead_letters=None, config=config,
                           available_now=True, clock=clock)
    observations = SparkObservations(queries, OperatorProfiles(pipeline.operator_stats()), cores=2, clock=clock)
    queries.start(SEQUENTIAL)
    if in_force is not None:  # an in-PE switch made before the failure
        queries.current.plan = in_force
    observed = []
    while (batch := observations.next_batch()) is not None:
        observed.append(batch.batch_id)
        if seen is not None:
            seen.append(batch)
    return observed, queries


def test_a_crashed_query_starts_again_with_the_plan_in_force_and_the_run_goes_on(monkeypatch, tmp_path, caplog):
    """Before: the worker crash ended the adaptive run."""
    observed, queries = observe(monkeypatch, tmp_path, [(2, RuntimeError(CRASH_TEXT)), (3, None)], in_force=SPLIT)
    assert observed == [0, 1, 2, 3, 4]
    assert queries.queries_started == 2
    assert FakeRunner.plans == [SEQUENTIAL, SPLIT]
    assert sum("starting it again on the checkpoint" in message for message in caplog.messages) == 1


def test_the_first_batch_of_each_query_is_marked_for_the_controller_to_discard(monkeypatch, tmp_path):
    """Before: a query restarted after a failure gave its first batch as any other, measured."""
    seen = []
    observe(monkeypatch, tmp_path, [(2, RuntimeError(CRASH_TEXT)), (3, None)], seen=seen)
    assert [batch.batch_id for batch in seen if batch.query_start] == [0, 2]  # the start; the restart's first


def test_a_crash_loop_ends_the_adaptive_run_saying_why(monkeypatch, tmp_path):
    with pytest.raises(RuntimeError) as raised:
        observe(monkeypatch, tmp_path, [(1, RuntimeError(CRASH_TEXT)) for _ in range(5)])
    assert FakeRunner.script and len(FakeRunner.plans) == 4  # three restarts, then the policy's no
    assert any("not restarted: 3 restarts in the last 600 s" in note for note in raised.value.__notes__)


def test_the_restart_budget_of_the_config_holds_for_an_adaptive_run(monkeypatch, tmp_path):
    with pytest.raises(RuntimeError) as raised:
        observe(monkeypatch, tmp_path, [(0, RuntimeError(CRASH_TEXT)), (1, None)], config=RunnerConfig(query_restarts=0))
    assert len(FakeRunner.plans) == 1
    assert any("not restarted" in note for note in raised.value.__notes__)


def test_a_failure_of_the_program_ends_the_adaptive_run_unrestarted(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="a bug") as raised:
        observe(monkeypatch, tmp_path, [(0, ValueError("a bug")), (1, None)])
    assert len(FakeRunner.plans) == 1
    assert not getattr(raised.value, "__notes__", [])


# --- a bounded adaptive run ended by its timeout ----------------------------------------------------

class StalledRunner(FakeRunner):
    """A query that never ends and never reports a batch, on a file source with input unread."""

    source = None

    def __init__(self, pipeline, source, sink, *, plan, checkpoint, **options) -> None:
        super().__init__(pipeline, source, sink, plan=plan)
        self.sources, self.checkpoint, self.spark = {"logs": source}, checkpoint, None
        self.time_aware = False

    def start(self, available_now=False) -> None:
        self.query = FakeQuery([], None)
        self.query.isActive = True


class FakeLock:
    store = None

    @classmethod
    def acquire(cls, store, program, **options):
        return cls()

    def check_held(self) -> None:
        pass

    def release(self) -> None:
        pass


def test_a_bounded_adaptive_run_ended_by_its_timeout_with_input_left_raises_run_timed_out(monkeypatch, tmp_path):
    """Before: the timeout did not bound an adaptive run of available_now=True at all."""
    monkeypatch.setattr(adaptive_queries, "Runner", StalledRunner)
    monkeypatch.setattr(adaptive_queries, "checkpoint_status", lambda spark, checkpoint: CheckpointStatus(None, None, None))
    monkeypatch.setattr(adaptive, "check_before_spark", lambda *args: None)
    monkeypatch.setattr(adaptive, "default_file_system", lambda *args: None)
    monkeypatch.setattr(adaptive, "default_parallelism", lambda session: 2)
    monkeypatch.setattr(adaptive, "open_store", lambda session, checkpoint: None)
    monkeypatch.setattr(adaptive, "CheckpointLock", FakeLock)
    FakeRunner.plans = []
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "part-0.json").write_text('{"a": 1}\n' * 4)
    pipeline = Pipeline("p").map("a", lambda record: record).map("b", lambda record: record)
    with pytest.raises(RunTimedOut) as raised:
        adaptive.run_adaptive_on_spark(pipeline, FileSource(str(logs), format="json", schema={"a": int}), None,
                                       checkpoint=str(tmp_path / "ckpt"), clock=FakeClock(),
                                       config=RunnerConfig(spark=object(), available_now=True, timeout_s=30,
                                                           progress="off", run_dir=str(tmp_path / "run")))
    assert str(raised.value).startswith("the run's timeout (30 s) ended it with input left: logs"), raised.value
    assert raised.value.left.files == 1 and raised.value.report.batches == 0


# --- the end of input of a bounded adaptive run -------------------------------------------------------

class EndingRunner(StalledRunner):
    """A time-aware query that runs its scripted batches and ends; its end-of-input batch
    (Runner.finish_input) fails with the scripted errors, one per call, then succeeds."""

    finish_errors: list = []
    finishes = 0
    end_of_input_from = None  # the fake's batches report no end-of-input batch of their own

    def __init__(self, pipeline, source, sink, *, plan, checkpoint, **options) -> None:
        super().__init__(pipeline, source, sink, plan=plan, checkpoint=checkpoint)
        self.time_aware, self.due_table = True, None

    def start(self, available_now=False) -> None:
        FakeRunner.start(self, available_now)

    def finish_input(self) -> bool:
        EndingRunner.finishes += 1
        if EndingRunner.finish_errors:
            raise EndingRunner.finish_errors.pop(0)
        return True


def run_to_the_end_of_input(monkeypatch, tmp_path, script, finish_errors):
    monkeypatch.setattr(adaptive_queries, "Runner", EndingRunner)
    monkeypatch.setattr(adaptive_queries, "checkpoint_status", lambda spark, checkpoint: CheckpointStatus(None, None, None))
    monkeypatch.setattr(adaptive, "check_before_spark", lambda *args: None)
    monkeypatch.setattr(adaptive, "default_file_system", lambda *args: None)
    monkeypatch.setattr(adaptive, "default_parallelism", lambda session: 2)
    monkeypatch.setattr(adaptive, "open_store", lambda session, checkpoint: None)
    monkeypatch.setattr(adaptive, "CheckpointLock", FakeLock)
    FakeRunner.script, FakeRunner.plans, FakeRunner.next_batch = list(script), [], 0
    EndingRunner.finish_errors, EndingRunner.finishes = list(finish_errors), 0
    pipeline = Pipeline("p").map("a", lambda record: record).map("b", lambda record: record)
    (tmp_path / "logs").mkdir()
    source = FileSource(str(tmp_path / "logs"), format="json", schema={"a": int})
    config = RunnerConfig(spark=object(), available_now=True, progress="off", run_dir=str(tmp_path / "run"))
    return adaptive.run_adaptive_on_spark(pipeline, source, None, checkpoint=str(tmp_path / "ckpt"), config=config,
                                          clock=FakeClock())


def test_a_crash_of_the_end_of_input_batch_starts_the_query_again_and_the_end_of_input_runs(monkeypatch, tmp_path):
    """Before: the end-of-input batch's worker crash ended the adaptive run, unrestarted."""
    report = run_to_the_end_of_input(monkeypatch, tmp_path, [(2, None), (0, None)], [RuntimeError(CRASH_TEXT)])
    assert report.queries == 2 and EndingRunner.finishes == 2
    assert FakeRunner.plans[1] == FakeRunner.plans[0]  # the plan in force


def test_a_failure_of_the_program_in_the_end_of_input_batch_ends_the_adaptive_run(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="a bug"):
        run_to_the_end_of_input(monkeypatch, tmp_path, [(2, None), (0, None)], [ValueError("a bug")])
    assert len(FakeRunner.plans) == 1 and EndingRunner.finishes == 1
