"""`fissure calibrate`: measure this Spark deployment's overheads, fit both models' constants, store them.

    fissure calibrate                      # about three minutes on local[*]; stores the result
    fissure calibrate --quick --dry-run    # a smaller run that stores nothing
    fissure calibrate --master spark://host:7077 --output cluster.json

What it measures (docs/profiling.md has the details):
- delta, the per-record cost of a PE process boundary, with the paper's two-run method
  (eqs. 15-17) for small (50 B) and large (2 KB) records, in processing elements on this machine;
- short Spark streaming queries of synthetic operators (per-record and per-batch identity
  operators, an exchange into replicas, a keyed stateful operator at few and many keys in one and
  two state partitions, a busy keyed operator and a busy map after it in one and two partitions,
  a keyed then an unkeyed stateful operator, sequential and with the keyed one in two partitions,
  a busy operator with one and two replicas), each micro-batch's time and the time of each of its
  Spark stages (Spark's monitoring REST API: this command's session runs the Spark UI on a free
  port), and the operators' costs from the live profile;
- the Spark model's constants by non-negative least squares over those stages and micro-batches,
  with the residual of every batch, and the paper's c_p from the busy operator's marginal rates
  (eq. 19).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from fissure.cli import UsageError

# Constants the Spark runs can tell apart; the rest keep their values (task_fixed_s is confounded
# with stage_fixed_s; boundary_record_us comes from the two-run method).
FITTED = ("batch_fixed_s", "state_operator_batch_s", "stage_fixed_s", "python_node_fixed_s", "state_partition_fixed_s",
          "state_partition_jvm_s", "io_record_us", "python_record_us", "conversion_record_us", "exchange_record_us",
          "state_record_us", "state_key_us", "state_group_us")
# Multiplications per record of the busy operator (about 50-80 us): enough that its batches are
# mostly its work, so that its one and two replicas tell what two busy tasks really get.
BUSY_LOOPS = 1600


def register(subparsers) -> None:
    parser = subparsers.add_parser("calibrate", help="measure the Spark deployment's overheads for the planner",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--master", default="local[*]", help="Spark master URL (default: local[*])")
    parser.add_argument("--quick", action="store_true", help="smaller batches and fewer repeats (under a minute)")
    parser.add_argument("--output", help="where to store the result (default: $FISSURE_CALIBRATION or "
                                         "~/.config/fissure/calibration.json)")
    parser.add_argument("--dry-run", action="store_true", help="measure and print, store nothing")
    parser.add_argument("--json", action="store_true", help="print the stored document as JSON")
    parser.set_defaults(handler=handle)


# -- the synthetic operators (module level: Spark's workers import them by reference) --------------


def identity(record):
    return record


def identity_batch(batch):
    return batch


def busy(record):
    value = record["x"]
    for _ in range(BUSY_LOOPS):
        value = (value * 1.0000001) % 1000.0
    return {**record, "x": value}


def count_per_key(state, record):
    state["n"] = state.get("n", 0) + 1
    return record


def busy_count_per_key(state, record):
    state["n"] = state.get("n", 0) + 1
    return busy(record)


RECORD = {"k": str, "x": float, "pad": str}


@dataclass(frozen=True)
class Experiment:
    label: str
    build: object  # () -> (Pipeline, Plan)
    keyed: bool = False
    keys: tuple[int, int] | None = None  # keyed: key groups in the small and large batches (None: 10 and half)


def _experiments():
    from fissure import Pipeline
    from fissure.model.types import Plan, RegionPlan

    def single(name, pipeline):
        return pipeline, Plan((RegionPlan(((name,),), 1),))

    return [
        Experiment("python-records", lambda: single("a", Pipeline("records").map("a", identity))),
        Experiment("python-batches", lambda: single("a", Pipeline("batches").map_batches("a", identity_batch))),
        # Two Python nodes in one Spark stage (two regions, no exchange between them): against
        # python-records, what one more node costs, apart from the batch's and the stage's own
        # costs (plans that cut a stage's operators into regions have such stages). On these
        # records one more node measured 30-57 ms at 3,000 records a batch and 60-160 ms at 15,000
        # (three calibrations); in the model-accuracy benchmark, LogWatch's extra node 33-71 ms at
        # 15,000 lines and the mixed chain's -36 to +72 ms at 10,000 records, which the default
        # constants price at 165 and 131 ms: a record's conversion depends on its fields.
        Experiment("two-nodes", lambda: (Pipeline("twonodes").map("a", identity).map("b", identity),
                                         Plan((RegionPlan((("a",),), 1), RegionPlan((("b",),), 1))))),
        Experiment("exchange", lambda: (Pipeline("exchange").map_batches("a", identity_batch)
                                        .map_batches("b", identity_batch),
                                        Plan((RegionPlan((("a",),), 1), RegionPlan((("b",),), 2))))),
        Experiment("state", lambda: single("s", Pipeline("state").partitioned("s", count_per_key, key="k")), True),
        # The keyed stage in two state partitions: what replicating a keyed region costs and saves.
        Experiment("state-x2", lambda: (Pipeline("state2").partitioned("s", count_per_key, key="k"),
                                        Plan((RegionPlan((("s",),), 2),))), True),
        # A keyed stage with real Python work and a PE after it, in one and two partitions: what two
        # such tasks side by side cost each other (the trivial operator above hardly works).
        Experiment("busy-state", lambda: (Pipeline("busystate").partitioned("s", busy_count_per_key, key="k")
                                          .map("after", busy), Plan((RegionPlan((("s", "after"),), 1),))),
                   True, (32, 32)),
        Experiment("busy-state-x2", lambda: (Pipeline("busystate2").partitioned("s", busy_count_per_key, key="k")
                                             .map("after", busy), Plan((RegionPlan((("s", "after"),), 2),))),
                   True, (32, 32)),
        # A keyed stage, then an unkeyed stateful one, sequential and with the keyed stage in two
        # partitions: the unkeyed stage then runs one full task beside an empty one.
        Experiment("state-global", lambda: (Pipeline("stateglobal").partitioned("s", count_per_key, key="k")
                                            .stateful("g", count_per_key),
                                            Plan((RegionPlan((("s", "g"),), 1),))), True),
        Experiment("state-global-x2", lambda: (Pipeline("stateglobal2").partitioned("s", count_per_key, key="k")
                                               .stateful("g", count_per_key),
                                               Plan((RegionPlan((("s",),), 2), RegionPlan((("g",),), 1)))), True),
        Experiment("busy-x1", lambda: single("busy", Pipeline("busy1").map("busy", busy))),
        Experiment("busy-x2", lambda: (Pipeline("busy2").map("busy", busy),
                                       Plan((RegionPlan((("busy",),), 2),)))),
    ]


def _files(directory: Path, sizes: list[tuple[int, int]]):
    """One JSON-lines file per batch: (records, distinct keys) each."""
    from fissure.testing import record_files

    directory.mkdir(parents=True, exist_ok=True)
    source = None
    for number, (count, keys) in enumerate(sizes):
        rows = [{"k": f"k{i % keys}", "x": float(i % 997), "pad": "p" * 40} for i in range(count)]
        source = record_files(directory, rows, RECORD, max_files_per_trigger=1, first_file=number)
    return source


def _measure_experiment(spark, stage_log, experiment: Experiment, sizes, work: Path, cores: int):
    """The observed batches of one experiment (its first batch, the warm-up, left out), each with
    its Spark stages' times."""
    import fissure
    from fissure.model.calibration import BatchObservation
    from fissure.model.spark_model import SparkWorkload

    pipeline, plan = experiment.build()
    source = _files(work / experiment.label, sizes)
    runner = fissure.Runner(pipeline, source, fissure.NoopSink(), plan=plan,
                            config=fissure.RunnerConfig(spark=spark, progress="off"))
    runner.start(available_now=True)
    try:
        runner.await_termination()
    finally:
        report = runner.stop()
    stages = {}
    if stage_log is not None:
        try:
            stages = stage_log.batches(str(runner.query.runId))
        except RuntimeError as error:  # the fit falls back to this experiment's batch times
            print(f"warning: {experiment.label}: no stage times ({error}); fitting its batch times only",
                  file=sys.stderr)
    summary = report.profile
    operators = []
    for stats in pipeline.operator_stats(summary.estimates() if summary is not None else None):
        operators.append(replace(stats, selectivity=1.0))
    observations = []
    for batch in runner.batch_profiles:
        if batch.batch_id == 0 or not batch.duration_s or not batch.source_records:
            continue
        records, keys = sizes[batch.batch_id] if batch.batch_id < len(sizes) else (batch.source_records, 1)
        workload = SparkWorkload(batch_records=batch.source_records,
                                 keys_per_batch={"s": float(keys)} if experiment.keyed else {})
        measured = stages.get(batch.batch_id)
        observations.append(BatchObservation(experiment.label, tuple(operators), plan, cores, workload,
                                             batch.duration_s, measured.stage_s if measured else None))
    return observations


