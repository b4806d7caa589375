"""Autopipelining on a stream graph (examples/logwatch_graph.py), on Spark: ratios inside one run.

    ./dev python benchmarks/autopipeline_graph.py            # the measurement (quiet machine!)
    ./dev python benchmarks/autopipeline_graph.py --quick    # tiny end-to-end check, no figures

Variants, alternating A B C A B C ... `--repeats` times, each a fresh query over the same input:
- unpipelined: every graph PE in one process;
- hand-placed: boundaries at `--hand` (default `events,failures`: lines-parsed-raw_events,
  events and failures each in a process of their own in the first graph PE);
- autopipelined: starts unpipelined, profiles, and lets the optimizer and the control stage
  place boundaries while it runs (its first windows run unpipelined: that cost is included).
Throughput: input lines / the summed wall time of the micro-batches (foreachBatch, which runs
the whole batch), so Spark's start is left out. Medians over the repeats, and each variant's ratio
to unpipelined. Results: benchmarks/results/autopipeline_graph.md and .json (with --quick: a
temporary directory).
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
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPOSITORY / "examples"))

import fissure  # noqa: E402
from fissure.spark.graph_autopipeline import GraphAutopipelineConfig  # noqa: E402
from generators.loglines import generate, split_into_files  # noqa: E402
from logwatch_graph import build_graph  # noqa: E402


def measure(spark, source_dir: str, batch_kb: int, lines: int, boundaries, autopipeline: bool, beta: float,
            work: str) -> dict:
    graph = build_graph()
    sinks = {name: fissure.NoopSink() for name in graph.sinks}
    source = fissure.FileSource(source_dir, format="text", max_bytes_per_trigger=batch_kb * 1024)
    report = fissure.run(graph, {"raw": source}, sinks, spark=spark, boundaries=boundaries,
                         checkpoint=tempfile.mkdtemp(dir=work, prefix="ckpt-"), autopipeline=autopipeline,
                         autopipeline_config=GraphAutopipelineConfig(profile_batches=2, beta=beta))
    busy_s = sum(batch.wall_s for batch in report.batch_log)
    return {"lines_per_s": lines / busy_s if busy_s > 0 else 0.0, "batches": report.batches,
            "boundaries_at_end": list(report.boundaries),
            "decisions": [f"batch {item.batch_id}: {item.decision.action.value}: {item.decision.reason}"
                          for item in report.decisions]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny end-to-end run (no figures)")
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--batch-kb", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="uncounted runs first (the session's first "
                                                             "queries start Python workers and JIT)")
    parser.add_argument("--hand", default="events,failures", help="hand-placed boundaries")
    parser.add_argument("--beta", type=float, default=0.5)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    if args.quick:
        args.lines, args.files, args.batch_kb, args.repeats, args.warmup = 3000, 3, 64, 1, 0
    work = tempfile.mkdtemp(prefix="fissure-bench-graph-")
    source_dir = os.path.join(work, "input")
    split_into_files(list(generate(args.lines)), source_dir, args.files)
    from fissure.spark.session import create_session

    spark = create_session(fissure.RunnerConfig(master=args.master))
    hand = [name for name in args.hand.split(",") if name]
    variants = {"unpipelined": ([], False), "hand-placed": (hand, False), "autopipelined": ([], True)}
    started = datetime.datetime.now(datetime.timezone.utc)
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for _ in range(args.warmup):
        measure(spark, source_dir, args.batch_kb, args.lines, [], False, args.beta, work)
    for repeat in range(args.repeats):
        for name, (boundaries, autopipeline) in variants.items():
            result = measure(spark, source_dir, args.batch_kb, args.lines, boundaries, autopipeline, args.beta, work)
            runs[name].append(result)
            print(f"repeat {repeat + 1} {name}: {result['lines_per_s']:,.0f} lines/s, boundaries at the end "
                  f"{','.join(result['boundaries_at_end']) or 'none'}", file=sys.stderr)
    medians = {name: statistics.median(run["lines_per_s"] for run in results) for name, results in runs.items()}
    base = medians["unpipelined"]
    document = {
        "command": "./dev python benchmarks/autopipeline_graph.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": started.isoformat(timespec="seconds"), "machine": f"{platform.node()} {platform.machine()}",
        "cores": os.cpu_count(), "master": args.master, "quick": args.quick, "lines": args.lines,
        "batch_kb": args.batch_kb, "repeats": args.repeats, "hand_placed": hand,
        "median_lines_per_s": medians,
        "ratio_to_unpipelined": {name: (rate / base if base > 0 else None) for name, rate in medians.items()},
        "runs": runs,
    }
    out_dir = Path(work) if args.quick else REPOSITORY / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "autopipeline_graph.json").write_text(json.dumps(document, indent=2))
    lines = ["# Autopipelining on the LogWatch graph (Spark)\n",
             f"`{document['command']}` on {document['machine']} ({document['cores']} cores, {args.master}), "
             f"{document['date']}; {args.lines:,} lines, {args.batch_kb} KiB per micro-batch, median of "
             f"{args.repeats}\n", "| variant | boundaries at the end (last run) | lines/s | ratio to unpipelined |",
             "| --- | --- | --- | --- |"]
    for name, rate in medians.items():
        ratio = document["ratio_to_unpipelined"][name]
        lines.append(f"| {name} | {','.join(runs[name][-1]['boundaries_at_end']) or 'none'} | {rate:,.0f} | "
                     f"{ratio:.2f} |" if ratio is not None else f"| {name} | | {rate:,.0f} | |")
    lines.append("\nAutopipelining decisions of the last run:\n")
    lines += [f"- {decision}" for decision in runs["autopipelined"][-1]["decisions"]] or ["- none"]
    (out_dir / "autopipeline_graph.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwritten to {out_dir}")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
