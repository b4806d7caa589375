"""Keyed stages under the two grouping key schemes: plain bucket numbers against balanced values.

The same code, the same programs and plans; only the values a keyed stage's buckets travel as
differ (fissure.runtime.state.grouping_keys). Under the plain numbers 0..63, Spark's hash sends
27 buckets to one of 2 partitions and 37 to the other; under the balanced values 32 and 32. Each
run starts on a new checkpoint holding only the record of its scheme and 64 buckets (as
fissure.spark.checkpoint.state_layout keeps an earlier fissure's checkpoint on the plain one; a new
checkpoint would get fewer buckets, which benchmarks/state_buckets.py compares).

Per workload (the goal shape of benchmarks/cost.py: 1,000,000 records in 20 files, 5 a
micro-batch, the planner's plan on 2 cores, through `fissure.run`): one uncounted warm-up, the
answer of both schemes checked against the direct loop's on a small input, then the two schemes
in one block, the order rotated each repeat; the steady rate `fissure run --json` reports, and
from Spark's monitoring REST API the tasks of the keyed stages: each stage that reads packed rows
(at most 5,000 a task) in both of its 2 tasks, the slower task's time and the faster's, summed over
the run. The throughput moves by a few percent at most (the keyed stages are a third of a hot-items
micro-batch, and the split moves the fuller task from 37 calls to 32), inside this machine's
run-to-run noise; the tasks show the split itself.

    ./dev python benchmarks/grouping_keys.py [--repeats 3] [--only hot-items] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "examples"))
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

import fissure  # noqa: E402
from fissure.plan.plans import describe_plan, planner_plan  # noqa: E402
from fissure.runtime.state.grouping_keys import BALANCED_KEYS, PLAIN_KEYS, GroupingKeys, spark_partition  # noqa: E402
from fissure.spark.checkpoint.state_layout import STATE_LAYOUT_RECORD  # noqa: E402

import direct_loops  # noqa: E402
import method  # noqa: E402

WORKLOADS = {"hot-items": ("hot-items", ""), "logwatch": ("logwatch", ""), "wordcount-10k": ("wordcount", "aggregate")}
SCHEMES = {"plain": PLAIN_KEYS, "balanced": BALANCED_KEYS}
CHECK_RECORDS = {"hot-items": 3_000, "logwatch": 12_000, "wordcount": 2_000}


def checkpoint_under(keys: GroupingKeys, parent: Path) -> str:
    """A new checkpoint in `parent` whose record names `keys`' scheme and bucket count: the plain
    scheme as an earlier fissure's checkpoint keeps it, any other as if the checkpoint had chosen it."""
    checkpoint = Path(tempfile.mkdtemp(prefix="keys-", dir=parent))
    (checkpoint / STATE_LAYOUT_RECORD).parent.mkdir(parents=True)
    (checkpoint / STATE_LAYOUT_RECORD).write_text(json.dumps({"grouping_keys": keys.scheme,
                                                              "buckets": keys.buckets}) + "\n")
    return str(checkpoint)


PACKED_ROWS_AT_MOST = 5_000  # a task reading more reads records, not packed rows: not a keyed stage


def keyed_tasks(stages: list[dict]) -> dict[str, float]:
    """Of completed stages as spark_stage_times.TaskLog gives them, the keyed ones (2 tasks, each
    reading packed rows): their slower and faster task's milliseconds, summed, and how many."""
    slower = faster = keyed = 0
    for stage in stages:
        tasks = stage["tasks"]
        if len(tasks) != 2 or not all(0 < task["shuffle_records"] <= PACKED_ROWS_AT_MOST for task in tasks):
            continue
        durations = sorted(task["duration_ms"] for task in tasks)
        slower, faster, keyed = slower + durations[1], faster + durations[0], keyed + 1
    return {"slower_ms": slower, "faster_ms": faster, "stages": keyed}


def run_once(spark, program, source, plan, keys: GroupingKeys, work: Path, sink=None, log=None) -> dict:
    """One run on a new checkpoint (in `work`) under `keys`: its steady rate, and with `log` its keyed
    stages' tasks."""
    checkpoint = checkpoint_under(keys, work)
    if log is not None:
        log.new_stages()  # earlier runs' stages are not this one's
    report = fissure.run(program, source, sink if sink is not None else fissure.NoopSink(), plan=plan,
                         checkpoint=checkpoint, config=fissure.RunnerConfig(spark=spark))
    recorded = json.loads((Path(checkpoint) / STATE_LAYOUT_RECORD).read_text())
    if recorded != {"grouping_keys": keys.scheme, "buckets": keys.buckets}:
        raise SystemExit(f"a run under {keys.scheme} with {keys.buckets} buckets recorded {recorded!r}")
    result = {"records_per_s": report.summary()["steady_records_per_s"] or 0.0}
    if log is not None:
        time.sleep(1.0)  # the listener behind the REST API catches up
        result.update(keyed_tasks(log.new_stages()))
    return result


def splits() -> dict[str, list[int]]:
    """How each scheme's 64 bucket values split over 2 and 3 partitions (Spark's hash)."""
    out = {}
    for name, keys in SCHEMES.items():
        for partitions in (2, 3):
            counts = [0] * partitions
            for value in keys.bucket_values:
                counts[spark_partition(value, partitions)] += 1
            out[f"{name} over {partitions}"] = counts
    return out


def goal_shape(args) -> tuple[int, int, int]:
    """Records, files and files a micro-batch: the goal shape of benchmarks/cost.py, or a quick one."""
    if args.quick:
        args.repeats = 1
    method.check_repeats(args.repeats, args.quick)
    return (1_000_000, 20, 5) if not args.quick else (20_000, 4, 1)


