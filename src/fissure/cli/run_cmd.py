"""`fissure run`: run a pipeline on Spark from a file source to a sink, with a live progress line.

    fissure run examples/logwatch.py:build_pipeline --source logs/ --sink out/ --plan planner
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os

from fissure.cli import UsageError


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="run a pipeline on Spark", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pipeline", help="FILE.py:FUNCTION or MODULE:FUNCTION returning a fissure Pipeline")
    parser.add_argument("--source", required=True, help="a directory of input files")
    parser.add_argument("--format", default="text", choices=("text", "json", "csv", "parquet"))
    parser.add_argument("--schema", help="source fields for json/csv/parquet: name:type,... (str, int, float, bool)")
    parser.add_argument("--files-per-batch", type=int, default=None, help="maxFilesPerTrigger of the source")
    parser.add_argument("--sink", help="output directory (Parquet, one folder per batch); default: console")
    parser.add_argument("--dead-letters", help="directory for dead letters (JSON); default: counted and kept in memory")
    parser.add_argument("--plan", default="planner", help="planner (default), sequential, or a JSON plan file")
    parser.add_argument("--master", default="local[*]", help="Spark master URL (default: local[*])")
    parser.add_argument("--checkpoint", help="checkpoint directory (restart from it; default: temporary)")
    parser.add_argument("--follow", action="store_true", help="keep running for new files (default: stop when done)")
    parser.add_argument("--timeout", type=float, default=None, help="with --follow: stop after this many seconds")
    parser.set_defaults(handler=handle)


TYPES = {"str": str, "int": int, "float": float, "bool": bool}


def parse_schema(text: str | None) -> dict | None:
    if not text:
        return None
    schema = {}
    for item in text.split(","):
        name, _, kind = item.partition(":")
        if not name or kind not in TYPES:
            raise UsageError(f"--schema item {item!r} is not name:type with type one of {', '.join(TYPES)}")
        schema[name.strip()] = TYPES[kind]
    return schema


def load_pipeline(reference: str):
    location, _, function_name = reference.rpartition(":")
    if not location or not function_name:
        raise UsageError(f"pipeline {reference!r} must be FILE.py:FUNCTION or MODULE:FUNCTION")
    if location.endswith(".py"):
        if not os.path.exists(location):
            raise UsageError(f"pipeline file {location!r} does not exist")
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
        raise UsageError(f"{location!r} has no {function_name!r}")
    from fissure.graph import Pipeline

    pipeline = factory() if callable(factory) and not isinstance(factory, Pipeline) else factory
    if not isinstance(pipeline, Pipeline):
        raise UsageError(f"{reference!r} gave {type(pipeline).__name__}, not a fissure Pipeline")
    return pipeline


def handle(args) -> int:
    import fissure
    from fissure.graph import PipelineError
    from fissure.spark.plans import describe_plan

    pipeline = load_pipeline(args.pipeline)
    if not os.path.isdir(args.source):
        raise UsageError(f"--source {args.source!r} is not a directory")
    try:
        source = fissure.FileSource(args.source, format=args.format, schema=parse_schema(args.schema),
                                    max_files_per_trigger=args.files_per_batch)
    except ValueError as error:
        raise UsageError(str(error)) from None
    sink = fissure.FileSink(args.sink) if args.sink else fissure.ConsoleSink()
    dead_letters = fissure.FileSink(args.dead_letters, format="json") if args.dead_letters else None
    try:
        report = fissure.run(pipeline, source, sink, plan=args.plan, checkpoint=args.checkpoint,
                             dead_letters=dead_letters, config=fissure.RunnerConfig(master=args.master),
                             available_now=not args.follow, timeout_s=args.timeout, progress=True)
    except PipelineError as error:
        raise UsageError(str(error)) from None
    print(f"{report.input_records:,} records in {report.batches} batches, {report.records_per_s:,.0f} records/s, "
          f"{report.dead_letters} dead letters; plan {describe_plan(report.plan)}")
    return 0
