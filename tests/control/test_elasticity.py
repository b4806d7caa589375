"""Thread-level policies: the papers' rules as written, their shortfalls, and the improvements."""

from __future__ import annotations

import logging
import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fissure.cli.elastic_sim_curves import (
    CurvePhase,
    plateau_curve,
    random_workload_spec,
    replay_curves,
    rise_peak_fall_curve,
    rise_plateau_fall_curve,
    settled_level,
    tent_curve,
)
from fissure.control.thread_level.config import ElasticityConfig, POLICY_NAMES
from fissure.control.thread_level.decisions import (
    PeriodMeasurement,
    ThreadLevelDecision,
    geometric_ladder,
    trend_threshold,
)
from fissure.control.thread_level.policies import ElasticOperatorPolicy, TrustTrendPolicy, make_policy
from fissure.control.thread_level.verdict import ThreadingVerdict, threading_verdict

AS_WRITTEN = ElasticityConfig.as_written(max_threads=32)
IMPROVED = ElasticityConfig(max_threads=32)


def feed(policy, rates_by_level, periods: int) -> list[int]:
    """Noise-free periods against a curve; the level in force in each."""
    phase = CurvePhase(periods=periods, throughput_per_s=tuple(rates_by_level))
    return list(replay_curves(policy, [phase], noise=0.0, seed=0)[0])


def share_of_best(curve, level: int) -> float:
    return curve[level - 1] / max(curve)


def settled_as_sens_allows(curve, level: int, noise: float) -> bool:
    """Within 5 % of the best level, or below it by no more than SENS asks of more threads: a
    climb must gain the trend threshold (SENS per doubling) plus the noise of two means, so a
    best level that gains less than that over a lower one is rightly not worth its threads
    (e.g. levels 1 and 2 at 866 and 913/s: +5.4 % for twice the threads)."""
    best_level = max(range(1, len(curve) + 1), key=lambda candidate: curve[candidate - 1])
    if share_of_best(curve, level) >= 0.95:
        return True
    gain = curve[best_level - 1] / curve[level - 1] - 1
    threshold = trend_threshold(IMPROVED, level, best_level, IMPROVED.sensitivity)
    return level < best_level and gain <= threshold + 2 * math.sqrt(2) * noise


# A curve with big steps: both papers' rules work as intended on it.
STEEP = [100, 200, 290, 330, 340, 300, 250, 200] + [150] * 24


class TestConfig:
    @pytest.mark.parametrize(
        "field, value",
        [
            ("min_threads", 0),
            ("max_threads", 0),
            ("period_s", 0),
            ("sensitivity", 1.5),
            ("cpu_usage_limit", 0),
            ("ladder_ratio", 0.5),
            ("coarse_scan_ratio", 1.0),
            ("load_change_scan_span", 1.0),
            ("smoothing_window", 0),
            ("trust_horizon_periods", 0),
            ("trend_noise_z", -1),
            ("decrease_guard_margin", 1.0),
            ("settle_noise_z", -1),
            ("probe_interval_periods", 0),
            ("probe_samples", 0),
            ("load_change_window", 1),
        ],
    )
    def test_rejects_out_of_range_values_naming_the_field(self, field, value):
        with pytest.raises(ValueError, match=field.split("_")[0]):
            ElasticityConfig(**{field: value})

    def test_as_written_turns_every_improvement_off(self):
        paper = ElasticityConfig.as_written()
        assert (paper.ladder_ratio, paper.smoothing_window, paper.load_change_confirmations) == (1.0, 1, 1)
        assert not paper.sensitivity_per_doubling and not paper.refine and not paper.elastic_operator_load_change
        assert paper.trust_horizon_periods is None and paper.coarse_scan_ratio is None
        assert paper.load_change_scan_span is None
        assert paper.decrease_guard_margin is None and paper.trend_noise_z == 0 and paper.load_change_noise_z == 0
        assert paper.sensitivity == 0.05  # SENS of the Streams paper
        assert not paper.settle and paper.load_change_window is None and paper.refine_samples == 1

    def test_make_policy_names_the_choices_for_an_unknown_name(self):
        with pytest.raises(ValueError, match="trust-trend, elastic-operator"):
            make_policy("greedy")


