"""Overheads of the processing element's process boundary, measured on this machine.

(a) speedup of a balanced CPU-heavy two-stage chain on one input stream: two processes vs one;
(b) the per-tuple cost δ of a process boundary (the paper's two-run method, eqs. 15-17) for
    records of about 50 B and 2 KB, with 1k and 10k rows per batch;
(c) the fixed cost per call (per micro-batch) of going through the child processes, and the
    cost of starting them (a new cut).

Each configuration warms both up (not counted), then runs one process and two processes in an order
rotated each repeat (at least 3) and keeps the medians (benchmarks/method.py). Results go to
pe_overheads.{md,json} under --out (default benchmarks/results/; --quick: a temporary folder), and
with --plots pe_overheads.png.

    ./dev python benchmarks/pe_overheads.py           # the real measurement (a few minutes)
    ./dev python benchmarks/pe_overheads.py --quick   # end to end in well under a minute
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

import method  # noqa: E402
from fissure.local.calibrate import (  # noqa: E402
                                     BoundaryMeasurement,
                                     CallOverheadMeasurement,
                                     busy_loops_per_us,
                                     measure_boundary,
                                     measure_call_overhead,
                                     )



@dataclass(frozen=True)
class BenchmarkSize:
    speedup_stage_cost_us: float
    speedup_batches: int
    delta_stage_cost_us: float
    delta_batches: int  # per configuration; the steady state leaves out the first output batch
    repeats: int
    calls: int


FULL = BenchmarkSize(
    speedup_stage_cost_us=20.0, speedup_batches=100, delta_stage_cost_us=2.0, delta_batches=60,
    repeats=5, calls=3000,
)
QUICK = BenchmarkSize(
    speedup_stage_cost_us=20.0, speedup_batches=30, delta_stage_cost_us=2.0, delta_batches=20,
    repeats=3, calls=300,
)
DELTA_CONFIGURATIONS = [(50, 1000), (50, 10_000), (2000, 1000), (2000, 10_000)]  # record B, rows
SPEEDUP_CONFIGURATION = (50, 1000)


def machine_description() -> dict:
    cpu_model = "unknown"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_model": cpu_model,
        "python": platform.python_version(),
        "pyarrow": pa.__version__,
        "platform": platform.platform(),
    }


def boundary_row(measurement: BoundaryMeasurement) -> dict:
    calibration = measurement.calibration
    return {
        "record_bytes": measurement.record_bytes,
        "batch_rows": measurement.batch_rows,
        "total_rows": measurement.total_rows,
        "single_process_rates_per_s": measurement.single_process_rates_per_s,
        "two_process_rates_per_s": measurement.two_process_rates_per_s,
        "single_process_cpu_us_per_row": measurement.single_process_cpu_us_per_row,
        "two_process_cpu_us_per_row": measurement.two_process_cpu_us_per_row,
        "boundary_cpu_us": measurement.boundary_cpu_us,
        "stage_cost_us": calibration.stage_cost_us,
        "boundary_overhead_us": calibration.boundary_overhead_us,
        "speedup": calibration.speedup,
    }


def call_row(measurement: CallOverheadMeasurement) -> dict:
    return {
        "batch_rows": measurement.batch_rows,
        "in_caller_call_median_us": 1e6 * statistics.median(measurement.in_caller_call_s),
        "pipelined_call_median_us": 1e6 * statistics.median(measurement.pipelined_call_s),
        "per_call_overhead_us": measurement.per_call_overhead_us,
        "empty_call_overhead_us": measurement.empty_call_overhead_us,
        "start_median_ms": 1e3 * statistics.median(measurement.start_s),
        "start_ms": [1e3 * value for value in measurement.start_s],
    }


def run(size: BenchmarkSize) -> dict:
    loops_per_us = busy_loops_per_us()
    record_bytes, batch_rows = SPEEDUP_CONFIGURATION
    print(f"(a) speedup: stage cost {size.speedup_stage_cost_us} us/row ...", file=sys.stderr)
    speedup = measure_boundary(
        record_bytes, batch_rows, size.speedup_stage_cost_us, size.speedup_batches * batch_rows,
        size.repeats, loops_per_us,
    )
    deltas = []
    for record_bytes, batch_rows in DELTA_CONFIGURATIONS:
        print(f"(b) delta: {record_bytes} B records, {batch_rows} rows/batch ...", file=sys.stderr)
        deltas.append(
            measure_boundary(
                record_bytes, batch_rows, size.delta_stage_cost_us, size.delta_batches * batch_rows,
                size.repeats, loops_per_us,
            )
        )
    print("(c) fixed cost per call ...", file=sys.stderr)
    calls = measure_call_overhead(size.calls)
    return {
        "busy_loops_per_us": loops_per_us,
        "speedup": boundary_row(speedup),
        "boundary_overhead": [boundary_row(measurement) for measurement in deltas],
        "call_overhead": call_row(calls),
    }


def markdown_report(report: dict) -> str:
    machine, results = report["machine"], report["results"]
    speedup = results["speedup"]
    lines = [
        "# Processing element overheads",
        "",
        f"CPU: {machine['nproc']} cores, {machine['cpu_model']}, Python {machine['python']}, "
        f"pyarrow {machine['pyarrow']}  ",
        f"Size: {report['size_name']} ({report['size']['repeats']} repeats, the order rotated each repeat, "
        "after an uncounted warm-up; medians)",
        "",
        "Throughputs are steady-state rates (from the first output batch to the last).",
        "",
    ]
    # Whether other work shared the machine is the method's verdict in the header (others' CPU);
    # the load average counts this benchmark's own two processes.
    lines += [
        "## (a) Balanced CPU-heavy two-stage chain, one input stream",
        "",
        f"Two busy stages of {speedup['stage_cost_us']:.1f} us/row (measured c), "
        f"{speedup['record_bytes']} B records, {speedup['batch_rows']} rows per batch, "
        f"{speedup['total_rows']} rows per run.",
        "",
        "| one process (rows/s) | two processes (rows/s) | speedup | delta (us/row) |",
        "| --- | --- | --- | --- |",
        f"| {statistics.median(speedup['single_process_rates_per_s']):,.0f} "
        f"| {statistics.median(speedup['two_process_rates_per_s']):,.0f} "
        f"| {speedup['speedup']:.2f}x | {speedup['boundary_overhead_us']:.2f} |",
        "",
        "## (b) Per-tuple cost of a process boundary (eqs. 15-17)",
        "",
        "delta = 1/T_p - 1/(2 T_s); two busy stages of cost c each, T_s in one process, T_p in two.",
        "The last column is the CPU time (all processes) the boundary adds per row, both sides",
        "together (about 2 delta when sender and receiver pay alike); waiting for a core does not",
        "count in it, so a busy machine disturbs it less than the rates.",
        "",
        "| record | rows/batch | c (us/row) | T_s (rows/s) | T_p (rows/s) | speedup | delta (us/row) "
        "| boundary CPU (us/row) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in results["boundary_overhead"]:
        lines.append(
            f"| {row['record_bytes']} B | {row['batch_rows']:,} | {row['stage_cost_us']:.2f} "
            f"| {statistics.median(row['single_process_rates_per_s']):,.0f} "
            f"| {statistics.median(row['two_process_rates_per_s']):,.0f} "
            f"| {row['speedup']:.2f}x | {row['boundary_overhead_us']:.2f} | {row['boundary_cpu_us']:.2f} |"
        )
    calls = results["call_overhead"]
    lines += [
        "",
        "## (c) Fixed costs",
        "",
        "| what | cost |",
        "| --- | --- |",
        f"| a call with one {calls['batch_rows']}-row batch, all stages in the caller (median) "
        f"| {calls['in_caller_call_median_us']:.0f} us |",
        f"| the same call through one child process (median) | {calls['pipelined_call_median_us']:.0f} us |",
        f"| fixed cost per call of the process boundary | {calls['per_call_overhead_us']:.0f} us |",
        f"| fixed cost of a call without input | {calls['empty_call_overhead_us']:.0f} us |",
        f"| starting and stopping a two-pipeline PE (fork, a new cut; median) "
        f"| {calls['start_median_ms']:.1f} ms |",
        "",
    ]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]["boundary_overhead"]
    labels = [f"{row['record_bytes']} B\n{row['batch_rows']:,} rows" for row in rows]
    figure, (delta_axis, speedup_axis) = plt.subplots(1, 2, figsize=(11, 4.5))
    positions = range(len(rows))
    delta_axis.bar(
        [p - 0.2 for p in positions], [row["boundary_overhead_us"] for row in rows], width=0.4,
        color="tab:blue", label="delta, eq. 17 (wall clock)",
    )
    delta_axis.bar(
        [p + 0.2 for p in positions], [row["boundary_cpu_us"] / 2 for row in rows], width=0.4,
        color="tab:orange", label="boundary CPU / 2",
    )
    delta_axis.set_xticks(list(positions), labels, fontsize=8)
    delta_axis.set_ylabel("us per tuple")
    delta_axis.set_title("Process boundary cost (two-run method)")
    delta_axis.legend(fontsize=8)
    speedups = [report["results"]["speedup"]] + rows
    speedup_labels = ["CPU-heavy\nc=%.0f us" % speedups[0]["stage_cost_us"]] + labels
    speedup_axis.bar(speedup_labels, [row["speedup"] for row in speedups], color="tab:green")
    speedup_axis.tick_params(axis="x", labelsize=8)
    speedup_axis.axhline(2.0, color="grey", linestyle="--", linewidth=1)
    speedup_axis.set_ylabel("T_p / T_s")
    speedup_axis.set_title("Two processes vs one")
    figure.suptitle(f"{report['machine']['nproc']} cores ({report['size_name']})")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser, repeats=None, plots=True)
    args = parser.parse_args(argv)
    size, size_name = (QUICK, "quick") if args.quick else (FULL, "full")
    method.check_repeats(size.repeats, args.quick)
    run_record = method.Run("pe_overheads.py", argv, quick=args.quick, out=args.out, master=None)
    started_s = time.monotonic()
    results = run(size)
    report = {
        "machine": machine_description(),
        "load_before": run_record.load_before,
        "load_after": method.load(),
        "duration_s": round(time.monotonic() - started_s, 1),
        "size_name": size_name,
        "size": asdict(size),
        "results": results,
    }
    run_record.write_results("pe_overheads", markdown_report(report), report)
    if args.plots:
        plot(report, run_record.path("pe_overheads.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
