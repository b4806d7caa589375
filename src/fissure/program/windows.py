"""Event-time windows: the family `Tumbling`, `Sliding`, `Session` (and the join's `TumblingWindow`).

    Tumbling(10.0)          # [0, 10), [10, 20), ...: each event in exactly one window
    Sliding(60.0, 10.0)     # windows of 60 s starting every 10 s: each event in 6 windows
    Session(30.0)           # a key's events closer than 30 s to the next form one session

Sizes are in seconds of event time (`Pipeline.event_time`). Window bounds are [start, end), starts
aligned to 0 (the epoch): a tumbling window of `size` starts at a multiple of `size`, a sliding one
at a multiple of `every`. A session of a key starts at its first event and ends `gap` seconds after
its last; an event that falls within `gap` of two sessions merges them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fissure.program.operators import PipelineError


def _positive(owner: str, label: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise PipelineError(f"{owner}: {label} must be a number of seconds > 0, got {value!r}")
    return float(value)


def aligned_index(t: float, size: float) -> int:
    """The largest k with k * size <= t (checked, so float rounding never puts `t` outside
    [k * size, (k + 1) * size))."""
    index = math.floor(t / size)
    if index * size > t:
        index -= 1
    elif (index + 1) * size <= t:
        index += 1
    return index


class Window:
    """A window family: which windows [start, end) an event time falls in."""

    def windows_of(self, t: float) -> list[tuple[float, float]]:
        """The windows an event at time `t` belongs to, earliest first (a session: its own gap)."""
        raise NotImplementedError

    @property
    def horizon(self) -> float:
        """The longest time from an event to the end of a window holding it."""
        raise NotImplementedError

    @property
    def merging(self) -> bool:
        """Whether windows of a key merge (sessions) or stand apart."""
        return False


@dataclass(frozen=True)
class Tumbling(Window):
    """Back-to-back windows of `size` seconds: [k * size, (k + 1) * size)."""

    size: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _positive("Tumbling", "size", self.size))

    def windows_of(self, t: float) -> list[tuple[float, float]]:
        index = aligned_index(t, self.size)
        return [(index * self.size, (index + 1) * self.size)]

    @property
    def horizon(self) -> float:
        return self.size


@dataclass(frozen=True)
class Sliding(Window):
    """Windows of `size` seconds starting every `every` seconds: [k * every, k * every + size).
    An event is in every such window that holds it (size / every of them when every divides size)."""

    size: float
    every: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _positive("Sliding", "size", self.size))
        object.__setattr__(self, "every", _positive("Sliding", "every", self.every))
        if self.every > self.size:
            raise PipelineError(f"Sliding(size={self.size:g}, every={self.every:g}): every must be at most size, "
                                f"else events between windows belong to none; use Tumbling({self.size:g}) for "
                                f"windows that do not overlap")

    def windows_of(self, t: float) -> list[tuple[float, float]]:
        windows = []
        index = aligned_index(t, self.every)
        while index * self.every + self.size > t:
            windows.append((index * self.every, index * self.every + self.size))
            index -= 1
        return windows[::-1]

    @property
    def horizon(self) -> float:
        return self.size


@dataclass(frozen=True)
class Session(Window):
    """A key's events closer than `gap` seconds to each other form one session [first, last + gap)."""

    gap: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "gap", _positive("Session", "gap", self.gap))

    def windows_of(self, t: float) -> list[tuple[float, float]]:
        return [(t, t + self.gap)]

    @property
    def horizon(self) -> float:
        return self.gap

    @property
    def merging(self) -> bool:
        return True
