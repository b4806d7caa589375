"""Spark stage and task times of keyed and stateful stages in one and two state partitions.

What the Spark model's stateful terms rest on, measured task by task through Spark's monitoring
REST API (the UI is turned on for this script only):

- `keyed`: a keyed operator alone (trivial update, then a 60 us busy update), 12,000 records over
  10 keys in 4 micro-batches, in one and in two state partitions: how the keys hash into the
  partitions, what a task costs beyond its records, and what two concurrent tasks cost each other;
- `mixed`: the model-accuracy benchmark's mixed chain (`model_accuracy.py`) under its sequential
  plan and under the plan that replicates its keyed stage, whose unkeyed stateful stage then has
  two state partitions, one of them empty.

Per stage kind: the median over the steady micro-batches (all but the first of each run) of each
task's duration and records read from the shuffle, for every repeat; Spark's phases of a batch
outside its job (planning, listing the source, the offset and commit logs) and each state
operator's own timings (updates, the store's commit and its changelog file's sync, its load); and
per run the CPU time of Spark's JVM and of its Python workers (Linux /proc: this process's
descendants), against the run's wall time. Run on a quiet machine.

Results: spark_stage_times.md/.json under --out (default benchmarks/results/).

    ./dev python benchmarks/spark_stage_times.py [--repeats 3]
    ./dev python benchmarks/spark_stage_times.py --quick   # a tenth of the input, one repeat: a check
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fissure  # noqa: E402
from fissure import Pipeline  # noqa: E402
from fissure.cli.calibrate_cmd import count_per_key  # noqa: E402
from fissure.model.types import Plan, RegionPlan  # noqa: E402
from fissure.plan.plans import describe_plan, sequential_plan  # noqa: E402
from fissure.spark.session.stage_log import STAGE_LOG_CONF, StageLog, parse_timestamp  # noqa: E402

import model_accuracy  # noqa: E402
import method  # noqa: E402
from model_accuracy import BusyUpdate, measure_run, mixed_pipeline, synthetic_source  # noqa: E402


class TaskLog(StageLog):
    """The stages Spark completed since the last call, with their tasks (monitoring REST API)."""

    def __init__(self, spark) -> None:
        super().__init__(spark)
        self.seen: set[tuple[int, int]] = set()
        self.new_stages()

    def new_stages(self) -> list[dict]:
        stages = [stage for stage in self.get("/stages?status=complete")
                  if (stage["stageId"], stage["attemptId"]) not in self.seen and stage["numTasks"] > 0]
        self.seen.update((stage["stageId"], stage["attemptId"]) for stage in stages)
        out = []
        for stage in sorted(stages, key=lambda item: item["stageId"]):
            tasks = self.get(f"/stages/{stage['stageId']}/{stage['attemptId']}/taskList?length=100")
            out.append({"wall_ms": 1e3 * (parse_timestamp(stage["completionTime"])
                                          - parse_timestamp(stage["submissionTime"])),
                        "tasks": [{"duration_ms": task["duration"],
                                   "shuffle_records": task.get("taskMetrics", {}).get("shuffleReadMetrics", {})
                                   .get("recordsRead", 0),
                                   "input_records": task.get("taskMetrics", {}).get("inputMetrics", {})
                                   .get("recordsRead", 0)} for task in tasks]})
        return out


def process_cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system, with reaped children) of this process's descendants: Spark's JVM
    and its Python workers. Linux only (empty elsewhere)."""
    stats = {}
    for pid in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else []):
        try:
            with open(f"/proc/{pid}/stat") as stat, open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                fields = stat.read().rsplit(")", 1)[1].split()
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        ticks = sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
        stats[int(pid)] = (int(fields[1]), ticks / os.sysconf("SC_CLK_TCK"), command)
    ours, changed = {os.getpid()}, True
    while changed:
        found = {pid for pid, (parent, _, _) in stats.items() if parent in ours} - ours
        ours |= found
        changed = bool(found)
    totals = {"jvm": 0.0, "python_workers": 0.0}
    for pid in ours - {os.getpid()}:
        _, seconds, command = stats[pid]
        if "java" in command.split(" ")[0]:
            totals["jvm"] += seconds
        elif "pyspark" in command:
            totals["python_workers"] += seconds
    return totals


