"""`fissure autopipeline`: where to add threads in a profiled stream graph (Tang and Gedik, Sec. 4).

    python -m fissure autopipeline PROFILE.json [--json]

PROFILE.json: {"beta": 0.8, "blacklist": ["o7"],
               "threads": {"t0": {"utilization": 0.9, "ports": {"o1": 0.15, "o3": 0.5}}, ...}}
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fissure.cli import UsageError
from fissure.plan.autopipeline import (
    DEFAULT_BETA,
    AutopipelinePlan,
    AutopipelineProfile,
    ThreadProfile,
    natural_sort_key,
    plan_autopipelining,
)

PROFILE_FIELDS = ("beta", "blacklist", "threads")
THREAD_FIELDS = ("utilization", "ports")
# Enough digits to tell answers apart, few enough to hide float noise (0.55000000000000004).
OUTPUT_DIGITS = 12


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "autopipeline",
        help="pick the input ports where new threads relieve the bottleneck threads",
        description=(
            "Reads a profile (per-thread and per-port utilization) and prints where to insert"
            " threaded ports: one new thread on the path of every bottleneck thread, the most"
            " loaded thread predicted as light as possible (Tang and Gedik, TPDS 2013)."
        ),
    )
    parser.add_argument("profile", metavar="PROFILE.json", help="the profile to plan for")
    parser.add_argument(
        "--json", action="store_true", help='print {"insertions": [...], "utility": ...}'
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    profile = load_profile(Path(args.profile))
    plan = plan_autopipelining(profile)
    if args.json:
        print(json.dumps(plan_as_json(plan)))
    else:
        print(describe_plan(profile, plan))
    return 0


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a utilization; write a number in [0, 1]")


def _check_fields(found: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(found) - set(allowed))
    if unknown:
        raise UsageError(
            f"unknown field(s) {', '.join(map(repr, unknown))} in {where}; known fields:"
            f" {', '.join(allowed)}"
        )


def _expect_object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UsageError(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


def load_profile(path: Path) -> AutopipelineProfile:
    """Reads and validates PROFILE.json; every error names the field at fault."""
    try:
        document = json.loads(path.read_text(), parse_constant=_reject_constant)
    except OSError as error:
        raise UsageError(f"cannot read the profile {path}: {error.strerror or error}") from error
    except ValueError as error:
        raise UsageError(f"{path} is not valid JSON: {error}") from error
    document = _expect_object(document, f"{path}: the profile")
    _check_fields(document, PROFILE_FIELDS, f"{path}")
    if "threads" not in document:
        raise UsageError(
            f'{path}: missing "threads": give each thread\'s "utilization" and its "ports"'
        )
    threads_field = _expect_object(document["threads"], f'{path}: "threads"')
    blacklist = document.get("blacklist", [])
    if not isinstance(blacklist, list) or not all(isinstance(port, str) for port in blacklist):
        raise UsageError(f'{path}: "blacklist" must be a list of operator (port) names')
    try:
        threads = tuple(_load_thread(name, value, path) for name, value in threads_field.items())
        return AutopipelineProfile(
            threads=threads,
            beta=_number(document.get("beta", DEFAULT_BETA), f'{path}: "beta"'),
            blacklisted_ports=frozenset(blacklist),
        )
    except ValueError as error:
        raise UsageError(f"{path}: {error}") from error


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{where} must be a number, got {json.dumps(value)}")
    return float(value)


def _load_thread(name: str, value: Any, path: Path) -> ThreadProfile:
    where = f'{path}: thread "{name}"'
    thread = _expect_object(value, where)
    _check_fields(thread, THREAD_FIELDS, where)
    if "utilization" not in thread:
        raise UsageError(f'{where}: missing "utilization" (its share of a core, 0 to 1)')
    ports = _expect_object(thread.get("ports", {}), f'{where}: "ports"')
    return ThreadProfile(
        name=name,
        utilization=_number(thread["utilization"], f'{where}: "utilization"'),
        port_utilization={
            port: _number(port_value, f'{where}: port "{port}"')
            for port, port_value in ports.items()
        },
    )


def _rounded(value: float) -> float:
    return round(value, OUTPUT_DIGITS)


def plan_as_json(plan: AutopipelinePlan) -> dict[str, Any]:
    """The command's contract: the insertions and their aggregate utility (null: none)."""
    return {
        "insertions": [
            {"operator": insertion.operator, "threads": list(insertion.threads)}
            for insertion in plan.insertions
        ],
        "utility": None if plan.utility is None else _rounded(plan.utility),
    }


def describe_plan(profile: AutopipelineProfile, plan: AutopipelinePlan) -> str:
    """The answer for people: what to insert, the loads it predicts, and why."""
    by_name = sorted(profile.threads, key=lambda thread: natural_sort_key(thread.name))
    lines = [
        f"profile: {len(profile.threads)} thread(s) ("
        + ", ".join(f"{thread.name} {thread.utilization:.2f}" for thread in by_name)
        + f"), beta {profile.beta:g}, bottlenecks: {', '.join(plan.bottleneck_threads) or 'none'}"
    ]
    if profile.blacklisted_ports:
        blacklisted = sorted(profile.blacklisted_ports, key=natural_sort_key)
        lines.append(f"blacklisted ports: {', '.join(blacklisted)}")
    if plan.insertions:
        lines.append("insert a thread at the input port of:")
        width = max(len(insertion.operator) for insertion in plan.insertions)
        for insertion in plan.insertions:
            loads = ", ".join(
                [f"new {insertion.new_thread_load:.2f}"]
                + [f"{load.thread} {load.load:.2f}" for load in insertion.remaining_loads]
            )
            lines.append(
                f"  {insertion.operator:<{width}}  relieves {', '.join(insertion.threads)};"
                f" predicted loads {loads} (utility {insertion.utility:.2f})"
            )
        lines.append(f"aggregate utility {plan.utility:.2f}")
    else:
        lines.append("no insertion")
    lines.append(f"why: {plan.reason}")
    return "\n".join(lines)
