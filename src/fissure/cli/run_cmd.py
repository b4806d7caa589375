"""`fissure run`: run a program on Spark from a source to a sink, showing its progress.

    fissure run examples/logwatch.py:build_pipeline --source logs/ --sink out/ --plan planner
    fissure run app.py:build --source 'rate://?rowsPerSecond=1000' --max-batches 20
    fissure run app.py:build --source socket://localhost:9999 --timeout 60
    fissure run app.py:build --source kafka://localhost:9092/events --follow
        --packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.3.0

--source is a directory of files (--format, --schema), rate://?rowsPerSecond=N&numPartitions=N
(fields timestamp, value), socket://HOST:PORT (field value) or
kafka://BROKERS/TOPICS?option=value&... (fields key and value as bytes, topic, partition, offset,
timestamp, timestampType; needs Spark's Kafka connector: --packages). A rate or socket source
never ends: --max-batches or --timeout ends the run (or ^C); a socket source is not re-planned
while running (a restart would lose the lines it sent).

Progress goes to standard error (--progress): on a terminal a live line redrawn in place,
elsewhere (a file, a pipe, a CI log) plain lines each starting with the ISO time: one when the
first batch completes, at each plan change and at the end, otherwise at most one per 10 s.

The program is a Pipeline or a StreamGraph of one source; a graph's sinks are written to
subdirectories of --sink named after them.

The terminal shows the progress line and the results; everything Spark prints goes to
`spark.log` in the run directory (--run-dir, default a new temporary directory), which the last
line names. A failed run prints a short reason and points to that log. A run on files (without --follow)
that --timeout ends before it read them all exits with 124 and says which files are left; a
--follow run, or one on a rate, socket or Kafka source, ends with its timeout (exit 0).

With --json the last line of standard output is the run's summary as one JSON object (plan,
batches, input_records, output_records, dead_letters, elapsed_s, first_batch_s,
steady_records_per_s, end_of_input_s, state_keys, state_keys_peak, late_records, missing_files); everything else
goes to standard error. Without --follow the input is bounded: at its end every event-time window
and expiry fires (docs/pipeline-api.md, Time).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import importlib.util
import os
import sys
import tempfile

from fissure.cli import UsageError
from fissure.cli.source_argument import parse_source_url, refuse_file_flags, source_of
from fissure.lifecycle.progress import PROGRESS_MODES

TIMED_OUT_EXIT = 124  # as timeout(1): the time ran out before the work was done

TYPES = {"str": str, "int": int, "float": float, "bool": bool}


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="run a pipeline on Spark", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pipeline", help="FILE.py:FUNCTION or MODULE:FUNCTION returning a fissure Pipeline or "
                                         "StreamGraph")
    parser.add_argument("--source", required=True,
                        help="a directory of input files, or rate://?rowsPerSecond=N, socket://HOST:PORT, "
                             "kafka://BROKERS/TOPICS?option=value")
    parser.add_argument("--format", choices=("text", "json", "csv", "parquet"),
                        help="the directory's file format (default: text)")
    parser.add_argument("--schema", help=f"source fields for json/csv/parquet: name:type,... ({', '.join(TYPES)})")
    batch = parser.add_mutually_exclusive_group()
    batch.add_argument("--files-per-batch", type=int, default=None, help="at most this many files per micro-batch")
    batch.add_argument("--kb-per-batch", type=int, default=None,
                       help="at most this many KiB of files per micro-batch")
    batch.add_argument("--all-per-batch", action="store_true",
                       help="every new file in one micro-batch (default: a size chosen from the Spark model)")
    parser.add_argument("--no-cost-sample", dest="cost_sample", action="store_false",
                        help="size micro-batches from the operators' declared costs; by default they are measured "
                             "once per checkpoint by running the operators on the first file's first records in a "
                             "separate process")
    parser.add_argument("--latency-bound", type=float, default=None, metavar="SECONDS",
                        help="with the chosen batch size: keep a micro-batch under this many seconds")
    parser.add_argument("--sink", help="output directory (Parquet, one folder per batch); default: print results")
    parser.add_argument("--dead-letters", help="directory for dead letters (JSON); default: counted and kept in memory")
    parser.add_argument("--plan", default="planner", help="planner (default), sequential, or a JSON plan file")
    parser.add_argument("--master", default=None,
                        help="Spark master URL (default: local[*,4]: every core, a failed task tried up to 4 times)")
    parser.add_argument("--spark-ui", nargs="?", const="127.0.0.1", default=None, metavar="ADDRESS",
                        help="run Spark's web UI and print its address (off by default: it slows the start); it "
                             "listens on loopback unless ADDRESS names another (it has no login)")
    parser.add_argument("--checkpoint", help="checkpoint directory (restart from it; default: in the run directory)")
    parser.add_argument("--run-dir", help="directory for Spark's log and the default checkpoint "
                                          "(default: a new temporary directory)")
    parser.add_argument("--follow", action="store_true", help="keep running for new files (default: stop when done)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop after this many seconds (with --follow, or a rate or socket source)")
    parser.add_argument("--max-batches", type=int, default=None, metavar="N",
                        help="stop after N micro-batches (a later one is left for a run on the checkpoint)")
    parser.add_argument("--progress", choices=PROGRESS_MODES, default=None,
                        help="auto (default): a live line on a terminal, timestamped lines elsewhere; "
                             "live, lines, or off")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting, as spark-submit's --conf (repeatable): spark.fissure.* keys are fissure's "
                             "(RunnerConfig's fields, e.g. spark.fissure.timeout_s=60; a flag given wins over "
                             "them), any other key a Spark setting for the session fissure starts, e.g. Spark's "
                             "metrics system: docs/spark-runner.md")
    parser.add_argument("--packages", metavar="GROUP:ARTIFACT:VERSION,...",
                        help="jars for Spark's JVM from Maven (spark.jars.packages), e.g. the Kafka connector")
    parser.add_argument("--json", action="store_true",
                        help="print the run's summary as one JSON object on the last line of standard output")
    parser.add_argument("--migrate-pickled-state", action="store_true",
                        help="read state an earlier fissure stored as pickles (which can run code: only if you "
                             "trust whoever could write the checkpoint) and rewrite it as data; once "
                             "(docs/pipeline-api.md). Pickled state is signed with FISSURE_STATE_KEY")
    parser.add_argument("--no-adapt", dest="adapt", action="store_false",
                        help="keep the starting plan (default: re-plan while running, keep what helps, roll back "
                             "what does not; the timeline goes to the run directory)")
    parser.set_defaults(handler=handle)


def parse_schema(text: str | None) -> dict | None:
    if not text:
        return None
    schema = {}
    for item in text.split(","):
        name, _, kind = item.partition(":")
        if not name.strip() or kind.strip() not in TYPES:
            raise UsageError(f"--schema item {item!r} is not name:type with type one of {', '.join(TYPES)}")
        schema[name.strip()] = TYPES[kind.strip()]
    return schema


def load_pipeline(reference: str):
    """The program (a Pipeline or a StreamGraph) that FILE.py:FUNCTION or MODULE:FUNCTION names (a
    function returning one, or one)."""
    location, _, function_name = reference.rpartition(":")
    if not location or not function_name:
        raise UsageError(f"pipeline {reference!r} must be FILE.py:FUNCTION or MODULE:FUNCTION, "
                         f"e.g. examples/logwatch.py:build_pipeline")
    if location.endswith(".py"):
        if not os.path.isfile(location):
            raise UsageError(f"pipeline file {location!r} does not exist")
        # The file's folder on the path, as `python FILE.py` would have it: its own imports work.
        sys.path.insert(0, os.path.dirname(os.path.abspath(location)))
        spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(location))[0], location)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(location)
        except ImportError as error:
            raise UsageError(f"cannot import pipeline module {location!r}: {error}") from None
    factory = getattr(module, function_name, None)
    if factory is None:
        defined = sorted(name for name, value in vars(module).items() if callable(value) and not name.startswith("_"))
        raise UsageError(f"{location!r} has no {function_name!r}; "
                         f"it defines {', '.join(defined) or 'nothing callable'}")
    from fissure.program.chain import Pipeline
    from fissure.program.graph import StreamGraph

    from fissure.program.operators import PipelineError

    programs = (Pipeline, StreamGraph)
    try:
        pipeline = factory() if callable(factory) and not isinstance(factory, programs) else factory
    except PipelineError as error:
        raise UsageError(f"{reference!r} does not build: {error}") from None
    if not isinstance(pipeline, programs):
        raise UsageError(f"{reference!r} gave {type(pipeline).__name__}, not a fissure Pipeline or StreamGraph")
    return pipeline


def handle(args) -> int:
    import fissure
    from fissure.program.graph import as_graph
    from fissure.program.operators import PipelineError
    from fissure.spark.io.sources import SourceUnavailable, check_before_spark

    pipeline = load_pipeline(args.pipeline)
    if args.max_batches is not None and args.max_batches < 1:
        raise UsageError(f"--max-batches must be a positive integer, got {args.max_batches}")
    source_url = parse_source_url(args.source)
    if source_url is None and not os.path.isdir(args.source):
        raise UsageError(f"--source {args.source!r} is not a directory; give the directory the input files arrive in "
                         f"(or a rate://, socket:// or kafka:// URL)")
    if source_url is not None:
        refuse_file_flags(args, args.source)
    try:
        if source_url is None:
            source = fissure.FileSource(args.source, format=args.format or "text", schema=parse_schema(args.schema),
                                        max_files_per_trigger=args.files_per_batch,
                                        max_bytes_per_trigger=args.kb_per_batch * 1024 if args.kb_per_batch else None)
        else:
            source = source_of(source_url, args.source)
        config = run_config(args, source_url)
    except ValueError as error:
        raise UsageError(str(error)) from None
    graph = as_graph(pipeline)
    if len(graph.sources) == 1:  # a graph of several sources is refused below
        try:  # what can fail without Spark fails before its start (about 10 s)
            check_before_spark(graph, {graph.sources[0]: source})
        except (PipelineError, SourceUnavailable) as error:
            raise UsageError(str(error)) from None
    sink = fissure.FileSink(args.sink) if args.sink else fissure.ConsoleSink()
    if isinstance(pipeline, fissure.StreamGraph):
        if len(pipeline.sources) != 1:
            raise UsageError(f"graph {pipeline.name!r} has sources {', '.join(pipeline.sources)}; `fissure run` "
                             f"reads one --source: run it from Python with fissure.run(graph, {{name: source}}, ...)")
        sink = {name: fissure.FileSink(os.path.join(args.sink, name)) if args.sink else fissure.ConsoleSink()
                for name in pipeline.sinks}
    return run_and_report(args, pipeline, source, sink, with_run_dir(config, args.run_dir))


def run_config(args, source_url) -> object:
    """The run's RunnerConfig: the command's defaults (re-planning adaptive), then the --conf
    settings, then the flags given (a flag wins over a key); ValueError naming a bad one."""
    import fissure

    conf = []
    for setting in args.conf:
        key, separator, value = setting.partition("=")
        if not separator or not key.strip():
            raise UsageError(f"--conf {setting!r} is not KEY=VALUE")
        conf.append((key.strip(), value))
    if args.packages:
        conf.append(("spark.jars.packages", args.packages))
    config = fissure.RunnerConfig.from_conf(conf, base=fissure.RunnerConfig(replanning="adaptive"))
    flags = {"master": args.master, "batch_latency_bound_s": args.latency_bound, "progress": args.progress,
             "timeout_s": args.timeout, "max_batches": args.max_batches,
             "batch_size": "all" if args.all_per_batch else None,
             "batch_sample_costs": False if not args.cost_sample else None,
             "spark_ui": True if args.spark_ui is not None else None, "spark_ui_address": args.spark_ui,
             "state_migration": "trust-pickle" if args.migrate_pickled_state else None,
             "replanning": "off" if not args.adapt else None,
             "available_now": False if args.follow or source_url is not None and source_url.endless else None,
             "dead_letters": fissure.FileSink(args.dead_letters, format="json") if args.dead_letters else None}
    config = dataclasses.replace(config, **{name: value for name, value in flags.items() if value is not None})
    if config.replanning == "adaptive" and source_url is not None and not source_url.replayable:
        print(f"fissure run: a {source_url.scheme} source cannot replay what it sent: the plan stays as it starts "
              f"(as with --no-adapt)", file=sys.stderr)
        config = dataclasses.replace(config, replanning="off")
    return config


def with_run_dir(config, run_dir: str | None):
    """The config with its run directory made (`--run-dir`, the key's, or a new temporary one):
    Spark's log and the default checkpoint go there."""
    run_dir = run_dir or config.run_dir or tempfile.mkdtemp(prefix="fissure-run-")
    os.makedirs(run_dir, exist_ok=True)
    spark_log = config.spark_log or os.path.abspath(os.path.join(run_dir, "spark.log"))
    return dataclasses.replace(config, run_dir=run_dir, spark_log=spark_log)


def run_and_report(args, pipeline, source, sink, config) -> int:
    """Run on Spark, print the results' summary (the last line of stdout with --json); the exit code."""
    import fissure
    from fissure.program.operators import PipelineError
    from fissure.spark.checkpoint.guard import CheckpointDamaged
    from fissure.spark.checkpoint.lock import CheckpointLocked
    from fissure.spark.query.run_end import RunTimedOut
    from fissure.spark.session.create import describe_failure
    from fissure.spark.io.sources import SourceUnavailable

    spark_log = config.spark_log
    print(f"fissure run: starting Spark (its output goes to {spark_log})", file=sys.stderr)
    try:
        report = fissure.run(pipeline, source, sink, plan=args.plan,
                             checkpoint=args.checkpoint or os.path.join(config.run_dir, "checkpoint"), config=config)
    except (PipelineError, SourceUnavailable) as error:
        raise UsageError(str(error)) from None
    except (CheckpointLocked, CheckpointDamaged) as error:  # whole: the holder, or the missing files
        print(f"\nfissure run: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nfissure run: interrupted; Spark's output: {spark_log}", file=sys.stderr)
        return 130
    except RunTimedOut as error:  # a bounded run's input not all read: the work is not done
        print(f"\nfissure run: {error}\nSpark's output: {spark_log}", file=sys.stderr)
        if args.json:
            print(json.dumps({**error.report.summary(), "timed_out": True, "files_left": error.left.files}), flush=True)
        return TIMED_OUT_EXIT
    except Exception as error:  # noqa: BLE001 - shown to people, the traceback goes to the log
        print(f"\nfissure run: the run failed: {describe_failure(error, spark_log)}", file=sys.stderr)
        return 1
    out = sys.stderr if args.json else sys.stdout  # with --json, stdout's last line is the summary
    print(f"{report.input_records:,} records in {report.batches} batch{'' if report.batches == 1 else 'es'}, "
          f"{report.records_per_s:,.0f} records/s, {report.dead_letters} dead letters; "
          f"plan {report.described_plan}", file=out)
    for admission in report.admissions:
        print(admission.describe(), file=out)
    if report.missing_files:
        print(f"{len(report.missing_files)} input file(s) were gone when their batch ran (read as empty): "
              f"{', '.join(report.missing_files[:5])}{' ...' if len(report.missing_files) > 5 else ''}", file=out)
    if args.sink:
        print(f"results: {args.sink}", file=out)
    if getattr(report, "timeline_json", None):
        print(f"timeline: {report.timeline_json}" + (f", {report.timeline_png}" if report.timeline_png else ""),
              file=out)
    print(f"Spark's output: {spark_log}", file=out)
    if args.json:
        print(json.dumps(report.summary()), flush=True)
    return 0
