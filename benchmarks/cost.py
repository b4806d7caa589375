"""What a record costs on fissure against one plain Python process running the same functions.

McSherry, Isard and Murray ("Scalability! But at what COST?", HotOS 2015) ask of every parallel
system how many cores it needs to beat one well-written thread. So every figure here starts with
that thread: a plain `for` loop in one process calling the program's own operator functions
record by record (keyed state in dicts), then fissure on Spark (`local[2]`), under the
sequential plan and the planner's plan, each as a ratio to the loop.

Workloads (the functions of the examples):
- LogWatch (`examples/logwatch.py`), generated log lines;
- the word count (`examples/wordcount.py`) over Zipf vocabularies of 10,000 and 100,000 words,
  12 words a line;
- the CPU-heavy chain of `benchmarks/spark_chain.py` (four 60 us maps).

Method: the inputs are written once, as files read one per micro-batch. A round runs, per
workload, the plain loop and both plans, in an order rotated each round; a fissure run's rate is
its steady rate (the records of the micro-batches after the first over their summed durations).
Reported: medians over rounds (at least 3 unless --quick), and the median of the per-round ratios
to the plain loop. One uncounted warm-up run starts Spark's Python workers first (the method of
benchmarks/method.py). Results: cost.md/.json (cost_1m.* with --goal) under --out.

    ./dev python benchmarks/cost.py                 # 3 rounds, the default sizes (about 15 minutes)
    ./dev python benchmarks/cost.py --scale 10      # 10x the records per workload
    ./dev python benchmarks/cost.py --quick         # tiny inputs, one round: a smoke test
    ./dev python benchmarks/cost.py --goal          # 1,000,000 records in 20 files, 5 files a batch,
                                                    # plain loop and planner (results: cost_1m.md)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "examples"))
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

from fissure import Pipeline  # noqa: E402
from fissure.graph import Action  # noqa: E402
from fissure.model.types import Kind  # noqa: E402
from fissure.spark.plans import describe_plan, planner_plan, sequential_plan  # noqa: E402
from fissure.testing import text_files  # noqa: E402
import method  # noqa: E402
from spark_chain import cpu_pipeline, cpu_source, logwatch_source, measure_fissure  # noqa: E402

# Records per workload at --scale 1, and files (one micro-batch each).
SIZES = {"logwatch": 60_000, "wordcount-10k": 10_000, "wordcount-100k": 10_000, "cpu": 20_000}
FILES = 5


def plain_loop_rate(pipeline: Pipeline, records: list[dict]) -> float:
    """Records per second of one process running the operators' functions record by record."""
    states: dict[str, dict] = {operator.name: {} for operator in pipeline.operators}
    started = time.perf_counter()
    for record in records:
        current = [record]
        for operator in pipeline.operators:
            following = []
            for item in current:
                if operator.action is Action.MAP:
                    following.append(operator.fn(item))
                elif operator.action is Action.FILTER:
                    if operator.fn(item):
                        following.append(item)
                elif operator.action is Action.FLAT_MAP:
                    following.extend(operator.fn(item) or ())
                else:
                    key = tuple(item[field] for field in operator.key) if operator.kind is Kind.PARTITIONED else ()
                    state = states[operator.name].get(key)
                    if state is None:
                        state = states[operator.name][key] = operator.state_factory()
                    emitted = operator.fn(state, item)
                    following.extend([emitted] if isinstance(emitted, dict) else (emitted or ()))
            current = following
    return len(records) / (time.perf_counter() - started)