class TestHelpers:
    @given(st.integers(1, 8), st.integers(0, 64), st.floats(1.0, 3.0))
    def test_ladder_climbs_from_min_to_max_by_at_most_the_ratio(self, low, extra, ratio):
        high = low + extra
        rungs = geometric_ladder(low, high, ratio)
        assert rungs[0] == low and rungs[-1] == high
        for lower, upper in zip(rungs, rungs[1:]):
            assert lower < upper <= max(lower + 1, round(lower * ratio))

    def test_ladder_of_ratio_one_is_every_level(self):
        assert geometric_ladder(1, 6, 1.0) == (1, 2, 3, 4, 5, 6)

    def test_trend_threshold_is_sens_per_doubling(self):
        assert trend_threshold(IMPROVED, 10, 20, 0.05) == pytest.approx(0.05)
        assert trend_threshold(IMPROVED, 10, 40, 0.05) == pytest.approx(1.05**2 - 1)
        assert trend_threshold(IMPROVED, 20, 21, 0.05) < 0.004
        assert trend_threshold(AS_WRITTEN, 20, 21, 0.05) == 0.05

    def test_settled_level_is_the_mode_of_the_last_quarter_ties_to_the_latest(self):
        assert settled_level([1, 2, 3, 4, 9, 9, 9, 9, 5, 5, 5, 9]) == 5
        assert settled_level([7, 7, 7, 7, 3, 4, 4, 3]) == 3


class TestTrustTrendAsWritten:
    def test_first_decision_is_rule_3_at_level_one(self):
        policy = TrustTrendPolicy(AS_WRITTEN)
        decision = policy.decide(PeriodMeasurement(now_s=10.0, throughput_per_s=100.0))
        assert decision == ThreadLevelDecision(
            level=2, previous_level=1, now_s=10.0, reason="increase: lowest level, nothing trusted above"
        )

    def test_climbs_while_trending_then_settles_below_the_first_step_without_a_trend(self):
        # 4 -> 5 gains 3 % (< SENS), so rule 5 takes it back to 4, where it stays (rule 6).
        levels = feed(TrustTrendPolicy(AS_WRITTEN), STEEP, 12)
        assert levels == [1, 2, 3, 4, 5, 4, 4, 4, 4, 4, 4, 4]

    def test_stops_short_on_linear_scaling_where_one_more_thread_gains_under_five_percent(self):
        linear = [100.0 * level for level in range(1, 33)]
        as_written = feed(TrustTrendPolicy(AS_WRITTEN), linear, 60)
        improved = feed(TrustTrendPolicy(IMPROVED), linear, 60)
        assert settled_level(as_written) == 20  # 21 / 20 - 1 = 5 % is not > SENS
        assert settled_level(improved) == 32

    def test_a_change_in_load_untrusts_everything_and_the_search_starts_again(self):
        policy = TrustTrendPolicy(AS_WRITTEN)
        feed(policy, STEEP, 12)
        decision = policy.decide(PeriodMeasurement(now_s=13.0, throughput_per_s=165.0))  # 330 -> 165 at level 4
        assert decision.reason == "load changed, all data untrusted; decrease: nothing trusted below"
        assert decision.level == 3
        assert [record.level for record in policy.records() if record.trusted] == [4]

    def test_cpu_check_refuses_an_increase(self):
        policy = TrustTrendPolicy(AS_WRITTEN)
        decision = policy.decide(PeriodMeasurement(now_s=1.0, throughput_per_s=100.0, cpu_usage=0.95))
        assert decision == ThreadLevelDecision.hold(1, 1.0, "hold: increase refused, CPU usage 95%")
        assert policy.decide(PeriodMeasurement(now_s=2.0, throughput_per_s=100.0, cpu_usage=0.5)).level == 2


