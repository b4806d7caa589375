"""Spark runner benchmark: ratios of throughput within one run, on the machine at hand.

Workloads:
- `cpu`: a chain of CPU-heavy Python map operators over one source partition per batch;
- `logwatch`: the LogWatch chain (examples/logwatch.py) over generated syslog lines.
Variants, each measured on a freshly built query (no reused shuffle output):
  (a) handwritten: the PySpark program a user would write: the same functions as Python UDFs in
      one stage (cpu only: LogWatch's stateful operators are no UDFs), in two lines:
      `handwritten-repartitioned`, the competent program, which repartitions each micro-batch to
      the session's cores before the UDFs (a micro-batch of one small file is one partition, so
      one task on one core, otherwise), and `handwritten-one-partition`, the naive program with
      default settings; planner_over_handwritten_repartitioned and
      planner_over_handwritten_one_partition divide by each;
  (b) sequential: fissure's sequential plan (one partition, one process);
  (c) planner: the plan the planner picks from the given operator costs;
  (d) the best of the others: every valid plan with at most --max-threads threads, screened once
      on a share of the input (--screen-share); the --finalists fastest join the block. Where the
      valid plans are too many to screen (LogWatch's 671), the Spark model shortlists the
      --logwatch-shortlist plans it predicts fastest, and the finalists come from those: a
      shortlist the model chose can only flatter the model's own planner. So beside it a seeded
      random sample of --random-plans plans the model did not shortlist (--random-seed) is
      screened too, and the fastest of the sample joins the block as `random-best`;
      planner_over_best_random divides by it, and planner_over_best_other counts it among the
      others. The sample adds 8 screenings and one variant of the block, about three to four
      minutes on 2 cores: an estimate from spark_chain_logwatch.json's rates (the screened plans'
      steady 3,700-6,500 lines/s over 50,000 lines, the block's 17,600-21,600 over 200,000),
      plus each query's first batch (LogWatch's stateful operators' schema processes: about
      5 s, first_batch.md), so about 15-20 s a screening and 20-25 s a run of the block.
Throughput is the steady rate of a query: records over the summed durations of its micro-batches
after the first (the first also pays for starting the query and its Python workers); the same
measure for every variant. The method of benchmarks/method.py: one uncounted warm-up run, then
every variant of (a)-(d) in one block of --repeats (at least 3) repeats, the order rotated each
repeat; medians. planner_over_best_other divides the planner's plan by the best of the *other*
plans of the block (sequential and the finalists), so it exceeds 1 when the planner's plan measured
best. Writes spark_chain[_ONLY].md/.json under --out (default benchmarks/results/; --quick: tiny
inputs, one repeat, one finalist, a temporary folder: a check of the script, not a result).

    ./dev python benchmarks/spark_chain.py            # the real measurement (quiet machine!)
    ./dev python benchmarks/spark_chain.py --quick    # end to end in a minute or two
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from itertools import combinations
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "examples"))
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

import fissure  # noqa: E402
from fissure import Pipeline  # noqa: E402
from fissure.model.types import Kind, Plan, RegionPlan  # noqa: E402
from fissure.plan.plans import check_plan, describe_plan, planner_plan, sequential_plan  # noqa: E402
from fissure.testing import record_files  # noqa: E402
import method  # noqa: E402

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


def handwritten_query(spark, source, sink_format="noop", repartition: bool = True):
    """(a): the same functions as plain Python UDFs in one select. `repartition`: each micro-batch
    spread round-robin over the session's cores first (the competent program); without it, default
    settings, and a micro-batch of one small file runs as one task (the naive program)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType

    frame = source.open(spark)
    if repartition:
        frame = frame.repartition(spark.sparkContext.defaultParallelism)
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


def measure_handwritten(spark, source, checkpoint, repartition: bool) -> float:
    query = handwritten_query(spark, source, repartition=repartition).option("checkpointLocation", checkpoint).start()
    query.awaitTermination()
    return steady_rate(query.recentProgress)


def measure_fissure(spark, pipeline, source, plan, checkpoint) -> float:
    runner = fissure.Runner(pipeline, source, fissure.NoopSink(), plan=plan, checkpoint=checkpoint,
                            config=fissure.RunnerConfig(spark=spark, progress="off"))
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
    from fissure.plan.stored_calibration import stored_spark_model

    settings, _ = stored_spark_model()
    operators = pipeline.operator_stats()

    def predicted(plan: Plan) -> float:
        try:
            return evaluate_spark(operators, plan, cores, settings.constants, settings.workload).throughput_per_s
        except ValueError:
            return 0.0

    return sorted(plans, key=predicted, reverse=True)[:keep]


def random_sample(plans: list[Plan], leave_out: list[Plan], count: int, seed: int) -> list[Plan]:
    """`count` plans of `plans` drawn with `seed`, none of `leave_out` (by the plan's text)."""
    import random

    left_out = {describe_plan(plan) for plan in leave_out}
    rest = [plan for plan in plans if describe_plan(plan) not in left_out]
    return random.Random(seed).sample(rest, min(count, len(rest)))


