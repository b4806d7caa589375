"""Where a record's time goes on the Spark path, part by part, in microseconds per input record.

For the workloads of benchmarks/cost.py (their programs, input files and direct loops come from
benchmarks/direct_loops.py): LogWatch, and the word count over a Zipf vocabulary of 10,000 words
as its two fissure programs, the aggregate (`aggregate(..., Count())`, combined before the
exchange) and the running count per occurrence (`partitioned`); and Nexmark's hot items
(examples/hot_items.py: bids counted per auction and 10-second window, `window(..., Count())`
combined before the exchange, then the auction with the most bids per window). Parts:

- jvm: Spark reads the workload's files and drops the rows (a `noop` sink), no Python;
- arrow: the same through an identity `mapInArrow` (Arrow batches into a Python worker and back,
  no fissure code), less jvm;
- exchange: Spark's shuffle of the rows a keyed stage receives (`repartition` on the key, then the
  identity `mapInArrow`), less the same query without the repartition. The rows are made by Spark
  without Python: the word count's words (`explode(split(lower(value)))`, keyed by the word), and
  LogWatch's lines (keyed by the line), scaled by the events a line makes (those cross its first
  exchange; its later exchanges, of fewer records, are not measured), and the hot items' bids
  (the JSON lines parsed by `from_json`, keyed by the auction). The aggregate word count and the
  hot items ship partials, not rows: their exchange is scaled by the share of rows that cross at
  most (`crossing_share`: a task sends each distinct key of its micro-batch once, a word, or an
  auction and 10-second window; the hot items' second exchange, a partial per window, is not
  measured);
- conversion: fissure's own Arrow -> dicts (`fissure.runtime.records.arrow_rows.batch_records`)
  and dicts -> Arrow (`pyarrow.RecordBatch.from_pylist`, as `records_to_batch` does), timed in
  this process over the first --sample-records input lines and, where they cross the exchange as
  records, the keyed records they make (LogWatch's events, the per-occurrence word count's words;
  the aggregate word count's and the hot items' partials are not converted as records), one thread;
- state: the keyed operators' state read and write, in this process: the state codec's calls
  (`StateCodec.loads/dumps/seal/unseal`) while `LocalGraphRun` runs the program's micro-batches
  (only the batches after the first are timed: a steady batch reads the states the earlier wrote).
  Spark's state-server requests and the packing of a bucket's entries are not in it. The hot
  items' windows fire only as the watermark passes them: the second batch runs with the
  watermark the first left, so it counts its bids into the open windows' state and fires the
  windows that watermark closes; the windows still open after it are never fired (no end of
  input is run), as in a steady micro-batch of an unbounded stream;
- operator: the direct loop (the user's functions called directly, dict state), one thread;
- total: fissure's run of the program under the planner's plan, its steady rate.

The word count's exchange pair and its per-occurrence total run over the first --subset-files
files (10 of 20: two micro-batches of 5 files, the second steady): their figures are per record, and the
per-occurrence program runs at about a tenth of the aggregate's rate.

The Spark parts (jvm, arrow, exchange, total) are wall time per record on `local[2]`, both cores
working; the in-process parts take one thread and are divided by the cores (`cores`) to stand
beside them, as if both cores shared them evenly. `unexplained` = total - the parts, shown as it
comes out (negative when the parts overlap or overstate). The method of benchmarks/method.py: one
uncounted warm-up, every variant of a workload in one block of --repeats (at least 3) repeats in
an order rotated each repeat, medians; the machine's speed taken in a fresh process before and
after. Results: record_breakdown.md/.json under --out.

    ./dev python benchmarks/record_breakdown.py            # 1,000,000 records a workload (quiet machine)
    ./dev python benchmarks/record_breakdown.py --quick    # tiny inputs, one repeat: a check of the script
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "examples"))
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

import direct_loops  # noqa: E402
import method  # noqa: E402

VOCABULARY = 10_000
ARROW_BATCH_ROWS = 10_000  # rows of an Arrow batch a fused stage receives (Spark's maxRecordsPerBatch)
PARTS = ("jvm", "arrow", "exchange", "conversion", "state", "operator")
WHAT = {
    "jvm": "Spark reads the files, a noop sink (no Python)",
    "arrow": "identity mapInArrow: Arrow batches into Python and back, less jvm",
    "exchange": "Spark's shuffle of the keyed rows (repartition on the key), less the same without it",
    "conversion": "fissure's Arrow <-> dicts over the same rows, in process, one thread / cores",
    "state": "the state codec's calls while the program runs in process, one thread / cores",
    "operator": "the direct loop: the user's functions, dict state, one thread / cores",
}


@dataclass(frozen=True)
class Workload:
    """A fissure program of a family: `variant` "" (the plain one) or "aggregate". `keyed_records`
    says whether the records a keyed stage receives cross the exchange as records (and so are
    converted to Arrow and back); the aggregate's partials do not: its words are folded in the
    stage that makes them."""

    name: str
    family: str
    variant: str
    keyed_records: bool


WORKLOADS = (Workload("logwatch", "logwatch", "", True),
             Workload("wordcount, aggregate", "wordcount", "aggregate", False),
             Workload("wordcount, per occurrence", "wordcount", "", True),
             Workload("hot-items", "hot-items", "", False))
FAMILIES = ("logwatch", "wordcount", "hot-items")


# -- the arithmetic (pure) --------------------------------------------------------------------------


def crossing_share(distinct_keys: list[int], rows: list[int], tasks: int) -> float:
    """The share of a stage's rows that cross the exchange at most, when each of `tasks` tasks of a
    micro-batch sends one partial per distinct key: per batch min(rows, tasks x distinct keys),
    summed over the batches, over all rows."""
    if len(distinct_keys) != len(rows):
        raise ValueError("one count of distinct keys per batch of rows")
    total = sum(rows)
    if total <= 0:
        return 0.0
    return sum(min(count, tasks * distinct) for distinct, count in zip(distinct_keys, rows)) / total


def breakdown(medians: dict[str, float], cores: int, crossing: float = 1.0) -> dict[str, float]:
    """The parts of a record's time (us per input record) from the medians of the measured runs:
    `jvm`, `arrow` (the identity mapInArrow), `exchange` and `exchange-base` (with and without the
    repartition, over the keyed rows), `conversion`, `state` and `operator` (one thread, in
    process) and `total` (fissure's run). Spark's parts are differences of runs; the in-process
    parts are divided by `cores`; the exchange is scaled by `crossing`. `unexplained`: total - the
    parts, whatever its sign."""
    if cores < 1:
        raise ValueError("at least one core")
    parts = {"jvm": medians["jvm"],
             "arrow": medians["arrow"] - medians["jvm"],
             "exchange": (medians["exchange"] - medians["exchange-base"]) * crossing,
             "conversion": medians["conversion"] / cores,
             "state": medians["state"] / cores,
             "operator": medians["operator"] / cores}
    explained = sum(parts.values())
    return {**parts, "explained": explained, "total": medians["total"], "unexplained": medians["total"] - explained}


def ceiling(parts: dict[str, float], cores: int) -> dict[str, float]:
    """How close to the direct loop a run on this Spark path can come at most, from the parts (us
    per input record, as `breakdown` gives them). `direct`: the direct loop on one thread
    (operator x cores). `floor`: what a run that hands every record to the user's Python functions
    cannot avoid: Spark's read (with a micro-batch's fixed costs of a query without state), one
    Arrow round trip, and the functions themselves shared evenly by the cores. `ceiling` = direct /
    floor; `with_conversion` = direct / (floor + conversion): the dicts those functions take made
    and turned back as well. `fissure` = direct / total: where fissure's run stands. A stateful
    stage's own fixed cost a micro-batch is not in the floor (docs/profiling.md adds it)."""
    if cores < 1:
        raise ValueError("at least one core")
    direct = parts["operator"] * cores
    floor = parts["jvm"] + parts["arrow"] + parts["operator"]
    with_conversion = floor + parts["conversion"]

    def share(cost: float) -> float:
        return direct / cost if cost > 0 else float("nan")

    return {"direct": direct, "floor": floor, "ceiling": share(floor), "with_conversion": share(with_conversion),
            "fissure": share(parts["total"])}


