"""The SparkSession fissure creates when the caller brings none, and the settings every query needs."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from fissure.spark.config import RunnerConfig

# Settings of the session fissure creates (measured on PySpark 4.3: see docs/spark-runner.md).
SESSION_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "spark.sql.session.timeZone": "UTC",
}

# Set on the session before every query fissure starts.
QUERY_DEFAULTS = {
    # repartition(n) sorts each partition first unless this is off (about 2 us per record).
    "spark.sql.execution.sortBeforeRepartition": "false",
    # Arrow batches handed to mapInArrow and the state handler.
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
}


def ensure_worker_python() -> None:
    """Spark's Python workers must run this interpreter (with fissure and its pins), not PATH's."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def create_session(config: RunnerConfig = RunnerConfig()) -> SparkSession:
    """A SparkSession on `config.master` (local[*] by default) with fissure's settings."""
    ensure_worker_python()
    builder = SparkSession.builder.master(config.master).appName(config.app_name)
    for name, value in {**SESSION_DEFAULTS, **config.spark_conf}.items():
        builder = builder.config(name, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def is_local(session: SparkSession) -> bool:
    return session.sparkContext.master.startswith("local")


def default_parallelism(session: SparkSession) -> int:
    """The task slots the query may use: executor cores (the model's C)."""
    return max(1, session.sparkContext.defaultParallelism)
