"""A policy's memory of the levels it measured: per-level sample windows (`LevelSamples`), the
geometric ladder of levels (`Ladder`), and the states of a coarse scan, a refinement race and the
settled level (`Survey`, `Race`, `Settled`).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from fissure.control.thread_level.config import ElasticityConfig
from fissure.control.thread_level.decisions import geometric_ladder


class LevelSamples:
    """The Streams paper's ThreadRecord (and the 2009 paper's peak / last), plus recent samples."""

    __slots__ = ("last_time", "first_throughput", "recent", "trusted", "peak")

    def __init__(self, window: int) -> None:
        self.last_time = -1
        self.first_throughput = math.nan
        self.recent: deque[float] = deque(maxlen=window)
        self.trusted = False
        self.peak: float | None = None

    @property
    def throughput(self) -> float:
        return sum(self.recent) / len(self.recent) if self.recent else math.nan

    def record(self, throughput: float, time: int) -> None:
        if not self.trusted:
            self.first_throughput = throughput
            self.recent.clear()
        self.recent.append(throughput)
        self.last_time = time
        self.trusted = True

    def forget(self) -> None:
        self.trusted = False
        self.recent.clear()
        self.peak = None


class Ladder:
    """The levels the rules move between (improvement 1); reset at the start of each epoch."""

    def __init__(self, config: ElasticityConfig) -> None:
        self.config = config
        self.rungs: list[int] = []
        self.reset(config.min_threads)

    def reset(self, current_level: int) -> None:
        """Geometric rungs, the one nearest to current_level moved onto it (ends stay put)."""
        config = self.config
        self.rungs = list(geometric_ladder(config.min_threads, config.max_threads, config.ladder_ratio))
        if current_level not in self.rungs:
            # Replace rather than insert: two adjacent rungs at 20+ threads differ by less than noise.
            inner = self.rungs[1:-1] or self.rungs
            nearest = min(inner, key=lambda rung: (abs(rung - current_level), rung))
            self.rungs = sorted((set(self.rungs) - {nearest}) | {current_level})

    def below(self, level: int) -> int | None:
        lower = [rung for rung in self.rungs if rung < level]
        return lower[-1] if lower else None

    def above(self, level: int) -> int | None:
        return next((rung for rung in self.rungs if rung > level), None)

    def levels_between_neighbours(self, level: int) -> list[int]:
        """Levels strictly between the rungs around `level`, nearest first, without `level`."""
        low = self.below(level) or level
        high = self.above(level) or level
        inside = [candidate for candidate in range(low + 1, high) if candidate != level]
        return sorted(inside, key=lambda candidate: (abs(candidate - level), candidate))


@dataclass
class Survey:
    """The coarse scan (improvement 7): levels still to measure, one period each, then the best."""

    purpose: str
    todo: deque[int]
    candidates: tuple[int, ...]
    local: bool = False  # improvement 11: around the level in force, extended while needed


@dataclass
class Race:
    """The refinement (improvement 8): the levels between the rungs around `home` (and, with
    improvement 10, the rungs), sampled in rounds; see `PolicyBase._continue_race`."""

    home: int
    candidates: list[int]
    samples: dict[int, int]  # samples taken in the race, per candidate
    target: int = 1  # samples each candidate left should have before the next round
    edge: tuple[int, ...] = ()  # the rungs at the window's ends
    extensions: int = 0  # races before this one in a row, each ending on its window's edge


@dataclass
class Settled:
    """Improvement 10: the level held since the refinement, and when and where to probe next."""

    level: int
    interval: int  # periods at the level between two probes (doubles while probes find nothing)
    next_probe_time: int  # logical time of the next probe
    probe: int | None = None  # the neighbouring rung being probed, None while at `level`
    probe_periods: int = 0  # periods spent at `probe` in this probe
    last_probed: int | None = None  # the neighbour probed last time
