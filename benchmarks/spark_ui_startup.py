"""What Spark's web UI costs a run's start: `RunnerConfig(spark_ui=True)` (`fissure run --spark-ui`)
against the default (UI off).

Each measurement is a fresh Python process (a new JVM: the UI's cost is paid when the SparkContext
starts), UI off and on in an order rotated each repeat (benchmarks/method.py), so that drift of the
machine hits both alike. A process measures
- session: `create_session` (JVM start, SparkContext, the UI's web server when on);
- first batch: the first micro-batch of a one-operator chain over --records records in one file
  (Spark's `triggerExecution` of batch 0: planning, Python workers' start, the batch's jobs);
- to first result: from before the session to the end of the run (one batch).
Reported: the medians over --rounds rounds of each setting, and on / off.

    ./dev python benchmarks/spark_ui_startup.py [--repeats 3] [--records 10000] [--master local[2]]\n    ./dev python benchmarks/spark_ui_startup.py --quick   # one repeat: a check, not a result
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import method  # noqa: E402

REPOSITORY = Path(__file__).resolve().parent.parent
MEASURES = ("session_s", "first_batch_s", "to_first_result_s")


def measure(ui: bool, records: int, master: str, scratch: Path) -> dict:
    """One process's figures (run in a fresh process: see the module docstring), its input in a
    new folder under `scratch`."""
    import fissure
    from fissure.spark.session.create import create_session
    from fissure.testing import record_files

    work = Path(tempfile.mkdtemp(dir=scratch))
    source = record_files(work / "in", [{"i": i} for i in range(records)], {"i": int}, records_per_file=records)
    started = time.perf_counter()
    spark = create_session(fissure.RunnerConfig(master=master, spark_ui=ui))
    session_s = time.perf_counter() - started
    pipeline = fissure.Pipeline("ui-startup").map("double", lambda record: {"i": record["i"] * 2})
    report = fissure.run(pipeline, source, fissure.NoopSink(), config=fissure.RunnerConfig(spark=spark, progress="off"))
    to_first_result_s = time.perf_counter() - started
    ui_url = spark.sparkContext.uiWebUrl
    spark.stop()
    return {"ui": ui, "ui_url": ui_url, "session_s": session_s,
            "first_batch_s": sorted(report.batch_times, key=lambda time_: time_.batch_id)[0].duration_s,
            "to_first_result_s": to_first_result_s}


def run_child(ui: bool, records: int, master: str, scratch: Path) -> dict:
    finished = subprocess.run([sys.executable, __file__, "--measure", "on" if ui else "off", "--records", str(records),
                               "--master", master, "--scratch", str(scratch)], capture_output=True, text=True,
                              check=True)
    return json.loads(finished.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--measure", choices=("off", "on"), help=argparse.SUPPRESS)  # one child process
    parser.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)  # the child's parent folder for its input
    args = parser.parse_args(argv)
    if args.measure is not None:
        print(json.dumps(measure(args.measure == "on", args.records, args.master, args.scratch)))
        return 0
    run = method.Run("spark_ui_startup.py", argv, quick=args.quick, out=args.out, master=args.master)
    repeats = 1 if args.quick else args.repeats
    with method.scratch_folder("spark_ui_startup.py") as scratch:
        block = method.measure_block(
            {"off": lambda: run_child(False, args.records, args.master, scratch),
             "on": lambda: run_child(True, args.records, args.master, scratch)},
            repeats, quick=args.quick, warm_up=lambda: run_child(False, args.records, args.master, scratch),
            warm_up_label="one process with the UI off, not counted", value=lambda result: result["to_first_result_s"],
            log=lambda line: print(line, file=sys.stderr, flush=True))
    medians = {setting: {name: statistics.median(result[name] for result in block.details[setting])
                         for name in MEASURES} for setting in ("off", "on")}
    lines = ["# Spark's web UI: start-up cost", "",
             f"Medians of {repeats} fresh processes per setting, in an order rotated each repeat, after one "
             f"uncounted process; first batch: one map over {args.records:,} records in one file.", "",
             "| | UI off | UI on | on - off | on / off |", "| --- | ---: | ---: | ---: | ---: |"]
    for name in MEASURES:
        off, on = medians["off"][name], medians["on"][name]
        lines.append(f"| {name.removesuffix('_s').replace('_', ' ')} (s) | {off:.2f} | {on:.2f} | {on - off:+.2f} | "
                     f"{on / off:.2f} |")
    lines += ["", f"Paired ratio on / off of the time to the first result, median over repeats: "
                  f"{block.paired_ratio('on', 'off'):.2f}."]
    run.write_results("spark_ui_startup", "\n".join(lines),
                      {"records": args.records, "block": block.to_dict(), "details": block.details, "medians": medians})
    return 0


if __name__ == "__main__":
    sys.exit(main())