class TestElasticOperatorAsWritten:
    def test_climbs_while_the_peak_improves_and_stays_at_the_first_level_without_gain(self):
        # 4 -> 5 gains 3 % (< TOLERANCE): stable from below at 5.
        levels = feed(ElasticOperatorPolicy(AS_WRITTEN), STEEP, 10)
        assert levels == [1, 2, 3, 4, 5, 5, 5, 5, 5, 5]

    def test_busy_system_decreases_and_the_peaking_state_checks_the_lower_level(self):
        policy = ElasticOperatorPolicy(AS_WRITTEN)
        feed(policy, STEEP, 6)
        busy = policy.decide(PeriodMeasurement(now_s=7.0, throughput_per_s=250.0))  # far below peak 340
        assert (busy.level, busy.reason) == (4, "busy system: decrease and check (peaking)")
        better = policy.decide(PeriodMeasurement(now_s=8.0, throughput_per_s=310.0))  # 310 >= last at 5
        assert (better.level, better.reason) == (4, "peaking: level 4 did at least as well; stay")

    def test_peaking_goes_back_up_when_the_lower_level_did_worse(self):
        policy = ElasticOperatorPolicy(AS_WRITTEN)
        feed(policy, STEEP, 6)
        policy.decide(PeriodMeasurement(now_s=7.0, throughput_per_s=250.0))
        worse = policy.decide(PeriodMeasurement(now_s=8.0, throughput_per_s=240.0))
        assert (worse.level, worse.reason) == (5, "peaking: level 4 did worse than 5; back up")

    def test_peak_decays_when_not_reached_and_a_big_gain_invalidates_the_peaks_above(self):
        policy = ElasticOperatorPolicy(AS_WRITTEN)
        feed(policy, STEEP, 5)  # measured 1..5 once each, now at 5 with peak 340
        policy.decide(PeriodMeasurement(now_s=7.0, throughput_per_s=330.0))  # 3 % under the peak: decay
        peak_at_5 = policy.records()[4].peak_per_s
        assert peak_at_5 == pytest.approx(340 * (1 - AS_WRITTEN.decay_rate))
        policy._level = 3  # noqa: SLF001 - put the policy at 3 to show invalidation above it
        policy.decide(PeriodMeasurement(now_s=8.0, throughput_per_s=400.0))  # 290 -> 400 at level 3
        assert [record.peak_per_s is None for record in policy.records()[3:5]] == [True, True]


class TestMeasurementsThatMeanNoChange:
    @pytest.mark.parametrize("policy_name", POLICY_NAMES)
    @pytest.mark.parametrize("value", [None, math.nan, math.inf, -5.0])
    def test_missing_or_broken_throughput_holds_and_logs(self, policy_name, value, caplog):
        policy = make_policy(policy_name, IMPROVED)
        with caplog.at_level(logging.INFO, logger="fissure.control.thread_level"):
            decision = policy.decide(PeriodMeasurement(now_s=3.0, throughput_per_s=value))
        assert decision == ThreadLevelDecision.hold(1, 3.0, "no usable throughput measurement: no change")
        assert "no usable throughput" in caplog.text

    @pytest.mark.parametrize("policy_name", POLICY_NAMES)
    def test_a_level_not_yet_in_force_holds(self, policy_name):
        policy = make_policy(policy_name, IMPROVED)
        decision = policy.decide(PeriodMeasurement(now_s=1.0, throughput_per_s=50.0, level_in_force=3))
        assert decision == ThreadLevelDecision.hold(
            1, 1.0, "level 1 not in force yet (3 threads active): no change"
        )


measurements = st.builds(
    PeriodMeasurement,
    now_s=st.floats(0, 1e6),
    throughput_per_s=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.floats(0, 1e7)),
    cpu_usage=st.one_of(st.none(), st.floats(0, 1), st.just(math.nan)),
)


