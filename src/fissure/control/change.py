"""A confirmed change in a measured series: the change-in-load test behind re-opening a decision.

The Streams 4.2 paper (Schneider and Wu) drops all trust in its measurements when the throughput
at a thread level departs from what that level measured before by more than SENS; it leaves the
test itself out and cites Algorithm 3 of Gedik et al. (TPDS 2014). `ChangeDetector` is that test
for any series (the throughput of one plan, an operator's cost): a reference (the mean of the
recent samples, but for a streak still unconfirmed) and a streak of samples that all deviate by more than the
threshold in the same direction; `confirmations` of them in a row are a change. The threshold
is SENS, or `noise_z` standard deviations of the reference samples when that is more: with 3 %
noise per micro-batch, SENS = 5 % alone is under two standard deviations and raises false
changes (the same remedy as improvement 4 of `fissure.control.thread_level`); noise_z = 0 is the
paper's test.

`fissure.control.thread_level` has the same rule inside its thread-level records (its
`_load_changed`, tied to the per-level smoothing); this class is the stand-alone form the
adaptive loop needs for plans instead of levels.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from fissure.control.thread_level.decisions import relative_gain


@dataclass(frozen=True)
class SeriesChange:
    """A confirmed departure: the reference before it and the samples that confirmed it."""

    reference: float
    confirming: tuple[float, ...]

    @property
    def relative_change(self) -> float:
        """Mean of the confirming samples relative to the reference (-0.4: 40 % lower)."""
        return relative_gain(self.reference, sum(self.confirming) / len(self.confirming))


class ChangeDetector:
    """Reference of a series and the streak of samples that depart from it.

    Attributes:
        sensitivity: relative departure that counts (SENS; Streams: 0.05).
        confirmations: departing samples in a row, in one direction, that make a change.
        noise_z: the departure must also exceed this many relative standard deviations of the
            reference samples (0: SENS alone).
        reference_window: samples the reference averages (the most recent ones).
        min_reference: samples needed before there is a reference to depart from.
    """

    def __init__(
        self, sensitivity: float, confirmations: int, noise_z: float = 0.0, reference_window: int = 20,
        min_reference: int = 2,
    ) -> None:
        if not 0 < sensitivity < 1:
            raise ValueError(f"sensitivity must be in (0, 1), got {sensitivity}")
        if confirmations < 1 or min_reference < 1 or reference_window < min_reference:
            raise ValueError("need confirmations >= 1 and 1 <= min_reference <= reference_window")
        if not noise_z >= 0:
            raise ValueError(f"noise_z must be >= 0, got {noise_z}")
        self.sensitivity = sensitivity
        self.noise_z = noise_z
        self.confirmations = confirmations
        self.min_reference = min_reference
        self._reference: deque[float] = deque(maxlen=reference_window)
        self._streak: list[float] = []

    @property
    def reference(self) -> float | None:
        if len(self._reference) < self.min_reference:
            return None
        return sum(self._reference) / len(self._reference)

    @property
    def threshold(self) -> float:
        """The relative departure that counts now: SENS, or noise_z relative deviations if more."""
        samples = self._reference
        if self.noise_z == 0 or len(samples) < 2:
            return self.sensitivity
        center = sum(samples) / len(samples)
        if center <= 0:
            return self.sensitivity
        spread = math.sqrt(sum((sample - center) ** 2 for sample in samples) / (len(samples) - 1))
        return max(self.sensitivity, self.noise_z * spread / center)

    def reset(self) -> None:
        self._reference.clear()
        self._streak.clear()

    def _unconfirmed(self) -> None:
        """A streak that did not confirm was noise: it joins the reference (and its spread)."""
        self._reference.extend(self._streak)
        self._streak.clear()

    def update(self, value: float) -> SeriesChange | None:
        """Take one sample; a `SeriesChange` when it confirms a change (the detector then resets)."""
        if not math.isfinite(value):
            return None
        reference = self.reference
        if reference is None:
            self._reference.append(value)
            return None
        deviation = relative_gain(reference, value)
        if abs(deviation) <= self.threshold:
            self._unconfirmed()
            self._reference.append(value)
            return None
        if self._streak and (relative_gain(reference, self._streak[-1]) > 0) != (deviation > 0):
            self._unconfirmed()
        self._streak.append(value)
        if len(self._streak) < self.confirmations:
            return None
        change = SeriesChange(reference, tuple(self._streak))
        self.reset()
        return change
