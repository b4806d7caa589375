"""Autopipelining on two stream graphs, on Spark: ratios inside one run.

    ./dev python benchmarks/autopipeline_graph.py            # the measurement (quiet machine!)
    ./dev python benchmarks/autopipeline_graph.py --quick    # tiny end-to-end check, no figures

The LogWatch graph (examples/logwatch_graph.py), whose operators compute: on local[2] every core
already runs a task, so no cut can pay and autopipelining should cost nothing. Then the waiting
graph, where a cut does pay: LogWatch's parsing (lines, parsed, raw_events, events) and then
`located`, a lookup that sleeps `--wait-us` per record (one sleep per group of 20 records,
releasing the GIL, as a call to a store would), into a sink; a process of its own lets the
parsing above it run while it waits. The wait is about what the parsing computes per event, and
the graph has no keyed branch, so the stage that a cut splits is most of every batch: with
LogWatch's keyed branches after the lookup it took 0.14-0.18 of a batch, and no cut paid.

Variants, in an order rotated each repeat (A B C, B C A, C A B, ...; at least 3 repeats unless
--quick) after --warmup uncounted runs, each a fresh query over the same input (benchmarks/method.py):
- unpipelined: every graph PE in one process;
- hand-placed: boundaries at `--hand` (default `events,failures`: lines-parsed-raw_events,
  events and failures each in a process of their own in the first graph PE);
- autopipelined: starts unpipelined, profiles, and lets the optimizer and the control stage
  place boundaries while it runs (its first windows run unpipelined: that cost is included).
On the waiting graph, the hand-placed variants are every placement of `--waiting-hand`
(placements separated by `;`), and autopipelined is compared with the best of them.
Throughput: input lines / the summed wall time of the micro-batches (foreachBatch, which runs
the whole batch), so Spark's start is left out. Medians over the repeats, and each variant's ratio
to unpipelined (and, on the waiting graph, to the best hand-placed cut). Results:
autopipeline_graph.md and .json under --out (default benchmarks/results/; with --quick: a
temporary directory); `--graphs` picks the graphs to measure.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPOSITORY / "examples"))
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

import fissure  # noqa: E402
from fissure.config import GraphAutopipelineConfig  # noqa: E402
from generators.loglines import generate, split_into_files  # noqa: E402
from logwatch_graph import build_graph  # noqa: E402
import method  # noqa: E402


LOOKUP_GROUP = 20  # records per sleep of the lookup: a sleep per record would be mostly the sleep call's own cost


class Lookup:
    """The waiting graph's `located`: a record's host looked up in a store that answers after
    `wait_us` per record, one call per LOOKUP_GROUP records (time.sleep releases the GIL)."""

    def __init__(self, wait_us: float) -> None:
        self.wait_s = wait_us * LOOKUP_GROUP / 1e6
        self.seen = 0

    def __call__(self, record):
        self.seen += 1
        if self.seen % LOOKUP_GROUP == 0:
            time.sleep(self.wait_s)
        return record


def build_waiting_graph(wait_us: float):
    """LogWatch's parsing, then the lookup `located` on every event, into a sink."""
    from logwatch import EVENT, PARSED, events, lines, parsed, raw_events

    g = fissure.StreamGraph("logwatch_lookup")
    (g.source("raw", schema={"value": str})
     .map("lines", lines, reads=["value"]).map("parsed", parsed, schema=PARSED)
     .filter("raw_events", raw_events).flat_map("events", events, schema=EVENT)
     .map("located", Lookup(wait_us), schema=EVENT).sink("located_events"))
    return g


def measure(spark, source_dir: str, batch_kb: int, lines: int, boundaries, autopipeline: bool, beta: float,
            work: str, graph_of=build_graph) -> dict:
    graph = graph_of()
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
    parser.add_argument("--graphs", default="logwatch,waiting", help="the graphs to measure: logwatch, waiting")
    parser.add_argument("--waiting-lines", type=int, default=600_000)
    parser.add_argument("--waiting-files", type=int, default=24,
                        help="files of the waiting graph's input, a micro-batch each: more batches than LogWatch's, "
                             "so that what autopipelining spends finding the cut (a window unpipelined, a window "
                             "profiled node by node) is a small part of the run")
    parser.add_argument("--waiting-batch-kb", type=int, default=2048)
    parser.add_argument("--wait-us", type=float, default=20.0, help="the lookup's wait per record, microseconds")
    parser.add_argument("--waiting-hand", default="located;events;parsed,located",
                        help="the hand-placed boundaries tried on the waiting graph, placements separated by ';'")
    args = parser.parse_args(argv)
    if args.quick:
        args.lines, args.files, args.batch_kb, args.repeats, args.warmup = 3000, 3, 64, 1, 0
        args.waiting_lines, args.waiting_files, args.waiting_batch_kb = 3000, 3, 64
    graphs = [name for name in args.graphs.split(",") if name]
    if not graphs or set(graphs) - {"logwatch", "waiting"}:
        parser.error(f"--graphs: logwatch and/or waiting, got {args.graphs!r}")
    method.check_repeats(args.repeats, args.quick)
    if args.warmup < 1 and not args.quick:
        parser.error("--warmup: at least one uncounted run unless --quick")
    run = method.Run("autopipeline_graph.py", argv, quick=args.quick, out=args.out, master=args.master)
    with method.scratch_folder("autopipeline_graph.py") as scratch:
        work = str(scratch)
        source_dir = os.path.join(work, "input")
        split_into_files(list(generate(args.lines)), source_dir, args.files)
        from fissure.spark.session.create import create_session

        spark = create_session(fissure.RunnerConfig(master=args.master))
        try:
            hand = [name for name in args.hand.split(",") if name]
            log = lambda line: print(line, file=sys.stderr)  # noqa: E731
            document = {"master": args.master, "quick": args.quick}
            lines = ["# Autopipelining on stream graphs (Spark)\n"]
            if "logwatch" in graphs:
                logwatch_document, lines = measure_logwatch(args, spark, source_dir, hand, work, log)  # its own title
                document.update(logwatch_document)
            if "waiting" in graphs:
                waiting_document, waiting_lines = measure_waiting(args, spark, work, log)
                document["waiting_graph"] = waiting_document
                lines += waiting_lines
        finally:
            method.end_spark(spark)
    run.write_results("autopipeline_graph", "\n".join(lines) + "\n", document)
    return 0


