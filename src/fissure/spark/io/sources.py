"""Where records come from: Spark's streaming sources, described before a session exists.

A source is any streaming DataFrame, or a description that fissure turns into one once it has a
session (the embedded default creates the session itself): FileSource for text, JSON, CSV and
Parquet directories, RateSource, SocketSource, KafkaSource, or any callable `spark -> streaming
DataFrame`.

The fields a program's first operators read (`reads=`) are the source's columns: a file
source's schema (text: `value`); the rate source's `timestamp` (datetime) and `value` (int); the
socket source's `value` (str); Kafka's `key` and `value` (bytes), `topic` (str), `partition`
(int), `offset` (int), `timestamp` (datetime) and `timestampType` (int).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from fissure.program.operators import SchemaSpec, to_arrow_schema as declared_arrow_schema
from fissure.runtime.records.columns import CORRUPT_RECORD
from fissure.runtime.records.unreadable_lines import LineFormat

FILE_FORMATS = ("text", "json", "csv", "parquet")
LINE_FORMATS = ("json", "csv")  # formats whose unreadable lines become dead letters with the raw line


@dataclass(frozen=True)
class FileSource:
    """New files in a directory, oldest first. `schema` is needed except for text files.

    Micro-batch size: at most `max_files_per_trigger` files, or files up to
    `max_bytes_per_trigger` bytes in all (at least one file), per batch. Given neither, the runner
    chooses the bytes (RunnerConfig.batch_size, fissure.spark.io.batch_admission). Every batch pays a
    fixed cost (about 1 s for LogWatch's three stateful operators here): small batches are slow.

    Bad input: JSON and CSV files are read in PERMISSIVE mode with the raw line of a line that
    does not parse or fit the schema kept in the column CORRUPT_RECORD; that row, and a row whose
    text is not valid UTF-8, becomes a dead letter of the source (fissure.runtime.records.source_rows),
    whose reason says what is wrong with the line (`line_format`).

    A path that does not exist raises SourcePathNotFound naming it and the fix: a local one (no
    scheme, or file://) before Spark starts (`check_path`), any other when Spark opens it.

    Files being written and unreadable files (fissure.spark.io.file_staging): a local directory's
    file is read once it has not been written for `settle_s` seconds (its size and modification
    time unchanged; None: Spark reads every file it lists, as it is then: write elsewhere and
    rename into the directory); a compressed file that does not decompress to its end (a
    truncated `.gz`), one compressed in a way Spark's text, JSON and CSV readers do not
    decompress (`.xz`, `.br`, an LZ4 frame; fissure.spark.io.file_staging.unreadable_reason) or a
    Parquet file without a footer becomes one dead letter naming the file
    (`on_unreadable="dead-letter"`) or stops the run naming it (`on_unreadable="stop"`).
    """

    path: str
    format: str = "text"
    schema: SchemaSpec = None
    max_files_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    settle_s: float | None = 1.0
    on_unreadable: str = "dead-letter"

    def __post_init__(self) -> None:
        where = f"file source {self.path!r}"
        if self.settle_s is not None and (not isinstance(self.settle_s, (int, float)) or self.settle_s < 0):
            raise ValueError(f"{where}: settle_s must be a number of seconds >= 0, or None, got {self.settle_s!r}")
        if self.on_unreadable not in ("dead-letter", "stop"):
            raise ValueError(f"{where}: on_unreadable must be 'dead-letter' or 'stop', got {self.on_unreadable!r}")
        if self.format not in FILE_FORMATS:
            raise ValueError(f"{where}: format must be one of {', '.join(FILE_FORMATS)}, got {self.format!r}")
        if self.format != "text" and self.schema is None:
            raise ValueError(f"{where}: a streaming {self.format} source needs schema= "
                             f"(a mapping of field name to type, e.g. {{'user': str, 'amount': float}})")
        for name in ("max_files_per_trigger", "max_bytes_per_trigger"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{where}: {name} must be a positive integer, got {value!r}")
        if self.max_files_per_trigger is not None and self.max_bytes_per_trigger is not None:
            raise ValueError(f"{where}: give max_files_per_trigger or max_bytes_per_trigger, not both "
                             f"(Spark's file source refuses the pair)")

    def known_schema(self) -> pa.Schema | None:
        """The fields the program reads, known without Spark: text's `value`, else the declared schema."""
        if self.format == "text":
            return pa.schema([("value", pa.string())])
        return declared_arrow_schema(self.schema, f"file source {self.path!r}")

    def line_format(self) -> LineFormat | None:
        """How the worker reads an unreadable line again to say what is wrong with it (JSON, CSV)."""
        if self.format not in LINE_FORMATS:
            return None
        options = {name.lower(): value for name, value in self.options.items()}
        return LineFormat(self.format, delimiter=options.get("sep", options.get("delimiter", ",")),
                          quote=options.get("quote", '"'), escape=options.get("escape", "\\"))

    def local_path(self, default_file_system: str = "file:///") -> str | None:
        """The path on this machine's file system (None: another scheme, such as s3a:// or hdfs://;
        a path without a scheme is on `default_file_system`, Hadoop's fs.defaultFS)."""
        parsed = urlparse(self.path)
        if parsed.scheme == "":
            return self.path if default_file_system.startswith("file:") else None
        if parsed.scheme == "file":
            return unquote(parsed.path)
        return None

    def check_path(self, default_file_system: str = "file:///") -> None:
        """A local path that matches nothing raises SourcePathNotFound (Spark would fail later, and
        with `AnalysisException: [PATH_NOT_FOUND]`); other schemes are checked when Spark opens them."""
        local = self.local_path(default_file_system)
        if local is None:
            return
        if any(character in local for character in "*?[{"):
            if not glob.glob(local):
                raise SourcePathNotFound(f"file source {self.path!r}: the pattern matches no file or directory "
                                         f"(in {os.path.abspath(os.path.dirname(local) or '.')}); check the pattern, "
                                         f"or give the directory the input files arrive in")
            return
        if not os.path.exists(local):
            raise SourcePathNotFound(
                f"file source {self.path!r}: the directory {os.path.abspath(local)} does not exist; create it "
                f"(`mkdir -p {local}`) before the run, or give the directory the input files arrive in: a streaming "
                f"file source watches an existing directory for new files")

    def open(self, spark: SparkSession) -> DataFrame:
        self.check_path(spark.sparkContext._jsc.hadoopConfiguration().get("fs.defaultFS") or "file:///")
        reader = spark.readStream.format(self.format)
        if self.schema is not None:
            schema = declared_arrow_schema(self.schema, f"file source {self.path!r}")
            if self.format in LINE_FORMATS:
                # A line that does not parse, or whose value does not fit the schema, keeps its raw
                # text in this column (PERMISSIVE mode): the source's envelopes make it a dead letter.
                schema = schema.append(pa.field(CORRUPT_RECORD, pa.string()))
                reader = reader.option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT_RECORD)
            reader = reader.schema(from_arrow_schema(schema))
        if self.max_files_per_trigger is not None:
            reader = reader.option("maxFilesPerTrigger", str(self.max_files_per_trigger))
        if self.max_bytes_per_trigger is not None:
            reader = reader.option("maxBytesPerTrigger", str(self.max_bytes_per_trigger))
        if self.format == "csv":
            reader = reader.option("header", "true")
        for name, value in self.options.items():
            reader = reader.option(name, value)
        try:
            return reader.load(self.path)
        except AnalysisException as error:
            if error.getCondition() != "PATH_NOT_FOUND":
                raise
            raise SourcePathNotFound(
                f"file source {self.path!r}: Spark finds no such path ({str(error).splitlines()[0]}); create the "
                f"directory before the run, or check the URL's scheme, host and path") from None


@dataclass(frozen=True)
class RateSource:
    """Spark's rate source: `timestamp` and `value` columns, one source partition by default."""

    rows_per_second: int = 1000
    partitions: int = 1

    def open(self, spark: SparkSession) -> DataFrame:
        return (spark.readStream.format("rate").option("rowsPerSecond", str(self.rows_per_second))
                .option("numPartitions", str(self.partitions)).load())


@dataclass(frozen=True)
class SocketSource:
    """Lines of text from a TCP socket (one `value` column); for tests and demos, not exactly-once."""

    host: str = "127.0.0.1"
    port: int = 9999

    def known_schema(self) -> pa.Schema:
        return pa.schema([("value", pa.string())])

    def open(self, spark: SparkSession) -> DataFrame:
        return spark.readStream.format("socket").option("host", self.host).option("port", str(self.port)).load()


KAFKA_FIELDS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")


class SourceUnavailable(RuntimeError):
    """A source this Spark cannot open (a connector missing from its classpath, a path that does
    not exist); the message says what to do."""


class SourcePathNotFound(SourceUnavailable):
    """A file source whose path does not exist; the message names the path and the fix."""


def kafka_connector(spark_version: str, scala_version: str = "2.13") -> str:
    """The Maven coordinate of Spark's Kafka connector for a Spark and Scala version."""
    return f"org.apache.spark:spark-sql-kafka-0-10_{scala_version}:{spark_version}"


@dataclass(frozen=True)
class KafkaSource:
    """Records of Kafka topics: fields KAFKA_FIELDS, `key` and `value` as bytes (decode them in the
    first operator: `record["value"].decode()`).

    Needs Spark's Kafka connector on the classpath when Spark's JVM starts: `spark.jars.packages`
    set to `kafka_connector(spark version)` (`RunnerConfig(spark_conf=...)`, `fissure run
    --packages`, `spark-submit --packages`); without it, opening the source raises
    SourceUnavailable saying so. `options` go to Spark's Kafka reader as given (for instance
    `startingOffsets`, `maxOffsetsPerTrigger`, `kafka.security.protocol`); run with
    available_now=True, the query reads what the topics hold at its start and ends.
    """

    bootstrap_servers: str
    topics: str  # one topic, or several separated by commas
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.bootstrap_servers or not self.topics:
            raise ValueError(f"a Kafka source needs bootstrap servers and topics, got {self.bootstrap_servers!r} "
                             f"and {self.topics!r}")

    def open(self, spark: SparkSession) -> DataFrame:
        reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", self.bootstrap_servers)
                  .option("subscribe", self.topics))
        for name, value in self.options.items():
            reader = reader.option(name, value)
        try:
            return reader.load()
        except AnalysisException as error:
            if error.getCondition() not in ("KAFKA_DATA_SOURCE_NOT_ENABLED", "DATA_SOURCE_NOT_FOUND"):
                raise
            coordinate = kafka_connector(spark.version, _scala_version(spark))
            raise SourceUnavailable(
                f"the Kafka source needs Spark's Kafka connector, which this Spark ({spark.version}) does not "
                f"have on its classpath; add it when Spark starts: `fissure run --packages {coordinate}`, "
                f"RunnerConfig(spark_conf={{'spark.jars.packages': '{coordinate}'}}) from Python, or "
                f"`spark-submit --packages {coordinate}`") from None


