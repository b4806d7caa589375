"""Spark runner benchmark: ratios of throughput within one run, on the machine at hand.

Workloads:
- `cpu`: a chain of CPU-heavy Python map operators over one source partition per batch;
- `logwatch`: the LogWatch chain (examples/logwatch.py) over generated syslog lines.
Variants, each measured on a freshly built query (no reused shuffle output):
  (a) handwritten: the PySpark program a user would write: the same functions as Python UDFs in
      one stage, default settings (cpu only: LogWatch's stateful operators are no UDFs);
  (b) sequential: fissure's sequential plan (one partition, one process);
  (c) planner: the plan the planner picks from the given operator costs;
  (d) best: every valid plan with at most --max-threads threads, each measured, the best kept.
Throughput is the steady rate of a query: records over the summed durations of its micro-batches
after the first (the first also pays for starting the query and its Python workers); the same
measure for every variant. Medians of --repeats alternating runs. Writes JSON and Markdown under benchmarks/results/
(--quick: tiny inputs, one run, one plan of (d), results in a temporary folder: a smoke test,
not figures).

    ./dev python benchmarks/spark_chain.py            # the real measurement (quiet machine!)
    ./dev python benchmarks/spark_chain.py --quick    # end to end in a minute or two
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from itertools import combinations
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "examples"))

import fissure  # noqa: E402
from fissure import Pipeline  # noqa: E402
from fissure.model.types import Kind, Plan, RegionPlan  # noqa: E402
from fissure.spark.plans import check_plan, describe_plan, planner_plan, sequential_plan  # noqa: E402
from fissure.testing import record_files  # noqa: E402

BUSY_LOOPS = 3000  # multiplications per record and operator (tens of microseconds)
CPU_OPERATORS = 4


def busy(record):
    value = record["x"]
    for _ in range(BUSY_LOOPS):
        value = (value * 1.0000001) % 1000.0
    return {"x": value}


def cpu_pipeline(operators: int) -> Pipeline:
    pipeline = Pipeline("cpu")
    for number in range(operators):
        pipeline = pipeline.map(f"busy{number + 1}", busy, reads=["x"], cost_us=60.0)
    return pipeline


def compositions(items: tuple, ) -> list[list[tuple]]:
    """Every way to cut `items` into contiguous non-empty groups."""
    result = []
    for cuts_count in range(len(items)):
        for cuts in combinations(range(1, len(items)), cuts_count):
            bounds = (0, *cuts, len(items))
            result.append([items[bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1)])
    return result


def valid_plans(pipeline: Pipeline, max_threads: int) -> list[Plan]:
    """Every plan (regions, pipelines, replicas) with at most max_threads threads that check_plan accepts."""
    plans = []

    def extend(regions_left, chosen, threads):
        if not regions_left:
            plans.append(Plan(tuple(chosen), method="enumerated"))
            return
        region_ops = regions_left[0]
        kinds = {pipeline.operator(name).kind for name in region_ops}
        max_replicas = 1 if Kind.STATEFUL in kinds else max_threads
        for split in compositions(region_ops):
            for replicas in range(1, max_replicas + 1):
                used = threads + replicas * len(split)
                if used > max_threads:
                    break
                extend(regions_left[1:], chosen + [RegionPlan(tuple(split), replicas)], used)

    for regions in compositions(pipeline.names):
        extend(regions, [], 0)
    accepted = []
    for plan in plans:
        try:
            check_plan(plan, pipeline)
        except fissure.PipelineError:
            continue
        accepted.append(plan)
    return accepted


def handwritten_query(spark, source, sink_format="noop"):
    """(a): the same functions as plain Python UDFs in one select, default settings."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType

    frame = source.open(spark)
    column = F.col("x")
    udf = F.udf(lambda x: busy({"x": x})["x"], DoubleType())
    for _ in range(CPU_OPERATORS):
        column = udf(column)
    return frame.select(column.alias("x")).writeStream.format(sink_format).trigger(availableNow=True)


def steady_rate(updates) -> float:
    """Records per second over the micro-batches after the first: a streaming query's throughput
    without its one-time start (the first batch also pays for query and worker start-up)."""
    steady = [u for u in updates if int(u["batchId"]) > 0 and int(u.get("numInputRows") or 0) > 0]
    if not steady:
        steady = [u for u in updates if int(u.get("numInputRows") or 0) > 0]
    records = sum(int(u["numInputRows"]) for u in steady)
    seconds = sum(float(u["durationMs"]["triggerExecution"]) for u in steady) / 1e3
    return records / seconds if seconds > 0 else 0.0


