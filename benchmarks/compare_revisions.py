"""Is this revision slower than an earlier one? The same chains and plans, both revisions, one run.

Each revision runs in Python processes of its own, importing fissure from its own checkout (a
git worktree of `--base`, and this checkout); the processes alternate, the order rotated each
round. A process starts one Spark session (local[2]), makes one uncounted warm-up run, then
measures every workload under the sequential plan and the planner's plan: steady records per
second (the micro-batches after the first). Reported: per workload and plan, each revision's
median over rounds (at least 3 unless --quick) and the median of the paired ratios (this / base,
round by round). The inputs are generated once and shared, so both revisions read the same files.
The method and the results header: benchmarks/method.py; results compare_revisions.md/.json (or
NAME.md/.json with --name) under --out (default benchmarks/results/).

Workloads (--workloads, default all): the CPU-heavy chain and LogWatch, and two that show keyed
state's throughput: the word count's per-word running count and per-user sessions, each built
here from the API both revisions have, so that both run the same program (WORKLOADS says what
each is).

A revision's process imports fissure's public names where there are some (`fissure.RunnerConfig`)
and otherwise each name from the first module that holds it, the paths after the package
restructure first, then the earlier ones: it runs at any revision, before or after the move.

    ./dev python benchmarks/compare_revisions.py --base ba355d4            # 3 rounds
    ./dev python benchmarks/compare_revisions.py --base HEAD~1 --quick     # tiny inputs, one round
    ./dev python benchmarks/compare_revisions.py --base 7fffe8e^ --workloads wordcount sessions \
        --name compare_revisions_state_layout    # before keyed state's sub-buckets of keys
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

import method  # noqa: E402
from provenance import revision  # noqa: E402

WORKLOADS = {
    "cpu": "the CPU-heavy chain: four busy maps of benchmarks/spark_chain.py over JSON records, no state",
    "logwatch": "LogWatch, the revision's own examples/logwatch.py over generated log lines",
    "wordcount": "word count with a per-word keyed running count: examples/wordcount.py's `words` (flat_map) and "
                 "`count` (partitioned by word), the count emitted at every occurrence (the example's program "
                 "before its aggregate form, --per-occurrence since), over generated lines of 1-24 words",
    "sessions": "per-user sessions as keyed state: parse a JSON click, then partitioned by user (ordered by ts): "
                "a click more than 30 s after the user's open session ends it, and the session (clicks, distinct "
                "pages) is emitted; built here from map and partitioned (examples/sessions.py's Session window is "
                "newer than the revisions compared) over examples/generators/clicks.py's click stream",
}
PLANS = ("sequential", "planner")
SESSION_GAP_S = 30.0


# -- the names a revision's process needs, wherever that revision keeps them --------------------------


def first_found(name: str, modules: Sequence[str]):
    """`name` from the first of `modules` that defines it. A module this revision does not have is
    skipped; one that exists but fails to import raises (a missing name inside it is a real error)."""
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            missing = error.name or ""
            if module_name == missing or module_name.startswith(missing + "."):
                continue
            raise
        if hasattr(module, name):
            return getattr(module, name)
    raise ImportError(f"{name} is in none of {', '.join(modules)} at this revision")


def runner_config():
    return first_found("RunnerConfig", ("fissure", "fissure.config", "fissure.spark.config"))


def plan_functions():
    """(sequential_plan, planner_plan) of this revision."""
    modules = ("fissure.plan.plans", "fissure.plan", "fissure.spark.plans")
    return first_found("sequential_plan", modules), first_found("planner_plan", modules)


def session_factory():
    return first_found("create_session", ("fissure.spark.session.create", "fissure.spark.session.session", "fissure.spark.session"))


# -- the keyed-state programs, the same at every revision ------------------------------------------------


def word_count_program(fissure, wordcount):
    """The word count with a running count per word, emitted at every occurrence: the example's
    own functions, chained as its build_pipeline() did before the aggregate form
    (build_pipeline(per_occurrence=True) since)."""
    return (fissure.Pipeline("wordcount")
            .flat_map("words", wordcount.words, schema={"word": str}, reads=["value"], cost_us=3.0, selectivity=12.0)
            .partitioned("count", wordcount.count, key="word", schema={"word": str, "count": int}, cost_us=2.0))


def parse_click(record):
    click = json.loads(record["value"])
    return {"user": str(click["user"]), "page": str(click["page"]), "ts": float(click["ts"])}


def sessionize(state, click):
    """A user's open session in `state`. A click more than SESSION_GAP_S after its last click
    ends it: the ended session is returned (emitted) and the click opens the next one."""
    ended = None
    if state and click["ts"] - state["end"] > SESSION_GAP_S:
        ended = {"user": click["user"], "start": state["start"], "end": state["end"], "clicks": state["clicks"],
                 "pages": len(state["pages"])}
        state.clear()
    if not state:
        state.update(start=click["ts"], end=click["ts"], clicks=0, pages=[])
    state["end"] = max(state["end"], click["ts"])
    state["clicks"] += 1
    if click["page"] not in state["pages"]:
        state["pages"].append(click["page"])
    return ended


def sessions_program(fissure):
    return (fissure.Pipeline("sessions")
            .map("parse", parse_click, schema={"user": str, "page": str, "ts": float}, reads=["value"], cost_us=4.0)
            .partitioned("sessions", sessionize, key="user", order_by="ts", cost_us=3.0, selectivity=0.15,
                         schema={"user": str, "start": float, "end": float, "clicks": int, "pages": int}))


def point(tree: str, inputs: str, checkpoints: str, workloads: Sequence[str] = tuple(WORKLOADS)) -> dict:
    """In a process importing fissure from `tree`: warm up, then every workload under every plan,
    each run's checkpoint in a folder of its own under `checkpoints`."""
    sys.path[:0] = [os.path.join(tree, "src"), os.path.join(tree, "examples"), os.path.join(tree, "benchmarks")]
    import fissure
    from spark_chain import cpu_pipeline, measure_fissure

    RunnerConfig = runner_config()
    sequential_plan, planner_plan = plan_functions()
    create_session = session_factory()
    spark = create_session(RunnerConfig(master="local[2]"))

    def text_source(name: str):
        return fissure.FileSource(os.path.join(inputs, name), format="text", max_files_per_trigger=1)

    programs = {"cpu": cpu_pipeline(4)}
    sources = {"cpu": fissure.FileSource(os.path.join(inputs, "cpu"), format="json", schema={"x": float},
                                         max_files_per_trigger=1)}
    if "logwatch" in workloads:
        from logwatch import build_pipeline

        programs["logwatch"], sources["logwatch"] = build_pipeline(), text_source("logwatch")
    if "wordcount" in workloads:
        import wordcount

        programs["wordcount"], sources["wordcount"] = word_count_program(fissure, wordcount), text_source("wordcount")
    if "sessions" in workloads:
        programs["sessions"], sources["sessions"] = sessions_program(fissure), text_source("sessions")

    def measure(workload: str, plan) -> float:
        return measure_fissure(spark, programs[workload], sources[workload], plan, tempfile.mkdtemp(dir=checkpoints))

    measure("cpu", sequential_plan(programs["cpu"]))  # warm-up, not counted
    rates = {}
    for workload in workloads:
        program = programs[workload]
        for plan_name, plan in (("sequential", sequential_plan(program)), ("planner", planner_plan(program, 2))):
            rates[f"{workload}/{plan_name}"] = measure(workload, plan)
    return {"fissure": fissure.__file__, "rates": rates}


