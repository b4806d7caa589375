"""Evaluate, blacklist, halt (Tang and Gedik, TPDS 2013, Section 5) as decision values."""

from __future__ import annotations

import logging
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fissure.control.autopipeline_control import (
    AutopipelineControlConfig,
    AutopipelineControlDecision,
    ControlAction,
    InsertionRound,
    decide_after_optimization,
    evaluate_round,
)
from fissure.control.noise import NoiseEstimate
from fissure.plan.autopipeline import AutopipelineProfile, ThreadProfile, plan_autopipelining

CONFIG = AutopipelineControlConfig(alpha=0.25, settle_s=5.0)
ROUND = InsertionRound(
    operators=("o4", "o8"), applied_at_s=100.0, throughput_before_per_s={"o4": 1000.0, "o8": 400.0}
)


def test_round_is_not_judged_before_it_settles():
    decision = evaluate_round(ROUND, {"o4": 10.0, "o8": 1.0}, 103.0, frozenset(), 8, CONFIG)
    assert decision == AutopipelineControlDecision.wait(
        "settling: 3.0 s of 5.0 s since the insertion", frozenset()
    )


def test_round_that_raised_every_port_is_kept():
    after = {"o4": 1500.0, "o8": 700.0}
    decision = evaluate_round(ROUND, after, 105.0, frozenset({"o1"}), 8, CONFIG)
    assert decision == AutopipelineControlDecision(
        ControlAction.CONTINUE,
        "throughput rose at every new thread: o4 1000 -> 1500/s, o8 400 -> 700/s",
        frozenset({"o1"}),
        keep=("o4", "o8"),
    )


def test_port_without_gain_is_reverted_and_blacklisted():
    decision = evaluate_round(ROUND, {"o4": 1500.0, "o8": 400.0}, 106.0, frozenset(), 8, CONFIG)
    assert decision == AutopipelineControlDecision(
        ControlAction.CONTINUE,
        "no gain at o8 400 -> 400/s: reverted and blacklisted; 1 of 8 input ports blacklisted"
        " (12%, alpha 25%)",
        frozenset({"o8"}),
        keep=("o4",),
        revert=("o8",),
    )


def test_blacklist_beyond_alpha_halts():
    # Two earlier ports and o8 make 3 of 8 = 37.5 % > alpha 25 %.
    after = {"o4": 900.0, "o8": 800.0}
    decision = evaluate_round(ROUND, after, 106.0, frozenset({"o1", "o2"}), 8, CONFIG)
    assert decision.action is ControlAction.HALT
    assert decision.revert == ("o4",) and decision.keep == ("o8",)
    assert decision.blacklist == frozenset({"o1", "o2", "o4"})
    assert decision.reason.endswith("3 of 8 input ports blacklisted (38%, alpha 25%): halt")


def test_blacklist_at_alpha_exactly_continues():
    after = {"o4": 900.0, "o8": 800.0}
    decision = evaluate_round(ROUND, after, 106.0, frozenset({"o1"}), 8, CONFIG)
    assert decision.action is ControlAction.CONTINUE  # 2 of 8 = alpha: the paper halts above it


def test_gain_below_the_margin_counts_as_no_gain():
    careful = AutopipelineControlConfig(alpha=0.5, settle_s=0.0, min_gain=0.05)
    decision = evaluate_round(ROUND, {"o4": 1040.0, "o8": 800.0}, 100.0, frozenset(), 8, careful)
    assert decision.revert == ("o4",) and decision.keep == ("o8",)


@pytest.mark.parametrize(
    "after", [{"o4": 1500.0}, {"o4": 1500.0, "o8": math.nan}, {"o4": 1500.0, "o8": -1.0}]
)
def test_missing_measurement_changes_nothing_and_logs(after, caplog):
    with caplog.at_level(logging.WARNING, logger="fissure.control.autopipeline_control"):
        decision = evaluate_round(ROUND, after, 110.0, frozenset({"o1"}), 8, CONFIG)
    assert decision == AutopipelineControlDecision.wait(
        "no change: throughput before or after missing for o8", frozenset({"o1"})
    )
    assert "o8" in caplog.text


def test_missing_throughput_before_changes_nothing():
    round_without_before = InsertionRound(("o4",), 0.0, {})
    decision = evaluate_round(round_without_before, {"o4": 5.0}, 10.0, frozenset(), 4, CONFIG)
    assert decision.action is ControlAction.WAIT


