"""The SparkSession fissure creates when the caller brings none, and the settings every query needs.

Quiet sessions: fissure starts Spark's JVM itself with its stdout and stderr going to a log file
(fissure.spark.session.jvm). Everything Spark prints then lands there: the JVM's log4j lines, and the
output of the Python processes the JVM starts (task workers, and the driver-side worker
transformWithStateInPandas starts at each query's first batch), which the JVM forwards to its own
streams. The terminal keeps the driver's own output: the progress line, the results and errors.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import sys
import tempfile
import threading
import traceback

from pyspark.sql import SparkSession

from fissure.lifecycle.failures import CRASH, restartable_failure
from fissure.lifecycle.watchdog import Heartbeat, read_heartbeat
from fissure.program.operators import PipelineError
from fissure.config import RunnerConfig
from fissure.runtime.records.fate import HEARTBEAT_DIR_VARIABLE
from fissure.spark.session.jvm import SPARK_LOG_TERMINAL, launch_jvm_with_output_to, spark_log_path

# Settings of the session fissure creates (measured on PySpark 4.3: see docs/spark-runner.md).
SESSION_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # The UI's kill links stop jobs and stages for anyone who can reach it.
    "spark.ui.killEnabled": "false",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "spark.sql.session.timeZone": "UTC",
    # A Python worker that dies leaves its fault-handler log in the task's error: a Python
    # traceback for a fatal signal, and the operator fissure noted as running (mark_running).
    "spark.python.worker.faulthandler.enabled": "true",
    "spark.sql.execution.pyspark.udf.faulthandler.enabled": "true",
    # Workers forked with pyarrow, pandas and fissure's worker code imported (fissure.spark.session.worker_daemon).
    "spark.python.daemon.module": "fissure.spark.session.worker_daemon",
    # Batches of checkpoint history kept (offset and commit logs, each state store's changelogs
    # and snapshots): Spark keeps 100, so a state whose batches each write 8 MB would keep 800 MB of
    # history. fissure resumes from the last committed batch, and repartitions from it, only.
    "spark.sql.streaming.minBatchesToRetain": "10",
}

# In local mode nothing outside the machine talks to the driver: its RPC and block-manager
# endpoints (which have no authentication by default) listen on loopback only. On a cluster the
# executors must reach the driver, so Spark's own choice of address stands.
LOCAL_MODE_ADDRESSES = {
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}
# Spark's JVM reads the UI's address from this environment variable (else it listens on every
# interface; there is no setting for it in Spark 4.3).
UI_ADDRESS_VARIABLE = "SPARK_LOCAL_IP"

# Set on the session before every query fissure starts.
QUERY_DEFAULTS = {
    # repartition(n) sorts each partition first unless this is off (about 2 us per record).
    "spark.sql.execution.sortBeforeRepartition": "false",
    # Arrow batches handed to mapInArrow and the state handler.
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
    # RocksDB state stores write a changelog per batch instead of a snapshot of the whole store:
    # commit 60-80 ms -> about 30 ms per stateful operator, partition and batch (measured here).
    # The checkpoint manager's offline repartitioning works with it (checked on 4.3).
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


def ensure_worker_python() -> None:
    """Spark's Python workers must run this interpreter (with fissure and its pins), not PATH's."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def ensure_heartbeat_dir() -> str:
    """The directory this driver's Python workers write their heartbeats to (fissure.runtime.records.fate.beat),
    made now and set in the environment the JVM, started after this, passes to the workers it starts
    (a JVM already running keeps its own: its workers write none). Removed when the driver exits."""
    directory = os.environ.get(HEARTBEAT_DIR_VARIABLE)
    if directory and os.path.isdir(directory):
        return directory
    directory = tempfile.mkdtemp(prefix="fissure-heartbeats-")
    os.environ[HEARTBEAT_DIR_VARIABLE] = directory
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory


def read_heartbeats() -> list[Heartbeat]:
    """The heartbeats this driver's local Python workers wrote (none without the directory)."""
    directory = os.environ.get(HEARTBEAT_DIR_VARIABLE)
    beats = []
    try:
        names = os.listdir(directory) if directory else []
    except OSError:
        return []
    for name in names:
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as heartbeat:
                beat = read_heartbeat(name, heartbeat.read())
        except OSError:
            continue
        if beat is not None:
            beats.append(beat)
    return beats