def write_inputs(directory: Path, workloads: Sequence[str], records: int, lines: int, word_lines: int, users: int,
                 files: int) -> None:
    """Every chosen workload's input, and the CPU chain's (the warm-up reads it), from this checkout."""
    sys.path[:0] = [str(REPOSITORY / "src"), str(REPOSITORY / "examples")]
    from generators.loglines import generate, split_into_files

    from fissure.testing import record_files

    record_files(directory / "cpu", [{"x": float(i % 997) + 0.5} for i in range(records)], {"x": float},
                 records_per_file=-(-records // files))
    if "logwatch" in workloads:
        split_into_files(list(generate(lines)), str(directory / "logwatch"), files)
    if "wordcount" in workloads:
        from generators.words import generate as word_lines_of

        split_into_files(word_lines_of(word_lines), str(directory / "wordcount"), files)
    if "sessions" in workloads:
        from generators.clicks import click_lines, generate_clicks

        split_into_files(click_lines(generate_clicks(users)), str(directory / "sessions"), files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the earlier revision (a commit, tag or branch)")
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--lines", type=int, default=30000, help="LogWatch's log lines")
    parser.add_argument("--word-lines", type=int, default=20000, help="the word count's lines (1-24 words each)")
    parser.add_argument("--users", type=int, default=5000, help="the sessions' users (about 16 clicks each)")
    parser.add_argument("--files", type=int, default=5)
    parser.add_argument("--workloads", nargs="+", choices=tuple(WORKLOADS), default=list(WORKLOADS),
                        metavar="WORKLOAD", help=f"the workloads to measure (default all: {', '.join(WORKLOADS)})")
    parser.add_argument("--rounds", type=int, default=3, help="repeats of both revisions (at least 3 unless --quick)")
    parser.add_argument("--name", default="compare_revisions",
                        help="the results files' name (NAME.md and NAME.json), to keep comparisons against "
                             "different bases apart")
    method.add_arguments(parser, repeats=None)
    parser.add_argument("--point", nargs=3, metavar=("TREE", "INPUTS", "CHECKPOINTS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.point:
        print(json.dumps(point(*args.point, workloads=args.workloads)))
        return 0
    if args.quick:
        args.records, args.lines, args.word_lines, args.users, args.files, args.rounds = 2000, 3000, 2000, 300, 3, 1
    workloads = [name for name in WORKLOADS if name in args.workloads]
    method.check_repeats(args.rounds, args.quick)
    run = method.Run("compare_revisions.py", argv, quick=args.quick, out=args.out)
    with method.scratch_folder("compare_revisions.py") as work:  # the base's worktree, the inputs, checkpoints
        base_tree = work / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), args.base], cwd=REPOSITORY, check=True,
                       capture_output=True)
        try:
            write_inputs(work / "inputs", workloads, args.records, args.lines, args.word_lines, args.users,
                         args.files)
            checkpoints = work / "checkpoints"
            checkpoints.mkdir()
            trees = {"base": base_tree, "this": REPOSITORY}
            rates: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
            for round_number in range(args.rounds):
                for name in method.run_order(list(trees), round_number):
                    result = method.run_in_tree([sys.executable, __file__, "--base", args.base,
                                                 "--workloads", *workloads, "--point", str(trees[name]),
                                                 str(work / "inputs"), str(checkpoints)], trees[name], name)
                    for key, rate in result["rates"].items():
                        rates[name].setdefault(key, []).append(rate)
                    print(f"round {round_number + 1} {name}: " + ", ".join(f"{key} {rate:,.0f}"
                                                                           for key, rate in result["rates"].items()),
                          flush=True)
            document = {
                "base": revision(base_tree), "this": run.revision,
                "workloads": {name: WORKLOADS[name] for name in workloads}, "rates": rates,
                "this_over_base": {key: method.paired_ratio({"this": rates["this"][key], "base": rates["base"][key]},
                                                            "this", "base")
                                   for key in rates["this"]},
            }
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=REPOSITORY,
                           capture_output=True)
    run.write_results(args.name, report(document), document)
    return 0


def report(document: dict) -> str:
    lines = ["# This revision against an earlier one, same chains and plans", "",
             f"Revisions: this {document['this']}, base {document['base']}. Each revision's process makes one "
             "uncounted warm-up run; the two revisions' order rotates each round.", "",
             *[f"- {name}: {what}" for name, what in document.get("workloads", {}).items()],
             *([""] if document.get("workloads") else []),
             "| workload / plan | base, median records/s | this, median records/s | this / base (median of paired ratios) |",
             "| --- | --- | --- | --- |"]
    for key, ratio in document["this_over_base"].items():
        lines.append(f"| {key} | {statistics.median(document['rates']['base'][key]):,.0f} | "
                     f"{statistics.median(document['rates']['this'][key]):,.0f} | {ratio:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
