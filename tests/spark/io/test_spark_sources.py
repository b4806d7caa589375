"""Sources and sinks: each file format, the rate and socket sources, the console, memory and
foreachBatch sinks, all through the shared session; and how a failed run is described."""

from __future__ import annotations

import datetime
import json
import os
import socket
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import fissure
from fissure import Pipeline
from fissure.spark.session.create import describe_failure
from fissure.spark.io.sinks import ConsoleSink, ForeachBatchSink, MemorySink
from fissure.spark.io.sources import FileSource, RateSource, SocketSource

pytestmark = pytest.mark.spark

ROWS = [{"user": "ann", "amount": 1.5}, {"user": "bob", "amount": 2.0}, {"user": "ann", "amount": 4.0}]
SCHEMA = {"user": str, "amount": float}


def doubled(record):
    return {"user": record["user"], "amount": record["amount"] * 2}


def write_input(directory, file_format):
    os.makedirs(directory)
    path = os.path.join(directory, f"part-0.{file_format}")
    if file_format == "parquet":
        pq.write_table(pa.Table.from_pylist(ROWS, schema=pa.schema([("user", pa.string()), ("amount", pa.float64())])),
                       path)
    elif file_format == "csv":
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("user,amount\n" + "".join(f"{row['user']},{row['amount']}\n" for row in ROWS))
    elif file_format == "json":
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("".join(json.dumps(row) + "\n" for row in ROWS))
    else:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("".join(f"{row['user']} {row['amount']}\n" for row in ROWS))


def parse_text(record):
    user, amount = record["value"].split()
    return {"user": user, "amount": float(amount)}


@pytest.mark.parametrize("file_format", ["text", "json", "csv", "parquet"])
def test_every_file_format_is_a_source(spark, tmp_path, file_format):
    write_input(tmp_path / "in", file_format)
    pipeline = Pipeline(f"from-{file_format}")
    if file_format == "text":
        pipeline = pipeline.map("parse", parse_text, schema=SCHEMA, reads=["value"])
        source = FileSource(str(tmp_path / "in"))
    else:
        source = FileSource(str(tmp_path / "in"), format=file_format, schema=SCHEMA)
    sink = MemorySink()
    report = fissure.run(pipeline.map("doubled", doubled, reads=["amount"]), source, sink,
                         config=fissure.RunnerConfig(spark=spark, progress="off"))
    assert sorted((r["user"], r["amount"]) for r in sink.records()) == [("ann", 3.0), ("ann", 8.0), ("bob", 4.0)]
    assert report.input_records == 3


def test_file_source_refuses_both_batch_limits_and_bad_values():
    with pytest.raises(ValueError, match="not both"):
        FileSource("in", max_files_per_trigger=1, max_bytes_per_trigger=1024)
    with pytest.raises(ValueError, match="max_bytes_per_trigger must be a positive integer"):
        FileSource("in", max_bytes_per_trigger=0)


def test_bytes_per_trigger_bounds_each_micro_batch(spark, tmp_path):
    directory = tmp_path / "in"
    directory.mkdir()
    for number in range(3):
        path = directory / f"part-{number}.txt"
        path.write_text("".join(f"u{number} {i}\n" for i in range(100)))  # 600 bytes a file
        os.utime(path, (1_700_000_000 + number, 1_700_000_000 + number))
    sink = MemorySink()
    pipeline = Pipeline("bounded").map("parse", parse_text, schema=SCHEMA, reads=["value"])
    report = fissure.run(pipeline, FileSource(str(directory), max_bytes_per_trigger=700), sink,
                         config=fissure.RunnerConfig(spark=spark, progress="off"))
    assert report.batches == 3 and report.input_records == 300
    assert len(sink.records()) == 300


def stamp(record):
    return {"value": record["value"], "at": record["timestamp"], "key": f"k{record['value'] % 2}"}


def count_per_key(state, record):
    state["n"] = state.get("n", 0) + 1
    return {**record, "n": state["n"]}


STAMPED = {"value": int, "at": datetime.datetime, "key": str}


@pytest.mark.slow
def test_rate_source_through_keyed_state_keeps_counts_and_timestamps(spark, tmp_path):
    pipeline = (Pipeline("rate").map("stamp", stamp, schema=STAMPED, reads=["value", "timestamp"])
                .partitioned("count", count_per_key, key="key", order_by="value", schema={**STAMPED, "n": int}))
    sink = MemorySink()
    runner = fissure.Runner(pipeline, RateSource(rows_per_second=20), sink,
                            checkpoint=str(tmp_path / "ckpt"), config=fissure.RunnerConfig(spark=spark, progress="off"))
    runner.start()
    deadline = time.monotonic() + 90
    try:
        while sink.batches < 2 or len(sink.records()) < 10:
            assert time.monotonic() < deadline, "the rate source gave too few rows in 90 s"
            assert runner.query.isActive, runner.query.exception()
            time.sleep(0.5)
    finally:
        runner.stop()
    records = sorted(sink.records(), key=lambda r: r["value"])
    values = [r["value"] for r in records]
    assert values == list(range(len(values)))  # every row once, none skipped
    for key in ("k0", "k1"):
        assert [r["n"] for r in records if r["key"] == key] == list(range(1, sum(r["key"] == key for r in records) + 1))
    assert all(isinstance(r["at"], datetime.datetime) for r in records)
    assert [r["at"] for r in records] == sorted(r["at"] for r in records)


class LineServer:
    """A TCP server on 127.0.0.1 that sends `lines` to its first client, then holds the connection
    until stopped or `hold_s` passes: bounded, it ends by itself."""

    def __init__(self, lines, hold_s=60.0):
        self.lines, self.hold_s = lines, hold_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(hold_s)
        self.port = self.listener.getsockname()[1]
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="line-server", daemon=True)

    def _serve(self):
        try:
            connection, _ = self.listener.accept()
        except OSError:
            return
        with connection:
            connection.sendall("".join(line + "\n" for line in self.lines).encode())
            self.stopped.wait(self.hold_s)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.listener.close()
        self.thread.join(timeout=10)


