"""Is this revision slower than an earlier one? The same chains and plans, both revisions, one run.

Each revision runs in Python processes of its own, importing fissure from its own checkout (a
git worktree of `--base`, and this checkout); the processes alternate, the order rotated each
round. A process starts one Spark session (local[2]), makes one uncounted warm-up run, then
measures every workload under the sequential plan and the planner's plan: steady records per
second (the micro-batches after the first). Reported: per workload and plan, each revision's
median over rounds (at least 3 unless --quick) and the median of the paired ratios (this / base,
round by round). The inputs are generated once and shared, so both revisions read the same files.
The method and the results header: benchmarks/method.py; results compare_revisions.md/.json under
--out (default benchmarks/results/).

    ./dev python benchmarks/compare_revisions.py --base ba355d4            # 3 rounds
    ./dev python benchmarks/compare_revisions.py --base HEAD~1 --quick     # tiny inputs, one round
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

import method  # noqa: E402
from provenance import revision  # noqa: E402
WORKLOADS = ("cpu", "logwatch")
PLANS = ("sequential", "planner")


def point(tree: str, inputs: str) -> dict:
    """In a process importing fissure from `tree`: warm up, then every workload under every plan."""
    sys.path[:0] = [os.path.join(tree, "src"), os.path.join(tree, "examples"), os.path.join(tree, "benchmarks")]
    import fissure
    from fissure.spark.config import RunnerConfig
    from fissure.plan.plans import planner_plan, sequential_plan
    from fissure.spark.session.create import create_session
    from logwatch import build_pipeline
    from spark_chain import cpu_pipeline, measure_fissure

    spark = create_session(RunnerConfig(master="local[2]"))
    programs = {"cpu": cpu_pipeline(4), "logwatch": build_pipeline()}
    sources = {"cpu": fissure.FileSource(os.path.join(inputs, "cpu"), format="json", schema={"x": float},
                                         max_files_per_trigger=1),
               "logwatch": fissure.FileSource(os.path.join(inputs, "logwatch"), format="text",
                                              max_files_per_trigger=1)}

    def measure(workload: str, plan) -> float:
        return measure_fissure(spark, programs[workload], sources[workload], plan, tempfile.mkdtemp())

    measure("cpu", sequential_plan(programs["cpu"]))  # warm-up, not counted
    rates = {}
    for workload in WORKLOADS:
        program = programs[workload]
        for plan_name, plan in (("sequential", sequential_plan(program)), ("planner", planner_plan(program, 2))):
            rates[f"{workload}/{plan_name}"] = measure(workload, plan)
    return {"fissure": fissure.__file__, "rates": rates}


def write_inputs(directory: Path, records: int, lines: int, files: int) -> None:
    sys.path[:0] = [str(REPOSITORY / "src"), str(REPOSITORY / "examples")]
    from generators.loglines import generate, split_into_files

    from fissure.testing import record_files

    record_files(directory / "cpu", [{"x": float(i % 997) + 0.5} for i in range(records)], {"x": float},
                 records_per_file=-(-records // files))
    split_into_files(list(generate(lines)), str(directory / "logwatch"), files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the earlier revision (a commit, tag or branch)")
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--lines", type=int, default=30000)
    parser.add_argument("--files", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="repeats of both revisions (at least 3 unless --quick)")
    method.add_arguments(parser, repeats=None)
    parser.add_argument("--point", nargs=2, metavar=("TREE", "INPUTS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.point:
        print(json.dumps(point(*args.point)))
        return 0
    if args.quick:
        args.records, args.lines, args.files, args.rounds = 2000, 3000, 3, 1
    method.check_repeats(args.rounds, args.quick)
    run = method.Run("compare_revisions.py", argv, quick=args.quick, out=args.out)
    work = Path(tempfile.mkdtemp(prefix="fissure-compare-"))
    base_tree = work / "base"
    subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), args.base], cwd=REPOSITORY, check=True,
                   capture_output=True)
    try:
        write_inputs(work / "inputs", args.records, args.lines, args.files)
        trees = {"base": base_tree, "this": REPOSITORY}
        rates: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
        for round_number in range(args.rounds):
            for name in method.run_order(list(trees), round_number):
                finished = subprocess.run([sys.executable, __file__, "--base", args.base, "--point",
                                           str(trees[name]), str(work / "inputs")],
                                          capture_output=True, text=True,
                                          # the workers Spark starts import fissure from this tree too
                                          env={**os.environ, "PYTHONPATH": str(trees[name] / "src")})
                if finished.returncode != 0:
                    print(finished.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"the {name} revision's process failed")
                result = json.loads(finished.stdout.strip().splitlines()[-1])
                expected = str(trees[name] / "src" / "fissure" / "__init__.py")
                if os.path.realpath(result["fissure"]) != os.path.realpath(expected):
                    raise SystemExit(f"the {name} process imported {result['fissure']}, not {expected}")
                for key, rate in result["rates"].items():
                    rates[name].setdefault(key, []).append(rate)
                print(f"round {round_number + 1} {name}: " + ", ".join(f"{key} {rate:,.0f}"
                                                                       for key, rate in result["rates"].items()),
                      flush=True)
        document = {
            "base": revision(base_tree), "this": run.revision, "rates": rates,
            "this_over_base": {key: method.paired_ratio({"this": rates["this"][key], "base": rates["base"][key]},
                                                        "this", "base")
                               for key in rates["this"]},
        }
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=REPOSITORY, capture_output=True)
    run.write_results("compare_revisions", report(document), document)
    return 0


def report(document: dict) -> str:
    lines = ["# This revision against an earlier one, same chains and plans", "",
             f"Revisions: this {document['this']}, base {document['base']}. Each revision's process makes one "
             "uncounted warm-up run; the two revisions' order rotates each round.", "",
             "| workload / plan | base, median records/s | this, median records/s | this / base (median of paired ratios) |",
             "| --- | --- | --- | --- |"]
    for key, ratio in document["this_over_base"].items():
        lines.append(f"| {key} | {statistics.median(document['rates']['base'][key]):,.0f} | "
                     f"{statistics.median(document['rates']['this'][key]):,.0f} | {ratio:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