def workloads(scale: float, work: Path, files: int = FILES, files_per_batch: int = 1,
              records: int | None = None, names: tuple[str, ...] = tuple(SIZES)):
    """(name, pipeline, fissure source, the same input as records) per workload: `records` each (or
    the defaults times `scale`) in `files` files, `files_per_batch` files a micro-batch."""
    from generators.loglines import generate as log_lines
    from generators.words import generate as word_lines
    from logwatch import build_pipeline as logwatch_pipeline
    from wordcount import build_pipeline as wordcount_pipeline

    size = {name: records or max(files, int(count * scale)) for name, count in SIZES.items()}
    if "logwatch" in names:
        lines = list(log_lines(size["logwatch"]))
        source = logwatch_source(work / "logwatch", size["logwatch"], files)
        yield ("logwatch", logwatch_pipeline(), replace(source, max_files_per_trigger=files_per_batch),
               [{"value": line} for line in lines])
    for name, vocabulary in (("wordcount-10k", 10_000), ("wordcount-100k", 100_000)):
        if name in names:
            text = word_lines(size[name], vocabulary_size=vocabulary, fixed_length=True)
            source = text_files(str(work / name), text, lines_per_file=-(-len(text) // files),
                                max_files_per_trigger=files_per_batch)
            yield name, wordcount_pipeline(), source, [{"value": line} for line in text]
    if "cpu" in names:
        rows = [{"x": float(i % 997) + 0.5} for i in range(size["cpu"])]
        source = cpu_source(work / "cpu", size["cpu"], files)
        yield "cpu", cpu_pipeline(4), replace(source, max_files_per_trigger=files_per_batch), rows


def report(document: dict) -> str:
    lines = ["# What a record costs: fissure against one plain Python process", "",
             "One uncounted warm-up run, then per workload every run once per round, the order rotated each "
             "round; medians, and the median of the per-round ratios to the plain loop.", ""]
    for name, workload in document["workloads"].items():
        rates = workload["rates"]
        lines += [f"## {name}", "", f"{workload['records']:,} records in {document['files']} files, "
                  f"{document['files_per_batch']} a micro-batch; planner's plan `{workload['planner_plan']}`", "",
                  "| run | median records/s | x plain loop (median of rounds) |", "| --- | --- | --- |"]
        for run in rates:
            ratio = "1" if run == "plain" else f"{workload['over_plain'][run]:.3f}"
            lines.append(f"| {run} | {statistics.median(rates[run]):,.0f} | {ratio} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="records per workload, times the defaults")
    parser.add_argument("--rounds", type=int, default=3, help="repeats of every run (at least 3 unless --quick)")
    method.add_arguments(parser, repeats=None)
    parser.add_argument("--goal", action="store_true",
                        help="the large shape: 1,000,000 records in 20 files, 5 files (250,000 records) "
                             "a micro-batch, LogWatch and the word counts, plain loop and planner only")
    args = parser.parse_args(argv)
    if args.quick:
        args.scale, args.rounds = 0.05, 1
    method.check_repeats(args.rounds, args.quick)
    run = method.Run("cost.py", argv, quick=args.quick, out=args.out)
    shape = {"files": FILES, "files_per_batch": 1, "records": None, "names": tuple(SIZES)}
    runs = ("plain", "sequential", "planner")
    if args.goal:
        shape = {"files": 20, "files_per_batch": 5, "records": 1_000_000,
                 "names": ("logwatch", "wordcount-10k", "wordcount-100k")}
        runs = ("plain", "planner")
    from fissure.spark.config import RunnerConfig
    from fissure.spark.session import create_session

    spark = create_session(RunnerConfig(master="local[2]"))
    work = Path(tempfile.mkdtemp(prefix="fissure-cost-"))
    document = {"files": shape["files"], "files_per_batch": shape["files_per_batch"], "workloads": {}}
    prepared = list(workloads(args.scale, work, **shape))
    warm_pipeline = cpu_pipeline(4)  # small: starts the Python workers, whatever the workloads' size
    measure_fissure(spark, warm_pipeline, cpu_source(work / "warm-up", 2_000, 2), sequential_plan(warm_pipeline),
                    tempfile.mkdtemp())
    for name, pipeline, source, records in prepared:
        plans = {"sequential": sequential_plan(pipeline), "planner": planner_plan(pipeline, 2)}
        rates: dict[str, list[float]] = {run: [] for run in runs}
        for round_number in range(args.rounds):
            for variant in method.run_order(runs, round_number):
                if variant == "plain":
                    rates[variant].append(plain_loop_rate(pipeline, records))
                else:
                    rates[variant].append(measure_fissure(spark, pipeline, source, plans[variant], tempfile.mkdtemp()))
            print(f"{name} round {round_number + 1}: " + ", ".join(f"{run} {values[-1]:,.0f}"
                                                                   for run, values in rates.items()), flush=True)
        document["workloads"][name] = {
            "records": len(records), "planner_plan": describe_plan(plans["planner"], pipeline), "rates": rates,
            "over_plain": {variant: method.paired_ratio(rates, variant, "plain") for variant in runs if variant != "plain"}}
    spark.stop()
    run.write_results("cost_1m" if args.goal else "cost", report(document), document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