def test_socket_source_reads_lines_from_a_tcp_server(spark, tmp_path):
    lines = [f"u{i % 3} {i}" for i in range(12)]
    pipeline = Pipeline("socket").map("parse", parse_text, schema=SCHEMA, reads=["value"])
    sink = MemorySink()
    with LineServer(lines) as server:
        runner = fissure.Runner(pipeline, SocketSource("127.0.0.1", server.port), sink,
                                checkpoint=str(tmp_path / "ckpt"),
                                config=fissure.RunnerConfig(spark=spark, progress="off"))
        runner.start()
        deadline = time.monotonic() + 60
        try:
            while len(sink.records()) < len(lines):
                assert time.monotonic() < deadline, f"got {len(sink.records())} of {len(lines)} lines in 60 s"
                assert runner.query.isActive, runner.query.exception()
                time.sleep(0.3)
        finally:
            runner.stop()
    assert sorted(r["amount"] for r in sink.records()) == [float(i) for i in range(12)]


def test_console_sink_prints_each_batch(spark, tmp_path, capsys):
    source = FileSource(str(tmp_path / "in"), format="json", schema=SCHEMA)
    write_input(tmp_path / "in", "json")
    fissure.run(Pipeline("console").map("doubled", doubled), source, ConsoleSink(),
                config=fissure.RunnerConfig(spark=spark, progress="off"))
    printed = capsys.readouterr().out
    assert "--- batch 0 ---" in printed
    assert "ann" in printed and "8.0" in printed and "bob" in printed


def test_memory_sink_is_a_queryable_view_and_foreach_batch_gets_batch_ids(spark, tmp_path):
    write_input(tmp_path / "in", "json")
    source = FileSource(str(tmp_path / "in"), format="json", schema=SCHEMA)
    sink = MemorySink("fissure_doubled")
    fissure.run(Pipeline("memory").map("doubled", doubled), source, sink,
                config=fissure.RunnerConfig(spark=spark, progress="off"))
    totals = {row.user: row.total for row in
              spark.sql("SELECT user, SUM(amount) AS total FROM fissure_doubled GROUP BY user").collect()}
    assert totals == {"ann": 11.0, "bob": 4.0}

    seen = []
    each_batch = ForeachBatchSink(lambda frame, batch_id: seen.append((batch_id, frame.count(), frame.columns)))
    fissure.run(Pipeline("each").map("doubled", doubled), source, each_batch,
                config=fissure.RunnerConfig(spark=spark, progress="off"))
    assert seen == [(0, 3, ["user", "amount"])]


def failing_sink(frame, batch_id):
    raise ValueError("the sink is full")


def test_a_failed_run_is_described_briefly_and_logged_in_full(spark, tmp_path):
    write_input(tmp_path / "in", "json")
    source = FileSource(str(tmp_path / "in"), format="json", schema=SCHEMA)
    with pytest.raises(Exception) as raised:
        fissure.run(Pipeline("failing").map("doubled", doubled), source, ForeachBatchSink(failing_sink),
                    config=fissure.RunnerConfig(spark=spark, progress="off"))
    log = tmp_path / "spark.log"
    message = describe_failure(raised.value, str(log))
    assert "ValueError: the sink is full" in message
    assert str(log) in message
    assert len(message.splitlines()) <= 4
    assert "Traceback" in log.read_text() and "the sink is full" in log.read_text()


def test_failure_description_names_the_innermost_error_not_the_wrappers(monkeypatch):
    import fissure.spark.session.create as session

    monkeypatch.setattr(session, "spark_log_path", lambda: None)  # no "Spark's output" line, whatever ran before

    class StreamingQueryException(Exception):
        pass

    error = StreamingQueryException(
        "[STREAM_FAILED] Query [id = 1] terminated with exception: [FOREACH_BATCH_USER_FUNCTION_ERROR] ...\n"
        "py4j.protocol.Py4JJavaError: An error occurred while calling o186.save.\n"
        ": org.apache.hadoop.fs.ParentNotDirectoryException: Parent path is not a directory: file:/out\n"
        "\tat org.apache.hadoop.fs.RawLocalFileSystem.mkdirs(RawLocalFileSystem.java:700)\n"
        "Caused by: py4j.Py4JException: An exception was raised by the Python Proxy.")
    assert describe_failure(error).splitlines() == [
        "StreamingQueryException: [STREAM_FAILED] Query [id = 1] terminated with exception: "
        "[FOREACH_BATCH_USER_FUNCTION_ERROR] ...",
        "  caused by ParentNotDirectoryException: Parent path is not a directory: file:/out"]


def test_a_path_spark_cannot_find_is_named_with_the_fix(spark, tmp_path, monkeypatch):
    """A path of another scheme than the local file system is checked by Spark when it opens the
    source; its PATH_NOT_FOUND becomes the same clear error as a missing local directory's."""
    from fissure.spark.io.sources import SourcePathNotFound

    missing = f"file://{tmp_path}/nowhere"
    monkeypatch.setattr(FileSource, "local_path", lambda self, default_file_system="file:///": None)  # as for s3a://
    with pytest.raises(SourcePathNotFound) as raised:
        FileSource(missing, format="json", schema=SCHEMA).open(spark)
    message = str(raised.value)
    assert message.startswith(f"file source {missing!r}: Spark finds no such path ([PATH_NOT_FOUND]")
    assert "create the directory before the run, or check the URL's scheme, host and path" in message
