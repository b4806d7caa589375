"""A run started from a script is quiet, its failures say why, and its Python workers start warm."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import fissure
from fissure.spark.session.jvm import spark_log_path

SCRIPT = textwrap.dedent("""
    import os, sys, tempfile
    import fissure

    directory = tempfile.mkdtemp()
    os.makedirs(directory + "/in")
    with open(directory + "/in/a.txt", "w") as handle:
        handle.write("a b a\\nc a\\n")

    def words(record):
        return [{"word": word} for word in record["value"].split()]

    def count(state, record):
        state["n"] = state.get("n", 0) + 1
        return {"word": record["word"], "n": state["n"]}

    pipeline = (fissure.Pipeline("wc").flat_map("split", words, schema={"word": str})
                .partitioned("count", count, key="word", schema={"word": str, "n": int}))
    sink = fissure.MemorySink()
    fissure.run(pipeline, fissure.FileSource(directory + "/in"), sink, config=fissure.RunnerConfig(progress="lines"))
    print(sorted((record["word"], record["n"]) for record in sink.records()))
    from fissure.spark.session.jvm import spark_log_path
    print("log", spark_log_path())
""")


@pytest.mark.slow
@pytest.mark.spark
def test_a_script_calling_fissure_run_prints_no_spark_line(tmp_path):
    script = tmp_path / "program.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "[('a', 1), ('a', 2), ('a', 3), ('b', 1), ('c', 1)]"
    # stderr holds fissure's own lines (progress, the cost sample's notice) and nothing else: no
    # log4j line, no PySpark worker chatter.
    others = [line for line in done.stderr.splitlines() if " fissure | " not in line and not line.startswith("fissure: ")]
    assert others == []
    assert sum(line.startswith("fissure: ") for line in done.stderr.splitlines()) <= 1  # the cost sample, once
    assert any("batch 0" in line for line in done.stderr.splitlines())
    # Spark's output went to the log file the run names.
    log_path = lines[1].removeprefix("log ")
    with open(log_path, encoding="utf-8") as log:
        assert "TransformWithStateInPandas" in log.read()


def _crash(state, record):
    os._exit(3)


@pytest.mark.spark
def test_a_failed_run_notes_its_cause_and_spark_log(spark, tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.txt").write_text("x\n")
    pipeline = fissure.Pipeline("crashes").partitioned("count", _crash, key="value")
    with pytest.raises(Exception) as raised:
        fissure.run(pipeline, fissure.FileSource(str(inputs)), fissure.MemorySink(),
                    config=fissure.RunnerConfig(query_restarts=0, spark=spark, progress="off"))
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    assert "caused by Python worker exited unexpectedly (crashed) while operator 'count' was running" in notes
    assert spark_log_path() is not None and spark_log_path() in notes


@pytest.mark.spark
def test_python_workers_fork_from_the_daemon_that_preloads_fissure(spark):
    def _parent_command(records):  # nested: shipped by value, as the workers cannot import this test module
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as handle:
            yield handle.read().replace(b"\0", b" ").decode()

    (command,) = set(spark.sparkContext.parallelize([0, 1], 2).mapPartitions(_parent_command).collect())
    assert "-m fissure.spark.session.worker_daemon" in command


@pytest.mark.spark
def test_python_workers_start_with_the_preloaded_modules_frozen(spark):
    def _frozen(records):  # nested: shipped by value
        import gc

        yield gc.get_freeze_count()

    # the daemon froze pandas, pyarrow and fissure's worker modules: tens of thousands of objects
    assert min(spark.sparkContext.parallelize([0, 1], 2).mapPartitions(_frozen).collect()) > 10_000


def test_the_daemon_preloads_every_module_it_names():
    from fissure.spark.session.worker_daemon import preload

    assert preload() == []


class RecordingProcessor:
    """Stands in for GraphStateProcessor: its state variables, and what it was given."""

    unpickled = 0

    def __init__(self):
        self.name = "counts"

    def state_variables(self):
        from fissure.spark.state.handler import StateVariable

        return (StateVariable("map", "keys", ("entry int", "value binary")), StateVariable("value", "due", ("value binary",)))

    def attach(self, states):
        self.states = states

    def handleInputRows(self, key, rows, timer_values):  # noqa: N802 - Spark's name
        yield (key, sorted(self.states), list(rows))

    def close(self):
        self.closed = True

    def __setstate__(self, state):
        RecordingProcessor.unpickled += 1
        self.__dict__.update(state)


class FakeHandle:
    def __init__(self):
        self.registered = []

    def getMapState(self, name, key_schema, value_schema):  # noqa: N802 - Spark's name
        self.registered.append(("map", name, key_schema, value_schema))
        return f"map:{name}"

    def getValueState(self, name, schema):  # noqa: N802 - Spark's name
        self.registered.append(("value", name, schema))
        return f"value:{name}"


def test_a_state_handler_registers_its_state_without_unpickling_the_operator_and_runs_it_on_rows():
    import pickle

    from fissure.spark.state.handler import LightStateProcessor

    shipped = pickle.loads(pickle.dumps(LightStateProcessor(RecordingProcessor())))  # as Spark ships it
    RecordingProcessor.unpickled = 0
    handle = FakeHandle()
    shipped.init(handle)  # what PySpark's state-schema process does: nothing of the operator is loaded
    assert handle.registered == [("map", "keys", "entry int", "value binary"), ("value", "due", "value binary")]
    assert RecordingProcessor.unpickled == 0
    assert list(shipped.handleInputRows((3,), iter(["rows"]), None)) == [((3,), ["due", "keys"], ["rows"])]
    assert list(shipped.handleInputRows((4,), iter([]), None)) == [((4,), ["due", "keys"], [])]
    assert RecordingProcessor.unpickled == 1  # once, on the first rows
    shipped.close()
    assert shipped._processor.closed


def test_importing_the_state_handler_loads_neither_pandas_nor_pyarrow_nor_the_worker_layer():
    import subprocess
    import sys

    code = ("import sys, fissure.spark.state.handler; "
            "print(sorted(m for m in ('pandas', 'pyarrow', 'fissure.runtime.operators.keyed', 'fissure.program.operators') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
