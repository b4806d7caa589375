"""A checkpoint on Spark: one run at a time (the second refused, naming the holder; a dead
holder's lock taken over), a failed start that keeps what it did not make, a changed program
refused before its query starts (and let through where the state is still valid), and a missing
offsets file named as such. Two driver processes at once: tests/spark/test_faults.py
("concurrent+written-in-place")."""

from __future__ import annotations

from dataclasses import replace

import logging
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

import fissure
from fissure import Pipeline, PipelineError
from fissure.spark.checkpoint.files import LocalStore
from fissure.spark.checkpoint.guard import CheckpointDamaged, ProgramChanged
from fissure.spark.checkpoint.lock import LOCK_FOLDER, CheckpointLocked, this_process
from fissure.lifecycle.checkpoint_lock import LockRecord
from fissure.spark.query.runner import Runner
from fissure.spark.io.sinks import FileSink, MemorySink
from fissure.spark.state.repartition import checkpoint_status
from fissure.testing import record_files

pytestmark = pytest.mark.spark

EVENTS = {"user": str, "host": str, "i": int}
PREPPED = {"user": str, "host": str, "i": int, "nu": int, "nh": int}
USERS, HOSTS, PER_FILE = 3, 2, 10


def prep(record):
    return {**record, "nu": 0, "nh": 0}


def note(state, record, field):
    state["n"] = state.get("n", 0) + 1
    return {**record, field: state["n"]}


def count_users(state, record):
    return note(state, record, "nu")


def count_hosts(state, record):
    return note(state, record, "nh")


def lowered(record):
    return {**record, "user": record["user"].lower()}


def counts(order=("per_user", "per_host"), keys=None, names=None, versions=None, extra_map=False):
    """prep, then the keyed counters in `order`, each keyed as `keys` says, named as `names` says."""
    keys = {"per_user": "user", "per_host": "host", **(keys or {})}
    names, versions = names or {}, versions or {}
    pipeline = Pipeline("counts").map("prep", prep, schema=PREPPED)
    if extra_map:
        pipeline.map("lowered", lowered)
    for role in order:
        fn = count_users if role == "per_user" else count_hosts
        pipeline.partitioned(names.get(role, role), fn, key=keys[role], state_version=versions.get(role, 1))
    return pipeline


def events(first, last):
    return [{"user": f"u{i % USERS}", "host": f"h{i % HOSTS}", "i": i} for i in range(first, last)]


