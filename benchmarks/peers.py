"""The peers of benchmarks/cost.py: what a user might run instead of fissure, over the same files.

- bytewax 0.21, one worker (`bytewax.run.cli_main(flow, workers_per_process=1)`), over the
  examples' own functions: LogWatch, the per-occurrence word count, the CPU chain, and Nexmark's
  hot items in bytewax's own event-time windows. Optional:
  `pip install -e ".[bench]"` installs it (pinned; never a dependency of fissure itself).
- Spark's own operators, where the workload is SQL: the word count as `explode(split())` and
  `groupBy().count()`, a streaming query over the same files, `update` output mode; Nexmark's hot
  items as `from_json`, a count per auction and 10-second window, then per window the auction
  with the most bids (a second windowed aggregation over `window_time`), `append` output mode
  with the program's 5 seconds of lateness as the watermark.
- A hand-written `transformWithStateInPandas` word count: the words (split by Spark) grouped into
  8 hash buckets, each bucket's counts in a MapState (word -> count), the shuffle partitioned to
  the cores.

Spark's queries are measured as fissure's are (benchmarks/spark_chain.py's steady rate: the
micro-batches after the first); bytewax, like the direct loops, over its whole run. pyspark and
bytewax are imported where used: tests/benchmarks/test_direct_loops.py runs the bytewax flows without Spark.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "examples"))
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

BYTEWAX_VERSION = "0.21"
TWS_BUCKETS = 8


def bytewax_missing() -> str | None:
    """Why the bytewax peer cannot run here (None: it can)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("bytewax")
    except PackageNotFoundError:
        return 'bytewax is not installed (pip install -e ".[bench]")'
    if not found.startswith(BYTEWAX_VERSION + "."):
        return f"bytewax {found} is installed; the benchmark's flows are written for {BYTEWAX_VERSION}.x"
    return None


# -- bytewax ----------------------------------------------------------------------------------------


def _bytewax_io():
    """A source of the files' lines, in order, in one partition (order matters to LogWatch's state),
    and a sink that drops what it gets (fissure's runs write to a no-op sink too)."""
    from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition, batch
    from bytewax.outputs import DynamicSink, StatelessSinkPartition

    class _Lines(StatefulSourcePartition):
        def __init__(self, paths, batch_size):
            self._batches = batch(_lines_of(paths), batch_size)

        def next_batch(self):
            return next(self._batches)

        def snapshot(self):
            return None

    class LinesOfFiles(FixedPartitionedSource):
        def __init__(self, paths, batch_size=1000):  # bytewax's FileSource reads 1,000 lines a batch
            self.paths, self.batch_size = list(paths), batch_size

        def list_parts(self):
            return ["lines"]

        def build_part(self, step_id, for_part, resume_state):
            return _Lines(self.paths, self.batch_size)

    class _Drop(StatelessSinkPartition):
        def write_batch(self, items):
            pass

    class Discard(DynamicSink):
        def build(self, step_id, worker_index, worker_count):
            return _Drop()

    return LinesOfFiles, Discard


def _lines_of(paths):
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                yield line.rstrip("\n")  # as bytewax's own file sources give lines


def _keyed(fn):
    """fissure's fn(state, record) as a bytewax stateful mapper (state None -> {})."""
    def step(state, record):
        if state is None:
            state = {}
        return state, fn(state, record)
    return step


def _in_order(fn, field: str):
    """fissure's `partitioned(fn, order_by=field)` as a bytewax stateful_batch builder: each batch
    of a key's records sorted by `field`, fn(state, record) on each, its records (not None) out.
    Without the sort LogWatch finds other break-ins: bytewax hands a keyed step the records of a
    batch grouped by the previous step's keys, not in the order they were read."""
    from bytewax.operators import StatefulBatchLogic

    class InOrder(StatefulBatchLogic):
        def __init__(self, resume_state):
            self.state = {} if resume_state is None else resume_state

        def on_batch(self, values):
            out = []
            for record in sorted(values, key=lambda value: value[field]):
                result = fn(self.state, record)
                if result is not None:
                    out.append(result)
            return out, StatefulBatchLogic.RETAIN

        def snapshot(self):
            return self.state

    return InOrder


def _parsed_or_none(record):
    from logwatch import parsed

    try:
        return parsed(record)
    except ValueError:
        return None