# Spark's phases of a micro-batch (StreamingQueryProgress.durationMs): listing the source, planning,
# writing the offset log (walCommit), the job that runs the stages (addBatch), writing the commit log.
PHASES = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets")


def run_case(spark, log: TaskLog, pipeline, plan, source, work: Path) -> dict:
    """One run: its throughput, the CPU the JVM and the Python workers used over its wall time,
    per position of a stage in the micro-batch's job the tasks of the steady batches (the job of
    the first batch left out), the mean of each of PHASES over those batches and the state
    operators' own timings."""
    cpu_before, started = process_cpu_seconds(), time.perf_counter()
    run = measure_run(spark, pipeline, source, plan, work)
    wall_s = time.perf_counter() - started
    cpu = {name: seconds - cpu_before.get(name, 0.0) for name, seconds in process_cpu_seconds().items()}
    time.sleep(1.0)  # the listener behind the REST API catches up
    stages = log.new_stages()
    per_batch = len(stages) // max(1, run["batches"] + 1)
    steady = stages[per_batch:] if per_batch else []
    positions: dict[int, list[list[dict]]] = {}
    for number, stage in enumerate(steady):
        positions.setdefault(number % per_batch, []).append(stage["tasks"])
    batches = max(1, run["batches"])
    return {"records_per_s": run["records_per_s"], "positions": positions, "wall_s": wall_s, "cpu_s": cpu,
            "batch_ms": run["durations_ms"].get("triggerExecution", 0.0) / batches,
            "stages_ms": sum(stage["wall_ms"] for stage in steady) / batches,
            "phases_ms": {phase: run["durations_ms"].get(phase, 0.0) / batches for phase in PHASES},
            "state_ms": run["state_ms"]}


def summarize(positions: dict[int, list[list[dict]]]) -> list[dict]:
    """Per stage position: tasks per stage; the median duration and shuffle records of each task slot,
    tasks sorted by records so that the fuller partition is compared with the fuller one."""
    out = []
    for position, stages in sorted(positions.items()):
        ordered = [sorted(tasks, key=lambda task: (task["shuffle_records"], task["input_records"])) for tasks in stages]
        width = min(len(tasks) for tasks in ordered)
        slots = [{"duration_ms": statistics.median(tasks[slot]["duration_ms"] for tasks in ordered),
                  "records": statistics.median(max(tasks[slot]["shuffle_records"], tasks[slot]["input_records"])
                                               for tasks in ordered)} for slot in range(width)]
        out.append({"position": position, "tasks": width, "slots": slots})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    records = (12_000, 20_000)
    if args.quick:
        args.repeats, records = 1, (1_200, 2_000)
    method.check_repeats(args.repeats, args.quick)
    bench_run = method.Run("spark_stage_times.py", argv, quick=args.quick, out=args.out, master=args.master)
    model_accuracy.LOOPS_PER_US = model_accuracy.busy_loops_per_us()
    document = {"master": args.master, "quick": args.quick}
    from fissure.spark.session.create import create_session

    with method.scratch_folder("spark_stage_times.py") as work:
        spark = create_session(fissure.RunnerConfig(master=args.master, spark_conf=STAGE_LOG_CONF))
        try:
            log = TaskLog(spark)
            keyed_source = synthetic_source(work / "keyed", records[0], 4, keys=10)
            mixed_source = synthetic_source(work / "mixed", records[1], 4)
            mixed = mixed_pipeline()
            cases = []
            for label, update in (("trivial update", count_per_key), ("busy update 60 us", BusyUpdate(60))):
                for partitions in (1, 2):
                    pipeline = Pipeline(f"keyed{partitions}").partitioned("s", update, key="k")
                    plan = Plan((RegionPlan((("s",),), partitions),))
                    cases.append((f"keyed, {label}", pipeline, plan, keyed_source))
            cases.append(("mixed", mixed, sequential_plan(mixed), mixed_source))
            cases.append(("mixed", mixed, Plan((RegionPlan((("m20", "f10"),), 1), RegionPlan((("p15", "m30"),), 2),
                                                RegionPlan((("s5",),), 1))), mixed_source))
            results = {f"{label}: {describe_plan(plan)}": {"runs": []} for label, _, plan, _ in cases}
            warm_up_source = synthetic_source(work / "warm-up", 2_000, 2)
            measure_run(spark, mixed, warm_up_source, sequential_plan(mixed), work)  # warm-up
            log.new_stages()  # the warm-up's stages are not any case's
            for repeat in range(args.repeats):  # the cases' order rotated each repeat
                for label, pipeline, plan, source in method.run_order(cases, repeat):
                    key = f"{label}: {describe_plan(plan)}"
                    print(f"repeat {repeat + 1}/{args.repeats}: {key}", flush=True)
                    run = run_case(spark, log, pipeline, plan, source, work)
                    results[key]["runs"].append({"records_per_s": run["records_per_s"], "wall_s": run["wall_s"],
                                                 "cpu_s": run["cpu_s"], "batch_ms": run["batch_ms"],
                                                 "stages_ms": run["stages_ms"], "stages": summarize(run["positions"]),
                                                 "phases_ms": run["phases_ms"], "state_ms": run["state_ms"]})
        finally:
            method.end_spark(spark)
    document["results"] = results
    bench_run.write_results("spark_stage_times_quick" if args.quick else "spark_stage_times", report(document), document)
    return 0