def stage_logged_session():
    """A local[2] session whose stages Spark's monitoring REST API lists, and its task log."""
    from fissure.config import RunnerConfig
    from fissure.spark.session.create import create_session
    from fissure.spark.session.stage_log import STAGE_LOG_CONF
    from spark_stage_times import TaskLog

    spark = create_session(RunnerConfig(master="local[2]", spark_conf=STAGE_LOG_CONF))
    return spark, TaskLog(spark)


def measure_layouts(spark, log, name: str, work: Path, shape: tuple[int, int, int],
                    layouts: dict[str, GroupingKeys], warm_up: GroupingKeys, repeats: int, quick: bool) -> dict:
    """One workload under every layout (label -> grouping keys): every layout's answer checked
    against the direct loop's on a small input, then all in one block; the plan, the block and
    the keyed stages' tasks summed per layout."""
    records, files, per_batch = shape
    family, variant = WORKLOADS[name]
    program = direct_loops.programs(family)[variant]
    plan = planner_plan(program, 2)
    vocabulary = 10_000 if family == "wordcount" else None
    source = direct_loops.write_input(family, work / name, records, files, per_batch, vocabulary)
    check_source = direct_loops.write_input(family, work / f"{name}-check", CHECK_RECORDS[family], 2, 1, vocabulary)
    expected = direct_loops.direct_answer(family, direct_loops.input_files(work / f"{name}-check"))
    answer = getattr(direct_loops, f"{family.replace('-', '_')}_answer")
    for layout, keys in layouts.items():
        sink = fissure.MemorySink()
        run_once(spark, program, check_source, plan, keys, work, sink)
        if answer(sink.records()) != expected:
            raise SystemExit(f"{name}: the answer under {layout} differs from the direct loop's")
    variants = {layout: (lambda keys=keys: run_once(spark, program, source, plan, keys, work, log=log))
                for layout, keys in layouts.items()}
    block = method.measure_block(variants, repeats, quick=quick,
                                 warm_up=lambda: run_once(spark, program, check_source, plan, warm_up, work),
                                 value=lambda result: result["records_per_s"],
                                 log=lambda line: print(f"{name}: {line}", flush=True))
    tasks = {layout: {"slower_ms": sum(run["slower_ms"] for run in runs),
                      "faster_ms": sum(run["faster_ms"] for run in runs),
                      "stages": sum(run["stages"] for run in runs)} for layout, runs in block.details.items()}
    return {"plan": describe_plan(plan, program), "block": block, "keyed_tasks": tasks}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser)
    parser.add_argument("--only", action="append", default=[], choices=tuple(WORKLOADS))
    args = parser.parse_args(argv)
    shape = goal_shape(args)
    run = method.Run("grouping_keys.py", argv, quick=args.quick, out=args.out)
    document = {"records": shape[0], "files": shape[1], "files_per_batch": shape[2], "splits": splits(),
                "workloads": {}}
    with method.scratch_folder("grouping_keys.py") as work:
        spark, log = stage_logged_session()
        try:
            for name in args.only or WORKLOADS:
                measured = measure_layouts(spark, log, name, work, shape, SCHEMES, BALANCED_KEYS, args.repeats,
                                           args.quick)
                block = measured["block"]
                document["workloads"][name] = {"plan": measured["plan"], **block.to_dict(),
                                               "balanced_over_plain": block.paired_ratio("balanced", "plain"),
                                               "keyed_tasks": measured["keyed_tasks"]}
        finally:
            method.end_spark(spark)
    run.write_results("grouping_keys_quick" if args.quick else "grouping_keys", report(document), document)
    return 0


def report(document: dict) -> str:
    lines = ["# Keyed stages under plain bucket numbers and balanced grouping key values", "",
             "How Spark's hash splits the 64 buckets' values over the partitions:", "",
             "| scheme | buckets a partition |", "| --- | --- |"]
    lines += [f"| {label} | {' / '.join(map(str, counts))} |" for label, counts in document["splits"].items()]
    lines += ["", f"{document['records']:,} records in {document['files']} files, {document['files_per_batch']} a "
              "micro-batch, the planner's plan on local[2], through `fissure.run` (steady records/s, the rate "
              "`fissure run --json` prints). Both schemes in one block per workload, the order rotated each "
              "repeat, after an uncounted warm-up; both answer as the direct loop on a small input first.", "",
              "| workload | plan | plain, median records/s | balanced, median records/s | balanced / plain (paired, "
              "median) | every repeat, balanced / plain |", "| --- | --- | --- | --- | --- | --- |"]
    rows = []
    for name, result in document["workloads"].items():
        pairs = ", ".join(f"{balanced / plain:.3f}" for balanced, plain in zip(result["runs"]["balanced"],
                                                                            result["runs"]["plain"]) if plain)
        lines.append(f"| {name} | `{result['plan']}` | {result['medians']['plain']:,.0f} | "
                     f"{result['medians']['balanced']:,.0f} | {result['balanced_over_plain']:.3f} | {pairs} |")
        for scheme, tasks in result.get("keyed_tasks", {}).items():
            if tasks["stages"]:
                rows.append(f"| {name} | {scheme} | {tasks['stages']} | {tasks['slower_ms']:,.0f} | "
                            f"{tasks['faster_ms']:,.0f} | {tasks['slower_ms'] / max(1, tasks['faster_ms']):.3f} | "
                            f"{tasks['slower_ms'] / tasks['stages']:,.0f} |")
    if rows:
        lines += ["", "The keyed stages' two tasks over the measured runs (each stage reading packed rows in both of "
                  "its 2 tasks): the slower task's time and the faster's, summed.", "",
                  "| workload | scheme | keyed stages | slower tasks, ms | faster tasks, ms | slower / faster | "
                  "slower task a stage, ms |", "| --- | --- | --- | --- | --- | --- | --- |", *rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
