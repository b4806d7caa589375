"""What a record costs on fissure against the direct loop, with the peers a user would pick instead.

McSherry, Isard and Murray ("Scalability! But at what COST?", HotOS 2015) ask of every parallel
system how many cores it needs to beat one competent thread. So every figure here starts with
that thread: the direct loop (benchmarks/direct_loops.py), the plain Python a user writes without
a framework: open the same files, iterate their lines, call the example's functions directly,
keep state in dicts. Then fissure on Spark (`local[2]`), under the sequential plan and the
planner's plan, and the peers (benchmarks/peers.py), each optional: bytewax 0.21 with one worker
over the same functions (hot items in bytewax's own windows), Spark's own operators for the word
count (`explode(split())`, `groupBy().count()`) and the hot items (`from_json`, two windowed
aggregations), and a hand-written `transformWithStateInPandas` word count over 8 hash buckets.
Every run's rate is a ratio to the direct loop of its round.

Workloads (the functions of the examples):
- LogWatch (`examples/logwatch.py`), generated log lines written in time order;
- the word count (`examples/wordcount.py`'s functions) over Zipf vocabularies of 10,000 and
  100,000 words, 12 words a line, as two fissure programs: the running count per occurrence
  (`partitioned`) and the aggregate (`aggregate(..., Count())`, ", aggregate" below);
- the CPU-heavy chain of `benchmarks/spark_chain.py` (four 60 us maps);
- Nexmark's hot items (`examples/hot_items.py`): bids counted per auction in 10-second event-time
  windows, then the auction with the most bids per window.

Method: the inputs are written once, as files read `files_per_batch` a micro-batch. Before
anything is timed, every run computes its answer over a small input of the same kind and is
checked against the direct loop's: a run whose answer differs (or that fails, or whose peer is not
installed) is left out of the rounds, with the reason in the results. A round runs, per workload,
the direct loop, then the other runs in an order rotated each round, then the direct loop again;
the round's direct rate is the median of the two (both are reported). A fissure run goes through
`fissure.run` with its default settings, as `fissure run` does, and its rate is the steady rate
that `fissure run --json` prints (the records of the micro-batches after the first over their
summed durations); a Spark peer's rate is the same over its query's batches; the direct loop's and
bytewax's, records over the whole run. Reported: medians
over rounds (at least 3 unless --quick), and the median of the per-round ratios to the direct
loop. One uncounted warm-up run starts Spark's Python workers first (benchmarks/method.py).
Results: cost.md/.json (cost_1m.* with --goal) under --out. The inputs and the runs' checkpoints
(about 300 MB with --goal) go in one temporary folder, removed at the end.

    ./dev python benchmarks/cost.py                 # 3 rounds, the default sizes
    ./dev python benchmarks/cost.py --scale 10      # 10x the records per workload
    ./dev python benchmarks/cost.py --quick         # tiny inputs, one round: a smoke test
    ./dev python benchmarks/cost.py --goal          # 1,000,000 records in 20 files, 5 files a batch,
                                                    # direct loop, planner and peers (cost_1m.md),
                                                    # LogWatch, the word counts and hot items
    ./dev python benchmarks/cost.py --without bytewax --without spark-tws
    ./dev python benchmarks/cost.py --only wordcount-10k --variant aggregate   # the combined word count only

bytewax is the optional extra `bench` (`.venv/bin/python -m pip install -e ".[bench]"`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "examples"))
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

import fissure  # noqa: E402
from fissure.plan.plans import describe_plan, planner_plan, sequential_plan  # noqa: E402
import direct_loops  # noqa: E402
import method  # noqa: E402
import peers  # noqa: E402
from spark_chain import cpu_pipeline, cpu_source, measure_fissure  # noqa: E402

# Records per workload at --scale 1, and files (one micro-batch each).
SIZES = {"logwatch": 60_000, "wordcount-10k": 10_000, "wordcount-100k": 10_000, "cpu": 20_000, "hot-items": 50_000}
FAMILY = {"logwatch": "logwatch", "wordcount-10k": "wordcount", "wordcount-100k": "wordcount", "cpu": "cpu",
          "hot-items": "hot-items"}
VOCABULARY = {"wordcount-10k": 10_000, "wordcount-100k": 100_000}
FILES = 5
# The small input every run's answer is checked on before the rounds (2 files, 1 a micro-batch).
# Hot items: 200 s of event time, 20 windows (a Spark peer leaves the last open: peers.LAST_WINDOWS_OPEN).
CHECK_RECORDS = {"logwatch": 12_000, "wordcount": 2_000, "cpu": 200, "hot-items": 20_000}
PEERS = {"logwatch": ("bytewax",), "wordcount": ("bytewax", "spark-sql", "spark-tws"), "cpu": ("bytewax",),
         "hot-items": ("bytewax", "spark-sql")}
DIRECT_BEFORE, DIRECT_AFTER, DIRECT = "direct (before)", "direct (after)", "direct"
WHAT = {
    DIRECT: "the direct loop: the median of its runs before and after the others in the round",
    "sequential": "fissure (`fissure.run`), the sequential plan",
    "planner": "fissure (`fissure.run`), the planner's plan",
    "bytewax": "bytewax 0.21, one worker, the same functions",
    "spark-sql": "Spark's own operators: explode(split()), groupBy().count()",
    "spark-tws": "transformWithStateInPandas, 8 hash buckets of words",
}
WHAT_OF_FAMILY = {("hot-items", "bytewax"): "bytewax 0.21, one worker, the same functions in bytewax's windows "
                                           "(count_window, fold_window)",
                  ("hot-items", "spark-sql"): "Spark's own operators: from_json, a count per auction and 10-second "
                                             "window, then per window the auction with the most bids (append mode)"}


@dataclass
class Workload:
    name: str
    family: str
    paths: list[str]
    records: int
    source: object  # fissure.FileSource over `paths`
    check_paths: list[str]
    check_source: object
    programs: dict[str, fissure.Pipeline]  # by variant: "" or "aggregate"
    scratch: Path  # its runs' checkpoints (removed with the benchmark's folder at the end)
    runs: dict[str, object] = field(default_factory=dict)  # measured runs: label -> how to run it
    skipped: dict[str, str] = field(default_factory=dict)  # label -> why it is not measured
    notes: dict[str, str] = field(default_factory=dict)  # label -> what its check found beside the answer


def fissure_label(plan_name: str, variant: str) -> str:
    return plan_name + (f", {variant}" if variant else "")


def prepare(name: str, work: Path, records: int, files: int, files_per_batch: int) -> Workload:
    family = FAMILY[name]
    vocabulary = VOCABULARY.get(name)
    source = direct_loops.write_input(family, work / name, records, files, files_per_batch, vocabulary)
    check_source = direct_loops.write_input(family, work / f"{name}-check", CHECK_RECORDS[family], 2, 1, vocabulary)
    paths = direct_loops.input_files(work / name)
    return Workload(name, family, paths, direct_loops.count_records(paths), source,
                    direct_loops.input_files(work / f"{name}-check"), check_source, direct_loops.programs(family),
                    work)


def plan_runs(workload: Workload, plan_names: tuple[str, ...], without: set[str]) -> None:
    """The runs of a workload: fissure's plans for every program, and its peers."""
    for variant, program in workload.programs.items():
        for plan_name in plan_names:
            plan = sequential_plan(program) if plan_name == "sequential" else planner_plan(program, 2)
            workload.runs[fissure_label(plan_name, variant)] = ("fissure", program, plan)
    for peer in PEERS[workload.family]:
        if peer in without:
            workload.skipped[peer] = "left out (--without)"
        elif peer == "bytewax" and peers.bytewax_missing():
            workload.skipped[peer] = peers.bytewax_missing()
        else:
            workload.runs[peer] = ("peer", peer)