def bytewax_flow(family: str, paths: list[str], sink=None):
    """The bytewax dataflow of a workload family over `paths`; `sink` (default: one that drops
    everything) gets its output records."""
    import bytewax.operators as op
    from bytewax.dataflow import Dataflow

    LinesOfFiles, Discard = _bytewax_io()
    flow = Dataflow(f"{family}_bytewax")
    text = op.input("read", flow, LinesOfFiles(paths))
    if family == "logwatch":
        from logwatch import breakins, cutoff, events, lines, range_, raw_events, realtime, results

        records = op.map("lines", text, lambda line: lines({"value": line}))
        records = op.filter_map("parsed", records, _parsed_or_none)
        records = op.filter("raw_events", records, raw_events)
        records = op.flat_map("events", records, events)
        records = op.key_rm("ranged", op.stateful_batch(
            "range", op.key_on("by_host", records, lambda e: e["host"]), _in_order(range_, "ts")))
        records = op.filter("cutoff", records, cutoff)
        records = op.map("realtime", records, realtime)
        records = op.key_rm("found", op.stateful_batch(
            "breakins", op.key_on("by_user", records, lambda e: e["user"]), _in_order(breakins, "ts")))
        out = op.key_rm("numbered", op.stateful_batch(
            "results", op.key_on("all", records, lambda _: "all"), _in_order(results, "ts")))
    elif family == "wordcount":
        from wordcount import count, words

        records = op.flat_map("words", text, lambda line: words({"value": line}))
        out = op.key_rm("counted", op.stateful_map("count", op.key_on("by_word", records, lambda r: r["word"]),
                                                   _keyed(count)))
    elif family == "cpu":
        from spark_chain import busy

        out = op.map("parse", text, json.loads)
        for number in range(4):
            out = op.map(f"busy{number + 1}", out, busy)
    elif family == "hot-items":
        out = _bytewax_hot_items(text)
    else:
        raise ValueError(f"no bytewax flow for {family!r}")
    op.output("out", out, sink if sink is not None else Discard())
    return flow


def _bytewax_hot_items(lines):
    """Nexmark's hot items in bytewax's own windows over the example's functions: `parse_bid`,
    bids counted per auction in 10-second tumbling windows of event time (`count_window`), then
    per window the auction with the most (`fold_window` with `MostBids`). The watermark is the
    largest event time less the program's lateness: bytewax's event clock also adds the system
    time since that bid was read, frozen here so that a slow stretch of the run judges nothing
    late. Each key has its own clock in bytewax; the end of the input closes every window."""
    from datetime import datetime, timedelta, timezone

    import bytewax.operators as op
    from bytewax.operators.windowing import EventClock, TumblingWindower, count_window, fold_window

    from hot_items import LATENESS_S, WINDOW_S, MostBids, parse_bid

    epoch = datetime.fromtimestamp(0, tz=timezone.utc)

    def event_clock(seconds_of):
        return EventClock(ts_getter=lambda item: epoch + timedelta(seconds=seconds_of(item)),
                          wait_for_system_duration=timedelta(seconds=LATENESS_S), now_getter=lambda: epoch,
                          to_system_utc=lambda _: None)

    windows = TumblingWindower(length=timedelta(seconds=WINDOW_S), align_to=epoch)  # window id n: [10 n, 10 n + 10)
    bids = op.map("parse", lines, lambda line: parse_bid({"value": line}))
    counted = count_window("bids", bids, event_clock(lambda bid: bid["ts"]), windows,
                           key=lambda bid: str(bid["auction"]))
    periods = op.key_on("by_period", op.map("as_period", counted.down, lambda item: {
        "period": item[1][0] * WINDOW_S, "auction": int(item[0]), "count": item[1][1]}),
        lambda period: str(period["period"]))
    most = MostBids()
    hottest = fold_window("hottest", periods, event_clock(lambda period: period["period"] + WINDOW_S / 2), windows,
                          most.create, most.add, most.merge)
    return op.map("result", hottest.down, lambda item: {"period": item[1][0] * WINDOW_S, **most.result(item[1][1])})


def run_bytewax(flow) -> None:
    """Run a flow to its end with one worker, as `python -m bytewax.run FLOW -w 1` does."""
    from bytewax.run import cli_main

    cli_main(flow, workers_per_process=1)


def bytewax_rate(family: str, paths: list[str], records: int) -> float:
    """Records per second of the family's flow over `paths` (`records` of them), one worker."""
    started = time.perf_counter()
    run_bytewax(bytewax_flow(family, paths))
    return records / (time.perf_counter() - started)


def bytewax_output(family: str, paths: list[str]) -> list:
    from bytewax.testing import TestingSink

    collected: list = []
    run_bytewax(bytewax_flow(family, paths, TestingSink(collected)))
    return collected


# -- Spark's own operators and transformWithStateInPandas --------------------------------------------


def _words(spark, source):
    """The source's lines as one lowercased word a row (Python's str.split: runs of whitespace,
    no empty words)."""
    from pyspark.sql import functions as F

    words = source.open(spark).select(F.explode(F.split(F.lower(F.col("value")), r"\s+")).alias("word"))
    return words.where(F.col("word") != "")


def spark_sql_wordcount(spark, source):
    """The word count in Spark's own operators: a running count per word, `update` mode."""
    return _words(spark, source).groupBy("word").count()