def _scala_version(spark: SparkSession) -> str:
    """The Scala binary version Spark's JVM runs ("2.13"; Spark 4 has no other)."""
    try:
        return ".".join(spark.sparkContext._jvm.scala.util.Properties.versionNumberString().split(".")[:2])
    except Exception:  # noqa: BLE001 - a remote session without a JVM here: Spark 4's only Scala
        return "2.13"


SourceLike = (FileSource | RateSource | SocketSource | KafkaSource | DataFrame
              | Callable[[SparkSession], DataFrame])


def open_source(source: SourceLike, spark: SparkSession) -> DataFrame:
    """The streaming DataFrame of any accepted source."""
    if isinstance(source, DataFrame):
        frame = source
    elif hasattr(source, "open"):
        frame = source.open(spark)
    elif callable(source):
        frame = source(spark)
    else:
        raise TypeError(f"a source must be a streaming DataFrame, a FileSource/RateSource/SocketSource/KafkaSource, "
                        f"or a callable spark -> DataFrame; got {source!r}")
    if not isinstance(frame, DataFrame) or not frame.isStreaming:
        raise TypeError(f"the source {source!r} gave {type(frame).__name__}, not a streaming DataFrame; "
                        f"build it with spark.readStream")
    return frame


def default_file_system(spark: SparkSession | None, master: str, spark_conf: Mapping[str, str]) -> str | None:
    """Where a path without a scheme lives: the session's Hadoop fs.defaultFS; without a session
    yet, the local file system in local mode unless the settings name another, and None (not known
    before the session reads the cluster's Hadoop configuration) on a cluster."""
    if spark is not None:
        return spark.sparkContext._jsc.hadoopConfiguration().get("fs.defaultFS") or "file:///"
    if not master.startswith("local"):
        return None
    return spark_conf.get("spark.hadoop.fs.defaultFS", "file:///")