def run_answer(spark, workload: Workload, label: str):
    """What a run computes over the workload's check input, as the direct loop's answer reads."""
    how = workload.runs[label]
    answer = getattr(direct_loops, f"{workload.family.replace('-', '_')}_answer")
    if how[0] == "fissure":
        _, program, plan = how
        sink = fissure.MemorySink()
        fissure.run(program, workload.check_source, sink, plan=plan, checkpoint=tempfile.mkdtemp(dir=workload.scratch),
                    config=fissure.RunnerConfig(spark=spark, progress="off"))
        return answer(sink.records())
    peer = how[1]
    if peer == "bytewax":
        return answer(peers.bytewax_output(workload.family, workload.check_paths))
    return answer(peers.spark_peer_output(spark, workload.family, peer, workload.check_source,
                                          tempfile.mkdtemp(dir=workload.scratch)))


def describe_difference(got, expected) -> str:
    if not got:
        return f"no results, against {len(expected):,}"
    if isinstance(expected, dict) and isinstance(got, dict):
        differing = sorted(key for key in expected.keys() | got.keys() if expected.get(key) != got.get(key))
        return (f"{len(differing)} of {len(expected)} keys differ, e.g. {differing[0]!r}: "
                f"{got.get(differing[0])!r} against {expected.get(differing[0])!r}")
    return f"{len(got)} results against {len(expected)}; first {got[:1]!r} against {expected[:1]!r}"