def run_workload(name, spark, pipeline, source, screen_source, with_handwritten, args, work) -> dict:
    """(d)'s finalists first: every candidate once on the smaller `screen_source`, the `finalists`
    fastest kept. Then one block on `source`: a warm-up run (not counted), and `repeats` repeats of
    every variant, (a)-(c) and the finalists, in an order rotated each repeat; medians."""
    cores = spark.sparkContext.defaultParallelism
    variants = {"sequential": sequential_plan(pipeline), "planner": planner_plan(pipeline, cores)}
    candidates = valid_plans(pipeline, args.max_threads)
    enumerated = len(candidates)
    sample = []
    if args.shortlist and len(candidates) > args.shortlist:
        every_plan = candidates
        candidates = model_shortlist(pipeline, candidates, cores, args.shortlist)
        sample = random_sample(every_plan, candidates + list(variants.values()), args.random_plans, args.random_seed)
    if args.quick:
        candidates = candidates[:1] + candidates[-1:]
        sample = sample[:1]
    counter = [0]

    def checkpoint():
        counter[0] += 1
        return os.path.join(work, f"{name}-ckpt-{counter[0]}")

    screened, screened_sample = {}, {}
    earlier = (args.earlier or {}).get(name, {})
    if earlier.get("screened_records_per_s"):  # reuse an earlier run's screening (same plans, same share)
        by_label = {describe_plan(plan): plan for plan in candidates + sample}
        screened = {label: (rate, by_label[label]) for label, rate in earlier["screened_records_per_s"].items()
                    if label in by_label}
        earlier_sample = earlier.get("random_sample_records_per_s", {})
        screened_sample = {label: (rate, by_label[label]) for label, rate in earlier_sample.items() if label in by_label}
        candidates = []
        sample = [plan for plan in sample if describe_plan(plan) not in screened_sample]
    for kind, plans, into in (("screened", candidates, screened), ("random sample", sample, screened_sample)):
        for number, plan in enumerate(plans, start=1):
            into[describe_plan(plan)] = (measure_fissure(spark, pipeline, screen_source, plan, checkpoint()), plan)
            print(f"[{name}] {kind} {number}/{len(plans)}: {describe_plan(plan)} "
                  f"{into[describe_plan(plan)][0]:,.0f}/s", file=sys.stderr, flush=True)

    def fastest(rates: dict) -> list:
        return sorted(rates.items(), key=lambda item: (-item[1][0], item[0]))  # equal rates: by the plan's text

    finalists = {label: plan for label, (_, plan) in fastest(screened)[: args.finalists]}
    labels = {label: describe_plan(plan) for label, plan in variants.items()}
    measured = {}
    if with_handwritten:
        measured["handwritten-repartitioned"] = lambda: measure_handwritten(spark, source, checkpoint(), True)
        measured["handwritten-one-partition"] = lambda: measure_handwritten(spark, source, checkpoint(), False)
    for label, plan in variants.items():
        measured[label] = lambda plan=plan: measure_fissure(spark, pipeline, source, plan, checkpoint())
    for text, plan in finalists.items():
        if text not in labels.values():  # a finalist that is the planner's (or the sequential) plan runs once
            measured[f"finalist {text}"] = lambda plan=plan: measure_fissure(spark, pipeline, source, plan, checkpoint())
            labels[f"finalist {text}"] = text
    best_random = fastest(screened_sample)[0] if screened_sample else None
    if best_random is not None:
        text, (_, plan) = best_random
        measured["random-best"] = lambda plan=plan: measure_fissure(spark, pipeline, source, plan, checkpoint())
        labels["random-best"] = text
    block = method.measure_block(
        measured, args.repeats, quick=args.quick,
        warm_up=lambda: measure_fissure(spark, pipeline, screen_source, variants["sequential"], checkpoint()),
        warm_up_label="the sequential plan once on the screening input",
        log=lambda line: print(f"[{name}] {line}", file=sys.stderr, flush=True))
    medians = block.medians()
    plans = [label for label in labels if label != "planner"]  # every fissure plan but the planner's
    over_best, best_other = block.over_best_of_others("planner", among=plans)
    result = {"records_per_s": medians, "block": block.to_dict(), "plans": labels,
              "best_other_plan": labels[best_other], "best_other_records_per_s": medians[best_other],
              "plans_enumerated": enumerated, "plans_screened": len(screened),
              "screened_records_per_s": {label: rate for label, (rate, _) in screened.items()},
              "finalists": list(finalists),
              "planner_over_best_other": over_best,
              "planner_over_sequential": block.ratio("planner", "sequential")}
    if screened_sample:
        result["random_sample_seed"] = args.random_seed
        result["random_sample_records_per_s"] = {label: rate for label, (rate, _) in screened_sample.items()}
        result["planner_over_best_random"] = block.ratio("planner", "random-best")
    if with_handwritten:
        result["planner_over_handwritten_repartitioned"] = block.ratio("planner", "handwritten-repartitioned")
        result["planner_over_handwritten_one_partition"] = block.ratio("planner", "handwritten-one-partition")
    return result


