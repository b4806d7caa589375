"""Whether a measured gain beats this run's noise: `NoiseEstimate`, `judge_gain` and its `GainVerdict`.

Every keep-or-revert of a run-time change (the adaptive loop's plan switches, the autopipeliner's
cuts) compares a window of per-batch rates after the change with a window before it. On this
project's 2-core machine one micro-batch's throughput under an unchanged plan spreads by about
±10 % (docs/benchmarks.md), so a rule that keeps any gain, or a fixed 5 %, keeps noise: the
autopipeliner once kept a cut for a 2.6 % rise and ran at 0.77 of the unpipelined graph.

The rule here measures the noise on the run itself: the spread of per-batch rates around their
window's mean, pooled over every window measured under an unchanged plan (in log space, so a
spread is relative: 1,000 against 1,100 records/s is the spread of 10,000 against 11,000). A gain
is kept only beyond the band that noise could give at the stated confidence, one-sided:
`z * sd * sqrt(1/n_before + 1/n_after)` between the two windows' mean log rates. Until the run
has measured a few windows, an assumed spread weighs in as `PRIOR_DEGREES` samples (the same
caution as the thread-level policies' `assumed_noise`). The model's prediction joins the
measurement: a change the model predicts to lose by more than the band must show twice the band.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist, fmean

PRIOR_DEGREES = 2  # an assumed spread counts as two samples' worth of evidence


def _log_rates(rates: Sequence[float]) -> list[float]:
    return [math.log(rate) for rate in rates if isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0]


@dataclass(frozen=True)
class NoiseEstimate:
    """The spread of one batch's rate under an unchanged plan, pooled over this run's windows.

    Attributes:
        squares: sum of squared deviations of log rates from their window's mean.
        degrees: degrees of freedom behind it (a window of n usable rates adds n - 1).
    """

    squares: float = 0.0
    degrees: int = 0

    def with_window(self, rates: Sequence[float]) -> NoiseEstimate:
        """This estimate with one more window of rates measured under one unchanged plan."""
        logs = _log_rates(rates)
        if len(logs) < 2:
            return self
        center = fmean(logs)
        return NoiseEstimate(self.squares + sum((value - center) ** 2 for value in logs),
                             self.degrees + len(logs) - 1)

    @property
    def relative_sd(self) -> float | None:
        """The measured spread alone (a log-space standard deviation, 0.1 ~ 10 %), None before any."""
        return math.sqrt(self.squares / self.degrees) if self.degrees else None

    def spread(self, assumed_sd: float) -> float:
        """The spread to judge with: the measured one, with `assumed_sd` weighing as PRIOR_DEGREES samples."""
        return math.sqrt((self.squares + PRIOR_DEGREES * assumed_sd ** 2) / (self.degrees + PRIOR_DEGREES))

    def describe(self, assumed_sd: float) -> str:
        if not self.degrees:
            return f"batch spread {assumed_sd:.1%} assumed, none measured yet"
        return (f"batch spread {self.relative_sd:.1%} over {self.degrees} degrees of freedom,"
                f" {self.spread(assumed_sd):.1%} with {assumed_sd:.0%} assumed")


@dataclass(frozen=True)
class GainVerdict:
    """Keep the change or not, the measured gain, the band noise could give, and why."""

    keep: bool
    gain: float  # after / before - 1, from the windows' mean log rates
    band: float  # the relative gain noise could give at the confidence
    reason: str


def noise_band(spread: float, before: int, after: int, confidence: float) -> float:
    """The relative gain between two windows of `before` and `after` batches that noise of
    `spread` exceeds with probability 1 - `confidence` (one-sided)."""
    if before < 1 or after < 1:
        raise ValueError(f"need at least one rate on each side, got {before} and {after}")
    z = NormalDist().inv_cdf(confidence)
    return math.expm1(z * spread * math.sqrt(1 / before + 1 / after))


def judge_gain(before: Sequence[float], after: Sequence[float], noise: NoiseEstimate, *, confidence: float,
               assumed_sd: float, predicted_gain: float | None = None, min_gain: float = 0.0,
               unit: str = "/s") -> GainVerdict:
    """Keep a change whose windows of rates show a gain beyond the noise (see the module docstring).

    `predicted_gain`: what the model expected (relative, None: no prediction); `min_gain`: a floor
    under the band (0: the band alone)."""
    if not 0.5 <= confidence < 1:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence}")
    before_logs, after_logs = _log_rates(before), _log_rates(after)
    if not before_logs or not after_logs:
        raise ValueError("need at least one usable rate before and after the change")
    gain = _relative(fmean(after_logs) - fmean(before_logs))
    spread = noise.spread(assumed_sd)
    band = noise_band(spread, len(before_logs), len(after_logs), confidence)
    bar = max(band, min_gain)
    predicted_loss = predicted_gain is not None and predicted_gain < -band
    if predicted_loss:
        bar *= 2
    figures = (f"measured {gain:+.0%} ({_rate(math.exp(fmean(before_logs)))} -> {_rate(math.exp(fmean(after_logs)))}"
               f"{unit}, {len(before_logs)} batches before, {len(after_logs)} after)")
    noise_text = f"the {band:+.1%} noise could give at {confidence:.0%} confidence ({noise.describe(assumed_sd)})"
    if predicted_loss:
        noise_text = f"twice {noise_text}, as the model predicted {predicted_gain:+.0%}"
    elif min_gain > band:
        noise_text = f"the {min_gain:.0%} asked (above {noise_text})"
    if gain > bar:
        return GainVerdict(True, gain, band, f"{figures}, beyond {noise_text}")
    return GainVerdict(False, gain, band, f"{figures}, within {noise_text}")


def _relative(log_ratio: float) -> float:
    """exp(log_ratio) - 1, infinite where a ratio of rates is beyond a float (a rate of 1e-313)."""
    return math.expm1(log_ratio) if log_ratio < 700 else math.inf


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
