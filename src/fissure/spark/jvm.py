"""Starting Spark's JVM for the session fissure creates, with its output in a log file.

PySpark starts its JVM (spark-submit's py4j gateway) on the first SparkContext with the
terminal's streams: every log4j line and everything the Python processes the JVM starts print
(`Starting Streaming TransformWithStateInPandas Python worker...`) then reach the user's terminal.
fissure starts the JVM itself instead, through PySpark's own `launch_gateway` with its output
appended to a file: the one `RunnerConfig.spark_log` names, or `spark.log` in a new temporary
directory. `spark_log_path()` tells where it went; failures name that file.
"""

from __future__ import annotations

import os
import subprocess
import tempfile

# RunnerConfig.spark_log value that leaves Spark's output on the terminal, as PySpark does.
SPARK_LOG_TERMINAL = "-"

_spark_log: str | None = None  # where the JVM this process started writes its output


def spark_log_path() -> str | None:
    """The file Spark's output goes to, when fissure started this process's JVM (None: it did not)."""
    return _spark_log


def launch_jvm_with_output_to(log_path: str | None, settings: dict[str, str]) -> bool:
    """Start Spark's JVM (the py4j gateway) with its stdout and stderr appended to `log_path`
    (None: `spark.log` in a new temporary directory).

    This starts the JVM through PySpark's own `launch_gateway` and its `popen_kwargs`, and hands
    it to SparkContext, which then uses it. Returns False when a JVM already runs in this process
    (its output stays where it goes); driver options such as extraJavaOptions need the settings
    here.
    """
    global _spark_log
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return False
    if log_path is None:
        log_path = os.path.join(tempfile.mkdtemp(prefix="fissure-spark-"), "spark.log")
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    conf = SparkConf(loadDefaults=False)
    for name, value in settings.items():
        conf.set(name, value)
    with open(log_path, "ab") as log:
        gateway = launch_gateway(conf, popen_kwargs={"stdout": log, "stderr": subprocess.STDOUT})
    SparkContext._ensure_initialized(gateway=gateway)
    _spark_log = os.path.abspath(log_path)
    return True