class TestProperties:
    @settings(max_examples=60, deadline=None)
    @given(
        st.sampled_from(POLICY_NAMES),
        st.booleans(),
        st.integers(1, 4),
        st.integers(0, 40),
        st.lists(measurements, max_size=80),
    )
    def test_decisions_stay_in_range_and_broken_measurements_change_nothing(
        self, policy_name, as_written, min_threads, extra_levels, stream
    ):
        base = AS_WRITTEN if as_written else IMPROVED
        config = base.with_levels(min_threads, min_threads + extra_levels)
        policy = make_policy(policy_name, config)
        for measurement in stream:
            before = policy.level
            decision = policy.decide(measurement)
            assert config.min_threads <= decision.level <= config.max_threads
            assert decision.level == policy.level and decision.previous_level == before
            assert decision.reason
            value = measurement.throughput_per_s
            if value is None or not math.isfinite(value) or value < 0:
                assert decision.level == before

    @settings(max_examples=25, deadline=None)
    @given(st.sampled_from(POLICY_NAMES), st.integers(0, 10_000), st.integers(-6, 6))
    def test_only_relative_throughput_matters(self, policy_name, seed, power_of_two):
        # Scaling every rate by 2**k is exact in floating point: the decisions must not change.
        spec = random_workload_spec(seed)
        phases = [CurvePhase(phase["periods"], tuple(phase["throughput"])) for phase in spec["phases"]]
        scaled = [CurvePhase(p.periods, tuple(rate * 2.0**power_of_two for rate in p.throughput_per_s)) for p in phases]
        original = replay_curves(make_policy(policy_name, IMPROVED), phases, spec["noise"], seed)
        assert replay_curves(make_policy(policy_name, IMPROVED), scaled, spec["noise"], seed) == original

    @settings(max_examples=40, deadline=None)
    @given(
        st.sampled_from(POLICY_NAMES),
        st.floats(1, 32),
        st.floats(0.5, 3),
        st.integers(1, 32),
        st.integers(0, 10_000),
    )
    def test_settles_within_five_percent_on_a_bump_then_a_plateau(self, policy_name, peak, sharpness, knee, seed):
        bump = rise_peak_fall_curve(32, peak, sharpness, 1000.0)
        flat_top = plateau_curve(32, knee, 40.0)
        phases = [CurvePhase(120, bump), CurvePhase(120, flat_top)]
        levels = replay_curves(make_policy(policy_name, IMPROVED), phases, noise=0.02, seed=seed)
        assert settled_as_sens_allows(bump, settled_level(levels[0]), noise=0.02)
        assert settled_as_sens_allows(flat_top, settled_level(levels[1]), noise=0.02)


class TestSyntheticCurvesWithFakeClock:
    """Improved policies against the curve shapes of docs/elastic-scheduler.md, 120 periods per phase, noise 0.02."""

    @pytest.mark.parametrize("policy_name", POLICY_NAMES)
    @pytest.mark.parametrize("peak", [1, 3, 12, 27, 32])
    def test_rise_peak_fall(self, policy_name, peak):
        curve = tent_curve(32, peak, base_share=0.1, fall_per_level=0.05, peak_rate=5000.0)
        levels = replay_curves(make_policy(policy_name, IMPROVED), [CurvePhase(120, curve)], 0.02, seed=peak)[0]
        assert share_of_best(curve, settled_level(levels)) >= 0.95

    @pytest.mark.parametrize("policy_name", POLICY_NAMES)
    @pytest.mark.parametrize("knee", [2, 10, 25])
    def test_plateau_settles_on_the_plateau(self, policy_name, knee):
        curve = plateau_curve(32, knee, 300.0)
        levels = replay_curves(make_policy(policy_name, IMPROVED), [CurvePhase(120, curve)], 0.02, seed=knee)[0]
        assert settled_level(levels) >= knee

    @pytest.mark.parametrize("policy_name", POLICY_NAMES)
    def test_settles_again_after_a_load_change(self, policy_name):
        fast_service = rise_peak_fall_curve(32, 6, 2.0, 3000.0)
        slow_service = rise_peak_fall_curve(32, 20, 2.0, 1800.0)
        phases = [CurvePhase(120, fast_service), CurvePhase(120, slow_service), CurvePhase(120, fast_service)]
        levels = replay_curves(make_policy(policy_name, IMPROVED), phases, 0.02, seed=11)
        for phase, phase_levels in zip(phases, levels):
            assert share_of_best(phase.throughput_per_s, settled_level(phase_levels)) >= 0.95

    def test_as_written_falls_short_where_the_improved_policy_does_not(self):
        curve = rise_peak_fall_curve(32, 24, 1.0, 1000.0)  # a slow rise to a peak at 24
        phase = [CurvePhase(120, curve)]
        for policy_name in POLICY_NAMES:
            paper = replay_curves(make_policy(policy_name, AS_WRITTEN), phase, 0.02, seed=5)[0]
            improved = replay_curves(make_policy(policy_name, IMPROVED), phase, 0.02, seed=5)[0]
            assert share_of_best(curve, settled_level(paper)) < 0.95 <= share_of_best(curve, settled_level(improved))