def us_per_record(records_per_s: float) -> float:
    return 1e6 / records_per_s if records_per_s > 0 else float("inf")


# -- Spark's runs ---------------------------------------------------------------------------------


def spark_query_us(spark, frame, checkpoint: str) -> float:
    """us per input record of a streaming query over `frame` into a noop sink: its steady rate."""
    from spark_chain import steady_rate

    query = (frame.writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return us_per_record(steady_rate(query.recentProgress))


def through_python(frame):
    """`frame` through an identity mapInArrow: Arrow batches into a Python worker and back."""
    def identity(batches):  # nested: pickled by value, so the workers need not import this script
        yield from batches

    return frame.mapInArrow(identity, frame.schema)


def spark_bids(spark, source):
    """The hot items' bids parsed from their JSON lines by Spark (`from_json`), as `parse_bid`
    makes them: a row per line, its auction, bidder, price and ts."""
    from pyspark.sql import functions as F

    schema = "auction long, bidder long, price double, ts double"
    return source.open(spark).select(F.from_json(F.col("value"), schema).alias("bid")).select("bid.*")


def keyed_rows(spark, family: str, source):
    """The rows a keyed stage of the family receives, made by Spark without Python, and their key."""
    if family == "wordcount":
        from peers import _words

        return _words(spark, source), "word"
    if family == "hot-items":
        return spark_bids(spark, source), "auction"
    return source.open(spark), "value"


def spark_variants(spark, family: str, source, fresh: Callable[[], str],
                   exchange_source=None) -> dict[str, Callable[[], float]]:
    """jvm and arrow over `source`; the exchange pair over `exchange_source` (default `source`)."""
    from pyspark.sql import functions as F

    cores = spark.sparkContext.defaultParallelism

    def exchange(repartition: bool) -> float:
        rows, key = keyed_rows(spark, family, exchange_source or source)
        if repartition:
            rows = rows.repartition(cores, F.col(key))
        return spark_query_us(spark, through_python(rows), fresh())

    return {"jvm": lambda: spark_query_us(spark, source.open(spark), fresh()),
            "arrow": lambda: spark_query_us(spark, through_python(source.open(spark)), fresh()),
            "exchange-base": lambda: exchange(False),
            "exchange": lambda: exchange(True)}


def fissure_us(spark, program, source, checkpoint: str) -> float:
    from fissure.plan.plans import planner_plan
    from spark_chain import measure_fissure

    plan = planner_plan(program, spark.sparkContext.defaultParallelism)
    return us_per_record(measure_fissure(spark, program, source, plan, checkpoint))


# -- in process -----------------------------------------------------------------------------------


def file_lines(paths: list[str]) -> list[str]:
    """The files' lines as Spark's text source gives them (no line ends)."""
    lines = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            lines.extend(line.rstrip("\n").rstrip("\r") for line in handle)
    return lines


def file_lines_upto(paths: list[str], limit: int) -> list[str]:
    """The first `limit` lines of the files, as Spark's text source gives them."""
    lines: list[str] = []
    for path in paths:
        if len(lines) >= limit:
            break
        lines.extend(file_lines([path]))
    return lines[:limit]


def exchanged_records(family: str, lines: list[str]) -> list[dict]:
    """The records a keyed stage of the family receives, made by the example's own functions: the
    word count's words, the hot items' bids, LogWatch's events."""
    if family == "wordcount":
        return [word for line in lines for word in direct_loops.words({"value": line})]
    if family == "hot-items":
        from hot_items import parse_bid

        return [parse_bid({"value": line}) for line in lines]
    from logwatch import events, lines as line_record, parsed, raw_events

    out = []
    for line in lines:
        try:
            record = parsed(line_record({"value": line}))
        except ValueError:
            continue
        if raw_events(record):
            out.extend(events(record))
    return out


def conversion_us(record_sets: list[list[dict]], records: int) -> float:
    """us per input record (`records` of them, which the sets stand for) of fissure's conversions
    over every set: Arrow batches of ARROW_BATCH_ROWS rows to dicts (`batch_records`) and the dicts
    back to Arrow.

    The garbage the other runs of the block leave is collected before each timed loop: with
    3,000,000 dicts held beside 100,000 word-count lines, a full collection landing inside the
    loop took one run from 0.23 to 1.32 us a line, and the aggregate word count's median read
    0.91 in one results file where the run before read 0.21."""
    import pyarrow as pa

    from fissure.runtime.records.arrow_rows import batch_records

    spent = 0.0
    for rows in record_sets:
        if not rows:
            continue
        table = pa.Table.from_pylist(rows)
        batches = table.to_batches(max_chunksize=ARROW_BATCH_ROWS)
        gc.collect()
        started = time.perf_counter()
        for batch in batches:
            pa.RecordBatch.from_pylist(batch_records(batch), schema=batch.schema)
        spent += time.perf_counter() - started
    return 1e6 * spent / max(1, records)


@contextmanager
def timed_state_codec() -> Iterator[list[float]]:
    """Time every call of StateCodec's loads, dumps, seal and unseal while the block runs: the
    list's one value is the seconds spent (reset it to start counting)."""
    from fissure.runtime.state.codec import StateCodec

    spent = [0.0]
    originals = {name: getattr(StateCodec, name) for name in ("loads", "dumps", "seal", "unseal")}

    def timed(function):
        def call(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - started
        return call

    for name, function in originals.items():
        setattr(StateCodec, name, timed(function))
    try:
        yield spent
    finally:
        for name, function in originals.items():
            setattr(StateCodec, name, function)


def state_us(program, batches: list[list[str]]) -> float:
    """us per input record of the state codec's calls in the micro-batches after the first, the
    program run in process (`LocalGraphRun`) over `batches` of lines."""
    from fissure.local.executor import LocalGraphRun
    from fissure.program.graph import as_graph

    graph = as_graph(program)
    run = LocalGraphRun(graph)
    (source,) = graph.sources
    timed_records = 0
    with timed_state_codec() as spent:
        for number, lines in enumerate(batches):
            if number == 1:
                spent[0] = 0.0
            if number >= 1:
                timed_records += len(lines)
            run.run_batch({source: [{"value": line} for line in lines]})
    return 1e6 * spent[0] / max(1, timed_records)


def operator_us(family: str, paths: list[str], records: int) -> float:
    loop = direct_loops.DIRECT[family][0]
    started = time.perf_counter()
    loop(paths)
    return 1e6 * (time.perf_counter() - started) / records


# -- the runs -------------------------------------------------------------------------------------


def batches_of(paths: list[str], files_per_batch: int) -> list[list[str]]:
    return [paths[start:start + files_per_batch] for start in range(0, len(paths), files_per_batch)]


def partial_keys(family: str, line: str) -> list:
    """The keys a line's rows are combined under before the exchange: the word count's words, the
    hot items' (auction, window start) of its bid (a 10-second tumbling window, as Tumbling
    assigns it)."""
    if family == "hot-items":
        from hot_items import WINDOW_S, parse_bid

        bid = parse_bid({"value": line})
        return [(bid["auction"], (bid["ts"] // WINDOW_S) * WINDOW_S)]
    return [record["word"] for record in direct_loops.words({"value": line})]


def distinct_keys(family: str, paths_by_batch: list[list[str]]) -> tuple[list[int], list[int]]:
    """Per micro-batch of files: its distinct partial keys and its rows (`partial_keys`)."""
    distinct, counts = [], []
    for paths in paths_by_batch:
        seen, count = set(), 0
        for line in file_lines(paths):
            for key in partial_keys(family, line):
                seen.add(key)
                count += 1
        distinct.append(len(seen))
        counts.append(count)
    return distinct, counts


def subset_source(paths: list[str], directory: Path, files_per_batch: int):
    """A file source over `paths` alone (linked, or copied where links cannot be made)."""
    import fissure

    directory.mkdir(parents=True, exist_ok=True)
    for path in paths:
        target = directory / Path(path).name
        try:
            os.link(path, target)
        except OSError:
            shutil.copyfile(path, target)
    return fissure.FileSource(str(directory), format="text", max_files_per_trigger=files_per_batch)


def family_variants(spark, family: str, work: Path, args, fresh: Callable[[], str]) -> tuple[dict, dict]:
    """The measured variants of a family's block (label -> a callable giving us per input record)
    and what the report needs beside them. The in-process conversion and state run over the first
    lines of the input (a sample: a million lines' words as dicts would not fit the machine's
    memory beside Spark); the word count's exchange and its per-occurrence total over the first
    `subset_files` files (their rates are per record: a share of the files keeps the run short)."""
    source = direct_loops.write_input(family, work / family, args.records, args.files, args.files_per_batch,
                                      VOCABULARY if family == "wordcount" else None)
    paths = direct_loops.input_files(work / family)
    records = direct_loops.count_records(paths)
    subset = None
    if family == "wordcount" and args.subset_files < len(paths):
        subset = subset_source(paths[:args.subset_files], work / "wordcount-subset", args.files_per_batch)
    sample_lines = file_lines_upto(paths, max(args.sample_records, 2 * args.state_batch_records))
    sample = sample_lines[:args.sample_records]
    keyed = exchanged_records(family, sample)
    state_lines = sample_lines[:2 * args.state_batch_records]
    state_batches = [state_lines[:args.state_batch_records], state_lines[args.state_batch_records:]]
    programs = direct_loops.programs(family)
    variants = spark_variants(spark, family, source, fresh, exchange_source=subset or source)
    variants["operator"] = lambda: operator_us(family, paths, records)
    info = {"records": records, "files": len(paths), "sample_records": len(sample), "keyed_records_in_sample": len(keyed),
            "exchange_files": args.subset_files if subset else len(paths), "workloads": {}}
    cores = spark.sparkContext.defaultParallelism
    for workload in WORKLOADS:
        if workload.family != family:
            continue
        program = programs[workload.variant]
        suffix = f" ({workload.name})" if family == "wordcount" else ""
        sets = [[{"value": line} for line in sample]] + ([keyed] if workload.keyed_records else [])
        variants["conversion" + suffix] = lambda sets=sets: conversion_us(sets, len(sample))
        variants["state" + suffix] = lambda program=program: state_us(program, state_batches)
        total_source, total_records = source, records
        if workload.name == "wordcount, per occurrence" and subset is not None:
            total_source, total_records = subset, direct_loops.count_records(paths[:args.subset_files])
        variants["total" + suffix] = lambda program=program, total_source=total_source: \
            fissure_us(spark, program, total_source, fresh())
        if not workload.keyed_records:  # partials: the aggregate word count's, the hot items' bids window's
            crossing = crossing_share(*distinct_keys(family, batches_of(paths, args.files_per_batch)), tasks=cores)
        elif family == "logwatch":  # the lines shuffled stand for the events that cross, fewer than the lines
            crossing = len(keyed) / max(1, len(sample))
        else:  # the words shuffled are the words that cross
            crossing = 1.0
        info["workloads"][workload.name] = {"suffix": suffix, "crossing": crossing, "total_records": total_records,
                                            "state_records": len(state_batches[1])}
    return variants, info


def medians_of(block_medians: dict[str, float], suffix: str) -> dict[str, float]:
    """One workload's medians under the names `breakdown` takes."""
    names = ("jvm", "arrow", "exchange-base", "exchange", "operator", "conversion", "state", "total")
    return {name: block_medians[name + suffix] if name + suffix in block_medians else block_medians[name]
            for name in names}


CROSSING_NOTES = {
    "wordcount": "the share of words that cross at most, as partials",
    "hot-items": "the share of bids that cross at most, as partial counts, one per auction and 10-second window "
                 "a task's micro-batch holds (the second exchange, a partial per window, is not measured)",
    "logwatch": "the keyed records (events) a line makes, in the conversion's sample",
}


def report(document: dict) -> str:
    lines = ["# What a record costs, part by part, on the Spark path", "",
             "Microseconds per input record. Spark's parts (jvm, arrow, exchange) and the total are wall time on "
             f"local[{document['cores']}], both cores working; conversion, state and operator are one thread's time in "
             f"process divided by the {document['cores']} cores. `unexplained` is the total less the parts, as it comes "
             "out. One uncounted warm-up; per family one block, its runs in an order rotated each repeat; medians. "
             "How each part is measured: docs/profiling.md, \"What a record costs, part by part\".", "",
             "| workload | jvm | arrow | exchange | conversion | state | operator | parts | total | unexplained |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, result in document["workloads"].items():
        parts = result["breakdown"]
        lines.append(f"| {name} | " + " | ".join(f"{parts[part]:.2f}" for part in PARTS)
                     + f" | {parts['explained']:.2f} | {parts['total']:.2f} | {parts['unexplained']:.2f} |")
    lines += ["", "| part | what |", "| --- | --- |"] + [f"| {part} | {WHAT[part]} |" for part in PARTS]
    lines += ["", "The most any run on this path can reach against the direct loop: the floor is Spark's read, one Arrow "
              "round trip and the user's functions on every core (jvm + arrow + operator), us per input record; the "
              "ceiling is the direct loop's time on one thread over the floor (with conversion: over the floor and the "
              "conversion); fissure is the direct loop's time over fissure's total. A stateful stage's fixed cost a "
              "micro-batch is not in the floor.", "",
              "| workload | direct loop, one thread | floor | ceiling x direct loop | with conversion | fissure x direct "
              "loop |", "| --- | --- | --- | --- | --- | --- |"]
    for name, result in document["workloads"].items():
        bound = result["ceiling"]
        lines.append(f"| {name} | {bound['direct']:.2f} | {bound['floor']:.2f} | {bound['ceiling']:.3f} | "
                     f"{bound['with_conversion']:.3f} | {bound['fissure']:.3f} |")
    lines += ["", "Inputs:", ""]
    for family, info in document["families"].items():
        lines.append(f"- {family}: {info['records']:,} records in {info['files']} files, {document['files_per_batch']} a "
                     f"micro-batch; the exchange over {info['exchange_files']} files; conversion over the first "
                     f"{info['sample_records']:,} records, which make the {info['keyed_records_in_sample']:,} records its "
                     "first keyed stage receives")
        for name, workload in info["workloads"].items():
            notes = [f"total over {workload['total_records']:,} records",
                     f"state over a steady in-process batch of {workload['state_records']:,}"]
            if workload["crossing"] != 1.0:
                notes.append(f"exchange scaled by {workload['crossing']:.3f}: " + CROSSING_NOTES[family])
            lines.append(f"  - {name}: " + "; ".join(notes))
    lines += ["", "Medians of every run (us per input record):", "", "| family | run | median |", "| --- | --- | --- |"]
    for family, block in document["blocks"].items():
        for label, value in block["medians"].items():
            lines.append(f"| {family} | {label} | {value:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser)
    parser.add_argument("--records", type=int, default=1_000_000, help="input records a family")
    parser.add_argument("--files", type=int, default=20, help="input files a family")
    parser.add_argument("--files-per-batch", type=int, default=5, help="files a micro-batch")
    parser.add_argument("--subset-files", type=int, default=10,
                        help="files the word count's exchange and its per-occurrence total run over (the latter's "
                             "rate is about a tenth of the aggregate's: all 20 files would take most of the run)")
    parser.add_argument("--sample-records", type=int, default=100_000,
                        help="input records the in-process conversion runs over")
    parser.add_argument("--state-batch-records", type=int, default=50_000,
                        help="records of each of the two in-process micro-batches the state part runs")
    parser.add_argument("--only", choices=FAMILIES, help="one family")
    args = parser.parse_args(argv)
    if args.quick:
        args.records, args.files, args.files_per_batch, args.subset_files = 2_000, 4, 1, 3
        args.state_batch_records, args.sample_records, args.repeats = 300, 1_000, 1
    method.check_repeats(args.repeats, args.quick)
    run = method.Run("record_breakdown.py", argv, quick=args.quick, out=args.out)
    import fissure
    from fissure.plan.plans import sequential_plan
    from fissure.spark.session.create import create_session
    from spark_chain import cpu_pipeline, cpu_source, measure_fissure

    with method.scratch_folder("record_breakdown.py") as work:
        spark = create_session(fissure.RunnerConfig(master="local[2]"))
        try:
            cores = spark.sparkContext.defaultParallelism
            counter = [0]

            def fresh() -> str:
                counter[0] += 1
                return str(work / f"checkpoint-{counter[0]}")

            warm = cpu_pipeline(4)  # small: starts the Python workers, whatever the workloads' size
            document = {"cores": cores, "files_per_batch": args.files_per_batch, "families": {}, "blocks": {},
                        "workloads": {}}
            for family in FAMILIES:
                if args.only and family != args.only:
                    continue
                variants, info = family_variants(spark, family, work, args, fresh)
                block = method.measure_block(
                    variants, args.repeats, quick=args.quick,
                    warm_up=lambda: measure_fissure(spark, warm, cpu_source(work / f"warm-{family}", 2_000, 2),
                                                    sequential_plan(warm), fresh()),
                    warm_up_label="the CPU chain's sequential plan over 2,000 records",
                    log=lambda line, family=family: print(f"[{family}] {line}", file=sys.stderr, flush=True))
                medians = block.medians()
                document["families"][family] = info
                document["blocks"][family] = block.to_dict()
                for name, workload in info["workloads"].items():
                    own = medians_of(medians, workload["suffix"])
                    parts = breakdown(own, cores, workload["crossing"])
                    document["workloads"][name] = {"medians": own, "breakdown": parts, "ceiling": ceiling(parts, cores)}
        finally:
            method.end_spark(spark)
    run.write_results("record_breakdown", report(document), document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
