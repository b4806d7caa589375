"""Model-based experiments of the pipelined fission paper (Section 5.2), reproduced and extended.

Random chains drawn with the paper's Table 1 parameters (seeded), planned by every method, each
plan scored by the throughput model. Writes under benchmarks/results/:
  planner_model.md    summary: heuristic vs optimal (mean, 5th percentile, worst), sweeps, timings
  planner_model.json  every figure behind it
  planner_model.png   with --plots only: a panel per sweep, the running times and the
                      heuristic/optimal ratios

    ./dev python benchmarks/planner_model.py            # full run (several minutes)
    ./dev python benchmarks/planner_model.py --quick    # a smoke run (a temporary folder unless --out)

Quality figures are model values (no timing); the planning times are medians of at least 3 timed
calls after one uncounted call (benchmarks/method.py), and are machine-dependent: the results
header (benchmarks/method.py) says whether the machine was busy.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import method as bench  # noqa: E402

from fissure.model.types import Kind, Machine, OperatorStats  # noqa: E402
from fissure.plan import plan_chain  # noqa: E402
from fissure.plan.chain import ChainModel  # noqa: E402
from fissure.plan.exhaustive import SearchSpace, count_configurations  # noqa: E402
METHODS = ("optimal", "heuristic", "paper-heuristic", "fission-only", "pipelining-only", "sequential")
KEY_FIELDS = ("k1", "k2")


@dataclass(frozen=True)
class Workload:
    """Table 1 of the paper: defaults, each sweep varies one field."""

    cost_mean: float = 200.0
    cost_stddev: float = 100.0
    operators: int = 8
    cores: int = 4
    selectivity_mean: float = 0.8
    selectivity_stddev: float = 0.4
    stateless_fraction: float = 0.4
    partitioned_fraction: float = 0.2  # the rest is stateful (0.4 by default)
    thread_switch_overhead: float = 1.0
    replication_cost: float = 50.0


SWEEPS = {
    "selectivity_mean": [0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 1.0],
    "cost_mean": [50, 100, 150, 200, 250],
    "stateless_fraction": [0.0, 0.2, 0.4, 0.6, 0.8],
    "replication_cost": [10, 50, 100, 150, 190],
    "thread_switch_overhead": [10, 60, 110, 160, 210],
    "cores": [1, 2, 4, 6, 8, 10, 12],
    "operators": [1, 2, 3, 4, 5, 6, 7, 8],
}


def random_chain(workload: Workload, rng: random.Random) -> list[OperatorStats]:
    operators = []
    for index in range(workload.operators):
        draw = rng.random()
        if draw < workload.stateless_fraction:
            kind, key = Kind.STATELESS, None
        elif draw < workload.stateless_fraction + workload.partitioned_fraction:
            kind, key = Kind.PARTITIONED, (rng.choice(KEY_FIELDS),)
        else:
            kind, key = Kind.STATEFUL, None
        cost = max(1.0, rng.gauss(workload.cost_mean, workload.cost_stddev))
        selectivity = min(1.0, max(0.01, rng.gauss(workload.selectivity_mean, workload.selectivity_stddev)))
        operators.append(OperatorStats(f"o{index + 1}", kind, cost, selectivity, key))
    return operators


def machine_of(workload: Workload) -> Machine:
    return Machine(workload.cores, workload.thread_switch_overhead, workload.replication_cost)


def run_point(workload: Workload, instances: int, seed: int) -> dict:
    rng = random.Random(seed)
    throughput = {method: [] for method in METHODS}
    ratio_heuristic, ratio_paper = [], []
    for _ in range(instances):
        operators = random_chain(workload, rng)
        machine = machine_of(workload)
        values = {method: plan_chain(operators, machine, method).evaluation.throughput_per_s for method in METHODS}
        for method in METHODS:
            throughput[method].append(values[method])
        ratio_heuristic.append(values["heuristic"] / values["optimal"])
        ratio_paper.append(values["paper-heuristic"] / values["optimal"])
    return {
        "mean_throughput_per_s": {method: statistics.fmean(values) for method, values in throughput.items()},
        "heuristic_over_optimal": ratio_heuristic,
        "paper_heuristic_over_optimal": ratio_paper,
    }


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def ratio_summary(ratios: list[float]) -> dict:
    return {
        "mean": statistics.fmean(ratios),
        "p5": percentile(ratios, 0.05),
        "worst": min(ratios),
        "instances": len(ratios),
    }


def time_method(operators, machine, planner: str, repeats: int) -> float:
    """Median planning time in ms over `repeats` calls after one uncounted call (each call builds
    its model anew)."""
    plan_chain(operators, machine, planner)  # warm-up: not counted
    return bench.median(plan_chain(operators, machine, planner).solve_ms for _ in range(repeats))


def running_times(quick: bool) -> dict:
    rng = random.Random(99)
    sizes = [2, 3, 4, 5, 6, 7, 8] if not quick else [2, 4, 6]
    table = []
    for size in sizes:  # the paper's Fig. 12: operators = cores
        workload = replace(Workload(), operators=size, cores=size)
        operators = random_chain(workload, rng)
        machine = machine_of(workload)
        table.append(
            {
                "operators": size,
                "cores": size,
                "configurations": count_configurations(size, SearchSpace(2 * size), ChainModel(operators, machine).replicable),
                "heuristic_ms": time_method(operators, machine, "heuristic", 5),
                "optimal_ms": time_method(operators, machine, "optimal", bench.MIN_REPEATS),
            }
        )
    targets = []
    for size, cores, limit_ms in [(8, 12, 5.0), (100, 64, 50.0)]:
        workload = replace(Workload(), operators=size, cores=cores)
        samples = []
        for _ in range(5 if quick else 30):
            operators = random_chain(workload, rng)
            samples.append(time_method(operators, machine_of(workload), "heuristic", 3))
        targets.append(
            {
                "operators": size,
                "cores": cores,
                "target_ms": limit_ms,
                "median_ms": statistics.median(samples),
                "p95_ms": percentile(samples, 0.95),
                "max_ms": max(samples),
                "instances": len(samples),
            }
        )
    return {"by_size": table, "targets": targets}


def plot(results: dict, path: Path) -> str:
    """One figure: a panel per sweep, the running times and the heuristic/optimal ratios."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 3
    rows = (len(results["sweeps"]) + 2 + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 3.8 * rows), squeeze=False)
    cells = iter(axes.flat)
    for name, points in results["sweeps"].items():
        axis = next(cells)
        xs = [point["value"] for point in points]
        for method in METHODS:
            axis.plot(xs, [p["mean_throughput_per_s"][method] for p in points], marker="o", label=method)
        axis.set_xlabel(name.replace("_", " "))
        axis.set_ylabel("mean throughput (tuples/s, model)")
        axis.set_title(f"impact of {name.replace('_', ' ')}")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    times = results["running_times"]["by_size"]
    axis = next(cells)
    axis.semilogy([t["operators"] for t in times], [t["optimal_ms"] for t in times], marker="o", label="optimal (exact search)")
    axis.semilogy([t["operators"] for t in times], [t["heuristic_ms"] for t in times], marker="o", label="heuristic")
    axis.set_xlabel("operators = cores")
    axis.set_ylabel("planning time (ms, median)")
    axis.grid(alpha=0.3)
    axis.legend()
    axis = next(cells)
    ratios = results["default_point"]
    axis.hist([ratios["heuristic_over_optimal"], ratios["paper_heuristic_over_optimal"]], bins=30, label=["fissure heuristic", "Algorithms 1-4 as written"])
    axis.set_xlabel("throughput / exhaustive optimum (model)")
    axis.set_ylabel("instances")
    axis.legend()
    for axis in cells:
        axis.set_visible(False)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path.name