def measure_logwatch(args, spark, source_dir: str, hand: list[str], work: str, log) -> tuple[dict, list[str]]:
    variants = {"unpipelined": ([], False), "hand-placed": (hand, False), "autopipelined": ([], True)}
    block = method.measure_block(
        {name: (lambda boundaries=boundaries, autopipeline=autopipeline: measure(
            spark, source_dir, args.batch_kb, args.lines, boundaries, autopipeline, args.beta, work))
         for name, (boundaries, autopipeline) in variants.items()},
        args.repeats, quick=args.quick, value=lambda result: result["lines_per_s"],
        warm_up=(lambda: [measure(spark, source_dir, args.batch_kb, args.lines, [], False, args.beta, work)
                          for _ in range(args.warmup)]) if args.warmup else None,
        warm_up_label=f"{args.warmup} unpipelined run(s)", log=log)
    runs = block.details
    medians = block.medians()
    document = {
        "lines": args.lines,
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
    return document, lines


def measure_waiting(args, spark, work: str, log) -> tuple[dict, list[str]]:
    """The waiting graph: unpipelined, every hand placement, autopipelined; ratios to unpipelined
    and to the best hand placement."""
    source_dir = os.path.join(work, "waiting-input")
    split_into_files(list(generate(args.waiting_lines)), source_dir, args.waiting_files)
    placements = [[name for name in placement.split(",") if name] for placement in args.waiting_hand.split(";")
                  if placement.strip()]
    variants = {"unpipelined": ([], False), **{f"hand-placed {','.join(placement)}": (placement, False)
                                              for placement in placements}, "autopipelined": ([], True)}

    def graph_of():
        return build_waiting_graph(args.wait_us)

    def run_variant(boundaries, autopipeline):
        return measure(spark, source_dir, args.waiting_batch_kb, args.waiting_lines, boundaries, autopipeline,
                       args.beta, work, graph_of)

    block = method.measure_block(
        {name: (lambda boundaries=boundaries, autopipeline=autopipeline: run_variant(boundaries, autopipeline))
         for name, (boundaries, autopipeline) in variants.items()},
        args.repeats, quick=args.quick, value=lambda result: result["lines_per_s"],
        warm_up=(lambda: [run_variant([], False) for _ in range(args.warmup)]) if args.warmup else None,
        warm_up_label=f"{args.warmup} unpipelined run(s)", log=lambda line: log(f"waiting graph: {line}"))
    runs, medians = block.details, block.medians()
    hand_labels = [name for name in variants if name.startswith("hand-placed")]
    to_best, best = block.over_best_of_others("autopipelined", hand_labels)
    document = {
        "lines": args.waiting_lines, "files": args.waiting_files, "batch_kb": args.waiting_batch_kb,
        "wait_us": args.wait_us,
        "lookup_group": LOOKUP_GROUP, "repeats": args.repeats, "orders": block.orders,
        "median_lines_per_s": medians,
        "ratio_to_unpipelined": {name: block.ratio(name, "unpipelined") for name in medians if name != "unpipelined"},
        "best_hand_placed": best, "autopipelined_to_best_hand_placed": to_best, "runs": runs,
    }
    lines = ["\n## A graph where a cut pays: LogWatch's parsing and a waiting lookup\n",
             "`lines -> parsed -> raw_events -> events -> located -> sink`:"
             f" `located` waits {args.wait_us:g} us per record (a sleep of {LOOKUP_GROUP} records' worth"
             f" every {LOOKUP_GROUP} records); {args.waiting_lines:,} lines in {args.waiting_files} files, a"
             f" micro-batch each (at most {args.waiting_batch_kb} KiB); medians of {args.repeats} repeat(s) in"
             " rotated order\n",
             "| variant | boundaries at the end (last run) | lines/s | ratio to unpipelined"
             " | ratio to the best hand-placed |",
             "| --- | --- | --- | --- | --- |"]
    for name, rate in medians.items():
        ratio = document["ratio_to_unpipelined"].get(name)
        lines.append(f"| {name} | {','.join(runs[name][-1]['boundaries_at_end']) or 'none'} | {rate:,.0f} | "
                     + (f"{ratio:.2f}" if ratio is not None else "1") + f" | {rate / medians[best]:.2f} |")
    lines.append(f"\nAutopipelined / the best hand-placed cut ({best}): {to_best:.2f}\n")
    lines.append("Autopipelining decisions of the last run:\n")
    lines += [f"- {decision}" for decision in runs["autopipelined"][-1]["decisions"]] or ["- none"]
    return document, lines


if __name__ == "__main__":
    raise SystemExit(main())
