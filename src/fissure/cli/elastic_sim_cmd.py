"""`fissure elastic-sim SPEC.json`: drive a thread-level policy against synthetic throughput curves.

The contract (docs/commands.md) is stable: outside checks call it. Each period the policy sees the
spec's throughput at the level in force times (1 + noise x a seeded standard normal draw), with a
fake clock and the CPU-usage check passing, and names the next level.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

from fissure.cli import UsageError
from fissure.cli.elastic_sim_curves import CurvePhase, replay_curves, settled_level
from fissure.control.thread_level.config import ElasticityConfig, POLICY_NAMES
from fissure.control.thread_level.policies import make_policy


@dataclass(frozen=True)
class SimSpec:
    max_threads: int
    noise: float
    seed: int
    phases: tuple[CurvePhase, ...]


@dataclass(frozen=True)
class PhaseOutcome:
    settled_level: int
    best_level: int
    settled_share_of_best: float


@dataclass(frozen=True)
class SimResult:
    policy: str
    levels: tuple[int, ...]  # the level in force during each period, all phases in order
    phases: tuple[PhaseOutcome, ...]

    def to_json(self) -> dict:
        return {
            "policy": self.policy,
            "levels": list(self.levels),
            "phases": [
                {
                    "settled_level": phase.settled_level,
                    "best_level": phase.best_level,
                    "settled_share_of_best": phase.settled_share_of_best,
                }
                for phase in self.phases
            ],
        }


def parse_spec(document: object) -> SimSpec:
    """Validate a decoded SPEC.json; raise UsageError naming the field at fault."""
    if not isinstance(document, dict):
        raise UsageError("the spec must be a JSON object with max_threads, noise, seed and phases")
    for field in ("max_threads", "phases"):
        if field not in document:
            raise UsageError(f"the spec has no {field!r} (see docs/commands.md, 'fissure elastic-sim')")
    max_threads = document["max_threads"]
    if not isinstance(max_threads, int) or isinstance(max_threads, bool) or max_threads < 1:
        raise UsageError(f"max_threads must be an integer >= 1, got {max_threads!r}")
    noise = document.get("noise", 0.0)
    if not isinstance(noise, (int, float)) or isinstance(noise, bool) or not 0 <= noise < 1:
        raise UsageError(f"noise must be a number in [0, 1), got {noise!r}")
    seed = document.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise UsageError(f"seed must be an integer, got {seed!r}")
    phases = document["phases"]
    if not isinstance(phases, list) or not phases:
        raise UsageError("phases must be a non-empty list of {periods, throughput}")
    return SimSpec(
        max_threads=max_threads,
        noise=float(noise),
        seed=seed,
        phases=tuple(_parse_phase(index, phase, max_threads) for index, phase in enumerate(phases)),
    )


def _parse_phase(index: int, phase: object, max_threads: int) -> CurvePhase:
    where = f"phases[{index}]"
    if not isinstance(phase, dict) or "periods" not in phase or "throughput" not in phase:
        raise UsageError(f"{where} must be an object with 'periods' and 'throughput'")
    periods = phase["periods"]
    if not isinstance(periods, int) or isinstance(periods, bool) or periods < 1:
        raise UsageError(f"{where}.periods must be an integer >= 1, got {periods!r}")
    throughput = phase["throughput"]
    if not isinstance(throughput, list) or len(throughput) != max_threads:
        count = len(throughput) if isinstance(throughput, list) else "no list"
        raise UsageError(
            f"{where}.throughput must list the rate at each level 1..{max_threads} "
            f"({max_threads} numbers), got {count}"
        )
    for level, value in enumerate(throughput, start=1):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise UsageError(f"{where}.throughput at level {level} must be a finite number >= 0, got {value!r}")
    if max(throughput) <= 0:
        raise UsageError(f"{where}.throughput is zero at every level: nothing to compare")
    return CurvePhase(periods=periods, throughput_per_s=tuple(float(value) for value in throughput))


def load_spec(path: str) -> SimSpec:
    try:
        document = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"spec file {path!r} not found") from None
    except json.JSONDecodeError as error:
        raise UsageError(f"spec file {path!r} is not valid JSON: {error}") from None
    return parse_spec(document)


def simulate(spec: SimSpec, policy_name: str, config: ElasticityConfig | None = None) -> SimResult:
    """Run the policy through every phase of the spec, one decision per period, fake clock."""
    config = (config or ElasticityConfig()).with_levels(1, spec.max_threads)
    policy = make_policy(policy_name, config)
    levels_per_phase = replay_curves(policy, spec.phases, spec.noise, spec.seed, config.period_s)
    outcomes = []
    for phase, levels in zip(spec.phases, levels_per_phase):
        settled = settled_level(levels)
        best_value = max(phase.throughput_per_s)
        outcomes.append(
            PhaseOutcome(
                settled_level=settled,
                best_level=phase.throughput_per_s.index(best_value) + 1,
                settled_share_of_best=phase.throughput_per_s[settled - 1] / best_value,
            )
        )
    levels = tuple(level for phase_levels in levels_per_phase for level in phase_levels)
    return SimResult(policy=policy_name, levels=levels, phases=tuple(outcomes))


def run_length(levels: tuple[int, ...]) -> str:
    """'1 2 3 4x5 ...': each level in force, with how many periods in a row when more than one."""
    parts = []
    index = 0
    while index < len(levels):
        end = index
        while end < len(levels) and levels[end] == levels[index]:
            end += 1
        count = end - index
        parts.append(f"{levels[index]}x{count}" if count > 1 else str(levels[index]))
        index = end
    return " ".join(parts)


def result_table(spec: SimSpec, result: SimResult) -> str:
    rows = [("phase", "periods", "settled level", "best level", "share of best")]
    for index, (phase, outcome) in enumerate(zip(spec.phases, result.phases), start=1):
        rows.append(
            (
                str(index),
                str(phase.periods),
                str(outcome.settled_level),
                str(outcome.best_level),
                f"{outcome.settled_share_of_best:.3f}",
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = [f"policy {result.policy}, levels 1..{spec.max_threads}, noise {spec.noise}, seed {spec.seed}"]
    lines += ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows]
    start = 0
    for index, phase in enumerate(spec.phases, start=1):
        lines.append(f"levels in phase {index}: {run_length(result.levels[start : start + phase.periods])}")
        start += phase.periods
    return "\n".join(lines)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "elastic-sim",
        help="run a thread-level policy against synthetic throughput curves (fake clock)",
        description="Simulate a thread-level elasticity policy on the throughput curves of SPEC.json.",
    )
    parser.add_argument("spec", help="SPEC.json: max_threads, noise, seed and phases of {periods, throughput}")
    parser.add_argument(
        "--policy", choices=POLICY_NAMES, default="trust-trend", help="thread-level policy (default: trust-trend)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    result = simulate(spec, args.policy)
    print(json.dumps(result.to_json()) if args.json else result_table(spec, result))
    return 0