def check_runs(spark, workload: Workload) -> None:
    """Leave out every run whose answer on the check input is not the direct loop's."""
    expected = direct_loops.direct_answer(workload.family, workload.check_paths)
    for label in list(workload.runs):
        try:
            got = run_answer(spark, workload, label)
        except Exception as error:  # noqa: BLE001 - any failure leaves the run out, with its reason
            traceback.print_exc()
            workload.skipped[label] = f"failed on the check input: {type(error).__name__}: {str(error).splitlines()[0]}"
        else:
            compared, note = expected, None
            if (workload.family, label) in peers.LAST_WINDOWS_OPEN and got and isinstance(got, dict):
                last = max(got)  # windows are keyed by their start: the ones after it stayed open
                compared = {start: value for start, value in expected.items() if start <= last}
                if len(compared) < len(expected):
                    note = (f"its answer on the check input: the direct loop's first {len(compared)} windows of "
                            f"{len(expected)}; the last {len(expected) - len(compared)} stayed open (append mode)")
            if got == compared:
                if note is not None:
                    workload.notes[label] = note
                continue
            workload.skipped[label] = ("answered otherwise than the direct loop on the check input "
                                       f"({CHECK_RECORDS[workload.family]:,} records): "
                                       f"{describe_difference(got, compared)}")
        del workload.runs[label]
        print(f"{workload.name}: {label} left out: {workload.skipped[label]}", file=sys.stderr, flush=True)


def direct_rate(workload: Workload) -> float:
    loop = direct_loops.DIRECT[workload.family][0]
    started = time.perf_counter()
    loop(workload.paths)
    return workload.records / (time.perf_counter() - started)


def fissure_run_rate(spark, program, source, plan, scratch: Path) -> float:
    """fissure's steady rate through the user's way in: `fissure.run` (which `fissure run` calls)
    with its defaults (profiling on, progress as a run without a terminal shows it, the end of
    input flushed), the figure `fissure run --json` prints as `steady_records_per_s`."""
    report = fissure.run(program, source, fissure.NoopSink(), plan=plan, checkpoint=tempfile.mkdtemp(dir=scratch),
                         config=fissure.RunnerConfig(spark=spark))
    return report.summary()["steady_records_per_s"] or 0.0


def measure(spark, workload: Workload, label: str) -> float:
    how = workload.runs[label]
    if how[0] == "fissure":
        _, program, plan = how
        return fissure_run_rate(spark, program, workload.source, plan, workload.scratch)
    peer = how[1]
    if peer == "bytewax":
        return peers.bytewax_rate(workload.family, workload.paths, workload.records)
    return peers.spark_peer_rate(spark, workload.family, peer, workload.source, tempfile.mkdtemp(dir=workload.scratch))


def measure_rounds(spark, workload: Workload, rounds: int) -> dict[str, list[float]]:
    others = list(workload.runs)
    rates: dict[str, list[float]] = {label: [] for label in (DIRECT, DIRECT_BEFORE, DIRECT_AFTER, *others)}
    for round_number in range(rounds):
        rates[DIRECT_BEFORE].append(direct_rate(workload))
        for label in method.run_order(others, round_number):
            rates[label].append(measure(spark, workload, label))
        rates[DIRECT_AFTER].append(direct_rate(workload))
        rates[DIRECT].append(statistics.median([rates[DIRECT_BEFORE][-1], rates[DIRECT_AFTER][-1]]))
        print(f"{workload.name} round {round_number + 1}: " + ", ".join(f"{label} {values[-1]:,.0f}"
                                                                        for label, values in rates.items()), flush=True)
    return rates


def what(label: str, family: str) -> str:
    if label in (DIRECT_BEFORE, DIRECT_AFTER):
        return "the direct loop, run " + label.split("(")[1].rstrip(")") + " the others"
    plan_name, _, variant = label.partition(", ")
    if plan_name not in ("sequential", "planner"):
        return WHAT_OF_FAMILY.get((family, label), WHAT[label])
    if variant:
        return WHAT[plan_name] + ", the aggregate program (aggregate(..., Count()))"
    return WHAT[plan_name] + (", the running count per occurrence" if family == "wordcount" else "")


