"""Synthetic throughput curves and their replay against a thread-level policy with a fake clock:
what `fissure elastic-sim`, the tests and the policy benchmark drive the policies with.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from fissure.control.loop import run_loop
from fissure.control.thread_level.decisions import PeriodMeasurement, ThreadLevelDecision, ThreadLevelPolicy


@dataclass(frozen=True)
class CurvePhase:
    """A synthetic workload for a stretch of periods: the noise-free throughput at each level."""

    periods: int
    throughput_per_s: tuple[float, ...]  # [i] is the rate at level i + 1


def settled_level(levels: Sequence[int]) -> int:
    """The elastic-sim contract's settled level: the most frequent level over the last quarter of
    the periods; a tie goes to the level in force last."""
    if not levels:
        raise ValueError("no periods: nothing settled")
    tail = levels[-max(1, len(levels) // 4) :]
    counts = {level: tail.count(level) for level in set(tail)}
    top = max(counts.values())
    return next(level for level in reversed(tail) if counts[level] == top)


class SimulatedThreadLevel:
    """The realizer of a replay: the thread level the simulated operator runs at."""

    def __init__(self, level: int) -> None:
        self.level = level

    def apply(self, decision: ThreadLevelDecision) -> float | None:
        if decision.level == self.level:
            return None
        self.level = decision.level
        return 0.0  # a simulated level change costs nothing


def replay_curves(
    policy: ThreadLevelPolicy, phases: Sequence[CurvePhase], noise: float, seed: int, period_s: float = 1.0
) -> tuple[tuple[int, ...], ...]:
    """Drive `policy` through the phases with a fake clock; the level in force in each period.

    Each period the policy sees the phase's throughput at the level in force times
    (1 + noise x a standard normal draw from random.Random(seed)); the CPU check passes. The
    policy runs in the control loop (fissure.control.loop), `SimulatedThreadLevel` its realizer.
    """
    draws = random.Random(seed)
    threads = SimulatedThreadLevel(policy.level)
    levels_per_phase: list[tuple[int, ...]] = []
    now_s = 0.0

    def periods():
        nonlocal now_s
        for phase in phases:
            levels = []
            for _ in range(phase.periods):
                levels.append(threads.level)
                measured = phase.throughput_per_s[threads.level - 1] * (1 + noise * draws.gauss(0.0, 1.0))
                now_s += period_s
                yield PeriodMeasurement(now_s=now_s, throughput_per_s=measured)
            levels_per_phase.append(tuple(levels))

    run_loop(periods(), policy, threads, clock=lambda: now_s)
    return tuple(levels_per_phase)


# -- synthetic workloads: for elastic-sim specs, tests and benchmarks -------------------------------
def rise_peak_fall_curve(max_threads: int, peak_level: float, sharpness: float, peak_rate: float) -> tuple[float, ...]:
    """A smooth bump, peak_rate at peak_level: (n / p) ** a * exp(a * (1 - n / p))."""
    return tuple(
        peak_rate * (level / peak_level) ** sharpness * math.exp(sharpness * (1 - level / peak_level))
        for level in range(1, max_threads + 1)
    )


def tent_curve(
    max_threads: int, peak_level: int, base_share: float, fall_per_level: float, peak_rate: float
) -> tuple[float, ...]:
    """Linear rise from base_share x peak_rate at 1 thread to peak_rate, then a linear fall."""
    rates = []
    for level in range(1, max_threads + 1):
        if level <= peak_level:
            rise = (level - 1) / (peak_level - 1) if peak_level > 1 else 1.0
            share = base_share + (1 - base_share) * rise
        else:
            share = max(0.05, 1 - fall_per_level * (level - peak_level))
        rates.append(peak_rate * share)
    return tuple(rates)


def rise_plateau_fall_curve(
    max_threads: int, knee_level: int, plateau_end_level: int, fall_per_level: float, peak_rate: float
) -> tuple[float, ...]:
    """Linear rise to peak_rate at knee_level, flat up to plateau_end_level, then a linear fall
    (fall_per_level of the peak per level, down to a floor of 30 %): an I/O-bound operator whose
    service serves a fixed number of requests at once, and whose client threads cost CPU."""
    rates = []
    for level in range(1, max_threads + 1):
        if level <= knee_level:
            share = level / knee_level
        elif level <= plateau_end_level:
            share = 1.0
        else:
            share = max(0.3, 1 - fall_per_level * (level - plateau_end_level))
        rates.append(peak_rate * share)
    return tuple(rates)


def plateau_curve(max_threads: int, knee_level: int, rate_per_thread: float, softness: float = 0.0) -> tuple[float, ...]:
    """rate_per_thread x min(n, knee): flat from the knee on; softness > 0 rounds the knee off."""
    if softness <= 0:
        return tuple(rate_per_thread * min(level, knee_level) for level in range(1, max_threads + 1))
    exponent = 4 / softness
    return tuple(
        rate_per_thread * knee_level * (1 + (knee_level / level) ** exponent) ** (-1 / exponent)
        for level in range(1, max_threads + 1)
    )


def scalability_law_curve(max_threads: int, peak_level: float, contention: float, rate: float) -> tuple[float, ...]:
    """Gunther's universal scalability law, its coherency term set so the peak is at peak_level."""
    coherency = (1 - contention) / peak_level**2
    return tuple(
        rate * level / (1 + contention * (level - 1) + coherency * level * (level - 1))
        for level in range(1, max_threads + 1)
    )


def random_workload_spec(seed: int, max_threads: int = 32, phases: int = 2, noise: float = 0.02) -> dict:
    """An elastic-sim spec of seeded realistic phases: rise-peak-fall (smooth bump, tent, scalability
    law) with the peak anywhere in 1..max_threads, or a plateau (sharp or soft knee); each phase a
    new curve, so each phase boundary is a change in load. Phases last 100 to 140 periods."""
    draw = random.Random(seed)
    spec_phases = []
    for _ in range(phases):
        scale = draw.uniform(50, 5000)
        kind = draw.choice(("bump", "tent", "scalability-law", "plateau"))
        if kind == "bump":
            curve = rise_peak_fall_curve(max_threads, draw.uniform(1, max_threads), draw.uniform(0.5, 3), scale)
        elif kind == "tent":
            curve = tent_curve(
                max_threads, draw.randint(1, max_threads), draw.uniform(0.02, 0.6), draw.uniform(0.01, 0.15), scale
            )
        elif kind == "scalability-law":
            curve = scalability_law_curve(max_threads, draw.uniform(1, 1.25 * max_threads), draw.uniform(0, 0.3), scale)
        else:
            curve = plateau_curve(max_threads, draw.randint(1, max_threads), scale / 10, draw.choice((0, 0, 0.5, 1)))
        spec_phases.append({"periods": draw.randint(100, 140), "throughput": [round(rate, 3) for rate in curve]})
    return {"max_threads": max_threads, "noise": noise, "seed": seed, "phases": spec_phases}