def report(document: dict) -> str:
    lines = ["# Spark stage and task times: keyed and stateful stages in one and two state partitions", "",
             "One uncounted warm-up run first; the cases' order rotated each repeat.", "",
             "Per case and repeat: throughput, then per stage of the micro-batch's job (in job order) its tasks as "
             "`duration ms (records)`, the median over the steady micro-batches, tasks sorted by records; the "
             "whole run's CPU seconds of the JVM and of the Python workers, and its wall time; a steady micro-batch's "
             "time and the part of it its stages took (submission to completion, summed).", ""]
    for key, result in document["results"].items():
        lines += [f"## {key}", "", "| repeat | records/s | batch ms (in stages) | stages: task duration ms (records) "
                                   "| CPU s: JVM, Python workers / wall s |", "| --- | --- | --- | --- | --- |"]
        for number, run in enumerate(result["runs"], 1):
            stages = "; ".join(" + ".join(f"{slot['duration_ms']:.0f} ({slot['records']:,.0f})" for slot in stage["slots"])
                               for stage in run["stages"])
            cpu = run["cpu_s"]
            lines.append(f"| {number} | {run['records_per_s']:,.0f} | {run['batch_ms']:.0f} ({run['stages_ms']:.0f}) | "
                         f"{stages} | {cpu.get('jvm', 0):.2f}, "
                         f"{cpu.get('python_workers', 0):.2f} / {run['wall_s']:.2f} |")
        lines += ["", "Spark's phases of a steady micro-batch (ms, mean over the steady batches) and each state operator's "
                      "own timings (ms, median over them, summed over its partitions):", "",
                  "| repeat | " + " | ".join(PHASES) + " | state operators: updates, commit (file sync), load |",
                  "| --- | " + " | ".join("---" for _ in PHASES) + " | --- |"]
        for number, run in enumerate(result["runs"], 1):
            state = "; ".join(f"{item['updates']:.0f}, {item['commit']:.0f} ({item['commit_file_sync']:.0f}), "
                              f"{item['load']:.0f}" for item in run["state_ms"])
            lines.append(f"| {number} | " + " | ".join(f"{run['phases_ms'][phase]:.0f}" for phase in PHASES)
                         + f" | {state} |")
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