def report(document: dict) -> str:
    lines = ["# What a record costs: fissure against the direct loop, and its peers", "",
             "One uncounted warm-up run; every run's answer checked against the direct loop's on a small input "
             "first; then per workload and round the direct loop, the other runs in an order rotated each round, "
             "the direct loop again. Medians over rounds, and the median of the per-round ratios to the round's "
             "direct rate (the median of its two runs). The direct loops: `benchmarks/direct_loops.py` "
             "(docs/benchmarks.md shows them).", ""]
    for name, workload in document["workloads"].items():
        rates = workload["rates"]
        plans = "; ".join(f"planner's plan{' (' + variant + ')' if variant else ''} `{plan}`"
                          for variant, plan in workload["planner_plans"].items())
        lines += [f"## {name}", "", f"{workload['records']:,} records in {document['files']} files, "
                  f"{document['files_per_batch']} a micro-batch; {plans}", "", "| run | median records/s | x direct loop (median of rounds) | what |", "| --- | --- | --- | --- |"]
        for label, values in rates.items():
            ratio = "1" if label == DIRECT else "" if label in (DIRECT_BEFORE, DIRECT_AFTER) else \
                f"{workload['over_direct'][label]:.3f}"
            note = workload.get("notes", {}).get(label)
            lines.append(f"| {label} | {statistics.median(values):,.0f} | {ratio} | {what(label, workload['family'])}"
                         f"{'; ' + note if note else ''} |")
        for label, reason in workload["skipped"].items():
            lines.append(f"| {label} | not measured | | {reason} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="records per workload, times the defaults")
    parser.add_argument("--rounds", type=int, default=3, help="repeats of every run (at least 3 unless --quick)")
    parser.add_argument("--without", action="append", default=[], choices=("bytewax", "spark-sql", "spark-tws"),
                        help="leave a peer out (repeatable)")
    method.add_arguments(parser, repeats=None)
    parser.add_argument("--only", action="append", default=[], choices=tuple(SIZES),
                        help="measure only this workload (repeatable; results: cost_<names>.md)")
    parser.add_argument("--variant", action="append", default=[], choices=("plain", "aggregate"),
                        help="measure only this fissure program of each workload (repeatable): plain, or the word "
                             "count's aggregate(..., Count()), combined before the exchange")
    parser.add_argument("--goal", action="store_true",
                        help="the large shape: 1,000,000 records in 20 files, 5 files (250,000 records) "
                             "a micro-batch, LogWatch, the word counts and hot items, the direct loop, the planner "
                             "and the peers")
    args = parser.parse_args(argv)
    if args.quick:
        args.scale, args.rounds = 0.05, 1
    method.check_repeats(args.rounds, args.quick)
    run = method.Run("cost.py", argv, quick=args.quick, out=args.out)
    files, files_per_batch, names, plan_names = FILES, 1, tuple(SIZES), ("sequential", "planner")
    records = {name: max(files, int(count * args.scale)) for name, count in SIZES.items()}
    if args.goal:
        files, files_per_batch, plan_names = 20, 5, ("planner",)
        names = ("logwatch", "wordcount-10k", "wordcount-100k", "hot-items")
        records = {name: 1_000_000 for name in names}
    if args.only:
        names = tuple(name for name in names if name in args.only) or tuple(args.only)
        records = {name: records.get(name, max(files, int(SIZES[name] * args.scale))) for name in names}
    from fissure.config import RunnerConfig
    from fissure.spark.session.create import create_session

    spark = create_session(RunnerConfig(master="local[2]"))
    with method.scratch_folder("cost.py") as work:  # inputs and checkpoints: about 300 MB at --goal
        try:
            document = measure_workloads(spark, args, work, names, records, files, files_per_batch, plan_names)
        finally:
            method.end_spark(spark)
    stem = "cost_1m" if args.goal else "cost"
    if args.only:
        stem += "_" + "_".join(name.replace("-", "_") for name in names)
    run.write_results(stem, report(document), document)
    return 0


def measure_workloads(spark, args, work: Path, names, records, files: int, files_per_batch: int,
                      plan_names: tuple[str, ...]) -> dict:
    """Every workload's inputs written under `work`, its runs checked, then its rounds."""
    prepared = [prepare(name, work, records[name], files, files_per_batch) for name in names]
    if args.variant:  # a workload with one program (LogWatch, the CPU chain) keeps it: variants are the word count's
        for workload in prepared:
            if len(workload.programs) > 1:
                workload.programs = {variant: program for variant, program in workload.programs.items()
                                     if (variant or "plain") in args.variant}
    warm_pipeline = cpu_pipeline(4)  # small: starts the Python workers, whatever the workloads' size
    measure_fissure(spark, warm_pipeline, cpu_source(work / "warm-up", 2_000, 2), sequential_plan(warm_pipeline),
                    tempfile.mkdtemp(dir=work))
    document = {"files": files, "files_per_batch": files_per_batch, "workloads": {}}
    for workload in prepared:
        plan_runs(workload, plan_names, set(args.without))
        check_runs(spark, workload)
        rates = measure_rounds(spark, workload, args.rounds)
        document["workloads"][workload.name] = {
            "family": workload.family, "records": workload.records, "direct_loop": f"direct_loops.{workload.family}_direct",
            "planner_plans": {variant: describe_plan(planner_plan(program, 2), program)
                              for variant, program in workload.programs.items()},
            "rates": rates, "skipped": workload.skipped, "notes": workload.notes,
            "over_direct": {label: method.paired_ratio(rates, label, DIRECT) for label in workload.runs}}
    return document


if __name__ == "__main__":
    raise SystemExit(main())