# The benchmark's enrichment operator, as a curve: the service serves 16 requests at once (best
# plateau 14..18), then answers slower (best plateau 20..24, lower rates); 0.5 s periods on this
# machine vary by about +-12 % at a fixed level.
FAST_SERVICE = rise_plateau_fall_curve(32, 14, 18, 0.04, 4000.0)
SLOW_SERVICE = rise_plateau_fall_curve(32, 20, 24, 0.03, 2800.0)
REALISTIC_NOISE = 0.12


def last_quarter(levels):
    return levels[-max(1, len(levels) // 4) :]


def moves(levels) -> int:
    return sum(before != after for before, after in zip(levels, levels[1:]))


class TestUnderRealisticNoise:
    """Improvement 10 (the settled state): +-12 % per period, a flat top, a change in load."""

    @staticmethod
    def outcomes(policy_name: str, config: ElasticityConfig, seeds=range(20)):
        phases = [CurvePhase(90, FAST_SERVICE), CurvePhase(90, SLOW_SERVICE)]
        shares, tail_shares, tail_moves = [], [], []
        for seed in seeds:
            levels = replay_curves(make_policy(policy_name, config), phases, REALISTIC_NOISE, seed)
            for phase, phase_levels in zip(phases, levels):
                curve = phase.throughput_per_s
                shares.append(share_of_best(curve, settled_level(phase_levels)))
                tail = last_quarter(phase_levels)
                tail_shares.append(statistics.mean(curve[level - 1] for level in tail) / max(curve))
                tail_moves.append(moves(tail))
        return shares, tail_shares, tail_moves

    @pytest.mark.parametrize("policy_name", POLICY_NAMES)
    def test_settles_within_five_percent_and_again_after_the_load_change(self, policy_name):
        shares, tail_shares, _ = self.outcomes(policy_name, IMPROVED)
        assert sum(share >= 0.95 for share in shares) >= 38, shares  # 40 phases: 20 seeds x 2
        # What the settled quarter really delivers, probes included (true rates, not noisy ones).
        assert statistics.mean(tail_shares) >= 0.98

    @pytest.mark.parametrize("policy_name", POLICY_NAMES)
    def test_stays_settled_moving_far_less_than_without_the_settled_state(self, policy_name):
        _, _, settled_moves = self.outcomes(policy_name, IMPROVED)
        _, _, roaming_moves = self.outcomes(policy_name, ElasticityConfig(max_threads=32, settle=False))
        assert statistics.median(settled_moves) <= 1  # a probe there and back at most, mostly none
        assert statistics.mean(settled_moves) * 2 <= statistics.mean(roaming_moves)

    @pytest.mark.parametrize("policy_name", POLICY_NAMES)
    def test_a_drop_of_a_third_at_the_settled_level_is_found_within_a_dozen_periods(self, policy_name):
        # Single samples do not show it (2.5 standard errors of 12 % noise is 30 %); a mean of four does.
        found = 0
        for seed in range(10):
            policy = make_policy(policy_name, IMPROVED)
            replay_curves(policy, [CurvePhase(90, FAST_SERVICE)], REALISTIC_NOISE, seed)
            slower = [rate * 0.67 for rate in FAST_SERVICE]
            draws = random.Random(1000 + seed)
            for period in range(12):
                rate = slower[policy.level - 1] * (1 + REALISTIC_NOISE * draws.gauss(0.0, 1.0))
                decision = policy.decide(PeriodMeasurement(now_s=1000.0 + period, throughput_per_s=rate))
                if "load changed" in decision.reason:
                    found += 1
                    break
        assert found >= 9


class TestSettledState:
    """Noise-free, so that each step is exact."""

    @staticmethod
    def run(policy, curve, periods: int) -> list[ThreadLevelDecision]:
        decisions = []
        for period in range(1, periods + 1):
            rate = curve[policy.level - 1]
            decisions.append(policy.decide(PeriodMeasurement(now_s=float(period), throughput_per_s=rate)))
        return decisions

    def test_the_refinement_settles_then_probes_alternate_sides_and_back_off_exponentially(self):
        curve = tent_curve(32, 8, base_share=0.1, fall_per_level=0.05, peak_rate=1000.0)
        decisions = self.run(TrustTrendPolicy(IMPROVED), curve, 140)
        settle = next(index for index, decision in enumerate(decisions) if "refine: settle" in decision.reason)
        assert decisions[settle].level == 8
        after = decisions[settle + 1 :]
        probes = [decision.level for decision in after if ": probe level" in decision.reason]
        assert probes == [10, 6, 10, 6]  # the rungs around 8, alternating
        returns = [decision.reason for decision in after if "next probe in" in decision.reason]
        backoffs = [reason.rsplit("next probe in ", 1)[1] for reason in returns]
        assert backoffs == ["16 periods", "32 periods", "32 periods", "32 periods"]  # doubling, capped
        assert all("no gain" in reason for reason in returns)
        assert sum(decision.changed for decision in after) == 8  # four probes, there and back

    @pytest.mark.parametrize("policy_name", POLICY_NAMES)
    def test_a_neighbour_that_became_better_is_found_by_a_probe_and_settled_on(self, policy_name):
        # The settled level's own rate stays: only a probe can see the change.
        policy = make_policy(policy_name, IMPROVED)
        curve = tent_curve(32, 8, base_share=0.1, fall_per_level=0.05, peak_rate=1000.0)
        self.run(policy, curve, 40)
        assert policy.level == 8
        better_above = list(curve)
        better_above[9] = 1300.0  # level 10, the rung above, now 30 % better than 8
        decisions = self.run(policy, better_above, 120)
        at_ten = next(decision for decision in decisions if decision.previous_level == 10)
        assert at_ten.reason == "settled: level 10 departs from its record; measure again"
        assert any("load changed" in decision.reason for decision in decisions)
        assert policy.level == 10 and decisions[-1].reason.startswith("settled at level 10")


class TestLocalRescan:
    """Improvement 11: the first epoch scans the whole range; after a change in load only the
    levels around the one in force are scanned, and the rules go on from the best of them."""

    @staticmethod
    def scanned(decisions) -> list[int]:
        return [d.level for d in decisions if ": measure level" in d.reason and "refine" not in d.reason]

    @pytest.mark.parametrize("policy_name", POLICY_NAMES)
    def test_after_a_change_in_load_the_scan_stays_near_the_level_in_force(self, policy_name):
        policy = make_policy(policy_name, IMPROVED)
        curve = tent_curve(32, 16, base_share=0.1, fall_per_level=0.02, peak_rate=1000.0)
        first = TestSettledState.run(policy, curve, 60)
        assert self.scanned(first)[:3] == [2, 3, 5]  # the whole range at the start
        held = policy.level
        assert 12 <= held <= 20
        lower = [rate * 0.6 for rate in curve]  # every level 40 % slower: a change in load
        after = TestSettledState.run(policy, lower, 90)
        change = next(index for index, d in enumerate(after) if "load changed" in d.reason)
        rescan = self.scanned(after[change:change + 6])
        assert rescan and all(held / 2 <= level <= held * 2 for level in rescan), rescan
        assert "scan around level" in after[change].reason
        assert policy.level in range(14, 19)  # found the best again (16, within the 2 % steps)

    def test_a_best_that_moved_far_is_still_reached_by_the_rules(self):
        policy = make_policy("trust-trend", IMPROVED)
        TestSettledState.run(policy, tent_curve(32, 24, base_share=0.1, fall_per_level=0.04, peak_rate=1000.0), 60)
        assert policy.level >= 20
        moved = tent_curve(32, 4, base_share=0.1, fall_per_level=0.04, peak_rate=700.0)
        TestSettledState.run(policy, moved, 100)
        assert share_of_best(moved, policy.level) >= 0.95, policy.level

    @pytest.mark.parametrize("policy_name", POLICY_NAMES)
    def test_a_rescan_that_lands_on_a_flat_floor_widens_until_it_finds_the_slope(self, policy_name):
        # Settled high up; then the service collapses above 12 threads (the same low rate at every
        # level from 13 on) and peaks at 5: around the old level nothing has a slope to follow.
        policy = make_policy(policy_name, IMPROVED)
        TestSettledState.run(policy, plateau_curve(32, 28, rate_per_thread=40.0), 70)
        assert policy.level >= 24
        collapsed = [418, 554, 690, 826, 962, 854, 747, 639, 531, 424, 316, 208] + [48.0] * 20
        decisions = TestSettledState.run(policy, collapsed, 90)
        assert any("not clearly below it" in decision.reason for decision in decisions)
        assert share_of_best(collapsed, policy.level) >= 0.95, policy.level

    def test_the_scan_climbs_no_higher_once_the_cpu_is_busy(self):
        # Two cores: GIL-free work keeps them busy from two threads on; more threads only cost.
        policy = make_policy("trust-trend", IMPROVED)
        curve = [500.0, 1000.0, 1000.0] + [900.0] * 29
        decisions = []
        for period in range(1, 12):
            level = policy.level
            usage = min(1.0, 0.48 * level)
            decisions.append(policy.decide(PeriodMeasurement(now_s=float(period), throughput_per_s=curve[level - 1],
                                                             cpu_usage=usage)))
        assert max(decision.level for decision in decisions) <= 2, [d.level for d in decisions]
        assert "scan no higher than level 2" in decisions[1].reason

    def test_off_rescans_the_whole_range(self):
        policy = make_policy("trust-trend", ElasticityConfig(max_threads=32, load_change_scan_span=None))
        curve = tent_curve(32, 16, base_share=0.1, fall_per_level=0.02, peak_rate=1000.0)
        TestSettledState.run(policy, curve, 60)
        after = TestSettledState.run(policy, [rate * 0.6 for rate in curve], 60)
        change = next(index for index, d in enumerate(after) if "load changed" in d.reason)
        assert 1 in [d.level for d in after[change:change + 8]]


class TestThreadingVerdict:
    def test_a_declaration_decides(self):
        assert threading_verdict("lookup", declared_io_bound=True) == ThreadingVerdict(
            True, "operator 'lookup' is declared I/O-bound"
        )
        assert threading_verdict("fft", declared_releases_gil=True).run_threaded

    def test_wall_time_far_above_cpu_time_means_waiting(self):
        assert threading_verdict("lookup", wall_time_s=2.0, cpu_time_s=0.1).run_threaded
        verdict = threading_verdict("parse", wall_time_s=1.0, cpu_time_s=0.9)
        assert not verdict.run_threaded and "CPU-bound" in verdict.reason

    @pytest.mark.parametrize("wall, cpu", [(None, 0.1), (math.nan, 0.1), (1.0, None), (0.0, 0.0)])
    def test_no_profile_means_no_threads(self, wall, cpu):
        assert not threading_verdict("x", wall_time_s=wall, cpu_time_s=cpu).run_threaded


def test_the_two_presets_are_the_defaults_and_the_papers_rules():
    assert ElasticityConfig.preset("improved") == ElasticityConfig()
    assert ElasticityConfig.preset("as-written", max_threads=8) == ElasticityConfig.as_written(max_threads=8)
    assert ElasticityConfig.preset("as-written").refine is False and ElasticityConfig().refine is True
    with pytest.raises(ValueError, match="unknown thread-level preset 'fast'"):
        ElasticityConfig.preset("fast")