def _marginal_rate(observations) -> float | None:
    """Records per second of batch time that grows with the records: 1 / slope of time over records."""
    points = sorted((item.workload.batch_records, item.measured_s) for item in observations)
    small = [time_s for records, time_s in points if records == points[0][0]]
    large = [time_s for records, time_s in points if records == points[-1][0]]
    if points[0][0] == points[-1][0]:
        return None
    slope = (statistics.median(large) - statistics.median(small)) / (points[-1][0] - points[0][0])
    return 1.0 / slope if slope > 0 else None


def measure(master: str, quick: bool, out=sys.stdout) -> dict:
    """Run every measurement; returns the Calibration and the figures to print."""
    from fissure.model.calibration import Calibration, fit_spark_constants, replication_cost_us
    from fissure.model.spark_model import SparkConstants
    from fissure.config import RunnerConfig
    from fissure.spark.session.create import create_session, default_parallelism
    from fissure.spark.session.stage_log import STAGE_LOG_CONF, StageLog
    from fissure.local.calibrate import measure_boundary

    small, large = (1000, 4000) if quick else (3000, 15000)
    rows = 20_000 if quick else 100_000
    print("delta (PE process boundary, two-run method, eqs. 15-17):", file=out)
    boundaries = {}
    for record_bytes in (50, 2048):
        measured = measure_boundary(record_bytes=record_bytes, batch_rows=1000, stage_cost_us=5.0,
                                    total_rows=rows, repeats=3)
        cpu_per_side = measured.boundary_cpu_us / 2
        boundaries[record_bytes] = {"eq17_us": measured.calibration.boundary_overhead_us,
                                    "cpu_per_side_us": cpu_per_side,
                                    "speedup": measured.calibration.speedup}
        print(f"  {record_bytes:>5} B records: eq. 17 delta {measured.calibration.boundary_overhead_us:.2f} us, "
              f"boundary CPU per side {cpu_per_side:.2f} us, two-process speedup {measured.calibration.speedup:.2f}x",
              file=out)
    delta_small = _delta(boundaries[50])
    spark = create_session(RunnerConfig(master=master, spark_conf=STAGE_LOG_CONF))
    try:
        stage_log = StageLog(spark)
    except RuntimeError as error:  # a deployment that keeps the UI off: batch totals only
        print(f"warning: {error}; fitting batch times only", file=sys.stderr)
        stage_log = None
    cores = default_parallelism(spark)
    work = Path(tempfile.mkdtemp(prefix="fissure-calibrate-"))
    observations = {}
    try:
        # The session's first queries run slower (the JVM compiles, the Python workers start): one
        # discarded run of the first experiment, so that the fit sees a warm deployment, as a
        # long-running stream is. Without it the first experiment's batches measured 13-37 % above
        # the fit in every batch.
        experiments = _experiments()
        print(f"spark: warm-up ({experiments[0].label}, not counted)", file=out, flush=True)
        _measure_experiment(spark, stage_log, experiments[0], [(small, 1)] * 4, work / "warm-up", cores)
        for experiment in experiments:
            keys_small, keys_large = (experiment.keys or (10, small // 2)) if experiment.keyed else (1, 1)
            sizes = [(small, keys_small), (small, keys_small), (large, keys_small), (small, keys_large),
                     (large, keys_large)]
            if not quick:
                sizes += sizes[1:] * 2  # three rounds: the fit separates per-partition from per-record costs
            print(f"spark: {experiment.label} ({len(sizes)} batches)", file=out, flush=True)
            observations[experiment.label] = _measure_experiment(spark, stage_log, experiment, sizes, work, cores)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    every = [item for items in observations.values() for item in items]
    fit = fit_spark_constants(every, SparkConstants(boundary_record_us=delta_small), FITTED)
    rates = {label: _marginal_rate(observations[label]) for label in ("busy-x1", "busy-x2")}
    c_p = None
    if rates["busy-x1"] and rates["busy-x2"]:
        c_p = replication_cost_us(1, rates["busy-x1"], 2, rates["busy-x2"])
    calibration = Calibration(
        spark=fit.constants, thread_switch_overhead_us=delta_small,
        thread_switch_overhead_large_us=_delta(boundaries[2048]), replication_cost_us=c_p,
        batch_records=large, cores=cores, master=master,
        measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        fit={"r_squared": fit.r_squared, "median_abs_relative_error": fit.median_abs_relative_error,
             "fitted": list(fit.fitted), "notes": list(fit.notes), "boundaries": boundaries,
             "marginal_rates_per_s": rates,
             "residuals": [{"label": item.label, "batch_records": item.batch_records, "measured_s": item.measured_s,
                            "predicted_s": item.predicted_s, "stage_measured_s": item.stage_measured_s,
                            "stage_predicted_s": item.stage_predicted_s} for item in fit.residuals]})
    return {"calibration": calibration, "fit": fit}


def _delta(boundary: dict) -> float:
    """delta for the model: the boundary's CPU cost per side when measurable (it does not need two
    idle cores, as the rates of eq. 17 do), else eq. 17's value; never below 0."""
    value = boundary["cpu_per_side_us"]
    if value != value or value <= 0:
        value = boundary["eq17_us"]
    return max(0.0, value)


def report_text(calibration, fit) -> str:
    lines = ["", f"Spark model constants (fit over {len(fit.residuals)} micro-batches, R^2 {fit.r_squared:.3f}, "
                 f"median |error| {100 * fit.median_abs_relative_error:.1f}%):"]
    for name, value in calibration.spark.to_dict().items():
        lines.append(f"  {name:<26} {value:10.4g}{'' if name in fit.fitted else '   (not fitted)'}")
    lines.append("residuals (measured -> predicted batch time):")
    for item in fit.residuals:
        lines.append(f"  {item.label:<16} {item.batch_records:>7,} records  {item.measured_s:7.3f} s -> "
                     f"{item.predicted_s:7.3f} s  ({100 * item.relative_error:+.1f}%)")
    lines += stage_report_lines(fit.residuals)
    for note in fit.notes:
        lines.append(f"  note: {note}")
    c_p = "-" if calibration.replication_cost_us is None else f"{calibration.replication_cost_us:.3f} us"
    lines.append(f"paper model: delta {calibration.thread_switch_overhead_us:.3f} us (small records), "
                 f"{calibration.thread_switch_overhead_large_us:.3f} us (2 KB); c_p (eq. 19 on Spark) {c_p}")
    return "\n".join(lines)


def stage_report_lines(residuals) -> list[str]:
    """Per experiment and batch size, each Spark stage's median measured -> predicted time."""
    groups: dict[tuple[str, int], list] = {}
    for item in residuals:
        if item.stage_errors_s is not None:
            groups.setdefault((item.label, item.batch_records), []).append(item)
    if not groups:
        return []
    lines = ["stages (median measured -> predicted ms, in job order; the rest of the batch last):"]
    for (label, records), items in groups.items():
        stages = [f"{1e3 * statistics.median(item.stage_measured_s[k] for item in items):.0f} -> "
                  f"{1e3 * statistics.median(item.stage_predicted_s[k] for item in items):.0f}"
                  for k in range(len(items[0].stage_measured_s))]
        rest = (f"{1e3 * statistics.median(item.measured_s - sum(item.stage_measured_s) for item in items):.0f} -> "
                f"{1e3 * statistics.median(item.predicted_s - sum(item.stage_predicted_s) for item in items):.0f}")
        lines.append(f"  {label:<16} {records:>7,} records  " + "; ".join(stages) + f"; rest {rest}")
    return lines


def handle(args) -> int:
    from fissure.plan.stored_calibration import calibration_path, save_calibration

    target = Path(args.output) if args.output else calibration_path()
    if target.exists() and target.is_dir():
        raise UsageError(f"--output {target} is a directory; name a file such as {target / 'calibration.json'}")
    progress = sys.stderr if args.json else sys.stdout
    result = measure(args.master, args.quick, out=progress)
    calibration, fit = result["calibration"], result["fit"]
    print(report_text(calibration, fit), file=progress)
    if not args.dry_run:
        stored = save_calibration(calibration, target)
        print(f"stored in {stored} (the planner's --model spark reads it)", file=progress)
    if args.json:
        print(json.dumps(calibration.to_dict()))
    return 0
