"""Autopipelining on a stream graph (examples/logwatch_graph.py), on Spark: ratios inside one run.

    ./dev python benchmarks/autopipeline_graph.py            # the measurement (quiet machine!)
    ./dev python benchmarks/autopipeline_graph.py --quick    # tiny end-to-end check, no figures

Variants, in an order rotated each repeat (A B C, B C A, C A B, ...; at least 3 repeats unless
--quick) after --warmup uncounted runs, each a fresh query over the same input (benchmarks/method.py):
- unpipelined: every graph PE in one process;
- hand-placed: boundaries at `--hand` (default `events,failures`: lines-parsed-raw_events,
  events and failures each in a process of their own in the first graph PE);
- autopipelined: starts unpipelined, profiles, and lets the optimizer and the control stage
  place boundaries while it runs (its first windows run unpipelined: that cost is included).
Throughput: input lines / the summed wall time of the micro-batches (foreachBatch, which runs
the whole batch), so Spark's start is left out. Medians over the repeats, and each variant's ratio
to unpipelined. Results: autopipeline_graph.md and .json under --out (default
benchmarks/results/; with --quick: a temporary directory).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPOSITORY / "examples"))
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

import fissure  # noqa: E402
from fissure.config import GraphAutopipelineConfig  # noqa: E402
from generators.loglines import generate, split_into_files  # noqa: E402
from logwatch_graph import build_graph  # noqa: E402
import method  # noqa: E402


def measure(spark, source_dir: str, batch_kb: int, lines: int, boundaries, autopipeline: bool, beta: float,
            work: str) -> dict:
    graph = build_graph()
    sinks = {name: fissure.NoopSink() for name in graph.sinks}
    source = fissure.FileSource(source_dir, format="text", max_bytes_per_trigger=batch_kb * 1024)
    report = fissure.run(graph, {"raw": source}, sinks, checkpoint=tempfile.mkdtemp(dir=work, prefix="ckpt-"),
                         config=fissure.RunnerConfig(
                             spark=spark, boundaries=boundaries, replanning="autopipeline" if autopipeline else "off",
                             autopipelining=GraphAutopipelineConfig(profile_batches=2, beta=beta)))
    busy_s = sum(batch.wall_s for batch in report.batch_log)
    return {"lines_per_s": lines / busy_s if busy_s > 0 else 0.0, "batches": report.batches,
            "boundaries_at_end": list(report.boundaries),
            "decisions": [f"batch {item.batch_id}: {item.decision.action.value}: {item.decision.reason}"
                          for item in report.decisions]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--batch-kb", type=int, default=2048)
    parser.add_argument("--warmup", type=int, default=1, help="uncounted runs first (the session's first "
                                                             "queries start Python workers and JIT)")
    parser.add_argument("--hand", default="events,failures", help="hand-placed boundaries")
    parser.add_argument("--beta", type=float, default=0.5)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    if args.quick:
        args.lines, args.files, args.batch_kb, args.repeats, args.warmup = 3000, 3, 64, 1, 0
    method.check_repeats(args.repeats, args.quick)
    if args.warmup < 1 and not args.quick:
        parser.error("--warmup: at least one uncounted run unless --quick")
    run = method.Run("autopipeline_graph.py", argv, quick=args.quick, out=args.out, master=args.master)
    work = tempfile.mkdtemp(prefix="fissure-bench-graph-")
    source_dir = os.path.join(work, "input")
    split_into_files(list(generate(args.lines)), source_dir, args.files)
    from fissure.spark.session.create import create_session

    spark = create_session(fissure.RunnerConfig(master=args.master))
    hand = [name for name in args.hand.split(",") if name]
    variants = {"unpipelined": ([], False), "hand-placed": (hand, False), "autopipelined": ([], True)}
    block = method.measure_block(
        {name: (lambda boundaries=boundaries, autopipeline=autopipeline: measure(
            spark, source_dir, args.batch_kb, args.lines, boundaries, autopipeline, args.beta, work))
         for name, (boundaries, autopipeline) in variants.items()},
        args.repeats, quick=args.quick, value=lambda result: result["lines_per_s"],
        warm_up=(lambda: [measure(spark, source_dir, args.batch_kb, args.lines, [], False, args.beta, work)
                          for _ in range(args.warmup)]) if args.warmup else None,
        warm_up_label=f"{args.warmup} unpipelined run(s)", log=lambda line: print(line, file=sys.stderr))
    runs = block.details
    medians = block.medians()
    document = {
        "master": args.master, "quick": args.quick, "lines": args.lines,
        "batch_kb": args.batch_kb, "repeats": args.repeats, "hand_placed": hand, "orders": block.orders,
        "median_lines_per_s": medians,
        "ratio_to_unpipelined": {name: block.ratio(name, "unpipelined") for name in medians if name != "unpipelined"},
        "runs": runs,
    }
    lines = ["# Autopipelining on the LogWatch graph (Spark)\n",
             f"{args.lines:,} lines, {args.batch_kb} KiB per micro-batch; {args.warmup} uncounted warm-up run(s), then "
             f"{args.repeats} repeat(s) of the variants in an order rotated each repeat; medians\n",
             "| variant | boundaries at the end (last run) | lines/s | ratio to unpipelined |",
             "| --- | --- | --- | --- |"]
    for name, rate in medians.items():
        ratio = document["ratio_to_unpipelined"].get(name)
        lines.append(f"| {name} | {','.join(runs[name][-1]['boundaries_at_end']) or 'none'} | {rate:,.0f} | "
                     + (f"{ratio:.2f} |" if ratio is not None else "1 |"))
    lines.append("\nAutopipelining decisions of the last run:\n")
    lines += [f"- {decision}" for decision in runs["autopipelined"][-1]["decisions"]] or ["- none"]
    method.end_spark(spark)
    run.write_results("autopipeline_graph", "\n".join(lines) + "\n", document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
