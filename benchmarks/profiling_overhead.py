"""Profiling overhead and accuracy on Spark: profiled against unprofiled runs, and profiled costs
against the same operators timed alone.

(a) Overhead: each workload runs with profiling on (the defaults: every Arrow batch timed,
    every 32nd record of a stateful operator) and off, in adjacent pairs (ABBA order) after one
    discarded warm-up pair, each run a freshly built query over the same input; throughput =
    source records / batch time over the micro-batches after the first; overhead = 1 - the
    profiled series' median over the unprofiled series' median (the ratio of medians, as every
    other ratio of these benchmarks), with 1 - the median of the pairs' profiled / unprofiled
    ratios beside it and Spark's `addBatch` phase profiled over unprofiled. Workloads:
    - `light`: four cheap per-record maps (about 1 us each): the worst case, where the
      profiler's fixed work per batch weighs most;
    - `mixed`: busy operators of known cost with a filter, a keyed and an unkeyed stateful
      operator (benchmarks/model_accuracy.py's `mixed` chain).
(b) Accuracy: the profiled CPU cost per record of synthetic operators of known cost (5-80 us)
    run on Spark, in one fused chain:
    - `spin<N>`: spins until its thread's CPU clock has advanced N us: its CPU cost is N us by
      construction, whatever the machine's speed does, plus the call and the record copy (about
      1 us, which the profiler rightly charges to the operator);
    - `busy<N>`: a fixed number of multiplications (about N us): a cost defined by work, whose time
      follows the machine's speed.
    The reference of both is the same function timed in isolation in this process (thread CPU
    time, median of five passes) just before every Spark run, twice: on the idle machine, and
    with a process spinning on the other core (as Spark's JVM and task threads keep it during a
    run). Earlier runs timed the reference only before and after all the Spark runs and saw the
    ratio swing from 0.90 to 1.21 between two runs of the script: the machine's drift.
(c) The profiler's own CPU cost, in this process (thread CPU time: a busy machine hardly moves it):
    a fused stage of four cheap maps over 10,000-record batches with and without profiling, and a
    stateful update with and without its counting wrapper, alternating, medians.

    ./dev python benchmarks/profiling_overhead.py            # the real measurement (quiet machine!)
    ./dev python benchmarks/profiling_overhead.py --quick    # end to end in a few minutes (not figures)

The method of benchmarks/method.py (warm-up, rotation, medians of at least 3, one writer); results:
profiling_overhead.md/.json under --out (default benchmarks/results/; --quick: a temporary
folder), and with --plots profiling_overhead.png.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import method  # noqa: E402
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


class CpuSpinMap:
    """A map whose CPU cost is known by construction: it spins until its thread's CPU clock has
    advanced `cost_us` microseconds (plus the call, the clock reads and the record copy: about 1 us)."""

    def __init__(self, cost_us: float) -> None:
        self.cost_s = cost_us / 1e6

    def __call__(self, record):
        until = time.thread_time() + self.cost_s
        while time.thread_time() < until:
            pass
        return {**record, "x": record["x"] + 1.0}


def known_cost_pipeline() -> Pipeline:
    pipeline = Pipeline("known")
    for cost in KNOWN_COSTS_US:
        pipeline = pipeline.map(f"spin{cost}", CpuSpinMap(cost))
    for cost in KNOWN_COSTS_US:
        pipeline = pipeline.map(f"busy{cost}", shared.BusyMap(cost))
    return pipeline


def _spin_forever() -> None:
    while True:
        pass


def isolated_costs_us(pipeline: Pipeline, records: int = 2000, loaded: bool = False) -> dict[str, float]:
    """Each operator's CPU time per record, alone in this process: the median of five passes.
    `loaded`: with a process spinning beside it (the other core busy, as during a Spark run)."""
    rows = [{"i": i, "k": "k", "x": float(i % 997) + 0.5} for i in range(records)]
    neighbour = None
    if loaded:
        neighbour = multiprocessing.get_context("fork").Process(target=_spin_forever, daemon=True)
        neighbour.start()
        time.sleep(0.05)
    try:
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
    finally:
        if neighbour is not None:
            neighbour.terminate()
            neighbour.join()


def in_process_cpu_overhead(rounds: int) -> dict:
    """(c): thread CPU time per record, profiled against unprofiled, alternating; medians."""
    import pyarrow as pa

    from fissure.runtime.operators.fused import FusedStage, Step
    from fissure.runtime.records.carried import live_batch
    from fissure.runtime.profiling.profiler import ProfiledUpdate, ProfileTally, ProfileTallyParam

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
    """Profiled and unprofiled runs in adjacent pairs (ABBA order); overhead = 1 - the ratio of the
    two series' medians. Runs of one query vary by +-15 % on this machine and drift (the JVM warms
    up over the first runs); a ratio inside each pair compares runs a few seconds apart, so the
    median of the pairs' ratios is given too, but it is not the headline: in the 15-pair run of
    2026-11-26 it read -2.4 % where the ratio of medians read +3.6 % and addBatch +5 %, and a goal
    of 2 % is judged on the figure that is least kind to it. One discarded pair warms up first."""
    plan = Plan((RegionPlan((pipeline.names,), 1),))
    variants = [("profiled", True), ("unprofiled", None)]
    for label, profile in variants:
        print(f"[{name}] warm-up: {label}", flush=True)
        shared.measure_run(spark, pipeline, source, plan, work, profile)
    rates = {"profiled": [], "unprofiled": []}
    durations = {"profiled": [], "unprofiled": []}
    for repeat in range(args.repeats):
        for label, profile in method.run_order(variants, repeat):  # rotated: AB BA AB ...
            print(f"[{name}] repeat {repeat + 1}/{args.repeats}: {label}", flush=True)
            run = shared.measure_run(spark, pipeline, source, plan, work, profile)
            rates[label].append(run["records_per_s"])
            durations[label].append(run["durations_ms"])
    pair_ratios = [profiled / unprofiled for profiled, unprofiled in zip(rates["profiled"], rates["unprofiled"])]
    ratio = statistics.median(pair_ratios)
    # Where a difference would sit: Spark's per-phase durations (addBatch holds the job, the tasks'
    # accumulator updates and the foreachBatch write; the others are the driver's bookkeeping).
    phases = sorted(set().union(*(run.keys() for runs in durations.values() for run in runs)))
    phase_ms = {phase: {label: statistics.median(run.get(phase, 0.0) for run in runs)
                        for label, runs in durations.items()} for phase in phases}
    return {"runs_per_s": rates, "pair_ratios": pair_ratios, "profiled_over_unprofiled": ratio,
            "phase_ms_median": phase_ms,
            "pair_ratio_quartiles": statistics.quantiles(pair_ratios, n=4) if len(pair_ratios) >= 2 else None,
            "ratio_of_medians": statistics.median(rates["profiled"]) / statistics.median(rates["unprofiled"]),
            "overhead_pair_ratios": 1 - ratio,
            "overhead": 1 - statistics.median(rates["profiled"]) / statistics.median(rates["unprofiled"])}


def add_batch_ratio(item: dict) -> float | None:
    """Spark's addBatch phase (the job and its tasks), profiled over unprofiled, medians."""
    phase = item.get("phase_ms_median", {}).get("addBatch")
    return phase["profiled"] / phase["unprofiled"] if phase and phase["unprofiled"] else None