def known_source_schemas(sources: Mapping[str, object]) -> dict[str, pa.Schema]:
    """The schemas of the bound sources (by name) that are known without Spark: a source's
    `known_schema()` (FileSource, SocketSource, fissure.testing.TestingSource), where it has one."""
    schemas = {}
    for name, source in sources.items():
        known = getattr(source, "known_schema", None)
        schema = known() if callable(known) else None
        if isinstance(schema, pa.Schema):
            schemas[name] = schema
    return schemas


def check_before_spark(graph, sources: Mapping[str, object], default_file_system: str | None = "file:///") -> None:
    """What can be checked of a run before Spark starts, so every entry point fails in a moment,
    not after the session's start: each local FileSource path exists (SourcePathNotFound), and
    the program's fields (read, keyed and ordered by, joined and unioned), names and schemas fit
    the sources whose schema is known without Spark (`graph.check`, PipelineError). Sources of
    unknown schema are checked again when their frames exist. `default_file_system`: where a path
    without a scheme lives (None: not known before Spark starts, as on a cluster whose Hadoop
    configuration names it; such paths are checked when the source opens)."""
    for source in sources.values():
        if isinstance(source, FileSource):
            source.check_path(default_file_system or "hdfs:")
    graph.check(known_source_schemas(sources))


def arrow_schema_of(frame: DataFrame) -> pa.Schema:
    return to_arrow_schema(frame.schema, timezone="UTC")


def spark_schema_of(schema: pa.Schema):
    return from_arrow_schema(schema)
