"""Profiling overhead and accuracy on Spark: profiled against unprofiled runs, and profiled costs
against the same operators timed alone.

(a) Overhead: each workload runs with profiling on (the defaults: every Arrow batch timed,
    every 32nd record of a stateful operator) and off, in adjacent pairs (ABBA order) after one
    discarded warm-up pair, each run a freshly built query over the same input; throughput =
    source records / batch time over the micro-batches after the first; overhead = 1 - the median
    of the pairs' profiled / unprofiled ratios. Workloads:
    - `light`: four cheap per-record maps (about 1 us each): the worst case, where the
      profiler's fixed work per batch weighs most;
    - `mixed`: busy operators of known cost with a filter, a keyed and an unkeyed stateful
      operator (benchmarks/model_accuracy.py's `mixed` chain).
(b) Accuracy: the profiled CPU cost per record of busy-loop operators of known cost (5-80 us)
    run on Spark, against the same functions timed in isolation in this process (thread CPU time,
    median of five) before and after the runs.
(c) The profiler's own CPU cost, in this process (thread CPU time: a busy machine hardly moves it):
    a fused stage of four cheap maps over 10,000-record batches with and without profiling, and a
    stateful update with and without its counting wrapper, alternating, medians.

    ./dev python benchmarks/profiling_overhead.py            # the real measurement (quiet machine!)
    ./dev python benchmarks/profiling_overhead.py --quick    # end to end in a few minutes (not figures)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import model_accuracy as shared  # noqa: E402
from fissure import Pipeline  # noqa: E402
from fissure.model.types import Plan, RegionPlan  # noqa: E402

KNOWN_COSTS_US = (5, 20, 80)


def light_step(record):
    return {**record, "x": record["x"] + 1.0}


def light_pipeline() -> Pipeline:
    pipeline = Pipeline("light")
    for number in range(4):
        pipeline = pipeline.map(f"light{number + 1}", light_step)
    return pipeline


def known_cost_pipeline() -> Pipeline:
    pipeline = Pipeline("known")
    for cost in KNOWN_COSTS_US:
        pipeline = pipeline.map(f"busy{cost}", shared.BusyMap(cost))
    return pipeline


def isolated_costs_us(pipeline: Pipeline, records: int = 2000) -> dict[str, float]:
    """Each operator's CPU time per record, alone in this process: the median of five passes."""
    rows = [{"i": i, "k": "k", "x": float(i % 997) + 0.5} for i in range(records)]
    costs = {}
    for operator in pipeline.operators:
        samples = []
        for _ in range(5):
            started = time.thread_time()
            for row in rows:
                operator.fn(row)
            samples.append(1e6 * (time.thread_time() - started) / records)
        costs[operator.name] = statistics.median(samples)
    return costs


def in_process_cpu_overhead(rounds: int) -> dict:
    """(c): thread CPU time per record, profiled against unprofiled, alternating; medians."""
    import pyarrow as pa

    from fissure.worker.fused import FusedStage, Step, live_batch
    from fissure.worker.profiling import ProfiledUpdate, ProfileTally, ProfileTallyParam

    schema = pa.schema([("i", pa.int64()), ("k", pa.string()), ("x", pa.float64())])
    rows = [{"i": i, "k": f"k{i % 64}", "x": float(i)} for i in range(10_000)]
    batch = live_batch(pa.RecordBatch.from_pylist(rows, schema=schema), list(range(len(rows))))
    steps = [Step(f"light{n}", "map", light_step, schema) for n in range(4)]
    stages = {"unprofiled": FusedStage(steps, schema),
              "profiled": FusedStage(steps, schema, profile_id="bench/s0/p1")}

    class Accumulator:  # what Spark's accumulator does in a task
        def __init__(self):
            self.param, self.value = ProfileTallyParam(), ProfileTally()

        def add(self, term):
            self.value = self.param.addInPlace(self.value, term)

    def update(state, record):
        state["n"] = state.get("n", 0) + 1
        return record

    updates = {"unprofiled": update, "profiled": ProfiledUpdate(update, "count", Accumulator())}
    fused = {label: [] for label in stages}
    stateful = {label: [] for label in updates}
    for _ in range(rounds):
        for label, stage in stages.items():
            started = time.thread_time()
            stage(batch)
            fused[label].append(1e6 * (time.thread_time() - started) / len(rows))
        for label, fn in updates.items():
            started = time.thread_time()
            for key in range(100):
                state = {}
                for row in rows[:100]:
                    fn(state, row)
            stateful[label].append(1e9 * (time.thread_time() - started) / 10_000)
    fused_us = {label: statistics.median(values) for label, values in fused.items()}
    stateful_ns = {label: statistics.median(values) for label, values in stateful.items()}
    return {"fused_us_per_record": fused_us,
            "fused_overhead": fused_us["profiled"] / fused_us["unprofiled"] - 1,
            "stateful_ns_per_record": stateful_ns,
            "stateful_wrapper_ns": stateful_ns["profiled"] - stateful_ns["unprofiled"]}