HANDWRITTEN = {"handwritten-repartitioned": "UDFs in one stage, repartitioned to the cores",
               "handwritten-one-partition": "UDFs in one stage, one partition per batch (naive)"}
RATIOS = ("planner_over_handwritten_repartitioned", "planner_over_handwritten_one_partition",
          "planner_over_sequential", "planner_over_best_other", "planner_over_best_random")


def report(args, results) -> str:
    lines = ["# Spark runner benchmark", "",
             f"One block per workload: a warm-up run (not counted), then {args.repeats} repeat(s) of every variant "
             "in an order rotated each repeat; medians (benchmarks/method.py). (d)'s finalists are chosen by "
             f"screening: every candidate once on {args.screen_share:.0%} of the input"
             f"{' (in the run of --screen-from)' if args.screen_from else ''}, the {args.finalists} fastest kept; "
             "they are measured in the block beside (a)-(c). planner_over_best_other: the planner's plan over "
             "the best of the other fissure plans measured in the block (it exceeds 1 when the planner's plan "
             "measured best)."]
    for workload, result in results.items():
        screening = f"{result['plans_screened']} screened"
        if "random_sample_records_per_s" in result:
            sample = result["random_sample_records_per_s"]
            screening = (f"the {result['plans_screened']} the Spark model predicts fastest screened, and a random "
                         f"sample of {len(sample)} of the plans it did not shortlist (seed "
                         f"{result['random_sample_seed']}); the fastest of the sample is `random-best`")
        lines.append(f"\n## {workload}\n\n{result['plans_enumerated']} valid plans, {screening}."
                     "\n\n| variant | plan | records/s (median) |\n| --- | --- | --- |")
        for label, rate in result["records_per_s"].items():
            lines.append(f"| {label.split(' ')[0]} | {result['plans'].get(label, HANDWRITTEN.get(label, label))} "
                         f"| {rate:,.0f} |")
        lines.append(f"\nbest of the other plans: {result['best_other_plan']}")
        for ratio in RATIOS:
            if ratio in result:
                lines.append(f"\n{ratio}: {result[ratio]:.2f}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser)
    parser.add_argument("--records", type=int, default=40_000, help="cpu workload records")
    parser.add_argument("--lines", type=int, default=200_000, help="logwatch workload lines")
    parser.add_argument("--files", type=int, default=6, help="input files = micro-batches")
    parser.add_argument("--max-threads", type=int, default=4)
    parser.add_argument("--finalists", type=int, default=3, help="(d): screened plans measured in the block")
    parser.add_argument("--screen-share", type=float, default=0.25,
                        help="(d): the screening input as a share of the full input")
    parser.add_argument("--shortlist", type=int, default=0,
                        help="(d): screen only the N plans the Spark model ranks highest (0: all)")
    parser.add_argument("--logwatch-shortlist", type=int, default=8,
                        help="(d) for LogWatch, whose valid plans number in the hundreds")
    parser.add_argument("--random-plans", type=int, default=8,
                        help="(d) where the model shortlists: also screen this many random plans it did not pick")
    parser.add_argument("--random-seed", type=int, default=0, help="the seed of that random sample")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--only", choices=("cpu", "logwatch"), help="run one workload")
    parser.add_argument("--screen-from", metavar="JSON",
                        help="(d): reuse the screening of an earlier run's spark_chain.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.records, args.lines, args.files, args.repeats, args.finalists = 400, 2000, 3, 1, 1
    method.check_repeats(args.repeats, args.quick)
    run = method.Run("spark_chain.py", argv, quick=args.quick, out=args.out, master=args.master)
    from fissure.spark.session.create import create_session
    from logwatch import build_pipeline as logwatch_pipeline

    screen = max(0.01, args.screen_share)
    args.earlier = json.loads(Path(args.screen_from).read_text())["results"] if args.screen_from else None
    results = {}
    with method.scratch_folder("spark_chain.py") as work:
        spark = create_session(fissure.RunnerConfig(master=args.master))
        try:
            if args.only != "logwatch":
                results["cpu"] = run_workload(
                    "cpu", spark, cpu_pipeline(CPU_OPERATORS), cpu_source(work / "cpu", args.records, args.files),
                    cpu_source(work / "cpu-screen", max(1, int(args.records * screen)), args.files), True, args, work)
            args.shortlist = args.logwatch_shortlist
            if args.only != "cpu":
                results["logwatch"] = run_workload(
                    "logwatch", spark, logwatch_pipeline(), logwatch_source(work / "logs", args.lines, args.files),
                    logwatch_source(work / "logs-screen", max(1, int(args.lines * screen)), args.files), False,
                    args, work)
        finally:
            method.end_spark(spark)
    stem = "spark_chain" + (f"_{args.only}" if args.only else "")
    run.write_results(stem, report(args, results), {"master": args.master, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
