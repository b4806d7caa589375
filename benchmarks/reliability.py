"""Reliability under driver kills: how many `kill -9` points fissure recovers from exactly once.

Each kill point starts a driver process running the word count (a chain, or a graph with a
second sink) under one plan, SIGKILLs it at one moment, restarts drivers on the same checkpoint
until the input is consumed, and compares the sinks with the plain-Python word count (every
input's result once, every word's counts exactly 1..n). Plans: sequential, replicated (the keyed
region x2), planner, adaptive (a forced switch to the replicated plan: stop, offline state
repartition, restart). Moments: seeded random delays after the first committed batch; for the
adaptive plan also the switch's stop and the state repartition; for the sequential plan a second
driver started on the checkpoint of a running one (it must be refused by the checkpoint's lock,
naming the first, which is then killed). Every point also checks that no sink batch was written
by two runs. Worker faults without a kill, for the sequential and replicated plans: an operator
raising MemoryError once on each of four records, and its Python worker dying once on each (four
crashes, each its own restart window as in a long run): the one driver must recover by itself,
with no dead letter. Input files, for the sequential plan: a truncated `.gz` among the good files
(one driver: the good files' results exact, one dead letter naming the file) and a file written
in place in two halves while a following driver runs (killed once a batch read it, restarted:
the whole file's results, once). The harness is tests/fault_injection.py (tests/spark/test_faults.py
runs some of these points).

    ./dev python benchmarks/reliability.py            # every plan x program x moment, 2 seeds (about 15 minutes)
    ./dev python benchmarks/reliability.py --seeds 1  # one seed each
    ./dev python benchmarks/reliability.py --quick    # one kill point and the chain's two file scenarios: a check

Results: reliability.md/.json under --out (default benchmarks/results/), header by benchmarks/method.py.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "benchmarks"))
sys.path.insert(0, str(REPOSITORY / "tests"))

from fault_injection import FILE_FAULTS, WORKER_FAULTS, run_case  # noqa: E402
import method  # noqa: E402


KINDS = ("driver kills", "worker faults", "input files")


def scenario_kind(moment: str) -> str:
    return "worker faults" if moment in WORKER_FAULTS else "input files" if moment in FILE_FAULTS else "driver kills"


def kill_points(seeds: int) -> list[tuple[str, str, str, int]]:
    points = []
    for program in ("chain", "graph"):
        for plan in ("sequential", "replicated", "planner", "adaptive"):
            moments = (["random"] + (["switch", "repartition"] if plan == "adaptive" else [])
                       + (["concurrent"] if plan == "sequential" else [])
                       + (list(WORKER_FAULTS) if plan in ("sequential", "replicated") else [])
                       + (list(FILE_FAULTS) if plan == "sequential" else []))
            for moment in moments:
                for seed in range(seeds if moment == "random" else 1):
                    points.append((plan, program, moment, 100 + seed))
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2, help="random kill moments per plan and program")
    method.add_arguments(parser, repeats=None)
    args = parser.parse_args(argv)
    # not a timing: a busy machine changes when the kills land, not whether recovery is exact
    run = method.Run("reliability.py", argv, quick=args.quick, out=args.out, timed=False)
    points = kill_points(args.seeds)
    if args.quick:  # a check of the script: one kill point and the chain's file scenarios
        points = points[:1] + [point for point in points if point[2] in FILE_FAULTS and point[1] == "chain"]
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="fissure-reliability-") as work:
        for number, (plan, program, moment, seed) in enumerate(points):
            outcome = run_case(Path(work) / str(number), plan, program, moment, seed)
            outcomes.append(outcome)
            print(f"{plan:>10} {program:>5} {moment:>11} seed {seed}: "
                  f"{'killed' if outcome.killed else 'not reached'}, {'passed' if outcome.passed else 'FAILED'}"
                  f" {outcome.detail}", flush=True)
    tried = [outcome for outcome in outcomes if outcome.killed]
    passed = [outcome for outcome in tried if outcome.passed]
    by_kind = {kind: (sum(1 for outcome in tried if scenario_kind(outcome.moment) == kind),
                      sum(1 for outcome in passed if scenario_kind(outcome.moment) == kind)) for kind in KINDS}
    document = {"kill_points_tried": len(tried), "kill_points_passed": len(passed),
                "by_kind": {kind: {"tried": counts[0], "passed": counts[1]} for kind, counts in by_kind.items()},
                "outcomes": [asdict(outcome) for outcome in outcomes]}
    lines = ["# Reliability under driver kills, worker faults and bad input files", "",
             f"**{len(passed)} of {len(tried)} kill points passed** (a kill point counts when the driver was killed"
             " before it finished, or the fault happened; passed: after restarts on the same checkpoint, every"
             " input's result is in the sinks exactly once and every word's counts are exactly 1..n; a corrupt"
             " file is one dead letter naming it)"
             f": {'; '.join(f'{kind} {counts[1]} of {counts[0]}' for kind, counts in by_kind.items())}.", "",
             "| plan | program | moment | seed | killed (a worker or file fault: happened) | restarts | result |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for outcome in outcomes:
        lines.append(f"| {outcome.plan} | {outcome.program} | {outcome.moment} | {outcome.seed} | "
                     f"{'yes' if outcome.killed else 'no (ended first)'} | {outcome.restarts} | "
                     f"{'passed' if outcome.passed else 'FAILED: ' + outcome.detail} |")
    run.write_results("reliability", "\n".join(lines) + "\n", document)
    print(f"{len(passed)} of {len(tried)} kill points passed "
          f"({', '.join(f'{kind} {counts[1]} of {counts[0]}' for kind, counts in by_kind.items())})")
    return 0 if len(passed) == len(tried) else 1


if __name__ == "__main__":
    sys.exit(main())