def paper_profile(blacklist: frozenset[str] = frozenset()) -> AutopipelineProfile:
    return AutopipelineProfile(
        (
            ThreadProfile("t0", 0.90, {"o1": 0.15, "o3": 0.50, "o4": 0.20}),
            ThreadProfile("t1", 1.00, {"o3": 0.50, "o4": 0.20}),
            ThreadProfile("t2", 0.90, {"o6": 0.30, "o4": 0.15, "o10": 0.05}),
            ThreadProfile("t3", 0.95, {"o8": 0.60, "o9": 0.30, "o10": 0.20}),
        ),
        blacklisted_ports=blacklist,
    )


def test_plan_with_insertions_is_applied():
    plan = plan_autopipelining(paper_profile())
    decision = decide_after_optimization(plan, frozenset())
    assert decision.action is ControlAction.INSERT
    assert decision.insert == ("o4", "o8")
    assert decision.reason == f"insert threads at o4, o8: {plan.reason}"


def test_plan_without_insertions_halts():
    # Once o4 is blacklisted (say, it did not help), nothing is left below 100 %: halt.
    plan = plan_autopipelining(paper_profile(frozenset({"o4"})))
    decision = decide_after_optimization(plan, frozenset({"o4"}))
    assert decision == AutopipelineControlDecision.halt(
        f"the optimizer found nothing: {plan.reason}", frozenset({"o4"})
    )


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"alpha": 1.5}, "alpha must be in"),
        ({"settle_s": -1.0}, "settle_s"),
        ({"min_gain": -0.1}, "min_gain"),
    ],
)
def test_bad_configuration_is_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        AutopipelineControlConfig(**settings)


def test_port_count_must_be_positive():
    with pytest.raises(ValueError, match="input_port_count"):
        evaluate_round(ROUND, {"o4": 1.0, "o8": 1.0}, 200.0, frozenset(), 0, CONFIG)


ports = st.sampled_from([f"o{index}" for index in range(8)])
rates = st.floats(0.0, 1e6, allow_nan=False)


@given(
    inserted=st.lists(ports, min_size=1, max_size=4, unique=True),
    before=st.lists(rates, min_size=4, max_size=4),
    after=st.lists(rates, min_size=4, max_size=4),
    blacklist=st.frozensets(ports, max_size=3),
    alpha=st.floats(0.0, 1.0),
)
def test_every_settled_round_splits_into_kept_and_blacklisted(
    inserted, before, after, blacklist, alpha
):
    round_ = InsertionRound(tuple(inserted), 0.0, dict(zip(inserted, before)))
    config = AutopipelineControlConfig(alpha=alpha, settle_s=1.0, keep_confidence=None)  # the paper's rule
    decision = evaluate_round(round_, dict(zip(inserted, after)), 1.0, blacklist, 8, config)
    assert set(decision.keep) | set(decision.revert) == set(inserted)
    assert not set(decision.keep) & set(decision.revert)
    assert set(decision.keep) == {p for p, b, a in zip(inserted, before, after) if a > b}
    # The noise rule keeps a subset of those: a gain, and one beyond the band.
    careful = evaluate_round(round_, dict(zip(inserted, after)), 1.0, blacklist, 8,
                             AutopipelineControlConfig(alpha=alpha, settle_s=1.0))
    assert set(careful.keep) <= set(decision.keep)
    assert decision.blacklist == blacklist | set(decision.revert)
    halts = bool(decision.revert) and len(decision.blacklist) / 8 > alpha
    assert decision.action is (ControlAction.HALT if halts else ControlAction.CONTINUE)


def test_a_rise_inside_the_measured_noise_is_reverted():
    # The cut at `events` kept for 5,830 -> 5,984/s (+2.6 %) while batches spread by about 10 %.
    round_ = InsertionRound(("events",), 0.0, {"events": 5830.0},
                            samples_before={"events": (5300.0, 5830.0, 6400.0)})
    noise = NoiseEstimate().with_window([5300.0, 5830.0, 6400.0])
    config = AutopipelineControlConfig(alpha=1.0, settle_s=0.0)
    decision = evaluate_round(round_, {"events": 5984.0}, 1.0, frozenset(), 8, config,
                              samples_after={"events": (5500.0, 5984.0, 6500.0)}, noise=noise)
    assert decision.revert == ("events",) and decision.keep == ()
    paper = evaluate_round(round_, {"events": 5984.0}, 1.0, frozenset(), 8,
                           AutopipelineControlConfig(alpha=1.0, settle_s=0.0, keep_confidence=None))
    assert paper.keep == ("events",)
    clear = evaluate_round(round_, {"events": 7600.0}, 1.0, frozenset(), 8, config,
                           samples_after={"events": (7400.0, 7600.0, 7800.0)}, noise=noise)
    assert clear.keep == ("events",)
