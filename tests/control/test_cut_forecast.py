"""Whether autopipelining tries a cut: the model's bound on its gain (cores per task, computing or
waiting operators on either side) against the noise a trial must beat, as decision values."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fissure.control.autopipeline_control import (
    AutopipelineControlConfig,
    AutopipelineControlDecision,
    AutopipelinePolicy,
    AutopipelineWindow,
    ControlAction,
    decide_screen,
    decide_trials,
)
from fissure.control.cut_forecast import (
    NodeTiming,
    PieceTiming,
    TaskTiming,
    TrialForecast,
    best_cut_gain,
    compute_stretch,
    delivered,
    forecast_trial,
    predict_cut_gain,
)
from fissure.control.loop import RecordingRealizer, run_loop
from fissure.control.noise import NoiseEstimate
from fissure.plan.autopipeline import AutopipelineProfile, ThreadProfile

THREAD = "pe0/parse,lookup,failures/p0"


def piece(nodes: dict[str, NodeTiming], routing_s: float = 0.02) -> PieceTiming:
    """One piece running `nodes` in a chain; a cut at each node but the first moves it and the rest."""
    names = list(nodes)
    below = {name: frozenset(names[index:]) for index, name in enumerate(names) if index}
    return PieceTiming(THREAD, True, sum(node.cpu_s for node in nodes.values()) + routing_s, nodes, below)


# Seconds of one window; the call's wall time is 1.0 s, the rest of it the Spark worker's Arrow I/O.
COMPUTING = {"parse": NodeTiming(0.30, 0.31), "lookup": NodeTiming(0.20, 0.21), "failures": NodeTiming(0.05, 0.05)}
WAITING = {"parse": NodeTiming(0.30, 0.31), "lookup": NodeTiming(0.01, 0.40), "failures": NodeTiming(0.05, 0.05)}


def task(nodes, tasks_per_batch=2.0, cores=2) -> TaskTiming:
    return TaskTiming((piece(nodes),), 1.0, tasks_per_batch, cores)


def test_a_cut_between_computing_operators_cannot_gain_when_every_core_has_a_task():
    gain = predict_cut_gain(task(COMPUTING), THREAD, "lookup")
    assert gain.gain == 0.0
    assert gain.reason == (
        "a cut at lookup gains at most +0%: above it busy 0.74 of the task's time (waiting 0.00), below it 0.26"
        " (waiting 0.00); the task computes for 1.00 of its time on one core and has 1 (2 task(s) a batch on"
        " 2 core(s))")


def test_a_free_core_lets_a_cut_between_computing_operators_gain():
    # one task a batch on two cores: the halves can run side by side; the longer one, 0.74, bounds the call
    assert predict_cut_gain(task(COMPUTING, tasks_per_batch=1.0), THREAD, "lookup").gain == pytest.approx(1 / 0.74 - 1)


def test_a_waiting_operator_below_the_cut_overlaps_with_the_computing_ones_above():
    gain = predict_cut_gain(task(WAITING), THREAD, "lookup")
    # after the cut the task's computing, 0.61 of its time on its one core, bounds it: 1 / 0.61
    assert gain.gain == pytest.approx(1 / 0.61 - 1)
    assert "below it 0.45 (waiting 0.39)" in gain.reason
    # cutting after the waiting operator leaves it above, with the worker's I/O: 0.95 of the time
    assert predict_cut_gain(task(WAITING), THREAD, "failures").gain == pytest.approx(1 / 0.95 - 1)


def test_a_process_waiting_for_a_core_is_not_taken_for_a_waiting_operator():
    # wall 1.5 x CPU: preempted, not waiting (the ratio is 2); the operators still compute for their wall time
    preempted = {name: NodeTiming(node.cpu_s, node.cpu_s * 1.5) for name, node in COMPUTING.items()}
    assert not preempted["lookup"].waiting
    assert predict_cut_gain(task(preempted), THREAD, "lookup").gain == 0.0


@pytest.mark.parametrize("node, waiting", [
    (NodeTiming(0.20, 0.30, waits="io"), True),  # declared: waits whatever its times
    (NodeTiming(0.01, 0.40, waits="gil-free"), False),  # native code computes on a core for its wall time
    (NodeTiming(0.01, 0.40), True),  # undeclared, 40 x its CPU time: detected
])
def test_declarations_decide_before_the_times(node, waiting):
    assert node.waiting is waiting
    assert node.compute_s == pytest.approx(node.cpu_s if waiting else node.wall_s)
    assert node.occupied_s == pytest.approx(node.wall_s if waiting else node.cpu_s)


def test_the_bound_of_a_port_is_the_best_over_the_threads_it_relieves():
    timings = (task(COMPUTING), TaskTiming((PieceTiming("pe1/x,lookup/p0", True, 0.5, WAITING, {"lookup": frozenset(
        {"lookup", "failures"})}),), 1.0, 2.0, 2))
    best = best_cut_gain(timings, "lookup", (THREAD, "pe1/x,lookup/p0"))
    assert best.thread == "pe1/x,lookup/p0" and best.gain > 0
    assert best_cut_gain(timings, "lookup", ("pe9/other/p0",)) is None


def forecast(gain, noise=NoiseEstimate(), batches_before=2, max_trial_batches=2):
    return forecast_trial("lookup", gain, batches_before=batches_before, max_trial_batches=max_trial_batches,
                          noise=noise, confidence=0.9, assumed_sd=0.10)


def test_no_trial_when_the_bound_is_within_the_noise_band():
    gain = predict_cut_gain(task(COMPUTING), THREAD, "lookup")
    result = forecast(gain)
    assert result == TrialForecast(
        "lookup", 0.0, pytest.approx(0.1367, abs=1e-4), 0,
        f"lookup not tried: {gain.reason}; within the +13.7% band a trial of 2 batch(es) against 2 must pass at"
        " 90% confidence (batch spread 10.0% assumed, none measured yet)")


def test_a_large_bound_gets_a_short_trial_and_a_quiet_run_a_shorter_one():
    gain = predict_cut_gain(task(WAITING), THREAD, "lookup")  # +64 %
    assert forecast(gain, max_trial_batches=4).trial_batches == 1  # 1 batch: band +17 %, at most half of +64 %
    small = predict_cut_gain(task(COMPUTING, tasks_per_batch=1.8), THREAD, "lookup")  # +11 %: 1.1 cores a task
    assert small.gain == pytest.approx(1 / 0.9 - 1)
    noisy = NoiseEstimate().with_window([700.0, 1000.0, 1300.0, 1000.0])
    quiet = NoiseEstimate().with_window([1000.0, 1002.0, 998.0, 1001.0] * 4)
    assert forecast(small, noisy, max_trial_batches=4).trial_batches == 0  # within the noise: no trial
    assert forecast(small, quiet, max_trial_batches=4).trial_batches == 1


def test_a_port_without_timing_is_tried_for_a_whole_window():
    assert forecast(None) == TrialForecast("lookup", None, pytest.approx(0.1367, abs=1e-4), 2,
                                           "lookup: not timed, tried for 2 batch(es)")


def test_a_trial_needs_batches_on_both_sides():
    with pytest.raises(ValueError, match="at least one batch before and after"):
        forecast(None, batches_before=0)


# -- the decision: insert what can pay, set the rest aside, halt when nothing can ---------------------------

PROFILE = AutopipelineProfile((ThreadProfile(THREAD, 0.9, {"lookup": 0.45, "failures": 0.05}),), beta=0.5)


def test_halt_without_a_trial_when_no_proposed_cut_can_pay():
    decision = decide_trials(PROFILE, (task(COMPUTING),), frozenset(), batches_before={"lookup": 2, "failures": 2},
                             max_trial_batches=2, noise=NoiseEstimate())
    lookup = forecast(predict_cut_gain(task(COMPUTING), THREAD, "lookup"))
    failures = forecast_trial("failures", predict_cut_gain(task(COMPUTING), THREAD, "failures"), batches_before=2,
                              max_trial_batches=2, noise=NoiseEstimate(), confidence=0.9, assumed_sd=0.10)
    # the optimizer proposed lookup, then, with lookup set aside, failures: neither can pay
    assert decision == AutopipelineControlDecision(
        ControlAction.HALT, f"no cut can pay beyond the noise: {lookup.reason}; {failures.reason}", frozenset(),
        not_tried=("lookup", "failures"))


def test_insert_what_can_pay_for_a_short_trial():
    decision = decide_trials(PROFILE, (task(WAITING),), frozenset({"x"}), batches_before={"lookup": 2},
                             max_trial_batches=2, noise=NoiseEstimate())
    lookup = forecast(predict_cut_gain(task(WAITING), THREAD, "lookup"))
    assert decision == AutopipelineControlDecision(
        ControlAction.INSERT, "insert threads at lookup: 1 new thread(s) for 1 of 1 bottleneck thread(s); the most"
        f" loaded thread is predicted at 0.45, at port lookup; {lookup.reason}", frozenset({"x"}),
        insert=("lookup",), trial_batches=1, bounds=(lookup.gain,))


def test_the_screen_halts_a_computing_graph_and_profiles_a_waiting_one():
    computing = decide_screen((task(COMPUTING),), frozenset(), batches=2, noise=NoiseEstimate())
    assert computing == AutopipelineControlDecision(
        ControlAction.HALT,
        # the screen counts CPU time only: 0.98 of the time, the operators' 0.03 s more wall time could be waiting
        "no cut can pay beyond the noise: pe0/parse,lookup,failures: any cut gains at most +2%: the task computes for"
        " 0.98 of its time on one core and has 1 (2 task(s) a batch on 2 core(s)); within the +13.7% band a trial of"
        " 2 batch(es) must pass at 90% confidence (batch spread 10.0% assumed, none measured yet)", frozenset())
    waiting = decide_screen((task(WAITING),), frozenset(), batches=2, noise=NoiseEstimate())
    assert waiting.action is ControlAction.PROFILE and waiting.reason.startswith(
        "a cut may pay, profiling node by node: pe0/parse,lookup,failures: any cut gains at most +67%")
    assert decide_screen((), frozenset(), batches=2, noise=NoiseEstimate()) == AutopipelineControlDecision(
        ControlAction.PROFILE, "no task timed: profiling node by node", frozenset())


def test_after_a_kept_cut_the_screen_bounds_any_further_cut_by_the_piece_no_cut_can_split():
    # the waiting lookup has its own process: it stays busy 0.91 of the time (its wait and its routing)
    # whatever is cut above it
    parse = PieceTiming("pe0/parse,enrich|lookup/p0", True, 0.55,
                        {"parse": NodeTiming(0.30, 0.31), "enrich": NodeTiming(0.20, 0.21)},
                        {"enrich": frozenset({"enrich"})})
    lookup = PieceTiming("pe0/parse,enrich|lookup/p1", False, 0.05, {"lookup": NodeTiming(0.04, 0.90)},
                         {"lookup": frozenset({"lookup"})}, cuttable=False)
    after_cut = TaskTiming((parse, lookup), 1.0, 1.0, 2)
    decision = decide_screen((after_cut,), frozenset(), batches=2, noise=NoiseEstimate())
    assert decision == AutopipelineControlDecision(
        ControlAction.HALT,
        "no cut can pay beyond the noise: pe0/parse,enrich|lookup: any cut gains at most +10%: the task computes for"
        " 1.03 of its time on one core and has 2 (1 task(s) a batch on 2 core(s)); p1 (lookup) cannot be cut further"
        " and is busy 0.91 of the time; within the +13.7% band a trial of 2 batch(es) must pass at 90% confidence"
        " (batch spread 10.0% assumed, none measured yet)", frozenset())
    # the cores bound alone, had the lookup's piece two operators, would have sent it back to profiling:
    # 1.03 of one core's time on two cores, +94 %
    cuttable = TaskTiming((parse, replace(lookup, cuttable=True)), 1.0, 1.0, 2)
    assert decide_screen((cuttable,), frozenset(), batches=2, noise=NoiseEstimate()).action is ControlAction.PROFILE


def test_the_policy_screens_profiles_tries_and_screens_again():
    timings = iter([(task(WAITING),), (task(WAITING),), (task(COMPUTING),)])
    windows = [
        AutopipelineWindow(1, 2.0, {"lookup": 1000.0}, {"lookup": (990.0, 1010.0)}, batches=2),  # screened
        AutopipelineWindow(3, 4.0, {"lookup": 1000.0}, {"lookup": (995.0, 1005.0)}, batches=2),  # node by node
        AutopipelineWindow(4, 5.0, {"lookup": 1600.0}, {"lookup": (1600.0,)}, batches=1),  # the one-batch trial
        AutopipelineWindow(6, 7.0, {"lookup": 1600.0}, {"lookup": (1590.0, 1610.0)}, batches=2),  # screened again
    ]
    policy = AutopipelinePolicy(3, lambda window, blacklist: PROFILE, AutopipelineControlConfig(settle_s=0.0),
                                timings_of=lambda window: next(timings))
    realizer = RecordingRealizer(cost_s=lambda decision: 0.0)
    timeline = run_loop(windows, policy, realizer, clock=lambda: 0.0)
    assert [decision.summary() for decision in timeline.decisions()] == [
        "profile", "insert lookup", "continue: keep lookup", "halt"]
    assert timeline.decisions()[1].trial_batches == 1
    assert timeline.decisions()[3].reason.startswith("no cut can pay beyond the noise")
    assert realizer.applied == timeline.decisions() and policy.phase == "halted"
    assert policy.delivered_share == pytest.approx(1.6 * 0.61)  # 1,000 -> 1,600/s against a bound of 1 / 0.61


def test_a_short_trial_with_a_gain_inside_its_noise_goes_on_before_it_is_judged():
    def run(trial_then_more):
        windows = [
            AutopipelineWindow(1, 2.0, {"lookup": 1000.0}, {"lookup": (990.0, 1010.0)}, batches=2),  # screened
            AutopipelineWindow(3, 4.0, {"lookup": 1000.0}, {"lookup": (995.0, 1005.0)}, batches=2),  # node by node
            *trial_then_more]
        policy = AutopipelinePolicy(3, lambda window, blacklist: PROFILE, AutopipelineControlConfig(settle_s=0.0),
                                    timings_of=lambda window: (task(WAITING),))
        return policy, run_loop(windows, policy, RecordingRealizer(cost_s=lambda decision: 0.0), clock=lambda: 0.0)

    # +8 % in one batch is inside its band: one more batch, then the two together decide
    trial = AutopipelineWindow(4, 5.0, {"lookup": 1080.0}, {"lookup": (1080.0,)}, batches=1, wall_s=1.0)
    more = AutopipelineWindow(5, 6.0, {"lookup": 1320.0}, {"lookup": (1320.0,)}, batches=1, wall_s=1.0)
    policy, timeline = run([trial, more])
    decisions = timeline.decisions()
    assert [decision.summary() for decision in decisions] == ["profile", "insert lookup", "wait",
                                                              "continue: keep lookup"]
    assert decisions[2] == AutopipelineControlDecision(
        ControlAction.WAIT, "inconclusive after 1 batch(es): lookup +8%, within the noise of so few batches;"
        " the trial goes on for 1 more batch(es)", frozenset(), trial_batches=1)
    assert decisions[3].reason == "throughput rose at every new thread: lookup 1000 -> 1200/s"  # over both batches
    assert policy.blacklist == frozenset()
    # a loss is reverted at once, and a longer trial that still shows no gain beyond the noise is reverted
    _, timeline = run([AutopipelineWindow(4, 5.0, {"lookup": 900.0}, {"lookup": (900.0,)}, batches=1)])
    assert [decision.summary() for decision in timeline.decisions()][2:] == ["continue: revert lookup"]
    policy, timeline = run([AutopipelineWindow(4, 5.0, {"lookup": 1010.0}, {"lookup": (1010.0,)}, batches=1),
                            AutopipelineWindow(5, 6.0, {"lookup": 1000.0}, {"lookup": (1000.0,)}, batches=1)])
    assert [decision.summary() for decision in timeline.decisions()][2:] == ["wait", "continue: revert lookup"]
    assert policy.blacklist == frozenset({"lookup"})


def test_the_paper_rule_tries_what_the_optimizer_proposes():
    policy = AutopipelinePolicy(3, lambda window, blacklist: PROFILE,
                                AutopipelineControlConfig(settle_s=0.0, forecast_trials=False),
                                timings_of=lambda window: (task(COMPUTING),))
    decision = policy.decide(AutopipelineWindow(1, 2.0, {"lookup": 1000.0}, {"lookup": (990.0, 1010.0)}))
    assert (decision.action, decision.insert, decision.trial_batches) == (ControlAction.INSERT, ("lookup",), 0)


def test_a_machine_short_of_cores_stretches_every_operator_and_only_what_waits_beyond_counts():
    # load 4 on 2 cores: every computing operator shows 2.5 x its CPU time; the lookup 40 x
    stretch = compute_stretch([(0.30, 0.75, None, 1.0), (0.20, 0.50, None, 1.0), (0.01, 0.40, None, 1.0),
                               (0.001, 0.01, None, 1.0),  # too little CPU time to tell
                               (0.05, 0.50, "io", 1.0)])  # declared: not a measure of the machine
    assert stretch == pytest.approx(2.5)
    assert not NodeTiming(0.30, 0.75, stretch=stretch).waiting and NodeTiming(0.01, 0.40, stretch=stretch).waiting
    assert NodeTiming(0.30, 0.75).waiting  # without the stretch, parsing would be taken for waiting
    assert compute_stretch([]) == 1.0 and compute_stretch([(0.3, 0.2, None, 1.0)]) == 1.0


def test_cores_the_machine_did_not_leave_idle_are_not_free_for_a_cut():
    # one task a batch on two cores, but Spark's JVM computed for the same task beside it: 0.1 core idle
    busy_machine = TaskTiming((piece(COMPUTING),), 1.0, 1.0, 2, idle_cores=0.1)
    assert busy_machine.core_share == pytest.approx(1.1)  # the task's own 1.0 core and the idle 0.1
    gain = predict_cut_gain(busy_machine, THREAD, "lookup")
    assert gain.gain == pytest.approx(0.1)
    assert gain.reason.endswith("has 1.1 (1 task(s) a batch on 2 core(s), 0.10 idle while they ran)")
    assert forecast(gain).trial_batches == 0  # within the +13.7 % band: no trial
    quiet_machine = TaskTiming((piece(COMPUTING),), 1.0, 1.0, 2, idle_cores=1.0)
    assert quiet_machine.core_share == 2.0
    # a sleeping lookup frees its own core while it sleeps: the idle time says so
    waiting = TaskTiming((piece(WAITING),), 1.0, 1.0, 2, idle_cores=0.0)  # other programs took the idle core
    assert waiting.core_share == 1.0  # but the core its process sleeps on is its own
    assert predict_cut_gain(waiting, THREAD, "lookup").gain == pytest.approx(1 / 0.61 - 1)


def test_a_trial_that_fell_short_scales_the_bounds_that_follow():
    gain = predict_cut_gain(task(WAITING), THREAD, "lookup")  # +64 %
    assert delivered(gain, 1.0) is gain and delivered(None, 0.5) is None
    halved = delivered(gain, 0.7)
    assert halved.gain == pytest.approx(0.7 / 0.61 - 1)  # +15 %
    assert halved.reason == f"{gain.reason}; 0.70 of that as this run's trials delivered: +15%"
    assert delivered(gain, 0.5).gain == 0.0  # never below no gain


def test_two_processes_overlap_only_across_a_calls_arrow_batches():
    def with_batches(count):
        return TaskTiming((piece(WAITING),), 1.0, 2.0, 2, chunks_per_call=count)

    assert predict_cut_gain(with_batches(1), THREAD, "lookup").gain == 0.0  # one batch a call: nothing to overlap
    # four: the longer side (0.55) and a quarter of the shorter (0.45) one
    assert predict_cut_gain(with_batches(4), THREAD, "lookup").gain == pytest.approx(1 / (0.55 + 0.45 / 4) - 1)
    assert predict_cut_gain(with_batches(None), THREAD, "lookup").gain == pytest.approx(1 / 0.61 - 1)


def test_a_stage_that_takes_part_of_a_batch_gains_the_batch_less():
    # the stage's calls take 0.4 of the batches' time: halving them saves 0.2 of a batch, +25 %
    half_of_the_batch = TaskTiming((piece(WAITING),), 1.0, 2.0, 2, batch_share=0.4)
    assert half_of_the_batch.in_batches(1.0) == pytest.approx(1 / 0.8 - 1)
    gain = predict_cut_gain(half_of_the_batch, THREAD, "lookup")
    assert gain.gain == pytest.approx(1 / (0.6 + 0.4 * 0.61) - 1)
    assert gain.reason.endswith("; the stage takes 0.40 of the batches' time")
    assert TaskTiming((piece(WAITING),), 1.0, 2.0, 2).in_batches(1.0) == 1.0  # unknown: the calls' gain
