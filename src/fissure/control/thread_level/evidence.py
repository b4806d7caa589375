"""What a thread-level policy's measurements say (`LevelEvidence`, a base of PolicyBase): a
level's throughput and its neighbour-smoothed value, this run's noise per sample, whether one
level beats another by more than a threshold and the noise (significantly on the samples,
confidently on the means), a trend between two levels, and a change in load at the level in force.
The policies' decisions rest on these judgments; the judgments decide nothing themselves.
"""

from __future__ import annotations

import math
from collections import deque

from fissure.control.thread_level.config import ElasticityConfig
from fissure.control.thread_level.decisions import relative_gain, trend_threshold
from fissure.control.thread_level.ladder import LevelSamples


class LevelEvidence:
    """The statistics over a policy's per-level records. The policy holds the state they read:
    `config`, the level in force (`_level`), the records per level (`_records`), the per-sample
    noise estimates (`_noise_samples`) and the runs of deviating samples per level (`_deviations`)."""

    config: ElasticityConfig
    _level: int
    _records: dict[int, LevelSamples]
    _noise_samples: deque[float]
    _deviations: dict[int, list[float]]

    def _value(self, level: int) -> float:
        return self._records[level].throughput

    def _smoothed_value(self, level: int) -> float:
        """The level's mean with its measured next-door levels' means at half weight (each
        counted with no more samples than the level itself has): a curve of throughput by level
        is smooth, so neighbours carry information, and a level at the edge of a plateau is not
        chosen for one lucky run."""
        own = self._records[level]
        weight_sum, total = 0.0, 0.0
        for other_level, share in ((level - 1, 0.5), (level, 1.0), (level + 1, 0.5)):
            record = self._records.get(other_level)
            if record is None or not record.trusted or not record.recent:
                continue
            weight = share * min(len(record.recent), max(1, len(own.recent)))
            weight_sum += weight
            total += weight * record.throughput
        return total / weight_sum if weight_sum else own.throughput

    def _noise(self) -> float:
        """Relative noise of one sample (improvement 4), robust: the median of the per-sample
        estimates `_note_noise` keeps, which a change in load (a few large deviations) does not
        throw. `assumed_noise` weighs as two samples."""
        prior_weight = 2.0
        estimates = sorted(self._noise_samples)
        if not estimates:
            return self.config.assumed_noise
        robust = estimates[len(estimates) // 2]
        return math.sqrt(
            (prior_weight * self.config.assumed_noise**2 + len(estimates) * robust**2) / (prior_weight + len(estimates))
        )

    def _note_noise(self, throughput: float) -> None:
        """A sample at a level measured n times before deviates from their mean by sigma x
        sqrt(1 + 1 / n) for noise sigma, and the median of |normal| is 0.6745 of its sigma; so
        every such sample gives an estimate of sigma, not only consecutive periods at one level
        (a scan or a refinement rarely stays two periods at one level)."""
        record = self._records[self._level]
        count = len(record.recent)
        if record.trusted and count and record.throughput > 0:
            deviation = abs(throughput / record.throughput - 1)
            # Capped: one absurd sample (a mean near zero) must not overflow the estimate.
            self._noise_samples.append(min(1.0, deviation / math.sqrt(1 + 1 / count) / 0.6745))

    def _significantly_greater(
        self, lower: float, upper: float, threshold: float, lower_samples: int, upper_samples: int
    ) -> bool:
        """`upper` beats `lower` by more than `threshold` and by more than the noise (improvement 4)."""
        gain = relative_gain(lower, upper)
        if gain <= threshold:
            return False
        if self.config.trend_noise_z == 0:
            return True
        return gain > self.config.trend_noise_z * self._standard_error(lower_samples, upper_samples)

    def _standard_error(self, lower_samples: int, upper_samples: int) -> float:
        """Relative standard error of the difference of two levels' means."""
        return self._noise() * math.sqrt(1 / max(1, lower_samples) + 1 / max(1, upper_samples))

    def _confidently_better(
        self, reference_level: int, level: int, threshold: float, noise_z: float | None = None
    ) -> bool:
        """Improvement 10: `level`'s mean beats `reference_level`'s by more than `threshold` plus
        `settle_noise_z` standard errors, so the true gain very likely exceeds the threshold (a
        one-sided test on the means, not on single samples)."""
        reference, candidate = self._records[reference_level], self._records[level]
        if not (reference.trusted and candidate.trusted):
            return False
        z = self.config.settle_noise_z if noise_z is None else noise_z
        margin = z * self._standard_error(len(reference.recent), len(candidate.recent))
        return relative_gain(reference.throughput, candidate.throughput) > threshold + margin

    def _is_trend(self, lower_level: int, upper_level: int, base: float) -> bool:
        """The measured throughput of upper_level beats lower_level's by a trend (both trusted)."""
        lower, upper = self._records[lower_level], self._records[upper_level]
        if not (lower.trusted and upper.trusted):
            return False
        return self._significantly_greater(
            lower.throughput,
            upper.throughput,
            trend_threshold(self.config, lower_level, upper_level, base),
            len(lower.recent),
            len(upper.recent),
        )

    def _load_changed(self, throughput: float) -> bool:
        """The Streams paper's changeInLoad(), left out of the paper (it cites Gedik et al., TPDS
        2014, Algorithm 3): this period departs from the level's trusted record by more than SENS.
        The reference is the first trusted throughput as written, the smoothed one with
        improvement 3; improvement 5 wants several deviating samples in a row at the level, in one
        direction (per level, so that alternating between two levels cannot hide a change).
        """
        record = self._records[self._level]
        streak = self._deviations.setdefault(self._level, [])
        if not record.trusted:
            streak.clear()
            return False
        reference = record.first_throughput if self.config.smoothing_window == 1 else record.throughput
        deviation = relative_gain(reference, throughput)
        threshold = max(
            self.config.sensitivity,
            self.config.load_change_noise_z * self._noise() * math.sqrt(1 + 1 / len(record.recent)),
        )
        if self._mean_shifted(record, throughput):
            self._deviations.clear()
            return True
        if abs(deviation) <= threshold or (streak and (streak[-1] > 0) != (deviation > 0)):
            streak.clear()
        if abs(deviation) <= threshold:
            return False
        streak.append(deviation)
        if len(streak) < self.config.load_change_confirmations:
            return False
        self._deviations.clear()
        return True

    def _mean_shifted(self, record: LevelSamples, throughput: float) -> bool:
        """Improvement 5: the mean of the level's last `load_change_window` samples (this one
        included) departs from the mean of its earlier samples beyond SENS and the noise."""
        window = self.config.load_change_window
        if window is None or len(record.recent) + 1 < 2 * window:
            return False
        samples = [*record.recent, throughput]
        recent, earlier = samples[-window:], samples[:-window]
        earlier_mean = sum(earlier) / len(earlier)
        shift = relative_gain(earlier_mean, sum(recent) / window)
        margin = self.config.load_change_mean_z * self._noise() * math.sqrt(1 / window + 1 / len(earlier))
        return abs(shift) > max(self.config.sensitivity, margin)
