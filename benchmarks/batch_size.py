"""Micro-batch size: the size fissure chooses against sizes given by hand, on LogWatch.

A backlog of generated LogWatch lines (the functions of `examples/logwatch.py`) in 200 files is
drained under the planner's plan with micro-batches of fixed sizes (`max_bytes_per_trigger`),
with every file in one batch (`batch_size="all"`), and with the size fissure chooses from the
Spark model with operator costs measured on a sample of the input (`batch_size="auto"`,
fissure.plan.batch_size, fissure.local.cost_sample). Per run: the drain rate (records
over the summed batch durations, the first batch included: every variant pays one), the batches
and the longest batch (what a record may wait). Variants rotate each round; medians of the
rounds (at least 3 unless --quick); one uncounted warm-up run starts Spark's Python workers first
(benchmarks/method.py). Results: batch_size.md/.json under --out (default benchmarks/results/).

    ./dev python benchmarks/batch_size.py              # 1,000,000 lines, 3 rounds (about 15 minutes)
    ./dev python benchmarks/batch_size.py --quick      # tiny input, one round: a smoke test
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "examples"))
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

import fissure  # noqa: E402
from fissure.config import RunnerConfig  # noqa: E402
from fissure.plan.plans import describe_plan, planner_plan  # noqa: E402
import method  # noqa: E402

FILES = 200  # small files: Spark admits whole files, so sizes are met to a file (about 0.5 MiB)
FIXED_KIB = (2048, 8192, 32768)


def drain(spark, pipeline, plan, source, config: RunnerConfig, scratch: Path) -> dict:
    runner = fissure.Runner(pipeline, source, fissure.NoopSink(), plan=plan,
                            config=replace(config, spark=spark, progress="off"),
                            checkpoint=tempfile.mkdtemp(dir=scratch))
    runner.start(available_now=True)
    try:
        runner.await_termination()
    finally:
        report = runner.stop()
    durations = [time.duration_s for time in report.batch_times if time.input_records]
    records = sum(time.input_records for time in report.batch_times)
    chosen = report.admissions[0].decision.records if report.admissions else None
    return {"rate": records / sum(durations), "batches": len(durations), "longest_batch_s": max(durations),
            "chosen_records": chosen, "admission": report.admissions[0].describe() if report.admissions else None,
            "batch_times": [[time.input_records, round(time.duration_s, 3)] for time in report.batch_times]}


def fixed_cost_fit(runs: dict[str, list[dict]]) -> tuple[float, float]:
    """(F seconds, c microseconds) by least squares over every batch but each run's first (it
    also starts the query): a LogWatch micro-batch's measured fixed cost and cost per line."""
    points = [(records, seconds) for items in runs.values() for item in items
              for records, seconds in item["batch_times"][1:] if records]
    if len({records for records, _ in points}) < 2:  # one batch size only (a --quick input): no fit
        return float("nan"), float("nan")
    mean_r = statistics.fmean(r for r, _ in points)
    mean_t = statistics.fmean(t for _, t in points)
    slope = (sum((r - mean_r) * (t - mean_t) for r, t in points) / sum((r - mean_r) ** 2 for r, _ in points))
    return mean_t - slope * mean_r, slope * 1e6


def report_text(document: dict) -> str:
    lines = ["# Micro-batch size: chosen by fissure against sizes given by hand (LogWatch)", "",
             "One uncounted warm-up run, then every variant once per round, the order rotated each round.", "",
             f"{document['lines']:,} lines ({document['input_kib']:,} KiB) in {FILES} files; planner's plan "
             f"`{document['plan']}`; medians of {document['rounds']} rounds.", "",
             "| batch size | drain rate, lines/s | x best | batches | longest batch, s |", "| --- | --- | --- | --- | --- |"]
    medians = document["medians"]
    best = max(item["rate"] for item in medians.values())
    for name, item in medians.items():
        lines.append(f"| {name} | {item['rate']:,.0f} | {item['rate'] / best:.2f} | {item['batches']:.0f} | "
                     f"{item['longest_batch_s']:.1f} |")
    lines += ["", "x best: over the best median of all variants, for reading the table; the ratio quoted is the "
              "last line's, auto over the best of the *fixed* sizes.", "",
              f"fissure's choice: {document['auto_reason']}", "",
              f"Measured fixed cost per batch (least squares over every batch after each run's first): "
              f"{document['fixed_s']:.2f} s, and {document['per_line_us']:.1f} us a line.", "",
              f"auto against the best fixed size (median of the per-round ratios): {document['auto_over_best']:.2f}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser, repeats=None)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3, help="repeats of every variant (at least 3 unless --quick)")
    args = parser.parse_args(argv)
    if args.quick:
        args.lines, args.rounds = 20_000, 1
    method.check_repeats(args.rounds, args.quick)
    run = method.Run("batch_size.py", argv, quick=args.quick, out=args.out)
    from generators.loglines import generate, split_into_files
    from logwatch import build_pipeline

    from fissure.spark.session.create import create_session

    with method.scratch_folder("batch_size.py") as work:
        spark = create_session(RunnerConfig(master="local[2]"))
        try:
            split_into_files(list(generate(args.lines)), work / "input", FILES)
            input_kib = sum(item.stat().st_size for item in (work / "input").iterdir()) // 1024
            pipeline = build_pipeline()
            plan = planner_plan(pipeline, 2)
            base = fissure.FileSource(str(work / "input"), format="text")
            variants = {f"{kib:,} KiB": (replace(base, max_bytes_per_trigger=kib * 1024),
                                         RunnerConfig(master="local[2]")) for kib in FIXED_KIB}
            variants["all files"] = (base, RunnerConfig(master="local[2]", batch_size="all"))
            variants["auto"] = (base, RunnerConfig(master="local[2]"))
            split_into_files(list(generate(5_000)), work / "warm-up", 2)  # starts the Python workers, not counted
            drain(spark, pipeline, plan,
                  fissure.FileSource(str(work / "warm-up"), format="text", max_files_per_trigger=1), RunnerConfig(),
                  work)
            runs: dict[str, list[dict]] = {name: [] for name in variants}
            names = list(variants)
            for round_number in range(args.rounds):
                for name in method.run_order(names, round_number):
                    source, config = variants[name]
                    runs[name].append(drain(spark, pipeline, plan, source, config, work))
                print(f"round {round_number + 1}: " + ", ".join(f"{name} {items[-1]['rate']:,.0f}"
                                                                for name, items in runs.items()), flush=True)
            medians = {name: {key: statistics.median(item[key] for item in items)
                              for key in ("rate", "batches", "longest_batch_s")} for name, items in runs.items()}
            fixed = [name for name in names if name != "auto"]
            auto_over_best = statistics.median(
                runs["auto"][index]["rate"] / max(runs[name][index]["rate"] for name in fixed)
                for index in range(args.rounds))
            from fissure.plan.stored_calibration import stored_spark_model

            _, model_source = stored_spark_model()
            document = {"lines": args.lines, "input_kib": input_kib, "rounds": args.rounds,
                        "plan": describe_plan(plan, pipeline), "model": model_source, "runs": runs,
                        "medians": medians, "auto_over_best": auto_over_best,
                        "auto_reason": runs["auto"][-1]["admission"]}
            document["fixed_s"], document["per_line_us"] = fixed_cost_fit(runs)
        finally:
            method.end_spark(spark)
    run.write_results("batch_size", report_text(document), document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
