"""Keyed state size: does a batch cost more, in time and in bytes written, when the state it
reads holds many keys?

A keyed count (`partitioned`, one record per key per batch) on Spark local[2], sequential plan.
Held: one query first fills its state with `--keys` distinct keys (one batch), then runs
`TOUCHES` batches that each touch a different 1 % of those keys. Empty: a second query runs a tiny
first batch (it pays the query's start), then as many batches of the same size whose keys are new.
The held state's buckets start coarse (sub-buckets of about 128 keys, written by the first batch,
which touches every key) and the first touching batch, touching 1 %, switches them to one entry
per key (fissure.runtime.state.key_buckets): that batch rewrites the whole state once. Reported: each
batch's duration (Spark's triggerExecution), the medians, held / empty; and the bytes of each
held batch's state changelog (what the RocksDB state store writes per batch, summed over
partitions), against the state's size (the changelog of the switching batch, which writes every
key once in the final layout), with the checkpoint's state folder at the end and the snapshot
files Spark wrote in the background.
The method of benchmarks/method.py: a warm-up query first (not counted), then --repeats (at least
3) repeats of both queries, their order rotated; results state_size.md/.json under --out.

    ./dev python benchmarks/state_size.py                 # 200,000 keys, 3 repeats (about 2 minutes)
    ./dev python benchmarks/state_size.py --keys 1000000  # a million keys (about 3 minutes)
    ./dev python benchmarks/state_size.py --quick         # 40,000 keys, one repeat, a temporary folder
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

import fissure  # noqa: E402
from fissure import Pipeline  # noqa: E402
from fissure.model.state_buckets import new_checkpoint_buckets  # noqa: E402
from fissure.testing import record_files  # noqa: E402
from fissure.runtime.state.key_buckets import FINE_MIN_KEYS  # noqa: E402
import method  # noqa: E402

KEYED = {"k": str}
TOUCHES = 5


def count_per_key(state, record):
    state["n"] = state.get("n", 0) + 1
    return {"k": record["k"], "n": state["n"]}


def pipeline() -> Pipeline:
    return Pipeline("state-size").partitioned("count", count_per_key, key="k", schema={"k": str, "n": int})


def state_files(checkpoint: Path) -> dict[str, int]:
    """Bytes of the checkpoint's state files: every changelog by version ("changelog N"), the
    snapshots (zips and their SST files) and everything under state/."""
    sizes: dict[str, int] = {"snapshots": 0, "all": 0}
    for path in (checkpoint / "state").rglob("*"):
        if not path.is_file() or path.name.endswith(".crc"):
            continue
        size = path.stat().st_size
        sizes["all"] += size
        if path.name.endswith(".changelog"):
            name = f"changelog {int(path.name.split('.')[0].split('_')[0])}"
            sizes[name] = sizes.get(name, 0) + size
        elif path.suffix in (".zip", ".sst"):
            sizes["snapshots"] += size
    return sizes


def batch_seconds(spark, batches: list[list[str]], directory: Path) -> list[float]:
    """Each batch's duration, one file (one micro-batch) per list of keys, in order."""
    for number, keys in enumerate(batches):
        record_files(directory / "input", [{"k": key} for key in keys], KEYED, first_file=number)
    source = fissure.FileSource(str(directory / "input"), format="json", schema=KEYED, max_files_per_trigger=1)
    runner = fissure.Runner(pipeline(), source, fissure.NoopSink(), plan="sequential",
                            checkpoint=str(directory / "checkpoint"),
                            config=fissure.RunnerConfig(spark=spark, progress="off", profiling=None))
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
        args.keys, args.repeats = 40_000, 1  # 5,000 keys a bucket of 8: enough to switch to one entry per key
    method.check_repeats(args.repeats, args.quick)
    run = method.Run("state_size.py", argv, quick=args.quick, out=args.out)
    from fissure.config import RunnerConfig
    from fissure.spark.session.create import create_session

    with method.scratch_folder("state_size.py") as work:
        spark = create_session(RunnerConfig(master="local[2]"))
        try:
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
                    print(f"repeat {repeat + 1} {name}: " + ", ".join(f"{value:.2f}" for value in runs[name][-1]),
                          flush=True)
            # batch b commits state version b + 1; the held query's first batch loads every key, its second
            # switches the layout, the rest touch 1 % each
            # the state's size: the changelog of the batch that wrote every key in the final layout
            buckets = new_checkpoint_buckets(2)  # a new checkpoint's on local[2]
            whole = 1 if args.keys / buckets >= FINE_MIN_KEYS else 0
            held_files = [state_files(work / f"held-{repeat}" / "checkpoint") for repeat in range(args.repeats)]
            held_bytes = [{f"batch {batch}": files.get(f"changelog {batch + 1}", 0) for batch in range(TOUCHES + 1)}
                          | {"snapshots": files["snapshots"], "all": files["all"]} for files in held_files]
        finally:
            method.end_spark(spark)
    steady = [statistics.median([sizes[f"batch {batch}"] for batch in range(2, TOUCHES + 1)]) for sizes in held_bytes]
    state_size = [sizes[f"batch {whole}"] for sizes in held_bytes]
    medians = {name: [statistics.median(batches[1:]) for batches in items] for name, items in runs.items()}
    document = {"keys": args.keys, "touched_per_batch": touched, "orders": orders,
                "held_batches_s": runs["held"], "empty_batches_s": runs["empty"],
                "held_median_s": method.median(medians["held"]), "empty_median_s": method.median(medians["empty"]),
                "held_over_empty": method.paired_ratio(medians, "held", "empty"),
                "held_state_bytes": held_bytes, "touched_batch_bytes_median": method.median(steady),
                "state_bytes_median": method.median(state_size),
                "touched_over_state": method.median([a / b for a, b in zip(steady, state_size) if b]),
                "touched_over_first_load": method.median([a / sizes["batch 0"] for a, sizes in zip(steady, held_bytes)
                                                          if sizes["batch 0"]])}
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
        f"held / empty (median of the repeats' ratios): {document['held_over_empty']:.2f}", "",
        "## Bytes written", "",
        f"State changelog per held batch (last repeat): loading {args.keys:,} keys "
        f"{held_bytes[-1]['batch 0']:,} B; the first 1 % batch "
        f"{'(switching to one entry per key, so writing the state once) ' if whole else ''}"
        f"{held_bytes[-1]['batch 1']:,} B; then " +
        ", ".join(f"{held_bytes[-1][f'batch {batch}']:,} B" for batch in range(2, TOUCHES + 1)) + ".  ",
        f"Median over repeats of the 1 % batches after the switch: {document['touched_batch_bytes_median']:,.0f} B, "
        f"{document['touched_over_state']:.1%} of the state's {document['state_bytes_median']:,.0f} B (goal: at most "
        f"10 %, aim 3 %); {document['touched_over_first_load']:.1%} of the first batch's, which wrote every key in "
        "sub-buckets of about 128 (fewer bytes a key than an entry each).  ",
        f"Snapshots Spark wrote (zips and SST files, last repeat): {held_bytes[-1]['snapshots']:,} B; the state folder "
        f"at the end: {held_bytes[-1]['all']:,} B."])
    run.write_results("state_size", text, document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