def markdown(results: dict) -> str:
    default = results["default_summary"]
    overall = results["overall_summary"]
    lines = [
        "# Planner quality and speed on the model (pipelined fission paper, Section 5.2)",
        "",
        (f"- quality figures from the run of {results['quality_from']}; planning times from this run"
         if "quality_from" in results else "- quality figures and planning times from this run"),
        f"- instances: {results['instances_per_point']} seeded random chains per point (Table 1 parameters; "
        "selectivity drawn from a normal clipped to [0.01, 1], cost from a normal clipped to >= 1 us, "
        f"partitioned operators keyed on one of {len(KEY_FIELDS)} fields); M = 2 C threads",
        "",
        "## Heuristic against the exhaustive optimum",
        "",
        "| set | planner | mean | 5th percentile | worst | instances |",
        "|---|---|---|---|---|---|",
    ]
    for label, summary in (("Table 1 defaults", default), ("all sweep points", overall)):
        for planner in ("heuristic", "paper_heuristic"):
            s = summary[planner]
            name = "fissure heuristic" if planner == "heuristic" else "Algorithms 1-4 as written"
            lines.append(f"| {label} | {name} | {s['mean']:.4f} | {s['p5']:.4f} | {s['worst']:.4f} | {s['instances']} |")
    lines += ["", "## Sweeps (mean model throughput, tuples/s)", ""]
    for name, points in results["sweeps"].items():
        lines.append(f"### {name}")
        lines.append("")
        lines.append("| " + name + " | " + " | ".join(METHODS) + " | heuristic/optimal mean | worst |")
        lines.append("|" + "---|" * (len(METHODS) + 3))
        for point in points:
            ratios = point["heuristic_over_optimal"]
            cells = " | ".join(f"{point['mean_throughput_per_s'][m]:,.0f}" for m in METHODS)
            lines.append(f"| {point['value']} | {cells} | {statistics.fmean(ratios):.4f} | {min(ratios):.4f} |")
        lines.append("")
    lines += ["## Planning time", "", "| operators = cores | configurations (M = 2C) | heuristic ms | exhaustive ms |", "|---|---|---|---|"]
    for row in results["running_times"]["by_size"]:
        lines.append(f"| {row['operators']} | {row['configurations']:,} | {row['heuristic_ms']:.2f} | {row['optimal_ms']:.2f} |")
    lines += ["", "| heuristic on | target | median ms | 95th percentile ms | max ms | instances |", "|---|---|---|---|---|---|"]
    for row in results["running_times"]["targets"]:
        lines.append(
            f"| {row['operators']} operators, {row['cores']} cores | < {row['target_ms']:.0f} ms | "
            f"{row['median_ms']:.2f} | {row['p95_ms']:.2f} | {row['max_ms']:.2f} | {row['instances']} |"
        )
    if results.get("plot"):
        lines.append(f"\n![sweeps, planning time, ratios]({results['plot']})\n")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_arguments(parser, repeats=None, plots=True)
    parser.add_argument("--instances", type=int, help="random chains per sweep point (default 200, quick 5)")
    parser.add_argument("--default-instances", type=int, help="chains at the Table 1 defaults (default 1000)")
    parser.add_argument(
        "--timing-from", metavar="JSON",
        help="reuse the quality figures of an earlier run's JSON and only time the planners again "
        "(quality does not depend on the machine's load; timing does)",
    )
    args = parser.parse_args(argv)
    run = bench.Run("planner_model.py", argv, quick=args.quick, out=args.out, master=None)
    instances = args.instances or (5 if args.quick else 200)
    default_instances = args.default_instances or (20 if args.quick else 1000)
    started = time.monotonic()
    results = {
        "date": run.date,
        "revision": run.revision,
        "instances_per_point": instances,
        "workload_defaults": Workload().__dict__,
        "sweeps": {},
    }
    if args.timing_from:
        earlier = json.loads(Path(args.timing_from).read_text())
        for key in ("instances_per_point", "sweeps", "default_point", "default_summary", "overall_summary"):
            results[key] = earlier[key]
        results["quality_from"] = f"{earlier['date']}, revision {earlier['revision']}"
    else:
        quality(results, instances, default_instances, started)
    print(f"[{time.monotonic() - started:6.1f} s] timing the planners", file=sys.stderr)
    results["running_times"] = running_times(args.quick)
    suffix = "_quick" if args.quick else ""
    stem = f"planner_model{suffix}"
    if args.plots:
        results["plot"] = plot(results, run.path(f"{stem}.png"))
    written = run.write_results(stem, markdown(results), results)
    print(f"wrote {written} and .json{' and ' + results['plot'] if args.plots else ''} in "
          f"{time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


def quality(results: dict, instances: int, default_instances: int, started: float) -> None:
    """Every method on every sweep point and at the defaults: the ratios to the optimum."""
    all_heuristic, all_paper = [], []
    for seed, (name, values) in enumerate(SWEEPS.items()):
        points = []
        for value in values:
            workload = replace(Workload(), **{name: value})
            if name == "stateless_fraction":  # the paper keeps the partitioned share at 0.2
                workload = replace(workload, partitioned_fraction=min(0.2, 1 - value))
            point = run_point(workload, instances, seed=1000 * seed + int(value * 100))
            point["value"] = value
            points.append(point)
            all_heuristic += point["heuristic_over_optimal"]
            all_paper += point["paper_heuristic_over_optimal"]
            print(f"[{time.monotonic() - started:6.1f} s] {name} = {value}: heuristic/optimal "
                  f"mean {statistics.fmean(point['heuristic_over_optimal']):.4f}", file=sys.stderr)
        results["sweeps"][name] = points
    default_point = run_point(Workload(), default_instances, seed=7)
    results["default_point"] = default_point
    results["default_summary"] = {
        "heuristic": ratio_summary(default_point["heuristic_over_optimal"]),
        "paper_heuristic": ratio_summary(default_point["paper_heuristic_over_optimal"]),
    }
    results["overall_summary"] = {
        "heuristic": ratio_summary(all_heuristic + default_point["heuristic_over_optimal"]),
        "paper_heuristic": ratio_summary(all_paper + default_point["paper_heuristic_over_optimal"]),
    }


if __name__ == "__main__":
    raise SystemExit(main())