def measure_handwritten(spark, source, checkpoint) -> float:
    query = handwritten_query(spark, source).option("checkpointLocation", checkpoint).start()
    query.awaitTermination()
    return steady_rate(query.recentProgress)


def measure_fissure(spark, pipeline, source, plan, checkpoint) -> float:
    runner = fissure.Runner(pipeline, source, fissure.NoopSink(), plan=plan, spark=spark, checkpoint=checkpoint,
                            progress=False)
    runner.start(available_now=True)
    try:
        runner.await_termination()
        rate = steady_rate(runner.query.recentProgress)
    finally:
        runner.stop()
    return rate


def cpu_source(directory, records, files):
    rows = [{"x": float(i % 997) + 0.5} for i in range(records)]
    return record_files(directory, rows, {"x": float}, records_per_file=-(-records // files), max_files_per_trigger=1)


def logwatch_source(directory, lines, files):
    from generators.loglines import generate, split_into_files

    split_into_files(list(generate(lines)), directory, files)
    return fissure.FileSource(str(directory), format="text", max_files_per_trigger=1)


def model_shortlist(pipeline: Pipeline, plans: list[Plan], cores: int, keep: int) -> list[Plan]:
    """The `keep` plans the Spark model (stored calibration or defaults) predicts fastest."""
    from fissure.model.spark_model import evaluate_spark
    from fissure.profile.calibration import stored_spark_model

    settings, _ = stored_spark_model()
    operators = pipeline.operator_stats()

    def predicted(plan: Plan) -> float:
        try:
            return evaluate_spark(operators, plan, cores, settings.constants, settings.workload).throughput_per_s
        except ValueError:
            return 0.0

    return sorted(plans, key=predicted, reverse=True)[:keep]


def run_workload(name, spark, pipeline, source, screen_source, with_handwritten, args, work) -> dict:
    """(a)-(c) alternating, medians of `repeats`; (d) in two stages: every candidate once on the
    smaller `screen_source`, then the `finalists` fastest with `repeats` runs on `source`."""
    cores = spark.sparkContext.defaultParallelism
    variants = {"sequential": sequential_plan(pipeline), "planner": planner_plan(pipeline, cores)}
    candidates = valid_plans(pipeline, args.max_threads)
    enumerated = len(candidates)
    if args.shortlist and len(candidates) > args.shortlist:
        candidates = model_shortlist(pipeline, candidates, cores, args.shortlist)
    if args.quick:
        candidates = candidates[:1] + candidates[-1:]
    measured: dict[str, list[float]] = {}
    counter = [0]

    def checkpoint():
        counter[0] += 1
        return os.path.join(work, f"{name}-ckpt-{counter[0]}")

    for repeat in range(args.repeats):  # alternate the variants inside each repeat
        if with_handwritten:
            measured.setdefault("handwritten", []).append(measure_handwritten(spark, source, checkpoint()))
        for label, plan in variants.items():
            measured.setdefault(label, []).append(measure_fissure(spark, pipeline, source, plan, checkpoint()))
        print(f"[{name}] repeat {repeat + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}/s" for k, v in measured.items()),
              file=sys.stderr, flush=True)
    screened = {}
    earlier = (args.earlier or {}).get(name, {}).get("screened_records_per_s")
    if earlier:  # reuse an earlier run's screening (same plans, same share of the input)
        by_label = {describe_plan(plan): plan for plan in candidates}
        screened = {label: (rate, by_label[label]) for label, rate in earlier.items() if label in by_label}
        candidates = []
    for number, plan in enumerate(candidates, start=1):
        screened[describe_plan(plan)] = (measure_fissure(spark, pipeline, screen_source, plan, checkpoint()), plan)
        print(f"[{name}] screened {number}/{len(candidates)}: {describe_plan(plan)} "
              f"{screened[describe_plan(plan)][0]:,.0f}/s", file=sys.stderr, flush=True)
    finalists = sorted(screened.values(), key=lambda item: item[0], reverse=True)[: args.finalists]
    best = {}
    for _, plan in finalists:
        best[describe_plan(plan)] = statistics.median(
            measure_fissure(spark, pipeline, source, plan, checkpoint()) for _ in range(args.repeats))
    medians = {label: statistics.median(values) for label, values in measured.items()}
    best_plan = max(best, key=best.get) if best else None
    result = {"records_per_s": medians, "runs": measured,
              "plans": {label: describe_plan(plan) for label, plan in variants.items()},
              "best_plan": best_plan, "best_records_per_s": best.get(best_plan),
              "plans_enumerated": enumerated, "plans_screened": len(screened),
              "screened_records_per_s": {label: rate for label, (rate, _) in screened.items()},
              "finalists_records_per_s": best}
    best_reference = max(best.get(best_plan) or 0.0, *medians.values())
    result["planner_over_best"] = medians["planner"] / best_reference
    result["planner_over_sequential"] = medians["planner"] / medians["sequential"]
    if with_handwritten:
        result["planner_over_handwritten"] = medians["planner"] / medians["handwritten"]
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny end-to-end run (no figures)")
    parser.add_argument("--records", type=int, default=40_000, help="cpu workload records")
    parser.add_argument("--lines", type=int, default=200_000, help="logwatch workload lines")
    parser.add_argument("--files", type=int, default=6, help="input files = micro-batches")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-threads", type=int, default=4)
    parser.add_argument("--finalists", type=int, default=3, help="(d): screened plans re-measured with --repeats runs")
    parser.add_argument("--screen-share", type=float, default=0.25,
                        help="(d): the screening input as a share of the full input")
    parser.add_argument("--shortlist", type=int, default=0,
                        help="(d): screen only the N plans the Spark model ranks highest (0: all)")
    parser.add_argument("--logwatch-shortlist", type=int, default=8,
                        help="(d) for LogWatch, whose valid plans number in the hundreds")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--only", choices=("cpu", "logwatch"), help="run one workload")
    parser.add_argument("--screen-from", metavar="JSON",
                        help="(d): reuse the screening of an earlier run's spark_chain.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.records, args.lines, args.files, args.repeats = 400, 2000, 2, 1
    work = tempfile.mkdtemp(prefix="fissure-bench-")
    from fissure.spark.session import create_session

    spark = create_session(fissure.RunnerConfig(master=args.master))
    from logwatch import build_pipeline as logwatch_pipeline

    started = datetime.datetime.now(datetime.timezone.utc)
    screen = max(0.01, args.screen_share)
    args.earlier = json.loads(Path(args.screen_from).read_text())["results"] if args.screen_from else None
    results = {}
    if args.only != "logwatch":
        results["cpu"] = run_workload("cpu", spark, cpu_pipeline(CPU_OPERATORS),
                            cpu_source(Path(work) / "cpu", args.records, args.files),
                            cpu_source(Path(work) / "cpu-screen", max(1, int(args.records * screen)), args.files),
                            True, args, work)
    args.shortlist = args.logwatch_shortlist
    if args.only != "cpu":
        results["logwatch"] = run_workload(
            "logwatch", spark, logwatch_pipeline(),
            logwatch_source(Path(work) / "logs", args.lines, args.files),
            logwatch_source(Path(work) / "logs-screen", max(1, int(args.lines * screen)), args.files),
            False, args, work)
    document = {
        "command": "./dev python benchmarks/spark_chain.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": started.isoformat(timespec="seconds"), "machine": f"{platform.node()} {platform.machine()}",
        "cores": os.cpu_count(), "master": args.master, "quick": args.quick, "results": results,
    }
    out_dir = Path(work) if args.quick else REPOSITORY / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "spark_chain" + (f"_{args.only}" if args.only else "")
    (out_dir / f"{stem}.json").write_text(json.dumps(document, indent=2))
    lines = [f"# Spark runner benchmark\n", f"`{document['command']}` on {document['machine']} "
             f"({document['cores']} cores, {args.master}), {document['date']}\n"]
    for workload, result in results.items():
        lines.append(f"\n## {workload}\n\n| variant | plan | records/s |\n| --- | --- | --- |")
        for label, rate in result["records_per_s"].items():
            lines.append(f"| {label} | {result['plans'].get(label, 'UDFs in one stage')} | {rate:,.0f} |")
        if result["best_plan"]:
            lines.append(f"| (d) best: {result['plans_enumerated']} valid plans, {result['plans_screened']} screened "
                         f"once on {args.screen_share:.0%} of the input{' (in the run of --screen-from)' if args.screen_from else ''}, "
                         f"{args.finalists} finalists x {args.repeats} "
                         f"| {result['best_plan']} | {result['best_records_per_s']:,.0f} |")
        for ratio in ("planner_over_handwritten", "planner_over_sequential", "planner_over_best"):
            if ratio in result:
                lines.append(f"\n{ratio}: {result[ratio]:.2f}")
    (out_dir / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwritten to {out_dir}")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