def accuracy(spark, source, args, work) -> dict:
    """Profiled cost per operator (median over the runs) against its reference: the operator
    timed alone just before each run (median over the runs), idle and with the other core busy."""
    pipeline = known_cost_pipeline()
    plan = Plan((RegionPlan((pipeline.names,), 1),))
    idle, loaded, summaries = [], [], []
    for repeat in range(args.accuracy_repeats):
        print(f"[known costs] repeat {repeat + 1}/{args.accuracy_repeats}", flush=True)
        idle.append(isolated_costs_us(pipeline))
        loaded.append(isolated_costs_us(pipeline, loaded=True))
        summaries.append(shared.measure_run(spark, pipeline, source, plan, work)["profile"])
    rows = []
    for operator in pipeline.names:
        profiled = statistics.median(summary.operator(operator).cost_us for summary in summaries)
        isolated = statistics.median(costs[operator] for costs in idle)
        isolated_loaded = statistics.median(costs[operator] for costs in loaded)
        spin = operator.startswith("spin")
        rows.append({"operator": operator, "defined_by": "CPU time" if spin else "work",
                     "nominal_us": float(operator.removeprefix("spin" if spin else "busy")),
                     "isolated_us": isolated, "isolated_loaded_us": isolated_loaded, "profiled_us": profiled,
                     "profiled_per_run_us": [summary.operator(operator).cost_us for summary in summaries],
                     "ratio": profiled / isolated, "ratio_loaded": profiled / isolated_loaded})
    spins = [row for row in rows if row["defined_by"] == "CPU time"]
    works = [row for row in rows if row["defined_by"] == "work"]
    return {"operators": rows,
            "worst_deviation_cpu_defined": max(abs(row["ratio"] - 1) for row in spins),
            "worst_deviation_work_idle": max(abs(row["ratio"] - 1) for row in works),
            "worst_deviation_work_loaded": max(abs(row["ratio_loaded"] - 1) for row in works),
            # 1 + the share a busy neighbour core adds to a work-defined operator's CPU time
            "neighbour_slowdown": statistics.median(row["isolated_loaded_us"] / row["isolated_us"] for row in works)}


