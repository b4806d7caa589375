"""Word count over the text files of a directory, results as JSON files: a program for spark-submit.

    spark-submit --master spark://HOST:7077 examples/wordcount_files.py INPUT_DIR OUTPUT_DIR \\
        [--plan planner|sequential|FILE] [--checkpoint DIR] [--files-per-batch N]
    python examples/wordcount_files.py INPUT_DIR OUTPUT_DIR --master local[2]

Counts the words of every file INPUT_DIR holds when the run starts, then stops. OUTPUT_DIR gets
one directory per micro-batch (`batch_id=N/`) of JSON lines `{"word": ..., "count": n}`: a word's
running count at each of its occurrences, so its highest count is its total; the totals are
printed at the end (`TOTAL word n`). First it prints the Python and the fissure that the driver
and the executors run: a node without the environment it was given shows there, before the run.

Under spark-submit the session is spark-submit's (its --master, --conf and --archives); with
--master, fissure creates its own session on that master.

The operators repeat examples/wordcount.py's on purpose: spark-submit ships this one file, and
functions defined in it travel to the executors by value, where importing them from another
example would need that module (and its helpers) shipped with --py-files as well.
"""

from __future__ import annotations

import argparse
import os

from pyspark.sql import SparkSession

import fissure
from fissure import Pipeline
from fissure.plan.plans import describe_plan
from fissure.spark.session.create import create_session


def words(record):
    return [{"word": word.lower()} for word in record["value"].split()]


def count(state, record):
    state["n"] = state.get("n", 0) + 1
    return {"word": record["word"], "count": state["n"]}


def build_pipeline() -> Pipeline:
    return (Pipeline("wordcount")
            .flat_map("words", words, schema={"word": str}, reads=["value"], cost_us=3.0, selectivity=12.0)
            .partitioned("count", count, key="word", schema={"word": str, "count": int}, cost_us=2.0))


def where_fissure_runs(_=None) -> str:
    """This interpreter and the fissure it imports (run on the driver and in an executor)."""
    import sys

    import fissure

    return (f"python {sys.version.split()[0]} at {sys.executable}, "
            f"fissure {fissure.__version__} at {os.path.dirname(fissure.__file__)}")


def absolute(path: str) -> str:
    """A local path made absolute (executors do not share the driver's working directory); a URI
    (hdfs://..., s3a://..., file:/...) as given."""
    return path if ":" in path.split("/", 1)[0] else os.path.abspath(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", help="directory of text files")
    parser.add_argument("output", help="directory for the results (JSON lines, one directory per micro-batch)")
    parser.add_argument("--plan", default="planner", help="planner (default), sequential, or a JSON plan file")
    parser.add_argument("--checkpoint", help="checkpoint directory (default: OUTPUT-checkpoint)")
    parser.add_argument("--files-per-batch", type=int, help="files per micro-batch (default: fissure chooses)")
    parser.add_argument("--master", help="create fissure's own session on this master instead of spark-submit's")
    args = parser.parse_args(argv)

    output = absolute(args.output)
    checkpoint = absolute(args.checkpoint or output.rstrip("/") + "-checkpoint")
    if args.master:
        spark = create_session(fissure.RunnerConfig(master=args.master))
    else:
        spark = SparkSession.builder.appName("fissure-wordcount").getOrCreate()
    print(f"driver: {where_fissure_runs()}")
    slots = max(1, spark.sparkContext.defaultParallelism)
    executors = spark.sparkContext.parallelize(range(slots), slots).map(where_fissure_runs).distinct().collect()
    for line in sorted(executors):
        print(f"executor: {line}")

    pipeline = build_pipeline()
    source = fissure.FileSource(absolute(args.input), format="text",
                                max_files_per_trigger=args.files_per_batch)
    report = fissure.run(pipeline, source, fissure.FileSink(output, format="json"), plan=args.plan,
                         checkpoint=checkpoint, config=fissure.RunnerConfig(spark=spark, progress="off"))
    batches = f"{report.batches} micro-batch" + ("" if report.batches == 1 else "es")
    print(f"{report.input_records} lines in {batches}, plan {describe_plan(report.plan, pipeline)}")
    if report.input_records:
        totals = spark.read.json(output).groupBy("word").max("count").collect()
        for word, total in sorted(totals, key=lambda row: (-row[1], row[0])):
            print(f"TOTAL {word} {total}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
