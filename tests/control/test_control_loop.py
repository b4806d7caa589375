"""The one control-loop contract (fissure.control.loop): the driver's steps, hooks and timeline,
and each of the three run-time policies (adaptive plans, autopipelining, thread levels) driven
through it with the recording fake realizer, their decisions asserted whole."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from fissure.control.adaptive.config import AdaptiveConfig, SwitchCosts
from fissure.control.adaptive.controller import AdaptiveController
from fissure.control.adaptive.decisions import Action
from fissure.control.adaptive.observations import BatchObservation, OperatorProfile
from fissure.control.adaptive.search import ScoredPlan
from fissure.control.autopipeline_control import (
    AutopipelineControlConfig,
    AutopipelineControlDecision,
    AutopipelinePolicy,
    AutopipelineWindow,
    ControlAction,
)
from fissure.control.driver import AdaptivePolicy
from fissure.control.loop import ControlLoop, LoopTimeline, RealizerFailure, RecordingRealizer, run_loop
from fissure.control.plan_change import parse_fingerprint
from fissure.control.simulate import FakeClock, TablePlanSearch
from fissure.control.thread_level.config import ElasticityConfig
from fissure.control.thread_level.decisions import PeriodMeasurement, ThreadLevelDecision
from fissure.control.thread_level.policies import StaticThreadLevel, TrustTrendPolicy
from fissure.model.types import Kind, Machine, OperatorStats
from fissure.plan.autopipeline import AutopipelineProfile, ThreadProfile


# -- the driver -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    now_s: float
    value: int

    def summary(self) -> str:
        return f"value {self.value}"


@dataclass(frozen=True)
class Setting:
    target: int
    reason: str

    def summary(self) -> str:
        return f"set {self.target}"


class Threshold:
    """A toy policy: set the target to the reading when it rose by more than 2, else hold."""

    def __init__(self) -> None:
        self.target = 0

    def decide(self, reading: Reading) -> Setting:
        if reading.value > self.target + 2:
            self.target = reading.value
            return Setting(reading.value, f"{reading.value} is more than 2 above the target")
        return Setting(self.target, "within 2 of the target: hold")


def changes_only(setting: Setting) -> float | None:
    return 0.5 if setting.reason.startswith(str(setting.target)) else None


def test_each_tick_is_decided_realized_and_recorded_in_order():
    seen = []
    realizer = RecordingRealizer(cost_s=changes_only)
    readings = [Reading(1.0, 1), Reading(2.0, 5), Reading(3.0, 6)]
    timeline = run_loop(readings, Threshold(), realizer, clock=lambda: 0.0, on_step=seen.append)
    assert [(s.tick, s.time_s, s.observed, s.decision, s.reason, s.cost_s) for s in timeline.steps] == [
        (0, 1.0, "value 1", Setting(0, "within 2 of the target: hold"), "within 2 of the target: hold", None),
        (1, 2.0, "value 5", Setting(5, "5 is more than 2 above the target"), "5 is more than 2 above the target", 0.5),
        (2, 3.0, "value 6", Setting(5, "within 2 of the target: hold"), "within 2 of the target: hold", None),
    ]
    assert seen == list(timeline.steps)
    assert realizer.applied == [Setting(5, "5 is more than 2 above the target")]
    assert [step.tick for step in timeline.realized()] == [1]
    assert timeline.to_dict()["steps"][1] == {"tick": 1, "time_s": 2.0, "observed": "value 5", "decision": "set 5",
                                              "reason": "5 is more than 2 above the target", "cost_s": 0.5}


class Hooked(Threshold):
    """The toy policy with every optional hook."""

    def __init__(self) -> None:
        super().__init__()
        self.costs: list[float] = []
        self.failures: list[tuple[int, str, float]] = []

    def realized(self, setting: Setting, cost_s: float) -> None:
        self.costs.append(cost_s)

    def failed(self, setting: Setting, error: Exception, now_s: float) -> Setting:
        self.failures.append((setting.target, type(error).__name__, now_s))
        self.target = 0
        return Setting(0, f"could not set {setting.target}: back to 0")

    def follow_up(self, reading: Reading) -> Setting | None:
        return Setting(self.target, "asked again") if reading.value == 9 else None


def test_a_failed_realization_records_the_policys_answer_unrealized():
    policy = Hooked()
    realizer = RecordingRealizer(cost_s=changes_only, fail_for=lambda setting: setting.target == 8)
    clock = FakeClock(42.0)
    timeline = run_loop([Reading(1.0, 5), Reading(2.0, 8)], policy, realizer, clock)
    assert [(s.tick, s.decision, s.cost_s) for s in timeline.steps] == [
        (0, Setting(5, "5 is more than 2 above the target"), 0.5),
        (1, Setting(8, "8 is more than 2 above the target"), None),
        (1, Setting(0, "could not set 8: back to 0"), None),
    ]
    assert policy.costs == [0.5] and policy.failures == [(8, "RealizerFailure", 42.0)]
    assert realizer.applied == [Setting(5, "5 is more than 2 above the target")]


def test_without_a_failure_hook_the_realizers_error_propagates():
    realizer = RecordingRealizer(fail_for=lambda setting: True)
    loop = ControlLoop(Threshold(), realizer, clock=lambda: 0.0)
    with pytest.raises(RealizerFailure, match="refusing set 0"):
        loop.step(Reading(1.0, 1))
    assert len(loop.timeline) == 0


def test_a_follow_up_is_asked_after_the_first_decision_is_realized_on_the_same_tick():
    timeline = run_loop([Reading(1.0, 9), Reading(2.0, 10)], Hooked(), RecordingRealizer(cost_s=changes_only),
                        clock=lambda: 0.0)
    assert [(s.tick, s.reason) for s in timeline.steps] == [
        (0, "9 is more than 2 above the target"), (0, "asked again"), (1, "within 2 of the target: hold")]


def test_a_bounded_timeline_keeps_the_latest_steps():
    loop = ControlLoop(Threshold(), RecordingRealizer(), clock=lambda: 0.0, timeline=LoopTimeline(max_steps=2))
    for value in range(5):
        loop.step(Reading(float(value), value * 3))
    assert [step.tick for step in loop.timeline.steps] == [3, 4] and loop.ticks == 5


# -- the adaptive loop ---------------------------------------------------------------------------------

OPS = (
    OperatorStats("a", Kind.STATELESS, 10.0, 1.0),
    OperatorStats("b", Kind.STATELESS, 10.0, 1.0),
    OperatorStats("c", Kind.PARTITIONED, 10.0, 1.0, key=("k",)),
)
SEQ, PIPE, KEYED = (parse_fingerprint(text) for text in ("[a,b,c]", "[a|b,c]", "[a,b,c]x2"))


def batch(batch_id: int, throughput: float) -> BatchObservation:
    return BatchObservation(batch_id=batch_id, now_s=batch_id + 1.0, records_in=1000, duration_s=1.0,
                            throughput_per_s=throughput, operators=tuple(OperatorProfile(op, 1000) for op in OPS))


def test_the_adaptive_policy_through_the_loop_applies_evaluates_and_keeps():
    search = TablePlanSearch(ScoredPlan(SEQ, 1000.0), ScoredPlan(PIPE, 1500.0), ScoredPlan(KEYED, 2500.0))
    config = AdaptiveConfig(profile_batches=3, profile_s=2.0, evaluation_batches=2, evaluation_s=1.0,
                            min_operator_samples=1)
    controller = AdaptiveController(OPS, Machine(cores=2), SEQ, config, None, search)
    realizer = RecordingRealizer(cost_s=lambda decision: 7.0 if decision.switch is not None else None)
    observations = [batch(i, 1000.0) for i in range(4)] + [batch(i, 2500.0) for i in range(4, 7)]
    timeline = run_loop(observations, AdaptivePolicy(controller), realizer, clock=lambda: 0.0)
    assert [(s.tick, s.decision.action, s.decision.plan_in_force, s.reason, s.cost_s) for s in timeline.steps] == [
        (0, Action.OBSERVE, "[a,b,c]", "first batch under [a,b,c] discarded (restart effects)", None),
        (1, Action.OBSERVE, "[a,b,c]", "profiling [a,b,c]: 1 of 3 batches, 1.0 of 2.0 s", None),
        (2, Action.OBSERVE, "[a,b,c]", "profiling [a,b,c]: 2 of 3 batches, 2.0 of 2.0 s", None),
        (3, Action.APPLY, "[a,b,c]x2", "apply: [a,b,c]x2 predicted 2,500/s vs 1,000/s (+150%); its"
         " restart-with-state switch loses 13.0 s, won back in 21.7 s", 7.0),
        (4, Action.OBSERVE, "[a,b,c]x2", "first batch under [a,b,c]x2 discarded (restart effects)", None),
        (5, Action.OBSERVE, "[a,b,c]x2", "evaluating [a,b,c]x2: 1 of 2 batches, 2,500/s so far vs 1,000/s before",
         None),
        (6, Action.KEEP, "[a,b,c]x2", "keep [a,b,c]x2: measured +150% (1,000 -> 2,500 records/s, 3 batches before,"
         " 2 after), beyond the +8.6% noise could give at 90% confidence (batch spread 0.0% over 2 degrees of"
         " freedom, 7.1% with 10% assumed)", None),
    ]
    (switched,) = realizer.applied
    assert (switched.switch.plan, switched.switch.kind.value) == (KEYED, "restart-with-state")
    # The realizer's 7 s moved the controller's estimate of that kind of switch halfway from 13 s.
    assert controller.switch_costs == SwitchCosts(restart_with_state_s=10.0)
    assert timeline.steps[3].observed == "batch 3: 1000 records at 1,000/s"


# -- autopipelining ------------------------------------------------------------------------------------

BUSY = (ThreadProfile("t0", 0.9, {"big": 0.55, "small": 0.3}),)
SPLIT = (ThreadProfile("t0", 0.5, {"small": 0.3}), ThreadProfile("t1", 0.45, {"both": 0.2}))


def test_the_autopipelining_policy_through_the_loop_reverts_keeps_and_halts():
    profiles = iter([BUSY, BUSY, SPLIT])
    asked: list[tuple[int, frozenset[str]]] = []

    def profile_of(window: AutopipelineWindow, blacklist: frozenset[str]) -> AutopipelineProfile:
        asked.append((window.batch_id, blacklist))
        return AutopipelineProfile(next(profiles), 0.8, blacklist)

    windows = [
        AutopipelineWindow(2, 3.0, {"big": 100.0, "small": 100.0}, {"big": (100.0, 100.0, 100.0)}),
        AutopipelineWindow(5, 6.0, {"big": 101.0}, {"big": (101.0, 101.0, 101.0)}),  # no gain beyond noise
        AutopipelineWindow(8, 9.0, {"small": 100.0}, {"small": (100.0, 99.0, 101.0)}),
        AutopipelineWindow(11, 12.0, {"small": 200.0}, {"small": (200.0, 199.0, 201.0)}),
        AutopipelineWindow(14, 15.0, {"small": 200.0}, {"small": (200.0, 199.0, 201.0)}),
    ]
    policy = AutopipelinePolicy(4, profile_of, AutopipelineControlConfig(settle_s=0.0))
    realizer = RecordingRealizer(cost_s=lambda decision: None if decision.action is ControlAction.WAIT else 0.25)
    timeline = run_loop(windows, policy, realizer, clock=lambda: 0.0)
    big = frozenset({"big"})
    expected = [
        AutopipelineControlDecision(ControlAction.INSERT, "insert threads at big: 1 new thread(s) for 1 of 1"
                                    " bottleneck thread(s); the most loaded thread is predicted at 0.55, at port big",
                                    frozenset(), insert=("big",)),
        AutopipelineControlDecision(ControlAction.CONTINUE, "no gain at big 100 -> 101/s: reverted and blacklisted;"
                                    " 1 of 4 input ports blacklisted (25%, alpha 50%)", big, revert=("big",)),
        AutopipelineControlDecision(ControlAction.INSERT, "insert threads at small: 1 new thread(s) for 1 of 1"
                                    " bottleneck thread(s); the most loaded thread is predicted at 0.60, at port"
                                    " small", big, insert=("small",)),
        AutopipelineControlDecision(ControlAction.CONTINUE, "throughput rose at every new thread: small 100 -> 200/s",
                                    big, keep=("small",)),
        AutopipelineControlDecision(ControlAction.HALT, "the optimizer found nothing: no thread is at or above beta"
                                    " 0.8 (busiest: t0 at 0.5)", big),
    ]
    assert timeline.decisions() == expected and realizer.applied == expected
    assert [step.decision.summary() for step in timeline.steps] == [
        "insert big", "continue: revert big", "insert small", "continue: keep small", "halt"]
    assert asked == [(2, frozenset()), (8, big), (14, big)]  # profiled only when planning, with the blacklist
    assert policy.phase == "halted"
    assert policy.decide(windows[-1]) == AutopipelineControlDecision.wait("halted: autopipelining has stopped", big)


# -- thread levels ---------------------------------------------------------------------------------------


def test_the_thread_level_policy_through_the_loop_scans_and_refines():
    rate_at = {1: 100.0, 2: 190.0, 3: 260.0, 4: 250.0}
    policy = TrustTrendPolicy(ElasticityConfig(max_threads=4))
    realizer = RecordingRealizer(cost_s=lambda decision: 0.0 if decision.changed else None)

    def periods():  # the level in force is the last one the realizer set
        for period in range(8):
            level = realizer.applied[-1].level if realizer.applied else 1
            yield PeriodMeasurement(now_s=period + 1.0, throughput_per_s=rate_at[level])

    timeline = run_loop(periods(), policy, realizer, clock=lambda: 0.0)
    move, hold = ThreadLevelDecision.move, ThreadLevelDecision.hold
    assert timeline.decisions() == [
        move(1, 2, 1.0, "coarse scan: measure level 2"),
        move(2, 3, 2.0, "coarse scan: measure level 3"),
        move(3, 4, 3.0, "coarse scan: measure level 4"),
        move(4, 3, 4.0, "coarse scan: start the rules from level 3, the best scanned"),
        move(3, 2, 5.0, "refine: measure level 2 (3 left)"),
        move(2, 4, 6.0, "refine: measure level 4 (3 left)"),
        hold(4, 7.0, "refine: measure level 4 again (2 left)"),
        move(4, 3, 8.0, "refine: measure level 3 again (2 left)"),
    ]
    assert [step.observed for step in timeline.steps[:3]] == ["100/s", "190/s", "260/s"]
    assert [step.cost_s for step in timeline.steps].count(None) == 1  # the hold changed nothing


def test_a_static_thread_level_holds_every_period():
    timeline = run_loop([PeriodMeasurement(1.0, 50.0), PeriodMeasurement(2.0, 60.0, cpu_usage=0.5)],
                        StaticThreadLevel(3), RecordingRealizer(cost_s=lambda decision: None), clock=lambda: 0.0)
    assert timeline.decisions() == [ThreadLevelDecision.hold(3, 1.0, "static thread level 3"),
                                    ThreadLevelDecision.hold(3, 2.0, "static thread level 3")]
    assert timeline.steps[1].observed == "60/s, CPU 50%"
    with pytest.raises(ValueError, match="must be >= 1"):
        StaticThreadLevel(0)


def test_the_workers_realizer_sets_the_schedulers_thread_level():
    from fissure.runtime.elastic.runner import SchedulerThreadLevel
    from fissure.runtime.elastic.scheduler import DynamicScheduler

    scheduler = DynamicScheduler(name="loop-test")
    scheduler.add_port("noop", lambda item: None)
    scheduler.start(1)
    try:
        realizer = SchedulerThreadLevel(clock=FakeClock())
        assert realizer.apply(ThreadLevelDecision.move(1, 3, 1.0, "up")) is None  # no scheduler yet: nothing done
        realizer.scheduler = scheduler
        assert realizer.apply(ThreadLevelDecision.move(1, 3, 1.0, "up")) == 0.0
        assert scheduler.thread_level == 3
        assert realizer.apply(ThreadLevelDecision.hold(3, 2.0, "stay")) is None
    finally:
        scheduler.shutdown(drain=False)


def test_an_elastic_runner_steps_its_loop_once_per_period():
    from fissure.runtime.elastic.runner import ElasticOperatorRunner

    clock = FakeClock()

    def items():
        for value in range(30):
            clock.advance(0.1)  # ten items per second of the fake clock
            yield value

    with ElasticOperatorRunner(lambda value: value + 1, static_threads=2, clock=clock, cpu_usage=lambda: None,
                               config=ElasticityConfig(max_threads=4, period_s=1.0)) as runner:
        assert list(runner.run(items())) == list(range(1, 31))
    steps = runner.loop_timeline.steps
    assert [step.decision for step in steps] == [ThreadLevelDecision.hold(2, step.time_s, "static thread level 2")
                                                 for step in steps]
    assert len(steps) == len(runner.timeline) >= 2 and all(step.cost_s is None for step in steps)