def create_session(config: RunnerConfig = RunnerConfig()) -> SparkSession:
    """A SparkSession on `config.master` (local[*] by default) with fissure's settings.

    Spark's output goes to `config.spark_log`, or to `spark.log` in a new temporary directory
    (`spark_log_path()` names it), at log level WARN; with `spark_log="-"` it goes to the
    terminal as PySpark does, at level ERROR (see fissure.spark.session.jvm).
    """
    ensure_worker_python()
    ensure_heartbeat_dir()
    settings = session_settings(config)
    to_terminal = config.spark_log == SPARK_LOG_TERMINAL
    with environment({UI_ADDRESS_VARIABLE: config.spark_ui_address}):
        if not to_terminal:
            launch_jvm_with_output_to(config.spark_log, settings, class_archive=config.jvm_class_archive)
        else:
            _launch_jvm_here(settings)
    builder = SparkSession.builder
    for name, value in settings.items():
        builder = builder.config(name, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR" if to_terminal or spark_log_path() is None else "WARN")
    quiet_per_record_loggers(session)
    if config.spark_ui:
        print(ui_notice(session), file=sys.stderr)
    if config.warm_python_workers:
        warm_python_workers(session)
    return session


def session_settings(config: RunnerConfig) -> dict[str, str]:
    """The Spark settings of the session fissure creates for `config` (the caller's spark_conf last)."""
    local = config.master.startswith("local")
    return {"spark.master": config.master, "spark.app.name": config.app_name, **SESSION_DEFAULTS,
            **(LOCAL_MODE_ADDRESSES if local else {}), **({"spark.ui.enabled": "true"} if config.spark_ui else {}),
            **config.spark_conf}


@contextlib.contextmanager
def environment(variables: dict[str, str]):
    """This process's environment with `variables` set while the block runs (a JVM started then
    inherits them), as it was afterwards."""
    before = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _launch_jvm_here(settings: dict[str, str]) -> None:
    """Start the JVM with the terminal's streams, as PySpark would, while this process's
    environment holds the UI's address (a JVM already running keeps its own)."""
    from pyspark import SparkConf, SparkContext

    conf = SparkConf(loadDefaults=False)
    for name, value in settings.items():
        conf.set(name, value)
    SparkContext._ensure_initialized(conf=conf)


def _no_batches(batches):
    return iter(())


def _no_records(records):
    return iter(())


def warm_python_workers(session: SparkSession) -> threading.Thread:
    """Start the executors' Python worker daemons and one worker per task slot now, in the
    background, so that the first micro-batch finds them started: tiny jobs of one empty task per
    slot, whose workers stay in Spark's pools for the tasks that follow (`spark.python.worker.reuse`,
    on by default). It overlaps what the driver does before the first batch's tasks (opening the
    sources, the query's planning and PySpark's state-schema processes).

    Spark keeps one daemon and pool per set of worker environment variables, and its SQL UDFs
    (mapInArrow: fissure's pe stages) run with one set, the state handlers of
    transformWithStateInPandas with another (measured on PySpark 4.3: a mapInArrow job's workers
    served the first batch's mapInArrow tasks, `boot` 8-18 ms instead of 930 ms, but not its state
    handlers, and an RDD job's the reverse): so one job of each kind."""
    slots = default_parallelism(session)

    def run() -> None:
        try:
            session.range(0, slots, 1, slots).mapInArrow(_no_batches, "id long").count()
            session.sparkContext.parallelize(range(slots), slots).mapPartitions(_no_records).count()
        except Exception:  # noqa: BLE001 - a session stopped meanwhile: nothing to warm
            pass

    thread = threading.Thread(target=run, name="fissure-warm-workers", daemon=True)
    thread.start()
    return thread


# Loggers that write a line per record or key at WARN: PySpark's state server warns of every
# MapState read that finds no entry, that is of every key a keyed operator sees for the first time:
# a synchronous log write on the state server's request path, per new key.
PER_RECORD_LOGGERS = ("org.apache.spark.sql.execution.python.streaming.TransformWithStateInPySparkStateServer",)


def quiet_per_record_loggers(session: SparkSession) -> None:
    """Raise those loggers to ERROR in the driver's JVM (local mode's executors run there too; a
    cluster's executors keep their own log4j configuration)."""
    jvm = session.sparkContext._jvm
    try:
        level = jvm.org.apache.logging.log4j.Level.ERROR
        for name in PER_RECORD_LOGGERS:
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
    except Exception:  # noqa: BLE001 - a JVM without log4j 2 keeps its logging as it is
        pass


def ui_notice(session: SparkSession) -> str:
    """Where Spark's web UI of `session` is, or why there is none (a session that existed before
    with the UI off keeps it off)."""
    url = session.sparkContext.uiWebUrl
    if url:
        return f"fissure: Spark UI at {url} (Structured Streaming tab: observedMetrics \"fissure\" per batch)"
    return "fissure: no Spark UI: this process's session was created before with spark.ui.enabled=false"


# Exceptions that only carry another one: the cause shown is the innermost other error.
WRAPPING_ERRORS = ("Py4JJavaError", "Py4JException", "StreamingQueryException", "ForeachBatchUserFuncException",
                   "PythonException", "SparkException")




MAX_CAUSE_CHARS = 4000  # a cause is shown whole up to this (a record in a resource fault may be long)


def describe_failure(error: BaseException, spark_log: str | None = None) -> str:
    """A few lines for people about a failed run; the full traceback is appended to `spark_log`
    (default: the file Spark's output goes to, fissure.spark.session.jvm.spark_log_path).

    Spark's errors carry the JVM's stack trace and, from a Python worker or a foreachBatch, a
    Python traceback: shown are the first line and the innermost error that is not a wrapper,
    whole (also one Spark put inside a wrapper's line: `... most recent failure: Lost task ...:
    java.io.IOException: No space left on device`), with the nearest enclosing error that names
    a file when the innermost names none (a truncated checkpoint file: `EOFException` alone says
    not which); then why fissure did not start the query again (fissure.lifecycle.failures).
    """
    text = str(error).strip() or type(error).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if len(lines[0]) <= 160 else lines[0][:159] + "…"
    summary = f"{type(error).__name__}: {first}"
    causes = [cause for line in lines for cause in _errors_in_line(line)]
    failure = restartable_failure(text)
    if failure is not None and failure.kind == CRASH:
        # A dead worker process leaves no Python error; its cause is the crash itself.
        causes.append(failure.cause + (f" while operator {failure.operator!r} was running" if failure.operator else ""))
    if causes and causes[-1] not in summary:
        summary += f"\n  caused by {_shown_cause(causes[-1])}"
        if not _FILE_NAME.search(causes[-1]):
            named = next((cause for cause in reversed(causes[:-1]) if _FILE_NAME.search(cause)), None)
            if named is not None:
                summary += f"\n  in {_shown_cause(named)}"
    for note in getattr(error, "__notes__", ()):
        if note.startswith("fissure: not restarted"):
            summary += "\n  " + note.removeprefix("fissure: ")
    spark_log = spark_log or spark_log_path()
    if spark_log:
        try:
            with open(spark_log, "a", encoding="utf-8") as log:
                log.write("\n--- fissure: the run failed ---\n")
                log.write("".join(traceback.format_exception(error)))
        except OSError:
            pass
        summary += f"\n  Spark's output and the full error: {spark_log}"
    return summary


def _shown_cause(cause: str) -> str:
    return cause if len(cause) <= MAX_CAUSE_CHARS else cause[:MAX_CAUSE_CHARS - 1] + "…"


# Errors whose names do not end in Error or Exception.
NAMED_ERRORS = ("SystemExit", "KeyboardInterrupt", "ResourceExhausted", "CheckpointDamaged", "RunTimedOut")
_BARE_ERROR = re.compile(r"^([A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)*):?$")
# A path or URI in an error message: file:/..., hdfs://..., /a/b.
_FILE_NAME = re.compile(r"(?:\b[a-z][a-z0-9+.-]*:/|(?<![\w.])/)[\w.@%+=~-]+/[\w.@%+=~/-]*")
# Where an error's name starts inside a line: at its start, after ": " or after ") ".
_ERROR_NAME = re.compile(r"(?:^|(?<=: )|(?<=\) ))(?:Caused by: )?([A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)*): ")


def note_failure(error: BaseException) -> None:
    """Add what people need first to a failed run's error, as a note shown under its message
    (PEP 678): the innermost cause and the file with Spark's output and the full error. Spark's
    own message of a failed query runs to hundreds of lines of JVM stack. Once per error."""
    if getattr(error, "_fissure_noted", False):
        return
    summary = describe_failure(error)
    error.add_note("fissure: " + summary)
    try:
        error._fissure_noted = True
    except AttributeError:  # an exception type with __slots__
        pass


@contextlib.contextmanager
def noted_failures():
    """A block whose failure (other than a PipelineError, which names its own fix) leaves with
    `note_failure`'s note."""
    try:
        yield
    except PipelineError:
        raise
    except Exception as error:
        note_failure(error)
        raise


def _errors_in_line(line: str) -> list[str]:
    """The errors a line names that are not wrappers, outermost first, each with the rest of the
    line as its message: `ValueError: msg` from a traceback's last line, a Java `Caused by:
    a.b.SomeException: msg`, py4j's `: a.b.SomeException: msg`, and an error Spark wrote inside a
    wrapper's message (`...: Lost task 0.0 in stage 3.0 (TID 5) (driver): java.io.IOException: msg`)."""
    line = line.removeprefix("Caused by:").lstrip(": ")
    found = []
    matches = list(_ERROR_NAME.finditer(line + " " if line.endswith(":") else line))
    bare = _BARE_ERROR.match(line)
    if bare:  # a JVM cause without a message: `Caused by: java.io.EOFException`
        matches = [bare]
    for match in matches:
        short_name = match.group(1).rsplit(".", 1)[-1]
        if short_name in WRAPPING_ERRORS or not (short_name.endswith(("Error", "Exception"))
                                                 or short_name in NAMED_ERRORS):
            continue
        message = line[match.end():].strip()
        found.append(f"{short_name}: {message}" if message else short_name)
    return found[-1:]


def is_local(session: SparkSession) -> bool:
    return session.sparkContext.master.startswith("local")


def default_parallelism(session: SparkSession) -> int:
    """The task slots the query may use: executor cores (the model's C)."""
    return max(1, session.sparkContext.defaultParallelism)
