"""Keyed stages with 2 to 64 buckets of keys: what the bucket count of a checkpoint costs.

A keyed stage makes one handler call per bucket a micro-batch touches, each about 4.5 ms of the
partitions' time whatever its records (docs/profiling.md, "Where hot items' time goes"); fewer
buckets mean fewer calls, but bound the state partitions that split the operator's work. A new
checkpoint gets `fissure.model.state_buckets.new_checkpoint_buckets(cores)` buckets: 8 on 2 cores.
Each run here starts on a new checkpoint whose record names the balanced scheme and the count
compared (fissure.spark.checkpoint.state_layout), so the same code runs every count.

Per workload (the goal shape of benchmarks/cost.py: 1,000,000 records in 20 files, 5 a
micro-batch, the planner's plan on 2 cores, through `fissure.run`): one uncounted warm-up, every
count's answer checked against the direct loop's on a small input, then every count in one block,
the order rotated each repeat; the steady rate `fissure run --json` reports, each count's paired
ratio to 64 buckets (every checkpoint's count before counts were chosen), and from Spark's
monitoring REST API the keyed stages' tasks (benchmarks/grouping_keys.py's reading).

    ./dev python benchmarks/state_buckets.py [--repeats 3] [--only hot-items] [--counts 8,64] [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "examples"))
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

from fissure.model.state_buckets import BUCKET_COUNTS, LEGACY_STATE_BUCKETS, new_checkpoint_buckets  # noqa: E402
from fissure.runtime.state.grouping_keys import balanced_keys  # noqa: E402

import method  # noqa: E402
from grouping_keys import WORKLOADS, goal_shape, measure_layouts, stage_logged_session  # noqa: E402

DEFAULT_COUNTS = (2, 4, 8, 16, 64)


def counts_argument(text: str) -> tuple[int, ...]:
    """`--counts 8,64`: bucket counts a checkpoint may hold, 64 among them (the ratios' base)."""
    try:
        counts = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bucket counts are integers separated by commas, got {text!r}") from None
    unknown = [count for count in counts if count not in BUCKET_COUNTS]
    if unknown or LEGACY_STATE_BUCKETS not in counts:
        raise argparse.ArgumentTypeError(f"counts must be among {', '.join(map(str, BUCKET_COUNTS))} and include "
                                         f"{LEGACY_STATE_BUCKETS}, got {text!r}")
    return counts


def label(count: int) -> str:
    return f"{count} buckets"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser)
    parser.add_argument("--only", action="append", default=[], choices=tuple(WORKLOADS))
    parser.add_argument("--counts", type=counts_argument, default=DEFAULT_COUNTS)
    args = parser.parse_args(argv)
    shape = goal_shape(args)
    run = method.Run("state_buckets.py", argv, quick=args.quick, out=args.out)
    layouts = {label(count): balanced_keys(count) for count in args.counts}
    base = label(LEGACY_STATE_BUCKETS)
    document = {"records": shape[0], "files": shape[1], "files_per_batch": shape[2], "counts": list(args.counts),
                "new_checkpoint_buckets": new_checkpoint_buckets(2), "workloads": {}}
    with method.scratch_folder("state_buckets.py") as work:
        spark, log = stage_logged_session()
        try:
            for name in args.only or WORKLOADS:
                measured = measure_layouts(spark, log, name, work, shape, layouts, layouts[base], args.repeats,
                                           args.quick)
                block = measured["block"]
                document["workloads"][name] = {"plan": measured["plan"], **block.to_dict(),
                                               "over_64": {layout: block.paired_ratio(layout, base)
                                                           for layout in layouts if layout != base},
                                               "keyed_tasks": measured["keyed_tasks"]}
        finally:
            method.end_spark(spark)
    run.write_results("state_buckets_quick" if args.quick else "state_buckets", report(document), document)
    return 0


def report(document: dict) -> str:
    layouts = [label(count) for count in document["counts"]]
    base = label(LEGACY_STATE_BUCKETS)
    lines = ["# Keyed stages with 2 to 64 buckets of keys", "",
             f"{document['records']:,} records in {document['files']} files, {document['files_per_batch']} a "
             "micro-batch, the planner's plan on local[2], through `fissure.run` (steady records/s, the rate "
             "`fissure run --json` prints). Every count in one block per workload, the order rotated each repeat, "
             "after an uncounted warm-up; every count answers as the direct loop on a small input first. A new "
             f"checkpoint on 2 cores gets {document['new_checkpoint_buckets']} buckets.", "",
             "| workload | plan | " + " | ".join(f"{layout}, median records/s" for layout in layouts)
             + " | " + " | ".join(f"{layout} / 64 (paired, median)" for layout in layouts if layout != base) + " |",
             "| --- | --- | " + " | ".join("---" for _ in layouts) + " | "
             + " | ".join("---" for layout in layouts if layout != base) + " |"]
    rows = []
    for name, result in document["workloads"].items():
        lines.append(f"| {name} | `{result['plan']}` | "
                     + " | ".join(f"{result['medians'][layout]:,.0f}" for layout in layouts) + " | "
                     + " | ".join(f"{result['over_64'][layout]:.3f}" for layout in layouts if layout != base) + " |")
        for layout in layouts:
            pairs = ", ".join(f"{value / reference:.3f}" for value, reference
                              in zip(result["runs"][layout], result["runs"][base]) if reference)
            tasks = result.get("keyed_tasks", {}).get(layout, {"stages": 0})
            per_stage = (f"{tasks['slower_ms'] / tasks['stages']:,.0f} | {tasks['faster_ms'] / tasks['stages']:,.0f}"
                         if tasks["stages"] else "- | -")
            rows.append(f"| {name} | {layout} | {pairs if layout != base else '-'} | {tasks['stages']} | {per_stage} |")
    lines += ["", "Every repeat, and the keyed stages' two tasks over the measured runs (each stage reading packed rows "
              "in both of its 2 tasks): the slower and the faster task's time a stage.", "",
              "| workload | count | every repeat, this / 64 | keyed stages | slower task a stage, ms | "
              "faster task a stage, ms |", "| --- | --- | --- | --- | --- | --- |", *rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
