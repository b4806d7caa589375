"""C1 alone against C1 and C2: what the JVM's second compiler costs a run and what it gains it.

HotSpot compiles hot code with C1 first and again with C2, whose code is faster but whose
compiling takes CPU in the first tens of seconds, on the cores the run needs. The sessions
fissure creates start the driver's JVM with C1 alone (`-XX:TieredStopAtLevel=1`,
fissure.spark.session.create.SESSION_DEFAULTS). This measures that choice on LogWatch
(1,000,000 generated lines in 20 files, 5 a micro-batch, the planner's plan, through
`fissure.run` with its defaults): each variant in a fresh Python process with a session of its
own (the session's Java options as fissure sets them, `-XX:TieredStopAtLevel=1` left out for
C1 and C2), which runs the program `--runs` times on the same files. Reported per variant: the
first run's seconds and steady rate (what a process that runs the program once gets), and the
steady rate of the later runs (what a run gets once the JVM's code is compiled). The two
variants alternate, the order rotated each repeat, after one uncounted process
(benchmarks/method.py); medians over the repeats.

    ./dev python benchmarks/jvm_compilation.py            # 3 repeats, 4 runs a process (about 9 minutes)
    ./dev python benchmarks/jvm_compilation.py --quick    # 20,000 lines, one repeat: a check, not a result
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "benchmarks"))
sys.path.insert(0, str(REPOSITORY / "examples"))

import method  # noqa: E402

VARIANTS = {"C1 alone": False, "C1 and C2": True}

ONE_PROCESS = """
import json, sys, tempfile, time
sys.path.insert(0, {examples!r}); sys.path.insert(0, {benchmarks!r})
import fissure, direct_loops
from fissure.plan.plans import planner_plan
from fissure.spark.session.create import SESSION_DEFAULTS, create_session
options = SESSION_DEFAULTS["spark.driver.extraJavaOptions"].split()
if {full!r}:
    options = [option for option in options if not option.startswith("-XX:TieredStopAtLevel")]
started = time.monotonic()
spark = create_session(fissure.RunnerConfig(master="local[2]",
                                            spark_conf={{"spark.driver.extraJavaOptions": " ".join(options)}}))
session_s = time.monotonic() - started
program = direct_loops.programs("logwatch")[""]
plan = planner_plan(program, 2)
source = fissure.FileSource({input!r}, format="text", max_files_per_trigger={files_per_batch})
runs = []
for _ in range({runs}):
    began = time.monotonic()
    report = fissure.run(program, source, fissure.NoopSink(), plan=plan,
                         checkpoint=tempfile.mkdtemp(dir={scratch!r}), config=fissure.RunnerConfig(spark=spark))
    runs.append({{"seconds": time.monotonic() - began, "steady_per_s": report.summary()["steady_records_per_s"]}})
print(json.dumps({{"session_s": session_s, "runs": runs}}))
"""


def one_process(full: bool, input_path: Path, runs: int, files_per_batch: int, scratch: Path) -> dict:
    """One process's runs, their checkpoints in new folders under `scratch`."""
    script = ONE_PROCESS.format(examples=str(REPOSITORY / "examples"), benchmarks=str(REPOSITORY / "benchmarks"),
                                full=full, input=str(input_path), runs=runs, files_per_batch=files_per_batch,
                                scratch=str(scratch))
    return method.run_point_process(script, "a process", timeout_s=1800)


def later_steady(result: dict) -> float:
    """The median steady rate of a process's runs after its first."""
    return statistics.median(run["steady_per_s"] for run in result["runs"][1:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--files-per-batch", type=int, default=5)
    parser.add_argument("--runs", type=int, default=4, help="runs of the program a process (at least 2)")
    options = parser.parse_args(argv)
    if options.runs < 2:
        parser.error("--runs must be at least 2: the later runs are half of the result")
    lines = 20_000 if options.quick else options.lines
    repeats = 1 if options.quick else options.repeats
    run = method.Run("jvm_compilation.py", argv, quick=options.quick, out=options.out)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    import direct_loops

    with method.scratch_folder("jvm_compilation.py") as work:  # the input (a million lines by default), checkpoints
        input_path = work / "logwatch"
        direct_loops.write_input("logwatch", input_path, lines, options.files, options.files_per_batch)
        variants = {name: (lambda full=full: one_process(full, input_path, options.runs, options.files_per_batch,
                                                         work)) for name, full in VARIANTS.items()}
        block = method.measure_block(
            variants, repeats, quick=options.quick,
            warm_up=lambda: one_process(False, input_path, 1, options.files_per_batch, work),
            warm_up_label="one process with C1 alone and one run, not counted",
            value=lambda result: result["runs"][0]["seconds"], log=log)
    rows, figures = [], {}
    for name in VARIANTS:
        results = block.details[name]
        spans = [later_steady(result) for result in results]
        figures[name] = {
            "first_run_s": statistics.median(result["runs"][0]["seconds"] for result in results),
            "first_run_steady_per_s": statistics.median(result["runs"][0]["steady_per_s"] for result in results),
            "later_steady_per_s": statistics.median(spans),
            "session_s": statistics.median(result["session_s"] for result in results),
        }
        rows.append(f"| {name} | {figures[name]['session_s']:.1f} | {figures[name]['first_run_s']:.1f} | "
                    f"{figures[name]['first_run_steady_per_s']:,.0f} | {figures[name]['later_steady_per_s']:,.0f} "
                    f"({min(spans):,.0f}-{max(spans):,.0f}) |")
    full, quick_start = figures["C1 and C2"], figures["C1 alone"]
    lines_out = [
        "# The JVM's compilation: C1 alone against C1 and C2",
        "",
        f"LogWatch, {lines:,} lines in {options.files} files, {options.files_per_batch} a micro-batch, the planner's "
        f"plan, through `fissure.run`; each variant in a fresh process, {options.runs} runs of the program in its "
        f"session; {repeats} repeat(s), the variants' order rotated each repeat; medians.",
        "",
        "| compilation | session start s | first run s | first run, steady lines/s | later runs, steady lines/s (lowest-highest median of a process) |",
        "| --- | --- | --- | --- | --- |",
        *rows,
        "",
        f"C1 and C2 over C1 alone: first run {full['first_run_s'] / quick_start['first_run_s']:.3f}x the seconds; "
        f"later runs {full['later_steady_per_s'] / quick_start['later_steady_per_s']:.3f}x the steady rate.",
    ]
    run.write_results("jvm_compilation", "\n".join(lines_out), {"lines": lines, "runs": options.runs,
                                                                "block": block.to_dict(), "figures": figures})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
