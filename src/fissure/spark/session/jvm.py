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


def launch_jvm_with_output_to(log_path: str | None, settings: dict[str, str], class_archive: bool = True) -> bool:
    """Start Spark's JVM (the py4j gateway) with its stdout and stderr appended to `log_path`
    (None: `spark.log` in a new temporary directory).

    This starts the JVM through PySpark's own `launch_gateway` and its `popen_kwargs`, and hands
    it to SparkContext, which then uses it. Returns False when a JVM already runs in this process
    (its output stays where it goes); driver options such as extraJavaOptions need the settings
    here. `class_archive`: start the JVM with fissure's class-data-sharing archive
    (fissure.spark.session.class_archive), falling back to a start without it.
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
        gateway = _launch_with_archive(conf, settings, log) if class_archive else None
        if gateway is None:
            gateway = launch_gateway(conf, popen_kwargs={"stdout": log, "stderr": subprocess.STDOUT})
    SparkContext._ensure_initialized(gateway=gateway)
    _spark_log = os.path.abspath(log_path)
    return True


def _launch_with_archive(conf, settings: dict[str, str], log):
    """The gateway of a JVM started with the class archive's options, or, when it does not start
    with them but does without, of one started without them (and no archive for this setup from
    then on). None: no archive applies; the caller starts the JVM as usual."""
    from pyspark.java_gateway import launch_gateway

    from fissure.spark.session.class_archive import JAVA_OPTIONS_SETTING, prepared_archive

    java_options = settings.get(JAVA_OPTIONS_SETTING, "")
    archive, decision, candidate = prepared_archive(java_options)
    if archive is None or not decision.options:
        return None
    conf.set(JAVA_OPTIONS_SETTING, f"{java_options} {decision.options}".strip())
    try:
        gateway = launch_gateway(conf, popen_kwargs={"stdout": log, "stderr": subprocess.STDOUT})
    except Exception:  # noqa: BLE001 - PySpark raises a bare exception when the JVM exits at start
        conf.set(JAVA_OPTIONS_SETTING, java_options)
        log.write(f"fissure: the JVM did not start with {decision.options!r}; starting it without\n".encode())
        log.flush()
        # Raises when the JVM does not start without them either: then they were not the cause.
        gateway = launch_gateway(conf, popen_kwargs={"stdout": log, "stderr": subprocess.STDOUT})
        try:
            archive.give_up()
        except OSError:
            pass
        return gateway
    if decision.dumps:
        try:
            system = gateway.jvm.java.lang
            archive.note_candidate(candidate, int(system.ProcessHandle.current().pid()),
                                   str(system.System.getProperty("java.class.path")))
        except Exception:  # noqa: BLE001 - without its note the candidate is never used, and removed later
            pass
    return gateway
