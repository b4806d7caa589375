"""Faults at a run's start: a checkpoint whose state repartition a dead driver left unfinished is
finished and resumed exactly once; a start that fails removes the checkpoint directory it made."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import fissure
from fissure import Pipeline
from fissure.spark.query.runner import Runner
from fissure.spark.io.sinks import FileSink, MemorySink
from fissure.spark.state.repartition import checkpoint_status, unfinished_repartition
from fissure.testing import record_files

EVENTS = {"user": str, "i": int}
COUNTED = {"user": str, "i": int, "n": int}
USERS, PER_FILE = 3, 10


def count(state, record):
    state["n"] = state.get("n", 0) + 1
    return {"user": record["user"], "i": record["i"], "n": state["n"]}


def word_count():
    return Pipeline("word-count").partitioned("count", count, key="user", schema=COUNTED)


def events(first, last):
    return [{"user": f"u{i % USERS}", "i": i} for i in range(first, last)]


# The driver that repartitions the checkpoint's state (Spark's checkpoint manager, as an adaptive
# switch does) and is killed by the test while it does.
REPARTITIONER = textwrap.dedent("""
    import sys
    import fissure
    from fissure.spark.session.create import create_session
    spark = create_session(fissure.RunnerConfig(master="local[1]"))
    print("ready", flush=True)
    spark._streamingCheckpointManager.repartition(sys.argv[1], int(sys.argv[2]))
    print("done", flush=True)
""")


def kill_during_repartition(tmp_path, checkpoint, partitions, kill_when):
    """Run the repartition in a separate driver and SIGKILL it as soon as `kill_when()` holds."""
    script = tmp_path / "repartition.py"
    script.write_text(REPARTITIONER)
    driver = subprocess.Popen([sys.executable, str(script), checkpoint, str(partitions)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert driver.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 120
        while not kill_when() and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert driver.poll() is None, "the repartition ended before the kill point"
        os.kill(driver.pid, signal.SIGKILL)
    finally:
        driver.kill()
        driver.wait()


def assert_exactly_once(rows, total):
    assert sorted(row["i"] for row in rows) == list(range(total))
    per_user = {}
    for row in rows:
        per_user.setdefault(row["user"], []).append(row["n"])
    assert {user: sorted(ns) for user, ns in per_user.items()} == {
        user: list(range(1, len(ns) + 1)) for user, ns in per_user.items()}


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("kill_point, adaptive", [("offset-logged", False), ("state-written", True)])
def test_a_repartition_killed_midway_is_finished_at_the_next_start(spark, tmp_path, caplog, kill_point, adaptive):
    """The kill leaves batch N+1 logged without a commit: with only its offset-log entry
    ("offset-logged"), or with the new partitions' state already written ("state-written").
    Spark refuses to start on it (STREAMING_UNFINISHED_REPARTITION_DETECTED); fissure.run, plain
    or adaptive, finishes the repartition and resumes: every input once, every count 1..n."""
    checkpoint, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    source = record_files(tmp_path / "in", events(0, 20), EVENTS, records_per_file=PER_FILE, max_files_per_trigger=1)
    fissure.run(word_count(), source, FileSink(out), checkpoint=checkpoint,
                config=fissure.RunnerConfig(spark=spark, progress="off"))
    committed = checkpoint_status(spark, checkpoint)
    assert (committed.last_batch, committed.last_committed, committed.state_partitions) == (1, 1, 1)

    def offset_logged():
        return os.path.exists(os.path.join(checkpoint, "offsets", "2"))

    def state_written():
        return os.path.isdir(os.path.join(checkpoint, "state", "0", "1"))

    kill_during_repartition(tmp_path, checkpoint, 2, offset_logged if kill_point == "offset-logged" else state_written)
    found = unfinished_repartition(spark, checkpoint)
    assert found is not None and (found.batch, found.last_committed, found.partitions_before,
                                  found.partitions_after) == (2, 1, 1, 2)

    source = record_files(tmp_path / "in", events(20, 40), EVENTS, records_per_file=PER_FILE,
                          max_files_per_trigger=1, first_file=2)
    with caplog.at_level("WARNING", logger="fissure.spark.state.repartition"):
        fissure.run(word_count(), source, FileSink(out), checkpoint=checkpoint,
                    config=fissure.RunnerConfig(spark=spark, progress="off",
                                                replanning="adaptive" if adaptive else "off",
                                                run_dir=str(tmp_path / "run")))
    assert any("recovered" in record.getMessage() and "did not finish" in record.getMessage()
               for record in caplog.records)
    after = checkpoint_status(spark, checkpoint)
    assert after.state_partitions == 2 and not after.has_uncommitted_batch
    assert_exactly_once([row.asDict() for row in spark.read.parquet(out).collect()], 40)


@pytest.mark.spark
def test_a_start_that_fails_removes_the_checkpoint_directory_it_created(spark, tmp_path):
    """Spark writes a new checkpoint's metadata and logs before it refuses the query (here: a
    query of that name is already active); the directory goes again. One that was there before
    stays. A Runner given no checkpoint removes the temporary one it made when its start fails."""
    source = record_files(tmp_path / "in", events(0, 3), EVENTS)
    other = spark.readStream.format("rate").load().writeStream.format("memory").queryName("taken").start()
    try:
        checkpoint = tmp_path / "ckpt"
        runner = Runner(word_count(), source, MemorySink(), checkpoint=str(checkpoint),
                        config=fissure.RunnerConfig(spark=spark, progress="off", query_name="taken"))
        with pytest.raises(Exception, match="already active"):
            runner.start()
        assert not checkpoint.exists()
        checkpoint.mkdir()
        (checkpoint / "keep").write_text("mine")
        with pytest.raises(Exception, match="already active"):
            Runner(word_count(), source, MemorySink(), checkpoint=str(checkpoint),
                   config=fissure.RunnerConfig(spark=spark, progress="off", query_name="taken")).start()
        assert (checkpoint / "keep").read_text() == "mine"
    finally:
        other.stop()

    def broken_source(session):
        raise RuntimeError("the source cannot be opened")

    runner = Runner(word_count(), broken_source, MemorySink(), config=fissure.RunnerConfig(spark=spark, progress="off"))
    assert os.path.isdir(runner.checkpoint)  # a temporary checkpoint of its own
    with pytest.raises(RuntimeError, match="cannot be opened"):
        runner.start()
    assert not os.path.exists(runner.checkpoint)


CRASHING_DRIVER = textwrap.dedent("""
    import os, sys
    import fissure
    from fissure import Pipeline
    from fissure.spark.io.sinks import FileSink
    from fissure.spark.io.sources import FileSource
    from fissure.spark.session.create import describe_failure

    inputs, work = sys.argv[1:3]

    def run(mode):
        marker = os.path.join(work, f"crashed-{mode}")

        def tag(record):
            if record["i"] == 3 and (mode == "always" or not os.path.exists(marker)):
                open(marker, "w").close()
                os._exit(1)  # the Python worker process dies: no exception, no traceback
            return record

        def count(state, record):
            state["n"] = state.get("n", 0) + 1
            return {"user": record["user"], "i": record["i"], "n": state["n"]}

        pipeline = (Pipeline(f"crashing-{mode}").map("tag", tag)
                    .partitioned("count", count, key="user", schema={"user": str, "i": int, "n": int}))
        try:  # the embedded default master: RunnerConfig() as it comes
            fissure.run(pipeline, FileSource(inputs, format="json", schema={"user": str, "i": int}),
                        FileSink(os.path.join(work, f"out-{mode}")), config=fissure.RunnerConfig(progress="off"))
        except Exception as error:
            with open(os.path.join(work, f"failure-{mode}.txt"), "w") as failure:
                failure.write(describe_failure(error))
            return False
        return True

    # Both runs in one driver, one after the other: one JVM start for the two.
    once, always = run("once"), run("always")
    sys.exit(0 if once and always else 1)
