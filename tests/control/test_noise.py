"""The noise rule behind every keep-or-revert of a run-time change (fissure.control.noise)."""

from __future__ import annotations

import math
import random

import pytest

from fissure.control.noise import GainVerdict, NoiseEstimate, judge_gain, noise_band


def test_a_window_adds_its_spread_around_its_own_mean():
    # Two windows at different levels: only the spread inside each counts, not the step between.
    noise = NoiseEstimate().with_window([100.0, 100.0]).with_window([200.0, 200.0 * math.e ** 0.2])
    assert noise.degrees == 2
    assert noise.relative_sd == pytest.approx(math.sqrt(2 * 0.1 ** 2 / 2))
    assert NoiseEstimate().with_window([5.0]) == NoiseEstimate()  # one rate has no spread
    assert NoiseEstimate().with_window([5.0, float("nan"), -1.0]) == NoiseEstimate()


def test_until_the_run_measures_its_noise_the_assumed_spread_decides():
    assert NoiseEstimate().spread(0.1) == pytest.approx(0.1)
    quiet = NoiseEstimate().with_window([1000.0] * 21)  # 20 degrees of freedom at no spread
    assert quiet.spread(0.1) == pytest.approx(math.sqrt(2 * 0.01 / 22))


def test_the_band_narrows_with_more_batches_and_widens_with_confidence():
    assert noise_band(0.1, 4, 4, 0.9) > noise_band(0.1, 16, 16, 0.9)
    assert noise_band(0.1, 4, 4, 0.95) > noise_band(0.1, 4, 4, 0.9)
    assert noise_band(0.1, 4, 4, 0.9) == pytest.approx(math.expm1(1.2815516 * 0.1 * math.sqrt(0.5)), rel=1e-6)
    with pytest.raises(ValueError, match="at least one rate"):
        noise_band(0.1, 0, 4, 0.9)


def test_a_gain_inside_the_band_is_not_kept_and_one_beyond_it_is():
    # The autopipeliner's case: +2.6 % on a run whose batches spread by about 10 %.
    noisy = NoiseEstimate().with_window([5300.0, 5830.0, 6400.0, 5830.0])
    within = judge_gain([5830.0] * 3, [5984.0] * 3, noisy, confidence=0.9, assumed_sd=0.1)
    assert within == GainVerdict(
        False, pytest.approx(0.0264, abs=1e-4), pytest.approx(within.band),
        "measured +3% (5,830 -> 5,984/s, 3 batches before, 3 after), within the"
        f" +{within.band:.1%} noise could give at 90% confidence (batch spread 7.7% over 3 degrees of freedom,"
        " 8.7% with 10% assumed)")
    assert within.band > 0.026
    beyond = judge_gain([5830.0] * 3, [6800.0] * 3, noisy, confidence=0.9, assumed_sd=0.1)
    assert beyond.keep and beyond.reason.startswith("measured +17% (5,830 -> 6,800/s")


def test_the_model_predicting_a_loss_doubles_the_bar():
    quiet = NoiseEstimate().with_window([1000.0] * 21)
    args = dict(confidence=0.9, assumed_sd=0.1)
    plain = judge_gain([1000.0] * 4, [1040.0] * 4, quiet, **args)
    doubted = judge_gain([1000.0] * 4, [1040.0] * 4, quiet, predicted_gain=-0.3, **args)
    assert plain.keep and not doubted.keep
    assert plain.band == doubted.band < 0.04 < 2 * doubted.band
    assert "as the model predicted -30%" in doubted.reason
    # A predicted gain, or a loss inside the band, changes nothing.
    assert judge_gain([1000.0] * 4, [1040.0] * 4, quiet, predicted_gain=-0.01, **args).keep


def test_a_floor_above_the_band_is_asked_and_said():
    quiet = NoiseEstimate().with_window([1000.0] * 41)
    verdict = judge_gain([1000.0] * 8, [1040.0] * 8, quiet, confidence=0.9, assumed_sd=0.1, min_gain=0.05)
    assert not verdict.keep and "the 5% asked (above the" in verdict.reason


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="confidence"):
        judge_gain([1.0], [1.0], NoiseEstimate(), confidence=1.0, assumed_sd=0.1)
    with pytest.raises(ValueError, match="usable rate"):
        judge_gain([float("nan")], [1.0], NoiseEstimate(), confidence=0.9, assumed_sd=0.1)


def test_on_pure_noise_few_changes_are_kept():
    # No real change, 10 % noise: at 90 % confidence about one in ten noise-only comparisons may pass.
    rng = random.Random(7)
    noise = NoiseEstimate()
    for _ in range(5):
        noise = noise.with_window([1000.0 * math.exp(rng.gauss(0, 0.1)) for _ in range(5)])
    kept = sum(judge_gain([1000.0 * math.exp(rng.gauss(0, 0.1)) for _ in range(5)],
                          [1000.0 * math.exp(rng.gauss(0, 0.1)) for _ in range(5)], noise,
                          confidence=0.9, assumed_sd=0.1).keep for _ in range(400))
    assert kept < 400 * 0.16