def write_events(tmp_path, first, last):
    return record_files(tmp_path / "in", events(first, last), EVENTS, records_per_file=PER_FILE,
                        max_files_per_trigger=1, first_file=first // PER_FILE)


def assert_counted_once(rows, total):
    """Every input once; per user and per host, the counts are exactly 1..n (state carried over)."""
    assert sorted(row["i"] for row in rows) == list(range(total))
    for field, key in (("nu", "user"), ("nh", "host")):
        seen = {}
        for row in rows:
            seen.setdefault(row[key], []).append(row[field])
        assert {k: sorted(v) for k, v in seen.items()} == {k: list(range(1, len(v) + 1)) for k, v in seen.items()}


def quiet(spark) -> fissure.RunnerConfig:
    return fissure.RunnerConfig(spark=spark, progress="off")


def run(program, tmp_path, spark, first, last, plan="sequential"):
    fissure.run(program, write_events(tmp_path, first, last), FileSink(str(tmp_path / "out")), plan=plan,
                checkpoint=str(tmp_path / "ckpt"), config=fissure.RunnerConfig(spark=spark, progress="off"))


def sink_rows(spark, tmp_path):
    return [row.asDict() for row in spark.read.parquet(str(tmp_path / "out")).collect()]


# --- one run at a time --------------------------------------------------------------------------
def test_a_second_runner_on_a_running_checkpoint_is_refused_naming_the_first(spark, tmp_path):
    source = write_events(tmp_path, 0, 20)
    checkpoint = str(tmp_path / "ckpt")
    first = Runner(counts(), source, MemorySink(), checkpoint=checkpoint, config=quiet(spark))
    first.start()  # runs until stopped
    try:
        first.process_all_available()
        second = Runner(counts(), source, MemorySink(), checkpoint=checkpoint, config=quiet(spark))
        with pytest.raises(CheckpointLocked) as refused:
            second.start()
        message = str(refused.value)
        for part in ("in use by another run", "'counts'", f"pid {os.getpid()}", f"host {socket.gethostname()}",
                     "started ", "another run in it"):
            assert part in message, message
        assert second.query is None and first.query.isActive
    finally:
        first.stop()
    again = Runner(counts(), source, MemorySink(), checkpoint=checkpoint, config=quiet(spark))
    again.start(available_now=True)
    again.await_termination()
    again.stop()


def test_the_lock_of_a_dead_run_is_taken_over(spark, tmp_path, caplog):
    run(counts(), tmp_path, spark, 0, 20)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = this_process()
    holder = LockRecord(token="dead", holder=type(me)(pid=dead.pid, host=me.host, boot_id=me.boot_id,
                                                        pid_namespace=me.pid_namespace),
                        program="crashed-counts", command="python crashed.py", started_at=time.time() - 60,
                        lease_s=120.0)
    store = LocalStore(str(tmp_path / "ckpt"))
    assert store.create_exclusive(f"{LOCK_FOLDER}/{9:010d}", holder.to_json())  # newer than the released one
    with caplog.at_level(logging.WARNING, logger="fissure.spark.checkpoint.lock"):
        run(counts(), tmp_path, spark, 20, 40)
    assert any("took over" in r.getMessage() and "'crashed-counts'" in r.getMessage() and f"pid {dead.pid}" in
               r.getMessage() for r in caplog.records)
    assert_counted_once(sink_rows(spark, tmp_path), 40)


def test_a_failed_start_keeps_a_checkpoint_another_writer_filled_meanwhile(spark, tmp_path):
    """The runner's start finds no checkpoint; while it opens its source, a writer that does not
    take the lock (an older fissure, another tool) puts a checkpoint with committed batches there;
    then the start fails. What it cannot prove it made stays, and the checkpoint still resumes."""
    done = tmp_path / "done"
    # Read as Spark lists the files (settle_s=None): a staged source's log names the staging
    # folder inside its checkpoint, so a copy of that checkpoint elsewhere would not resume.
    fissure.run(counts(), replace(write_events(tmp_path, 0, 20), settle_s=None), FileSink(str(tmp_path / "out")),
                checkpoint=str(done), config=fissure.RunnerConfig(spark=spark, progress="off"))
    checkpoint = tmp_path / "ckpt"

    def meanwhile(session):
        shutil.copytree(done, checkpoint, dirs_exist_ok=True, ignore=shutil.ignore_patterns("lock"))
        raise RuntimeError("the source cannot be opened")

    runner = Runner(counts(), meanwhile, MemorySink(), checkpoint=str(checkpoint), config=quiet(spark))
    with pytest.raises(RuntimeError, match="cannot be opened"):
        runner.start()
    status = checkpoint_status(spark, str(checkpoint))
    assert (status.last_batch, status.last_committed) == (1, 1)
    fissure.run(counts(), replace(write_events(tmp_path, 20, 30), settle_s=None), FileSink(str(tmp_path / "out")),
                checkpoint=str(checkpoint), config=fissure.RunnerConfig(spark=spark, progress="off"))  # resumes: counts go on
    assert_counted_once(sink_rows(spark, tmp_path), 30)


# --- a changed program --------------------------------------------------------------------------
def test_a_changed_stateful_program_is_refused_before_its_query_starts(spark, tmp_path):
    run(counts(), tmp_path, spark, 0, 20)
    before = checkpoint_status(spark, str(tmp_path / "ckpt"))
    batches = sorted(os.listdir(tmp_path / "out"))
    refused = {
        "swapped": (counts(order=("per_host", "per_user")), "operators per_host and per_user swapped places"),
        "key": (counts(keys={"per_user": "host"}), "operator per_user: key user -> host"),
        "renamed": (counts(names={"per_user": "by_user"}), "renamed per_user -> by_user"),
        "version": (counts(versions={"per_host": 2}), "operator per_host: state_version 1 -> 2"),
    }
    for label, (program, expected) in refused.items():
        with pytest.raises(ProgramChanged) as error:
            run(program, tmp_path, spark, 20, 30)
        message = str(error.value)
        assert expected in message and "new checkpoint" in message, (label, message)
        assert ("fissure.migrate_state(" in message) == (label in ("renamed", "version")), (label, message)
    after = checkpoint_status(spark, str(tmp_path / "ckpt"))
    assert (after.last_batch, after.last_committed) == (before.last_batch, before.last_committed)
    assert sorted(os.listdir(tmp_path / "out")) == batches


def test_an_added_stateless_operator_and_another_plan_resume_the_state(spark, tmp_path):
    run(counts(), tmp_path, spark, 0, 20)
    run(counts(extra_map=True), tmp_path, spark, 20, 30)
    replicated = {"regions": [{"pipelines": [["prep", "lowered"]], "replicas": 1},
                              {"pipelines": [["per_user"]], "replicas": 2},
                              {"pipelines": [["per_host"]], "replicas": 2}]}
    run(counts(extra_map=True), tmp_path, spark, 30, 40, plan=replicated)
    assert_counted_once(sink_rows(spark, tmp_path), 40)


def test_a_migration_lets_a_renamed_operator_and_a_new_state_version_resume(spark, tmp_path):
    run(counts(), tmp_path, spark, 0, 20)
    changed = counts(names={"per_user": "by_user"}, versions={"per_host": 2})
    checkpoint = str(tmp_path / "ckpt")
    with pytest.raises(ProgramChanged, match="cannot be migrated"):
        fissure.migrate_state(checkpoint, counts(keys={"per_user": "host"}), spark=spark)
    with pytest.raises(ProgramChanged, match="remain after the migration"):
        fissure.migrate_state(checkpoint, changed, renamed={"per_user": "by_user"}, spark=spark)
    with pytest.raises(PipelineError, match="'nobody', which the checkpoint's record does not have"):
        fissure.migrate_state(checkpoint, changed, renamed={"nobody": "by_user"}, spark=spark)
    fissure.migrate_state(checkpoint, changed, renamed={"per_user": "by_user"}, reads_old_state=["per_host"],
                          spark=spark)
    run(changed, tmp_path, spark, 20, 30)
    assert_counted_once(sink_rows(spark, tmp_path), 30)
    run(changed, tmp_path, spark, 30, 40)  # the record now is the new program's
    assert_counted_once(sink_rows(spark, tmp_path), 40)


# --- a damaged checkpoint -----------------------------------------------------------------------
@pytest.mark.parametrize("deleted, expected", [
    (2, "commit log records batch 2 as committed but the offsets log has no entry"),
    (1, "no entry for batch 1 between batches 0 and 2"),
])
def test_a_missing_offsets_file_is_named_not_taken_for_another_job(spark, tmp_path, deleted, expected):
    run(counts(), tmp_path, spark, 0, 30)
    os.remove(tmp_path / "ckpt" / "offsets" / str(deleted))
    with pytest.raises(CheckpointDamaged) as damaged:
        run(counts(), tmp_path, spark, 30, 40)
    message = str(damaged.value)
    assert expected in message and f"offsets/{deleted} missing" in message and "Multiple streaming jobs" in message


CLI_PIPELINE = """
from fissure import Pipeline

def count(state, record):
    state["n"] = state.get("n", 0) + 1
    return {"user": record["user"], "i": record["i"], "n": state["n"]}

def build():
    return Pipeline("cli").partitioned("count", count, key="user", schema={"user": str, "i": int, "n": int})
"""


def test_fissure_run_shows_the_holder_of_a_locked_checkpoint_whole(tmp_path):
    """`fissure run` on a checkpoint this test process holds: exit 1, the refusal whole on stderr."""
    from fissure.spark.checkpoint.lock import CheckpointLock

    (tmp_path / "pipeline.py").write_text(CLI_PIPELINE)
    record_files(tmp_path / "in", [{"user": "u", "i": 1}], {"user": str, "i": int})
    checkpoint = tmp_path / "a-checkpoint-with-a-long-name-so-that-the-message-runs-long" / "ckpt"
    held = CheckpointLock.acquire(LocalStore(str(checkpoint)), "holder-program", renew=False)
    try:
        finished = subprocess.run(
            [sys.executable, "-m", "fissure", "run", f"{tmp_path / 'pipeline.py'}:build", "--source",
             str(tmp_path / "in"), "--format", "json", "--schema", "user:str,i:int", "--sink", str(tmp_path / "out"),
             "--checkpoint", str(checkpoint), "--run-dir", str(tmp_path / "run"), "--master", "local[1]"],
            capture_output=True, text=True, timeout=300)
    finally:
        held.release()
    assert finished.returncode == 1, finished.stderr[-2000:]
    for part in (f"checkpoint {checkpoint} is in use by another run", "'holder-program'", f"pid {os.getpid()}",
                 "Two runs on one checkpoint would write the same batches twice"):
        assert part in finished.stderr, finished.stderr[-2000:]
