"""What the examples share: their command line, a run directory, and a run for people.

A run for people shows fissure's progress line and the results; everything Spark prints goes to
`spark.log` in the run directory. A failure prints a short message that points to that log.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import fissure
from fissure.spark.session.create import describe_failure


def example_parser(description: str, files: int) -> argparse.ArgumentParser:
    """The options every example has: --files, --plan, --master."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=files, help=f"files the input is written as (default {files})")
    parser.add_argument("--plan", default="planner",
                        help="planner (default: the planner's choice for this machine's cores), sequential, "
                             "or a JSON plan file (`fissure plan --json` output)")
    parser.add_argument("--master", default="local[*]", help="Spark master URL (default: embedded local[*])")
    return parser


def run_directory(name: str) -> str:
    """A new directory for one run: its input, checkpoint and Spark's log."""
    return tempfile.mkdtemp(prefix=f"fissure-{name}-")


def spark_log_of(directory: str) -> str:
    return os.path.join(directory, "spark.log")


def run_for_people(pipeline: fissure.Pipeline, source, sink, args: argparse.Namespace,
                   directory: str) -> fissure.RunReport:
    """Run to the end with the progress line; on failure print why (and where the log is), exit 1."""
    spark_log = spark_log_of(directory)
    print(f"{pipeline.name}: starting Spark (its output goes to {spark_log})", file=sys.stderr)
    config = fissure.RunnerConfig(master=args.master, spark_log=spark_log, progress="auto")
    try:
        return fissure.run(pipeline, source, sink, plan=args.plan, checkpoint=os.path.join(directory, "checkpoint"),
                           config=config)
    except fissure.PipelineError as error:
        print(f"\n{pipeline.name}: {error}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"\n{pipeline.name}: interrupted; the run directory is {directory}", file=sys.stderr)
        raise SystemExit(130) from None
    except Exception as error:  # noqa: BLE001 - shown to people, the traceback goes to the log
        print(f"\n{pipeline.name} failed: {describe_failure(error, spark_log)}", file=sys.stderr)
    raise SystemExit(1)


def print_run_summary(report: fissure.RunReport, pipeline: fissure.Pipeline, directory: str,
                      what: str = "records") -> None:
    from fissure.plan.plans import describe_plan

    batches = f"{report.batches} batch" + ("" if report.batches == 1 else "es")
    print(f"\n{pipeline.name}: {report.input_records:,} {what} in {batches}, "
          f"{report.records_per_s:,.0f} {what}/s overall (Spark's start included), "
          f"{report.dead_letters} dead letters")
    print(f"plan: {describe_plan(report.plan, pipeline)}")
    for admission in report.admissions:
        print(admission.describe())
    print(f"Spark's output: {spark_log_of(directory)}")


def run_lines_for_people(pipeline: fissure.Pipeline, lines: list[str], args: argparse.Namespace, name: str,
                         what: str = "records") -> tuple[fissure.RunReport, list[dict]]:
    """Write `lines` as `args.files` text files (one a micro-batch), run `pipeline` over them for
    people (`run_for_people`), print the run's summary; the report and what the sink got."""
    from fissure.testing import text_files

    directory = run_directory(name)
    source = text_files(os.path.join(directory, "input"), lines, lines_per_file=-(-len(lines) // args.files),
                        max_files_per_trigger=1)
    sink = fissure.MemorySink()
    report = run_for_people(pipeline, source, sink, args, directory)
    print_run_summary(report, pipeline, directory, what=what)
    return report, sink.records()
