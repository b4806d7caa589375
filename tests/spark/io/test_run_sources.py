"""`fissure run` from sources other than a directory: the rate and socket sources in process on
the shared session, ended by --max-batches; Kafka without its connector; the URL's usage errors."""

from __future__ import annotations

import json
import re
import textwrap

import pyarrow.parquet as pq
import pytest

from fissure.cli import main
from test_spark_sources import LineServer

TIMESTAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d fissure \| ")

RATE_FILE = textwrap.dedent("""
    from fissure import Pipeline

    def tag(record):
        return {"value": record["value"], "even": record["value"] % 2 == 0, "at": record["timestamp"]}

    def build():
        import datetime
        return Pipeline("rate_cli").map("tag", tag, reads=["value", "timestamp"],
                                        schema={"value": int, "even": bool, "at": datetime.datetime})
""")

SOCKET_FILE = textwrap.dedent("""
    from fissure import Pipeline

    def parse(record):
        user, amount = record["value"].split()
        return {"user": user, "amount": int(amount)}

    def build():
        return Pipeline("socket_cli").map("parse", parse, reads=["value"], schema={"user": str, "amount": int})
""")


def summary_of(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.spark
@pytest.mark.slow
def test_rate_source_runs_until_max_batches_and_writes_each_value_once(spark, tmp_path, capsys, caplog):
    (tmp_path / "rate.py").write_text(RATE_FILE)
    out = tmp_path / "out"
    status = main(["run", f"{tmp_path / 'rate.py'}:build", "--source", "rate://?rowsPerSecond=50&numPartitions=2",
                   "--max-batches", "3", "--sink", str(out), "--run-dir", str(tmp_path / "run"), "--json"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    summary = summary_of(captured.out)
    assert summary["batches"] == 3 and summary["dead_letters"] == 0
    assert summary["input_records"] > 0 and summary["output_records"] == summary["input_records"]
    rows = pq.read_table(out).to_pylist()
    # The rate source's values count up from 0: three batches, every value once, none skipped.
    assert sorted(row["value"] for row in rows) == list(range(summary["input_records"]))
    assert all(row["even"] == (row["value"] % 2 == 0) and row["at"] is not None for row in rows)
    progress = [line for line in captured.err.splitlines() if " fissure | " in line]
    assert progress and all(TIMESTAMPED.match(line) for line in progress)  # stderr is no terminal here
    # The batch held past the limit raised when the run stopped; py4j did not log it as an error.
    assert not [record for record in caplog.records if record.name.startswith("py4j")]


@pytest.mark.spark
@pytest.mark.slow
def test_socket_source_reads_a_tcp_servers_lines_without_adapting(spark, tmp_path, capsys):
    (tmp_path / "socket.py").write_text(SOCKET_FILE)
    lines = [f"u{i % 3} {i}" for i in range(12)]
    out = tmp_path / "out"
    with LineServer(lines) as server:
        # Spark may run a first batch before the socket's lines arrived (empty), then one with them;
        # or one batch with them all and no more: the timeout ends that run.
        status = main(["run", f"{tmp_path / 'socket.py'}:build", "--source", f"socket://127.0.0.1:{server.port}",
                       "--max-batches", "2", "--timeout", "90", "--sink", str(out),
                       "--run-dir", str(tmp_path / "run"), "--json", "--progress", "off"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "a socket source cannot replay what it sent" in captured.err
    assert " fissure | " not in captured.err  # --progress off
    summary = summary_of(captured.out)
    assert summary["batches"] in (1, 2) and (summary["input_records"], summary["output_records"]) == (12, 12)
    assert sorted((row["user"], row["amount"]) for row in pq.read_table(out).to_pylist()) == sorted(
        (f"u{i % 3}", i) for i in range(12))


@pytest.mark.spark
def test_kafka_without_its_connector_says_how_to_add_it(spark, tmp_path, capsys):
    (tmp_path / "socket.py").write_text(SOCKET_FILE)
    status = main(["run", f"{tmp_path / 'socket.py'}:build", "--source", "kafka://localhost:9092/events",
                   "--run-dir", str(tmp_path / "run"), "--no-adapt"])
    error = capsys.readouterr().err
    assert status == 2
    assert f"--packages org.apache.spark:spark-sql-kafka-0-10_2.13:{spark.version}" in error
    assert "Kafka connector" in error
    assert "Traceback" not in error and "at org.apache" not in error and "KAFKA_DATA_SOURCE" not in error


@pytest.mark.parametrize("source, extra, message", [
    ("ftp://host/x", [], "unknown source 'ftp'"),
    ("rate://?rowsPerSecond=fast", [], "rowsPerSecond must be a positive integer"),
    ("rate://?speed=3", [], "the rate source has no option speed"),
    ("socket://localhost", [], "a socket source is socket://HOST:PORT"),
    ("kafka://localhost:9092", [], "a Kafka source is kafka://BROKER:PORT"),
    ("rate://", ["--format", "json"], "--format describes a directory of files"),
])
def test_bad_source_urls_are_usage_errors(tmp_path, capsys, source, extra, message):
    (tmp_path / "socket.py").write_text(SOCKET_FILE)
    assert main(["run", f"{tmp_path / 'socket.py'}:build", "--source", source, *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_url_names_its_source():
    from fissure.cli.source_argument import parse_source_url, source_of
    from fissure.spark.io.sources import KafkaSource, RateSource, SocketSource

    def source(text):
        return source_of(parse_source_url(text), text)

    assert parse_source_url("logs/in") is None
    assert source("rate://?rowsPerSecond=200&numPartitions=3") == RateSource(rows_per_second=200, partitions=3)
    assert source("rate://") == RateSource()
    assert source("socket://localhost:9999") == SocketSource("localhost", 9999)
    assert source("kafka://b1:9092,b2:9092/clicks,views?startingOffsets=earliest") == KafkaSource(
        "b1:9092,b2:9092", "clicks,views", {"startingOffsets": "earliest"})
