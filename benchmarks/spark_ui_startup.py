"""What Spark's web UI costs a run's start: `RunnerConfig(spark_ui=True)` (`fissure run --spark-ui`)
against the default (UI off).

Each measurement is a fresh Python process (a new JVM: the UI's cost is paid when the SparkContext
starts), UI off and on alternating (off, on, then on, off, ...) so that drift of the machine hits
both alike. A process measures
- session: `create_session` (JVM start, SparkContext, the UI's web server when on);
- first batch: the first micro-batch of a one-operator chain over --records records in one file
  (Spark's `triggerExecution` of batch 0: planning, Python workers' start, the batch's jobs);
- to first result: from before the session to the end of the run (one batch).
Reported: the medians over --rounds rounds of each setting, and on / off.

    ./dev python benchmarks/spark_ui_startup.py [--rounds 3] [--records 10000] [--master local[2]]
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

import provenance  # noqa: E402

REPOSITORY = Path(__file__).resolve().parent.parent
MEASURES = ("session_s", "first_batch_s", "to_first_result_s")


def measure(ui: bool, records: int, master: str) -> dict:
    """One process's figures (run in a fresh process: see the module docstring)."""
    import fissure
    from fissure.spark.session import create_session
    from fissure.testing import record_files

    work = Path(tempfile.mkdtemp(prefix="fissure-ui-startup-"))
    source = record_files(work / "in", [{"i": i} for i in range(records)], {"i": int}, records_per_file=records)
    started = time.perf_counter()
    spark = create_session(fissure.RunnerConfig(master=master, spark_ui=ui))
    session_s = time.perf_counter() - started
    pipeline = fissure.Pipeline("ui-startup").map("double", lambda record: {"i": record["i"] * 2})
    report = fissure.run(pipeline, source, fissure.NoopSink(), spark=spark, progress=False)
    to_first_result_s = time.perf_counter() - started
    ui_url = spark.sparkContext.uiWebUrl
    spark.stop()
    return {"ui": ui, "ui_url": ui_url, "session_s": session_s,
            "first_batch_s": sorted(report.batch_times, key=lambda time_: time_.batch_id)[0].duration_s,
            "to_first_result_s": to_first_result_s}


def run_child(ui: bool, records: int, master: str) -> dict:
    finished = subprocess.run([sys.executable, __file__, "--measure", "on" if ui else "off", "--records", str(records),
                               "--master", master], capture_output=True, text=True, check=True)
    return json.loads(finished.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--out", default=str(REPOSITORY / "benchmarks" / "results"), help="results directory")
    parser.add_argument("--measure", choices=("off", "on"), help=argparse.SUPPRESS)  # one child process
    args = parser.parse_args(argv)
    if args.measure is not None:
        print(json.dumps(measure(args.measure == "on", args.records, args.master)))
        return 0
    load_before = provenance.load()
    document = {"command": "./dev python benchmarks/spark_ui_startup.py " + " ".join(argv if argv is not None
                                                                                     else sys.argv[1:]),
                "revision": provenance.revision(REPOSITORY), "machine": provenance.machine(args.master),
                "date": provenance.now(), "load_before": load_before, "rounds": args.rounds,
                "records": args.records, "runs": []}
    for round_ in range(args.rounds):
        for ui in ((False, True) if round_ % 2 == 0 else (True, False)):
            print(f"round {round_ + 1}/{args.rounds}: UI {'on' if ui else 'off'}", file=sys.stderr, flush=True)
            document["runs"].append({"round": round_, **run_child(ui, args.records, args.master)})
    document["load_after"] = provenance.load()
    medians = {setting: {name: statistics.median(run[name] for run in document["runs"] if run["ui"] == (setting == "on"))
                         for name in MEASURES} for setting in ("off", "on")}
    document["medians"] = medians
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "spark_ui_startup.json").write_text(json.dumps(document, indent=2) + "\n")
    lines = ["# Spark's web UI: start-up cost", "",
             f"Command: `{document['command']}`  ", f"Revision: {document['revision']}  ",
             f"Machine: {document['machine']}  ", f"Date: {document['date']}  ",
             f"Load average before / after: {load_before} / {document['load_after']}"
             f"{provenance.load_note(load_before)}", "",
             f"Medians of {args.rounds} fresh processes per setting, alternating; first batch: one map over "
             f"{args.records:,} records.", "",
             "| | UI off | UI on | on - off | on / off |", "| --- | ---: | ---: | ---: | ---: |"]
    for name in MEASURES:
        off, on = medians["off"][name], medians["on"][name]
        lines.append(f"| {name.removesuffix('_s').replace('_', ' ')} (s) | {off:.2f} | {on:.2f} | {on - off:+.2f} | "
                     f"{on / off:.2f} |")
    (out / "spark_ui_startup.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
