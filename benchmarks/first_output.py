"""From the command to the LogWatch example's first output, Spark's start included, and where the time goes.

The headline: `./dev example` with its venv ready, timed from the command to the line that
reports the break-ins (the example's first output), as a newcomer runs it. Beside it, the same
program in a fresh process under four start-ups, each timed phase by phase (Python's imports,
the session and its JVM, the query's start, the first micro-batch):

- `fissure`: as fissure starts Spark (the driver's JVM from its class archive, Python workers
  forked from a daemon that preloads fissure, pyarrow and pandas, and started in the background
  as the session starts);
- `no class archive`: the same, the JVM loading its classes from the jars;
- `no warm-up`: the daemon preloads, nothing starts the workers before the first batch;
- `pyspark`: PySpark's own daemon, no warm-up (fissure before these two changes).

Variants in an order rotated each repeat after one uncounted run (benchmarks/method.py); medians.

    ./dev python benchmarks/first_output.py            # 3 repeats (about 5 minutes)
    ./dev python benchmarks/first_output.py --quick    # one repeat: a check, not a result
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

import method  # noqa: E402

FIRST_OUTPUT = "break-ins:"  # the example's first line of results
VARIANTS = {
    "fissure": {},
    "no class archive": {"jvm_class_archive": False},
    "no warm-up": {"warm_python_workers": False},
    "pyspark": {"warm_python_workers": False, "spark_conf": {"spark.python.daemon.module": "pyspark.daemon"}},
}
PHASES = ("imports", "session", "query start", "first batch", "to output")

ONE_RUN = """
import dataclasses, json, sys, tempfile, time
started = time.monotonic()
sys.path.insert(0, {examples!r})
import fissure, logwatch
from fissure.spark.session.create import create_session
import fissure.spark.query.runner as runner
marks = {{"imports": time.monotonic()}}
original_start = runner.Runner._start
def timed_start(self, *args, **kwargs):
    query = original_start(self, *args, **kwargs)
    marks["query start"] = time.monotonic()
    return query
runner.Runner._start = timed_start
original_write = runner.Runner._write_batch
def timed_write(self, frame, batch_id):
    original_write(self, frame, batch_id)
    marks.setdefault("first batch", time.monotonic())
runner.Runner._write_batch = timed_write
work = tempfile.mkdtemp(dir={scratch!r})
config = fissure.RunnerConfig(spark_log=work + "/spark.log", **{settings!r})
spark = create_session(config)
marks["session"] = time.monotonic()
source = fissure.FileSource(logwatch.prepare_input(work + "/in", 0, 5), format="text")
sink = fissure.MemorySink()
fissure.run(logwatch.build_pipeline(), source, sink, plan="planner", checkpoint=work + "/checkpoint",
            config=dataclasses.replace(config, spark=spark, progress="off"))
found = sink.records()
marks["to output"] = time.monotonic()
print(json.dumps({{"marks_s": {{name: at - started for name, at in marks.items()}}, "break_ins": len(found)}}))
"""


def example_command(scratch: Path) -> dict:
    """`./dev example`, timed from the command to its first line of results. Its run directory
    (input, checkpoint, Spark's log), kept for people after a run, goes under `scratch` (TMPDIR)."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(scratch)}
    started = time.monotonic()
    process = subprocess.Popen(["./dev", "example"], cwd=REPOSITORY, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, env=environment)
    first_output_s = None
    for line in process.stdout:
        if first_output_s is None and line.startswith(FIRST_OUTPUT):
            first_output_s = time.monotonic() - started
    code = process.wait(timeout=600)
    if code != 0 or first_output_s is None:
        raise SystemExit(f"./dev example failed (exit {code}) or printed no {FIRST_OUTPUT!r} line")
    return {"first_output_s": first_output_s, "exit_s": time.monotonic() - started}


def one_run(settings: dict, scratch: Path) -> dict:
    script = ONE_RUN.format(examples=str(REPOSITORY / "examples"), settings=settings, scratch=str(scratch))
    started = time.monotonic()
    result = method.run_point_process(script, "a run")
    result["process_s"] = time.monotonic() - started
    return result


def phase_lengths(marks: dict) -> dict:
    """Each phase's own seconds, from the marks (seconds since the process started)."""
    lengths, previous = {}, 0.0
    for phase in PHASES:
        lengths[phase] = marks[phase] - previous
        previous = marks[phase]
    return lengths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser)
    options = parser.parse_args(argv)
    run = method.Run("first_output.py", argv, quick=options.quick, out=options.out)
    repeats = 1 if options.quick else options.repeats
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    with method.scratch_folder("first_output.py") as scratch:  # each run's input, checkpoint and Spark's log
        variants = {"./dev example": lambda: example_command(scratch)}
        variants.update({name: (lambda settings=settings: one_run(settings, scratch))
                         for name, settings in VARIANTS.items()})
        block = method.measure_block(
            variants, repeats, quick=options.quick, warm_up=lambda: example_command(scratch),
            warm_up_label="one ./dev example, not counted",
            value=lambda result: result.get("first_output_s") or result["marks_s"]["to output"], log=log)
    command = statistics.median(result["first_output_s"] for result in block.details["./dev example"])
    lines = [
        "# From the command to the LogWatch example's first output",
        "",
        f"`./dev example` (venv ready) to its first line of results: median **{command:.1f} s** over {repeats} "
        "repeats (the goal: 12 s on this 2-core machine, quiet).",
        "",
        "The same program (the Loghub sample, 2,022 lines in one micro-batch, planner's plan) in a fresh process "
        "under four start-ups, seconds each phase takes (medians): imports (Python and fissure), session "
        "(the JVM and Spark's context), query start (fissure checks, sizes and compiles the program; Spark "
        "starts the query), first batch (PySpark's state-schema processes, one per stateful operator, then the "
        "batch's jobs), to output (stopping the query, the results in hand).",
        "",
        "| start-up | imports | session | query start | first batch | to output | total |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    medians = {}
    for name in VARIANTS:
        lengths = [phase_lengths(result["marks_s"]) for result in block.details[name]]
        medians[name] = {phase: statistics.median(length[phase] for length in lengths) for phase in PHASES}
        total = statistics.median(result["marks_s"]["to output"] for result in block.details[name])
        medians[name]["total"] = total
        lines.append(f"| {name} | " + " | ".join(f"{medians[name][phase]:.2f}" for phase in PHASES)
                     + f" | {total:.2f} |")
    run.write_results("first_output", "\n".join(lines),
                      {"block": block.to_dict(), "command_first_output_s": command, "phase_medians_s": medians})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