def _bucket_word_count():
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class BucketWordCount(StatefulProcessor):
        """One hash bucket of words: its words' counts in a MapState, one output row per word the
        micro-batch counted."""

        def init(self, handle) -> None:
            self.counts = handle.getMapState("counts", "word string", "count long")

        def handleInputRows(self, key, rows, timerValues):
            batch = pd.concat(list(rows), ignore_index=True)["word"].value_counts()
            words, totals = [], []
            for word, number in batch.items():
                before = self.counts.getValue((word,))
                total = int(number) + (before[0] if before is not None else 0)
                self.counts.updateValue((word,), (total,))
                words.append(word)
                totals.append(total)
            yield pd.DataFrame({"word": words, "count": totals})

        def close(self) -> None:
            pass

    return BucketWordCount()


def spark_tws_wordcount(spark, source, buckets: int = TWS_BUCKETS):
    """The word count as a user writes it with transformWithStateInPandas: grouped by a hash
    bucket of the word (`pmod(hash(word), buckets)`), not by the word (one handler call per word
    and micro-batch would cost more than the counting)."""
    from pyspark.sql import functions as F

    bucketed = _words(spark, source).withColumn("bucket", F.pmod(F.hash("word"), F.lit(buckets)))
    return bucketed.groupBy("bucket").transformWithStateInPandas(
        statefulProcessor=_bucket_word_count(), outputStructType="word string, count long",
        outputMode="Update", timeMode="None")


def spark_sql_hot_items(spark, source):
    """Nexmark's hot items in Spark's own operators (no Python on the record path): the bids parsed
    by `from_json`, counted per auction and 10-second event-time window, then per window the
    auction with the most bids, the lower id on a tie (the largest of (count, -auction)), chained
    over the first windows' `window_time`, with the program's lateness as the watermark. Spark
    emits a window once the watermark passes its end (`append` mode): at the end of a bounded
    input the last windows stay open in its state, as the watermark never passes them."""
    from pyspark.sql import functions as F

    from hot_items import LATENESS_S, WINDOW_S

    window = f"{WINDOW_S:g} seconds"
    bid = F.from_json(F.col("value"), "auction long, ts double")
    bids = (source.open(spark).select(bid.alias("bid"))
            .select(F.col("bid.auction").alias("auction"), F.timestamp_seconds(F.col("bid.ts")).alias("event_time"))
            .withWatermark("event_time", f"{LATENESS_S:g} seconds"))
    counts = bids.groupBy(F.window("event_time", window), "auction").count()
    hottest = (counts.select(F.window_time("window").alias("counted_at"), "auction", "count")
               .groupBy(F.window("counted_at", window))
               .agg(F.max(F.struct(F.col("count"), (-F.col("auction")).alias("lower_id"))).alias("most")))
    return hottest.select((F.unix_micros(F.col("window.start")) / 1e6).alias("period"),
                          (-F.col("most.lower_id")).alias("auction"), F.col("most.count").alias("bids"))


# (family, peer) -> (the query over a source, its output mode)
SPARK_PEERS = {("wordcount", "spark-sql"): (spark_sql_wordcount, "update"),
               ("wordcount", "spark-tws"): (spark_tws_wordcount, "update"),
               ("hot-items", "spark-sql"): (spark_sql_hot_items, "append")}
# The peers that leave the last windows of a bounded input open (append mode, above): their
# check compares the windows they emitted, and the ones they did not must be the input's last.
LAST_WINDOWS_OPEN = {("hot-items", "spark-sql")}


def _configure(spark, peer: str) -> None:
    """The settings a user gives such a query on this machine: a shuffle partition per core; the
    state store Spark uses by default for SQL aggregation, RocksDB (which transformWithState
    needs) with changelog checkpointing for transformWithStateInPandas."""
    spark.conf.set("spark.sql.shuffle.partitions", str(spark.sparkContext.defaultParallelism))
    provider = "spark.sql.streaming.stateStore.providerClass"
    if peer == "spark-tws":
        spark.conf.set(provider, "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
        spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    else:
        spark.conf.unset(provider)


def spark_peer_rate(spark, family: str, peer: str, source, checkpoint: str) -> float:
    """The steady rate (input records per second after the first micro-batch) of a Spark peer."""
    from spark_chain import steady_rate

    _configure(spark, peer)
    frame, mode = SPARK_PEERS[family, peer]
    query = (frame(spark, source).writeStream.format("noop").outputMode(mode)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    return steady_rate(query.recentProgress)


def spark_peer_output(spark, family: str, peer: str, source, checkpoint: str) -> list[dict]:
    """Every row a Spark peer emits, collected on the driver."""
    _configure(spark, peer)
    rows: list[dict] = []
    frame, mode = SPARK_PEERS[family, peer]
    query = (frame(spark, source).writeStream.outputMode(mode)
             .foreachBatch(lambda frame, _: rows.extend(row.asDict() for row in frame.collect()))
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    return rows