""")


@pytest.fixture(scope="module")
def crashed_runs(tmp_path_factory):
    """One driver process under the default master: a worker that crashes once in the first run,
    one that crashes every time in the second; the work directory (markers, sinks, failures)."""
    work = tmp_path_factory.mktemp("crashes")
    inputs = work / "in"
    inputs.mkdir()
    (inputs / "part-0.json").write_text("".join(f'{{"user": "u{i % 2}", "i": {i}}}\n' for i in range(8)))
    script = work / "driver.py"
    script.write_text(CRASHING_DRIVER)
    finished = subprocess.run([sys.executable, str(script), str(inputs), str(work)], capture_output=True, text=True,
                              timeout=600)
    (work / "driver.log").write_text(finished.stdout + finished.stderr)
    return work


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.xdist_group("worker-crashes")  # one process runs crashed_runs for both
@pytest.mark.parametrize("mode", ["once", "always"])
def test_a_worker_crash_is_retried_under_the_default_master(crashed_runs, mode):
    """A worker that crashes once (a marker file remembers it) costs a retry and the output is
    exactly once; one that always crashes ends the run with the crash as its cause."""
    assert (crashed_runs / f"crashed-{mode}").exists()  # the worker did crash
    failure = crashed_runs / f"failure-{mode}.txt"
    if mode == "once":
        assert not failure.exists(), failure.read_text() + (crashed_runs / "driver.log").read_text()[-2000:]
        import pyarrow.parquet as pq

        assert_exactly_once(pq.read_table(crashed_runs / "out-once").to_pylist(), 8)
    else:
        assert "caused by Python worker exited unexpectedly (crashed)" in failure.read_text()
