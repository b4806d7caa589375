"""Keyed state size: does a batch cost more when the state it reads holds many keys?

A keyed count (`partitioned`, one record per key per batch) on Spark local[2], sequential plan.
Held: one query first fills its state with `--keys` distinct keys (one batch), then runs three
batches that each touch a different 1 % of those keys. Empty: a second query runs a tiny first
batch (it pays the query's start), then three batches of the same size whose keys are new. Keys
live in sub-buckets of about 128 keys (fissure.worker.key_buckets): a held batch's keys fall in
thousands of sub-buckets, the empty state's new keys in a few per bucket, so held / empty
measures both the state store's growth and that loss of locality. Reported: each batch's
duration (Spark's triggerExecution), the medians, and held / empty.
The method of benchmarks/method.py: a warm-up query first (not counted), then --repeats (at least
3) repeats of both queries, their order rotated; results state_size.md/.json under --out.

    ./dev python benchmarks/state_size.py                 # 200,000 keys, 3 repeats (about 2 minutes)
    ./dev python benchmarks/state_size.py --keys 1000000  # a million keys (about 3 minutes)
    ./dev python benchmarks/state_size.py --quick         # 5,000 keys, one repeat, a temporary folder
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

import fissure  # noqa: E402
from fissure import Pipeline  # noqa: E402
from fissure.testing import record_files  # noqa: E402
import method  # noqa: E402

KEYED = {"k": str}
TOUCHES = 3


def count_per_key(state, record):
    state["n"] = state.get("n", 0) + 1
    return {"k": record["k"], "n": state["n"]}


def pipeline() -> Pipeline:
    return Pipeline("state-size").partitioned("count", count_per_key, key="k", schema={"k": str, "n": int})


def batch_seconds(spark, batches: list[list[str]], directory: Path) -> list[float]:
    """Each batch's duration, one file (one micro-batch) per list of keys, in order."""
    for number, keys in enumerate(batches):
        record_files(directory / "input", [{"k": key} for key in keys], KEYED, first_file=number)
    source = fissure.FileSource(str(directory / "input"), format="json", schema=KEYED, max_files_per_trigger=1)
    runner = fissure.Runner(pipeline(), source, fissure.NoopSink(), plan="sequential", spark=spark,
                            checkpoint=str(directory / "checkpoint"), progress=False, profile=None)
    runner.start(available_now=True)
    try:
        runner.await_termination()
    finally:
        report = runner.stop()
    return [time.duration_s for time in sorted(report.batch_times, key=lambda time: time.batch_id)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser)
    parser.add_argument("--keys", type=int, default=200_000)
    args = parser.parse_args(argv)
    if args.quick:
        args.keys, args.repeats = 5_000, 1
    method.check_repeats(args.repeats, args.quick)
    run = method.Run("state_size.py", argv, quick=args.quick, out=args.out)
    from fissure.spark.config import RunnerConfig
    from fissure.spark.session import create_session

    spark = create_session(RunnerConfig(master="local[2]"))
    work = Path(tempfile.mkdtemp(prefix="fissure-state-size-"))
    draw = random.Random(7)
    held_keys = [f"key-{number}" for number in range(args.keys)]
    touched = args.keys // 100
    touches = [draw.sample(held_keys, touched) for _ in range(TOUCHES)]
    batch_seconds(spark, [["warm-up"] * 10, ["warm-up"] * 10], work / "warm-up")  # not counted
    queries = {"held": lambda repeat: batch_seconds(spark, [held_keys, *touches], work / f"held-{repeat}"),
               "empty": lambda repeat: batch_seconds(
                   spark, [["warm-up"] * 10, *[[f"new-{repeat}-{number}-{key}" for key in range(touched)]
                                               for number in range(TOUCHES)]], work / f"empty-{repeat}")}
    runs: dict[str, list[list[float]]] = {"held": [], "empty": []}
    orders = []
    for repeat in range(args.repeats):  # the two queries' order rotated each repeat
        orders.append(method.run_order(list(queries), repeat))
        for name in orders[-1]:
            runs[name].append(queries[name](repeat))
            print(f"repeat {repeat + 1} {name}: " + ", ".join(f"{value:.2f}" for value in runs[name][-1]), flush=True)
    medians = {name: [statistics.median(batches[1:]) for batches in items] for name, items in runs.items()}
    document = {"keys": args.keys, "touched_per_batch": touched, "orders": orders,
                "held_batches_s": runs["held"], "empty_batches_s": runs["empty"],
                "held_median_s": method.median(medians["held"]), "empty_median_s": method.median(medians["empty"]),
                "held_over_empty": method.paired_ratio(medians, "held", "empty")}
    held, empty = runs["held"][-1], runs["empty"][-1]
    text = "\n".join([
        "# Keyed state size: a batch touching 1 % of a large state against the same batch on an empty state", "",
        f"One uncounted warm-up query, then {args.repeats} repeat(s) of both queries, their order rotated each "
        "repeat; per query the median of its batches after the first; held / empty: the median of the repeats' "
        "ratios.", "",
        f"Held (last repeat): {args.keys:,} keys written in the first batch ({held[0]:.1f} s), then {TOUCHES} batches "
        f"of {touched:,} of them: " + ", ".join(f"{value:.2f} s" for value in held[1:]) + ".  ",
        f"Empty (last repeat): a 10-record first batch ({empty[0]:.1f} s), then {TOUCHES} batches of {touched:,} new "
        "keys: " + ", ".join(f"{value:.2f} s" for value in empty[1:]) + ".", "",
        f"Median held / empty: {document['held_median_s']:.2f} s / {document['empty_median_s']:.2f} s; "
        f"held / empty (median of the repeats' ratios): {document['held_over_empty']:.2f}"])
    run.write_results("state_size", text, document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