def overhead(spark, name, pipeline, source, args, work) -> dict:
    """Profiled and unprofiled runs in adjacent pairs (ABBA order); overhead = 1 - the median of the
    pairs' ratios. Runs of one query vary by +-15 % on this machine and drift (the JVM warms up over
    the first runs), so a ratio of two medians taken over the whole series would measure the noise;
    a ratio inside each pair compares runs a few seconds apart. One discarded pair warms up first."""
    plan = Plan((RegionPlan((pipeline.names,), 1),))
    variants = [("profiled", True), ("unprofiled", None)]
    for label, profile in variants:
        print(f"[{name}] warm-up: {label}", flush=True)
        shared.measure_run(spark, pipeline, source, plan, work, profile)
    rates = {"profiled": [], "unprofiled": []}
    for repeat in range(args.repeats):
        for label, profile in variants if repeat % 2 == 0 else variants[::-1]:  # ABBA: no order bias
            print(f"[{name}] repeat {repeat + 1}/{args.repeats}: {label}", flush=True)
            rates[label].append(shared.measure_run(spark, pipeline, source, plan, work, profile)["records_per_s"])
    pair_ratios = [profiled / unprofiled for profiled, unprofiled in zip(rates["profiled"], rates["unprofiled"])]
    ratio = statistics.median(pair_ratios)
    return {"runs_per_s": rates, "pair_ratios": pair_ratios, "profiled_over_unprofiled": ratio,
            "ratio_of_medians": statistics.median(rates["profiled"]) / statistics.median(rates["unprofiled"]),
            "overhead": 1 - ratio}


def accuracy(spark, source, args, work) -> dict:
    pipeline = known_cost_pipeline()
    before = isolated_costs_us(pipeline)
    summaries = []
    for repeat in range(args.repeats):
        print(f"[known costs] repeat {repeat + 1}/{args.repeats}", flush=True)
        summaries.append(shared.measure_run(spark, pipeline, source, Plan((RegionPlan((pipeline.names,), 1),)),
                                            work)["profile"])
    after = isolated_costs_us(pipeline)
    rows = []
    for operator in pipeline.names:
        profiled = statistics.median(summary.operator(operator).cost_us for summary in summaries)
        isolated = statistics.median([before[operator], after[operator]])
        rows.append({"operator": operator, "isolated_us": isolated, "profiled_us": profiled,
                     "ratio": profiled / isolated})
    return {"operators": rows, "worst_deviation": max(abs(row["ratio"] - 1) for row in rows)}


