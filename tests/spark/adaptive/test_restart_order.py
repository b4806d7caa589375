"""The steps of a restart switch, in order, on a recording fake of the adaptive run's queries
(`QueryManager`'s seam): the new query is built while the old one stops and its state is
repartitioned, and started only after both, from what was built. No Spark here: the
exactly-once outcome of real restarts is tests/spark/adaptive/test_spark_adaptive.py's."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from fissure import Pipeline
from fissure.config import RunnerConfig
from fissure.model.types import Plan, RegionPlan
from fissure.control.plan_change import SwitchKind
from fissure.spark.adaptive import realizer as realizer_module
from fissure.spark.adaptive.queries import BackgroundPreparation, StopResult, canonical_plan
from fissure.spark.adaptive.realizer import SparkPlanRealizer, SwitchFailed
from fissure.spark.state.repartition import CheckpointStatus, StateRepartition

WAIT_S = 5.0  # how long a step waits for the one it overlaps before it says it did not


def count(state, record):
    state["n"] = state.get("n", 0) + 1
    return record


def keyed_pipeline():
    return Pipeline("restart-order").map("scale", lambda record: record).partitioned(
        "count", count, key="user", schema={"user": str})


def plan(*regions):
    return Plan(tuple(RegionPlan(tuple(tuple(p) for p in pipelines), replicas) for pipelines, replicas in regions))


SEQUENTIAL = plan(([["scale", "count"]], 1))
PREFIX_X2 = plan(([["scale"]], 2), ([["count"]], 1))  # a restart: the state partitions stay 1
KEYED_X2 = plan(([["scale", "count"]], 2))  # a restart with state: 1 -> 2 partitions


@dataclass
class FakeQuery:
    isActive: bool = True


@dataclass
class FakeGate:
    first_entry_s: float | None = 9.0
    first_batch: int | None = 3

    def wait(self, timeout_s):
        pass


@dataclass
class FakeLive:
    plan: Plan
    gate: FakeGate = field(default_factory=FakeGate)
    query: FakeQuery = field(default_factory=FakeQuery)


class RecordingQueries:
    """The realizer's seam to the queries, recording each step; the build runs on its own thread
    and waits for the stop to end, so a realizer that built after the stop would be seen."""

    def __init__(self, running: Plan, *, build_fails: bool = False) -> None:
        self.pipeline = keyed_pipeline()
        self.spark, self.checkpoint, self.config = None, "checkpoint", RunnerConfig()
        self.current = FakeLive(canonical_plan(running))
        self.fatal = None
        self.steps: list[str] = []
        self.build_began, self.stopped = threading.Event(), threading.Event()
        self.build_fails = build_fails
        self._lock = threading.Lock()

    def record(self, step: str) -> None:
        with self._lock:
            self.steps.append(step)

    def prepare_in_background(self, plan: Plan) -> BackgroundPreparation:
        def build():
            self.record("build began")
            self.build_began.set()
            overlapped = self.stopped.wait(WAIT_S)
            self.record("build ended" if overlapped else "build ended, no stop meanwhile")
            if self.build_fails:
                raise ValueError("the new plan does not compile")
            return ("built", plan)

        return BackgroundPreparation(build, clock=lambda: 0.0)

    def stop_at_boundary(self) -> StopResult:
        self.record("stop" if self.build_began.wait(WAIT_S) else "stop, nothing being built")
        self.current = None
        self.stopped.set()
        return StopResult(abandoned_batch=7, stop_s=0.1, checkpoint=CheckpointStatus(7, 6, 1))

    def start(self, plan: Plan, prepared=None) -> FakeLive:
        self.record("start built query" if prepared == ("built", plan) else f"start {'new' if prepared is None else prepared}")
        self.current = FakeLive(plan)
        return self.current


def record_repartitions(monkeypatch, queries: RecordingQueries) -> list:
    """The realizer's state repartitions, recorded as a step of `queries` (arguments kept)."""
    calls = []

    def repartition_state(spark, checkpoint, partitions, *, abandoned_batch, repartition, clock, status):
        calls.append((partitions, abandoned_batch, status))
        queries.record(f"repartition to {partitions}")
        return StateRepartition(status.state_partitions, partitions, abandoned_batch, 0.5)

    monkeypatch.setattr(realizer_module, "repartition_state", repartition_state)
    return calls


def test_a_restart_builds_the_new_query_while_the_old_one_stops_and_starts_what_it_built():
    queries = RecordingQueries(SEQUENTIAL)
    realizer = SparkPlanRealizer(queries, clock=lambda: 1.0)
    realizer.apply(PREFIX_X2, SwitchKind.RESTART)
    assert queries.steps == ["build began", "stop", "build ended", "start built query"]
    record = realizer.switches[-1]
    assert record.applied_as == "restart" and record.abandoned_batch == 7 and record.first_batch == 3
    assert record.state_partitions_before == record.state_partitions_after == 1


def test_a_restart_with_state_repartitions_after_the_stop_and_starts_after_the_build(monkeypatch):
    queries = RecordingQueries(SEQUENTIAL)
    calls = record_repartitions(monkeypatch, queries)
    realizer = SparkPlanRealizer(queries, clock=lambda: 1.0)
    realizer.apply(KEYED_X2, SwitchKind.RESTART_WITH_STATE)
    stop, start = queries.steps.index("stop"), queries.steps.index("start built query")
    assert queries.steps[0] == "build began"
    assert stop < queries.steps.index("repartition to 2") < start
    assert queries.steps.index("build ended") < start
    # The checkpoint read at the stop is the repartition's: it is not read again.
    assert calls == [(2, 7, CheckpointStatus(7, 6, 1))]
    record = realizer.switches[-1]
    assert record.applied_as == "restart-with-state" and record.repartition_s == 0.5
    assert (record.state_partitions_before, record.state_partitions_after) == (1, 2)


def test_a_new_query_that_fails_to_build_leaves_the_previous_plan_running_again():
    queries = RecordingQueries(SEQUENTIAL, build_fails=True)
    realizer = SparkPlanRealizer(queries, clock=lambda: 1.0)
    with pytest.raises(SwitchFailed, match="does not compile"):
        realizer.apply(PREFIX_X2, SwitchKind.RESTART)
    assert queries.steps == ["build began", "stop", "build ended", "start new"]
    assert queries.current.plan == canonical_plan(SEQUENTIAL)
    assert realizer.switches[-1].error.startswith("ValueError")
