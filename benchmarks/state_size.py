"""Keyed state size: does a batch cost more when the state it reads holds many keys?

A keyed count (`partitioned`, one record per key per batch) on Spark local[2], sequential plan.
Held: one query first fills its state with `--keys` distinct keys (one batch), then runs three
batches that each touch a different 1 % of those keys. Empty: a second query runs a tiny first
batch (it pays the query's start), then three batches of the same size whose keys are new. Each
key costs a MapState read and write (fissure.spark.stages.GraphStateProcessor), so the held
batches should cost what the empty ones cost if the state store's reads do not grow with its
size. Reported: each batch's duration (Spark's triggerExecution), the medians, and held / empty.

    ./dev python benchmarks/state_size.py                 # 200,000 keys (about 5 minutes)
    ./dev python benchmarks/state_size.py --keys 1000000  # the efficiency goal's size (about 15 minutes)
    ./dev python benchmarks/state_size.py --quick         # 5,000 keys, results to a temporary folder
"""

from __future__ import annotations

import argparse
import json
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
from provenance import load, load_note, machine, now, revision  # noqa: E402

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
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.keys = 5_000
    from fissure.spark.config import RunnerConfig
    from fissure.spark.session import create_session

    load_before = load()
    spark = create_session(RunnerConfig(master="local[2]"))
    work = Path(tempfile.mkdtemp(prefix="fissure-state-size-"))
    draw = random.Random(7)
    held_keys = [f"key-{number}" for number in range(args.keys)]
    touched = args.keys // 100
    touches = [draw.sample(held_keys, touched) for _ in range(TOUCHES)]
    held = batch_seconds(spark, [held_keys, *touches], work / "held")
    fresh = [[f"new-{round_number}-{number}" for number in range(touched)] for round_number in range(TOUCHES)]
    empty = batch_seconds(spark, [["warm-up"] * 10, *fresh], work / "empty")
    document = {"command": " ".join(["./dev python benchmarks/state_size.py", *(argv if argv is not None else sys.argv[1:])]),
                "date": now(), "machine": machine(), "revision": revision(REPOSITORY), "load_before": load_before,
                "load_after": load(), "keys": args.keys, "touched_per_batch": touched,
                "held_batches_s": held, "empty_batches_s": empty,
                "held_median_s": statistics.median(held[1:]), "empty_median_s": statistics.median(empty[1:])}
    document["held_over_empty"] = document["held_median_s"] / document["empty_median_s"]
    text = "\n".join([
        "# Keyed state size: a batch touching 1 % of a large state against the same batch on an empty state", "",
        f"Command: `{document['command']}`  ", f"Date: {document['date']}  ", f"Machine: {document['machine']}  ",
        f"Revision: {document['revision']}  ",
        f"Load average before / after: {document['load_before']} / {document['load_after']}"
        + load_note(document["load_before"]), "",
        f"Held: {args.keys:,} keys written in the first batch ({held[0]:.1f} s), then {TOUCHES} batches of "
        f"{touched:,} of them: " + ", ".join(f"{value:.2f} s" for value in held[1:]) + ".  ",
        f"Empty: a 10-record first batch ({empty[0]:.1f} s), then {TOUCHES} batches of {touched:,} new keys: "
        + ", ".join(f"{value:.2f} s" for value in empty[1:]) + ".", "",
        f"Median held / empty: {document['held_median_s']:.2f} s / {document['empty_median_s']:.2f} s = "
        f"{document['held_over_empty']:.2f}"])
    out = REPOSITORY / "benchmarks" / "results" if not args.quick else Path(tempfile.mkdtemp())
    (out / "state_size.json").write_text(json.dumps(document, indent=2))
    (out / "state_size.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