def write_outputs(document: dict, out_dir: Path, stem: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(document, indent=2))
    lines = ["# Profiling overhead and accuracy on Spark", "", f"Command: `{document['command']}`  ",
             f"Date: {document['date']}  ", f"Machine: {document['machine']}, Spark master {document['master']}  ",
             f"Load average before / after: {document['load_before']} / {document['load_after']}", ""]
    if document["quick"]:
        lines += ["**Quick mode** (tiny inputs, on a shared machine): a smoke test, not figures.", ""]
    lines += ["## Overhead (target: at most 2 %)", "",
              "Runs alternate in adjacent pairs (ABBA) after one discarded warm-up pair; overhead = 1 - the "
              "median of the pairs' profiled / unprofiled ratios (pair ratios listed; the ratio of the two "
              "series' medians beside it, for reference).", "",
              "| workload | profiled rec/s (median) | unprofiled rec/s (median) | pair ratios | overhead |",
              "| --- | --- | --- | --- | --- |"]
    for name, item in document["overhead"].items():
        pairs = ", ".join(f"{value:.3f}" for value in item["pair_ratios"])
        lines.append(f"| {name} | {statistics.median(item['runs_per_s']['profiled']):,.0f} | "
                     f"{statistics.median(item['runs_per_s']['unprofiled']):,.0f} | {pairs} | "
                     f"{100 * item['overhead']:+.1f} % |")
    cpu = document["in_process"]
    lines += ["", "## The profiler's own CPU cost (in one process, thread CPU time)", "",
              f"- fused stage of four cheap maps, 10,000-record batches: "
              f"{cpu['fused_us_per_record']['unprofiled']:.3f} us/record unprofiled, "
              f"{cpu['fused_us_per_record']['profiled']:.3f} profiled ({100 * cpu['fused_overhead']:+.1f} %)",
              f"- stateful update wrapper: {cpu['stateful_wrapper_ns']:.0f} ns per record "
              f"({cpu['stateful_ns_per_record']['unprofiled']:.0f} ns for the bare update; Spark's state handler "
              f"spends microseconds per record around it)"]
    lines += ["", "## Profiled cost against the cost measured in isolation (target: within 10 %)", "",
              "| operator | isolated us/record | profiled us/record | ratio |", "| --- | --- | --- | --- |"]
    for row in document["accuracy"]["operators"]:
        lines.append(f"| {row['operator']} | {row['isolated_us']:.2f} | {row['profiled_us']:.2f} | {row['ratio']:.3f} |")
    lines += ["", f"![overhead]({stem}.png)"]
    (out_dir / f"{stem}.md").write_text("\n".join(lines) + "\n")
    plot(document, out_dir / f"{stem}.png")


def plot(document: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = list(document["overhead"])
    left.bar(names, [100 * document["overhead"][name]["overhead"] for name in names], color="tab:blue")
    left.axhline(2, color="tab:red", linestyle="--", linewidth=1, label="2 % target")
    left.set_ylabel("throughput lost to profiling (%)")
    left.set_title("Profiling overhead (median of paired ratios)")
    left.legend()
    rows = document["accuracy"]["operators"]
    right.scatter([row["isolated_us"] for row in rows], [row["profiled_us"] for row in rows], color="tab:blue")
    top = max(max(row["isolated_us"], row["profiled_us"]) for row in rows) * 1.2
    right.plot([0, top], [0, top], color="grey", linewidth=1)
    right.fill_between([0, top], [0, top * 0.9], [0, top * 1.1], color="grey", alpha=0.15)
    right.set_xlabel("cost timed in isolation (us/record)")
    right.set_ylabel("profiled cost on Spark (us/record)")
    right.set_title("Profiled vs isolated cost (band: +/-10 %)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny end-to-end run (not figures)")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=5, help="input files = micro-batches (the first is warm-up)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    if args.quick:
        args.records, args.files, args.repeats = 2000, 3, 3
    shared.LOOPS_PER_US = shared.busy_loops_per_us()
    document = shared.run_header("profiling_overhead.py", argv, args.master, args.quick)
    work = Path(tempfile.mkdtemp(prefix="fissure-profiling-"))
    import fissure
    from fissure.spark.session import create_session

    spark = create_session(fissure.RunnerConfig(master=args.master))
    document["in_process"] = in_process_cpu_overhead(rounds=9 if args.quick else 41)
    source = shared.synthetic_source(work / "input", args.records, args.files)
    document["overhead"] = {"light": overhead(spark, "light", light_pipeline(), source, args, work),
                            "mixed": overhead(spark, "mixed", shared.mixed_pipeline(), source, args, work)}
    document["accuracy"] = accuracy(spark, source, args, work)
    shared.publish(document, "profiling_overhead_quick" if args.quick else "profiling_overhead", write_outputs)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
