"""What a plan switch of the adaptive loop costs on Spark, by kind, at this revision and (with
`--revision REV`) at another one, side by side.

A fixed small chain (two stateless maps that burn CPU, then a running count per user: a keyed,
partitioned operator) runs as a streaming query on the local Spark session (local[N], N =
--cores), fed one file of generated records per micro-batch. The query is driven by the Spark
realizer of the adaptive loop (QueryManager and SparkPlanRealizer, the adaptive run's own
mechanism) without a controller: a fixed script of switches, one every --every batches, from the
sequential plan and back to it:

- in-PE: another pipeline cut, `[parse|enrich,count]`, and back (the PE's processes change
  between two batches, no restart);
- restart: replicas of the stateless prefix, `[parse,enrich]x2 -> [count]`, and back (a new
  physical plan; the state partitions stay 1, so no state moves);
- restart with state: the keyed region replicated, `[parse,enrich,count]x2`, and back (the state
  partitions go 1 -> 2 -> 1: Spark's offline repartitioner rewrites the count's state).

Per switch the realizer's own record (fissure.spark.adaptive.realizer.SwitchRecord): stop,
repartition, start-to-first-batch and total seconds, the kind the revision's classifier asked for
and the kind the realizer applied. An in-PE switch costs the driver next to nothing, so for it the
extra seconds of the first batch under the new cut over the median of the batches before it are
reported too (the PE forks its new processes there).

Method (benchmarks/method.py): each revision runs in Python processes of its own, importing
fissure from its own checkout (this one, and a temporary git worktree of --revision); one process
per revision per round, the revisions' order rotated each round; a process starts one Spark
session, makes one uncounted warm-up switch round (not with --quick), then one counted round of
the script, and ends its Spark session and JVM (end_spark). At least 3 rounds unless --quick;
reported: the median seconds per applied kind over every counted switch of that kind, each
revision's, and this revision's over the other's. The results header carries the provenance, the
busy check and the machine-speed calibration before and after.

Writes switch_cost.md and .json under --out (default benchmarks/results/; --quick:
switch_cost_quick.md and .json in a temporary folder). A shared, noisy machine gives no figures: run it on a quiet one.

    ./dev python benchmarks/switch_cost.py --revision 6e64f92      # before/after, 3 rounds (quiet machine!)
    ./dev python benchmarks/switch_cost.py                          # this revision alone
    ./dev python benchmarks/switch_cost.py --revision 6e64f92 --quick   # an end-to-end check, no figures
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

import method  # noqa: E402
from provenance import revision  # noqa: E402

KINDS = ("in-pe", "restart", "restart-with-state")
USERS = 50


@dataclass(frozen=True)
class Size:
    records_per_file: int  # records per micro-batch
    heavy_us: float  # CPU per record of each stateless map
    every: int  # batches between two switches


FULL = Size(records_per_file=2000, heavy_us=30.0, every=3)
QUICK = Size(records_per_file=200, heavy_us=10.0, every=3)

SEQUENTIAL = "[parse,enrich,count]"
SCRIPT = (  # (target plan, the kind it is meant to exercise), from SEQUENTIAL and back to it
    ("[parse|enrich,count]", "in-pe"), (SEQUENTIAL, "in-pe"),
    ("[parse,enrich]x2 -> [count]", "restart"), (SEQUENTIAL, "restart"),
    ("[parse,enrich,count]x2", "restart-with-state"), (SEQUENTIAL, "restart-with-state"),
)
WARM_UP = (("[parse,enrich]x2 -> [count]", "restart"), (SEQUENTIAL, "restart"))


# -- one revision's process: imports fissure from its own checkout ------------------------------------


def burn(microseconds: float) -> None:
    end = time.perf_counter() + microseconds / 1e6
    while time.perf_counter() < end:
        pass


def chain(heavy_us: float):
    from fissure import Pipeline

    def parse(record):
        burn(heavy_us)
        return {"user": record["user"], "i": record["i"]}

    def enrich(record):
        burn(heavy_us)
        return {"user": record["user"], "i": record["i"] * 2}

    def count(state, record):
        state["n"] = state.get("n", 0) + 1
        return {"user": record["user"], "i": record["i"], "n": state["n"]}

    return (Pipeline("switch-cost").map("parse", parse, cost_us=heavy_us).map("enrich", enrich, cost_us=heavy_us)
            .partitioned("count", count, key="user", schema={"user": str, "i": int, "n": int}, cost_us=5.0))


def run_script(spark, work: Path, size: Size, script, tag: str) -> dict:
    """One query driven through `script`: every switch's record, and the in-PE first batches' extra seconds."""
    from fissure.config import RunnerConfig
    from fissure.control.plan_change import SwitchKind, classify_change, parse_fingerprint, plan_fingerprint
    from fissure.spark.adaptive.observations import OperatorProfiles, SparkObservations
    from fissure.spark.adaptive.queries import QueryManager
    from fissure.spark.adaptive.realizer import SparkPlanRealizer
    from fissure.spark.io.sinks import NoopSink
    from fissure.testing import record_files

    pipeline = chain(size.heavy_us)
    stats = pipeline.operator_stats()
    files = size.every * (len(script) + 2)
    records = [{"user": f"u{i % USERS}", "i": i} for i in range(files * size.records_per_file)]
    source = record_files(work / f"{tag}-in", records, {"user": str, "i": int},
                          records_per_file=size.records_per_file, max_files_per_trigger=1)
    queries = QueryManager(pipeline, source, NoopSink(), spark=spark, checkpoint=str(work / f"{tag}-ckpt"),
                           dead_letters=None, config=RunnerConfig(), available_now=True, clock=time.monotonic)
    realizer = SparkPlanRealizer(queries)
    observations = SparkObservations(queries, OperatorProfiles(stats), cores=2)
    pending = list(script)
    current = parse_fingerprint(SEQUENTIAL)
    queries.start(current)
    since_switch: list[float] = []  # durations of the batches since the last switch (or the start)
    in_pe_extra: list[float] = []
    classified: list[dict] = []
    waiting_for, baseline = None, None
    try:
        while (observation := observations.next_batch()) is not None:
            if waiting_for is not None and observation.plan_in_force == waiting_for:
                if baseline is not None:
                    in_pe_extra.append(observation.duration_s - baseline)
                waiting_for = None
            since_switch.append(observation.duration_s)
            if pending and len(since_switch) >= size.every:
                # the first batch after a switch or the start pays for it: not part of the baseline
                baseline = statistics.median(since_switch[1:]) if len(since_switch) > 1 else None
                text, meant = pending.pop(0)
                target = parse_fingerprint(text)
                change = classify_change(current, target, stats)
                classified.append({"plan_before": plan_fingerprint(current), "plan_after": text, "meant": meant,
                                   "classified_as": change.kind.value,
                                   "state_repartitions_named": [entry.operator for entry in change.state_repartitions]})
                realizer.apply(target, change.kind)
                if change.kind is SwitchKind.IN_PE:
                    waiting_for = plan_fingerprint(target)
                current, since_switch = target, []
    finally:
        queries.close()
    if pending:
        raise RuntimeError(f"the input ended with {len(pending)} switches of the script left")
    return {"switches": [asdict(switch) for switch in realizer.switches], "classified": classified,
            "in_pe_first_batch_extra_s": in_pe_extra}


# Switches of a chain with two keyed operators and an unkeyed stateful one: what the revision's
# classifier calls each (the kind the loop charges it), no Spark. p is stateless, x keyed by k,
# y keyed by u, z stateful without a key.
CLASSIFIED = (
    ("[p,x]x3 -> [y]x3 -> [z]", "[p,x]x2 -> [y]x3 -> [z]"),  # x narrows, y keeps the state partitions at 3
    ("[p,x,y]x2 -> [z]", "[p,x]x2 -> [y]x2 -> [z]"),  # y's region and its exchange key change at width 2
    ("[p,x]x2 -> [y]x2 -> [z]", "[p,x]x3 -> [y]x2 -> [z]"),  # the state partitions go 2 -> 3
    ("[p,x,y,z]", "[p]x2 -> [x,y,z]"),  # stateless replicas
)


def classified_examples() -> list[dict]:
    from fissure.control.plan_change import classify_change, parse_fingerprint
    from fissure.model.types import Kind, OperatorStats

    chain = (OperatorStats("p", Kind.STATELESS, 1.0, 1.0), OperatorStats("x", Kind.PARTITIONED, 1.0, 1.0, key=("k",)),
             OperatorStats("y", Kind.PARTITIONED, 1.0, 1.0, key=("u",)), OperatorStats("z", Kind.STATEFUL, 1.0, 1.0))
    examples = []
    for before, after in CLASSIFIED:
        change = classify_change(parse_fingerprint(before), parse_fingerprint(after), chain)
        examples.append({"plan_before": before, "plan_after": after, "classified_as": change.kind.value,
                         "state_repartitions_named": [entry.operator for entry in change.state_repartitions]})
    return examples


def point(tree: str, size: Size, cores: int, warm_up: bool, scratch: Path) -> dict:
    """In a process importing fissure from `tree`: an uncounted warm-up round, then the counted one,
    their inputs and checkpoints in a new folder under `scratch`."""
    sys.path[:0] = [os.path.join(tree, "src")]
    import fissure
    from fissure.config import RunnerConfig
    from fissure.spark.session.create import create_session

    spark = create_session(RunnerConfig(master=f"local[{cores}]", app_name="fissure-switch-cost"))
    work = Path(tempfile.mkdtemp(dir=scratch))
    try:
        if warm_up:
            run_script(spark, work, size, WARM_UP, "warm-up")
        counted = run_script(spark, work, size, SCRIPT, "counted")
    finally:
        method.end_spark(spark)
    return {"fissure": fissure.__file__, **counted, "classified_examples": classified_examples()}


# -- the parent: revisions, rounds, results ------------------------------------------------------------


def medians_by_kind(rounds: list[dict]) -> dict:
    """Per applied kind over every round's switches: the count and the median total, stop,
    repartition and start seconds."""
    by_kind: dict[str, list[dict]] = {}
    for result in rounds:
        for switch in result["switches"]:
            if switch.get("error") is None:
                by_kind.setdefault(switch["applied_as"], []).append(switch)
    summary = {}
    for kind, switches in by_kind.items():
        summary[kind] = {"switches": len(switches),
                         **{f"median_{part}": statistics.median(switch[part] for switch in switches)
                            for part in ("total_s", "stop_s", "repartition_s", "start_s")},
                         # a revision before the build overlapped records none: its start_s includes the build
                         "median_build_s": (statistics.median(switch["build_s"] for switch in switches)
                                            if all("build_s" in switch for switch in switches) else None)}
    extra = [value for result in rounds for value in result["in_pe_first_batch_extra_s"]]
    if "in-pe" in summary:
        summary["in-pe"]["median_first_batch_extra_s"] = statistics.median(extra) if extra else None
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--revision", default=None,
                        help="also measure this earlier revision (a commit, tag or branch), in a temporary worktree")
    parser.add_argument("--rounds", type=int, default=method.MIN_REPEATS,
                        help=f"rounds per revision, one process each (at least {method.MIN_REPEATS} unless --quick)")
    parser.add_argument("--cores", type=int, default=2, help="Spark task slots, local[N] (default 2)")
    method.add_arguments(parser, repeats=None)
    parser.add_argument("--point", nargs=3, metavar=("TREE", "SIZE", "SCRATCH"), help=argparse.SUPPRESS)
    parser.add_argument("--warm-up", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.point:
        size = Size(**json.loads(args.point[1]))
        print(json.dumps(point(args.point[0], size, args.cores, args.warm_up, Path(args.point[2]))))
        return 0
    if args.quick:
        args.rounds = 1
    method.check_repeats(args.rounds, args.quick)
    size = QUICK if args.quick else FULL
    run = method.Run("switch_cost.py", argv, quick=args.quick, out=args.out, master=f"local[{args.cores}]")
    trees = {"this": REPOSITORY}
    with method.scratch_folder("switch_cost.py") as work:  # the earlier revision's worktree, inputs, checkpoints
        if args.revision is not None:
            trees["base"] = work / "base"
            subprocess.run(["git", "worktree", "add", "--detach", str(trees["base"]), args.revision], cwd=REPOSITORY,
                           check=True, capture_output=True)
        rounds: dict[str, list[dict]] = {name: [] for name in trees}
        try:
            for round_number in range(args.rounds):
                for name in method.run_order(list(trees), round_number):
                    command = [sys.executable, __file__, "--cores", str(args.cores),
                               "--point", str(trees[name]), json.dumps(asdict(size)), str(work)]
                    result = method.run_in_tree(command + ([] if args.quick else ["--warm-up"]), trees[name], name)
                    rounds[name].append(result)
                    print(f"round {round_number + 1} {name}: " + ", ".join(
                        f"{switch['applied_as']} {switch['total_s']:.2f} s" for switch in result["switches"]),
                        flush=True)
            document = {
                "this": run.revision, "base": revision(trees["base"]) if "base" in trees else None,
                "cores": args.cores, "rounds": args.rounds, "size": asdict(size),
                "script": [{"plan_after": text, "meant": meant} for text, meant in SCRIPT],
                "by_kind": {name: medians_by_kind(results) for name, results in rounds.items()},
                "runs": rounds,
            }
        finally:
            if "base" in trees:
                subprocess.run(["git", "worktree", "remove", "--force", str(trees["base"])], cwd=REPOSITORY,
                               capture_output=True)
    run.write_results("switch_cost_quick" if args.quick else "switch_cost", report(document), document)
    return 0


def seconds(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if abs(value) < 0.1 else f"{value:.2f}"


def report(document: dict) -> str:
    this, base = document["by_kind"]["this"], document["by_kind"].get("base")
    revisions = f"this {document['this']}" + (f", before {document['base']}" if document["base"] else "")
    lines = ["# What a plan switch costs on Spark, by kind", "",
             f"Revisions: {revisions}. {document['rounds']} round(s) per revision, one process each, the order "
             f"rotated each round; a chain of two stateless maps ({document['size']['heavy_us']:g} us per record "
             f"each) and a keyed running count, {document['size']['records_per_file']:,} records per micro-batch, "
             f"a switch every {document['size']['every']} batches on {document['cores']} cores. Seconds are the "
             "realizer's: from the stop request (the apply call, in-PE) to the new query's first batch reaching its "
             "foreachBatch (to the new cut being set, in-PE); medians over every switch of the kind.", "",
             "| applied as | switches | this: total s | stop | repartition | start to first batch "
             "| build (overlaps stop and repartition) |"
             + (" before: total s | this / before |" if base is not None else ""),
             "| --- | --- | --- | --- | --- | --- | --- |" + (" --- | --- |" if base is not None else "")]
    for kind in KINDS:
        row = this.get(kind)
        if row is None:
            continue
        line = (f"| {kind} | {row['switches']} | {seconds(row['median_total_s'])} | {seconds(row['median_stop_s'])} | "
                f"{seconds(row['median_repartition_s'])} | {seconds(row['median_start_s'])} | "
                f"{seconds(row['median_build_s']) if row.get('median_build_s') is not None else 'not separate'} |")
        if base is not None:
            before = base.get(kind, {}).get("median_total_s")
            ratio = f"{row['median_total_s'] / before:.2f}" if before else "n/a"
            line += f" {seconds(before)} | {ratio} |"
        lines.append(line)
    extra = this.get("in-pe", {}).get("median_first_batch_extra_s")
    lines += ["", f"In-PE switches: the first batch under the new cut took {seconds(extra)} s over the median of the "
              "batches before it (the PE forks its new processes there)."]
    names = [name for name in ("this", "base") if document["runs"].get(name)]
    heading = " | ".join("this" if name == "this" else "before" for name in names)
    lines += ["", "What each revision's classifier calls a switch (the kind the loop charges it; in brackets the "
              "operators whose state is repartitioned): the script's switches, then switches of a chain with two "
              "keyed operators (x by k, y by u) and an unkeyed stateful one (z), classified without Spark.", "",
              f"| switch | {heading} |", "| --- |" + " --- |" * len(names)]
    for key in ("classified", "classified_examples"):
        rows = [document["runs"][name][0].get(key) or [] for name in names]
        for index, entry in enumerate(rows[0]):
            cells = []
            for row in rows:
                other = row[index] if index < len(row) else None
                repartitioned = ", ".join(other.get("state_repartitions_named") or []) if other else ""
                cells.append("n/a" if other is None else other["classified_as"]
                             + (f" ({repartitioned})" if repartitioned else ""))
            switch = f"`{entry['plan_before']}` to `{entry['plan_after']}`".replace("|", "\\|")  # a table cell
            lines.append(f"| {switch} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