def report(document: dict, stem: str, plots: bool = False) -> str:
    lines = ["# Profiling overhead and accuracy on Spark", ""]
    lines += ["## Overhead (target: at most 2 %)", "",
              "Runs alternate in adjacent pairs (ABBA) after one discarded warm-up pair; overhead = 1 - the "
              "ratio of the two series' medians (profiled / unprofiled), the figure the target is judged on. "
              "Beside it: 1 - the median of the pairs' profiled / unprofiled ratios (pair ratios listed), and "
              "Spark's addBatch phase profiled / unprofiled (medians; a time, so above 1 is a cost).", "",
              "| workload | profiled rec/s (median) | unprofiled rec/s (median) | ratio of medians | overhead "
              "| pair ratios | overhead by the median pair ratio | addBatch profiled / unprofiled |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, item in document["overhead"].items():
        pairs = ", ".join(f"{value:.3f}" for value in item["pair_ratios"])
        of_medians = statistics.median(item["runs_per_s"]["profiled"]) / statistics.median(
            item["runs_per_s"]["unprofiled"])
        by_pairs = item.get("overhead_pair_ratios", 1 - item["profiled_over_unprofiled"])
        add_batch = add_batch_ratio(item)
        lines.append(f"| {name} | {statistics.median(item['runs_per_s']['profiled']):,.0f} | "
                     f"{statistics.median(item['runs_per_s']['unprofiled']):,.0f} | {of_medians:.3f} | "
                     f"{100 * (1 - of_medians):+.1f} % | {pairs} | {100 * by_pairs:+.1f} % | "
                     f"{'-' if add_batch is None else f'{add_batch:.3f}'} |")
    lines += ["", "Quartiles of the pair ratios (the spread the median sits in): " + "; ".join(
        f"{name} {', '.join(f'{value:.3f}' for value in item['pair_ratio_quartiles'])}"
        for name, item in document["overhead"].items() if item.get("pair_ratio_quartiles")), "",
        "Spark's per-phase durations summed over a run's steady batches (medians over the runs, ms): a "
        "profiling cost would show in `addBatch` (the job, the tasks' accumulator updates, the foreachBatch "
        "write) or in the driver's phases.", "",
        "| workload | phase | profiled ms | unprofiled ms | difference |", "| --- | --- | ---: | ---: | ---: |"]
    for name, item in document["overhead"].items():
        for phase, values in item.get("phase_ms_median", {}).items():
            lines.append(f"| {name} | {phase} | {values['profiled']:.0f} | {values['unprofiled']:.0f} | "
                         f"{values['profiled'] - values['unprofiled']:+.0f} |")
    cpu = document["in_process"]
    lines += ["", "## The profiler's own CPU cost (in one process, thread CPU time)", "",
              f"- fused stage of four cheap maps, 10,000-record batches: "
              f"{cpu['fused_us_per_record']['unprofiled']:.3f} us/record unprofiled, "
              f"{cpu['fused_us_per_record']['profiled']:.3f} profiled ({100 * cpu['fused_overhead']:+.1f} %)",
              f"- stateful update wrapper: {cpu['stateful_wrapper_ns']:.0f} ns per record "
              f"({cpu['stateful_ns_per_record']['unprofiled']:.0f} ns for the bare update; Spark's state handler "
              f"spends microseconds per record around it)"]
    acc = document["accuracy"]
    lines += ["", "## Profiled cost against the cost measured in isolation (target: within 10 %)", "",
              "One fused chain of six operators on Spark, profiled cost = median over the runs. `spin<N>` "
              "spins on its thread's CPU clock for N us (N by construction, plus the call and the record copy); "
              "`busy<N>` does a fixed amount of work (about N us). Reference: the same function timed alone "
              "in this process just before every Spark run, on the idle machine and with a process spinning "
              "on the other core (medians over the runs).", "",
              "| operator | cost defined by | nominal us | reference us/record (idle) | reference, other core busy | "
              "profiled us/record on Spark | ratio to idle | ratio to loaded |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in acc["operators"]:
        lines.append(f"| {row['operator']} | {row['defined_by']} | {row['nominal_us']:g} | {row['isolated_us']:.2f} | "
                     f"{row['isolated_loaded_us']:.2f} | {row['profiled_us']:.2f} | {row['ratio']:.3f} | "
                     f"{row['ratio_loaded']:.3f} |")
    lines += ["", f"Worst deviation from the idle reference: CPU-defined operators "
              f"{100 * acc['worst_deviation_cpu_defined']:.1f} %, work-defined {100 * acc['worst_deviation_work_idle']:.1f} %"
              f" (against the loaded reference: {100 * acc['worst_deviation_work_loaded']:.1f} %). A busy neighbour "
              f"core multiplies a work-defined operator's CPU time by {acc['neighbour_slowdown']:.3f} (median)."]
    if plots:
        lines += ["", f"![overhead]({stem}.png)"]
    return "\n".join(lines) + "\n"


def plot(document: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = list(document["overhead"])
    left.bar(names, [100 * document["overhead"][name]["overhead"] for name in names], color="tab:blue")
    left.axhline(2, color="tab:red", linestyle="--", linewidth=1, label="2 % target")
    left.set_ylabel("throughput lost to profiling (%)")
    left.set_title("Profiling overhead (1 - ratio of medians)")
    left.legend()
    rows = document["accuracy"]["operators"]
    for defined_by, key, colour, label in (("CPU time", "isolated_us", "tab:blue", "spin (known CPU cost)"),
                                           ("work", "isolated_us", "tab:orange", "busy vs idle reference"),
                                           ("work", "isolated_loaded_us", "tab:green", "busy vs loaded reference")):
        chosen = [row for row in rows if row["defined_by"] == defined_by]
        right.scatter([row[key] for row in chosen], [row["profiled_us"] for row in chosen], color=colour, label=label)
    right.legend(fontsize=8)
    top = max(max(row["isolated_us"], row["isolated_loaded_us"], row["profiled_us"]) for row in rows) * 1.2
    right.plot([0, top], [0, top], color="grey", linewidth=1)
    right.fill_between([0, top], [0, top * 0.9], [0, top * 1.1], color="grey", alpha=0.15)
    right.set_xlabel("reference cost (us/record)")
    right.set_ylabel("profiled cost on Spark (us/record)")
    right.set_title("Profiled vs isolated cost (band: +/-10 %)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser, repeats=9, plots=True)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=5, help="input files = micro-batches (the first is warm-up)")
    parser.add_argument("--accuracy-repeats", type=int, default=5, help="Spark runs of the known-cost chain")
    parser.add_argument("--accuracy-records", type=int, default=30_000, help="records of the known-cost chain's input")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    if args.quick:
        args.records, args.files, args.repeats, args.accuracy_repeats, args.accuracy_records = 2000, 3, 3, 2, 2000
    method.check_repeats(args.repeats, args.quick)
    method.check_repeats(args.accuracy_repeats, args.quick)
    run = method.Run("profiling_overhead.py", argv, quick=args.quick, out=args.out, master=args.master)
    shared.LOOPS_PER_US = shared.busy_loops_per_us()
    document = {"master": args.master, "quick": args.quick}
    import fissure
    from fissure.spark.session.create import create_session

    with method.scratch_folder("profiling_overhead.py") as work:
        spark = create_session(fissure.RunnerConfig(master=args.master))
        try:
            document["in_process"] = in_process_cpu_overhead(rounds=9 if args.quick else 41)
            source = shared.synthetic_source(work / "input", args.records, args.files)
            document["overhead"] = {"light": overhead(spark, "light", light_pipeline(), source, args, work),
                                    "mixed": overhead(spark, "mixed", shared.mixed_pipeline(), source, args, work)}
            known_source = shared.synthetic_source(work / "known-input", args.accuracy_records, args.files)
            document["accuracy"] = accuracy(spark, known_source, args, work)
        finally:
            method.end_spark(spark)
    stem = "profiling_overhead_quick" if args.quick else "profiling_overhead"
    run.write_results(stem, report(document, stem, args.plots), document)
    if args.plots:
        plot(document, run.path(f"{stem}.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
