"""The checkpoint lock: its policy on a fake clock and fake processes, and its files on the local
file system (real create-exclusive races between threads). Spark runs: tests/spark/checkpoint/test_checkpoint_guard.py."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time

import pytest

from fissure.lifecycle.checkpoint_lock import (
    LockAction, LockFile, LockRecord, ProcessIdentity, decide, holds,
)
from fissure.spark.checkpoint.files import LocalStore
from fissure.spark.checkpoint.lock import (
    LOCK_FOLDER, CheckpointLock, CheckpointLocked, generations, process_alive, read_latest, this_process,
)

HERE = ProcessIdentity(pid=100, host="h1", boot_id="boot", pid_namespace="pid:[1]", started="50")
LEASE_S = 60.0


def record(holder: ProcessIdentity, *, started_at: float = 1000.0, released: bool = False,
           program: str = "wordcount") -> LockRecord:
    return LockRecord(token=f"t{holder.pid}", holder=holder, program=program, command="python job.py",
                      started_at=started_at, lease_s=LEASE_S, released=released)


def alive_set(*pids):
    return lambda pid, started: pid in pids


# --- policy -------------------------------------------------------------------------------------
def test_a_free_or_released_checkpoint_is_acquired_at_the_next_generation():
    first = decide(None, HERE, 0.0, alive_set(), LEASE_S)
    assert (first.action, first.generation) == (LockAction.ACQUIRE, 1)
    other = ProcessIdentity(pid=7, host="h1", boot_id="boot", pid_namespace="pid:[1]")
    released = decide(LockFile(4, record(other, released=True)), HERE, 2000.0, alive_set(7), LEASE_S)
    assert (released.action, released.generation) == (LockAction.ACQUIRE, 5)


def test_a_holder_on_this_machine_is_judged_by_its_processes():
    holder = ProcessIdentity(pid=7, host="h1", boot_id="boot", pid_namespace="pid:[1]", started="9",
                             jvm_pid=8, jvm_started="10")
    latest = LockFile(3, record(holder), modified_s=1000.0)
    # Alive however old its lease: the pid check is exact on one machine.
    refused = decide(latest, HERE, 1e9, alive_set(7, 8), LEASE_S)
    assert refused.action is LockAction.REFUSE and "process 7 is running" in refused.reason
    waiting = decide(latest, HERE, 1000.0, alive_set(8), LEASE_S)
    assert waiting.action is LockAction.WAIT and "JVM 8" in waiting.reason
    taken = decide(latest, HERE, 1000.0, alive_set(), LEASE_S)
    assert (taken.action, taken.generation) == (LockAction.TAKE_OVER, 4) and "gone" in taken.reason
    # The probe gets the recorded start mark: a reused pid is another process.
    seen = []
    decide(latest, HERE, 1000.0, lambda pid, started: seen.append((pid, started)) or False, LEASE_S)
    assert seen[0] == (7, "9")


def test_another_run_in_this_process_is_refused():
    same = ProcessIdentity(pid=100, host="h1", boot_id="boot", pid_namespace="pid:[1]", started="50")
    decision = decide(LockFile(1, record(same)), HERE, 1000.0, alive_set(100), LEASE_S)
    assert decision.action is LockAction.REFUSE and "this process" in decision.reason


def test_a_holder_on_another_machine_is_judged_by_its_lease_on_the_clock():
    remote = ProcessIdentity(pid=100, host="h2", boot_id="other", pid_namespace="pid:[1]")
    latest = LockFile(2, record(remote, started_at=1000.0), modified_s=1030.0)  # renewed at 1030
    assert decide(latest, HERE, 1030.0 + LEASE_S, alive_set(), LEASE_S).action is LockAction.REFUSE
    expired = decide(latest, HERE, 1030.0 + LEASE_S + 1, alive_set(), LEASE_S)
    assert expired.action is LockAction.TAKE_OVER and "h2" in expired.reason and "lease" in expired.reason
    # Same host name, another container (pid namespace): pids cannot be compared, the lease decides.
    twin = ProcessIdentity(pid=100, host="h1", boot_id="boot", pid_namespace="pid:[2]")
    assert decide(LockFile(2, record(twin), 1030.0), HERE, 1031.0, alive_set(), LEASE_S).action is LockAction.REFUSE


def test_an_unreadable_record_is_held_until_it_is_a_lease_old():
    broken = LockFile(5, None, modified_s=1000.0, problem="not JSON")
    young = decide(broken, HERE, 1000.0 + LEASE_S, alive_set(), LEASE_S)
    assert young.action is LockAction.REFUSE and "unreadable" in young.reason
    assert decide(broken, HERE, 1000.0 + LEASE_S + 1, alive_set(), LEASE_S).action is LockAction.TAKE_OVER


def test_the_newest_generation_wins():
    assert holds([1, 2, 3], 3) and not holds([1, 2, 3, 4], 3) and holds([], 1)


def test_a_record_reads_back_and_describes_its_holder():
    holder = ProcessIdentity(pid=4242, host="node-7", jvm_pid=4243)
    text = record(holder, started_at=time.time() - 300).to_json()
    again = LockRecord.from_json(text)
    assert again.holder == holder
    description = again.describe(time.time())
    for part in ("'wordcount'", "python job.py", "pid 4242", "JVM pid 4243", "host node-7", "5 min ago"):
        assert part in description
    with pytest.raises(ValueError):
        LockRecord.from_json('{"token": 1}')


# --- processes ----------------------------------------------------------------------------------
def test_process_alive_sees_dead_and_reused_pids():
    me = this_process()
    assert process_alive(me.pid, me.started)
    if me.started:  # Linux: the start mark tells a reused pid apart
        assert not process_alive(me.pid, str(int(me.started) + 1))
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not process_alive(child.pid, "")


# --- files --------------------------------------------------------------------------------------
def identity(pid: int) -> ProcessIdentity:
    return ProcessIdentity(pid=pid, host="h1", boot_id="boot", pid_namespace="pid:[1]", started="1")


def test_a_second_run_is_refused_naming_the_holder_and_a_released_lock_is_free(tmp_path):
    store = LocalStore(str(tmp_path / "ckpt"))
    first = CheckpointLock.acquire(store, "wordcount", identity=identity(11), alive=alive_set(11), renew=False)
    assert first.record.created_directory and generations(store) == [1]
    with pytest.raises(CheckpointLocked) as refused:
        CheckpointLock.acquire(store, "other", identity=identity(12), alive=alive_set(11), renew=False)
    message = str(refused.value)
    for part in ("in use by another run", "'wordcount'", "pid 11", "host h1", "started 20"):
        assert part in message
    assert refused.value.holder.token == first.record.token
    (tmp_path / "ckpt" / "metadata").write_text("{}")  # a stream was started: the directory stays
    first.release()
    latest = read_latest(store)
    assert latest.generation == 2 and latest.record.released
    second = CheckpointLock.acquire(store, "other", identity=identity(12), alive=alive_set(11), renew=False)
    assert second.generation == 3 and generations(store) == [3]  # older generations pruned
    second.release()


def test_a_lock_that_made_the_directory_and_kept_nothing_removes_it(tmp_path):
    store = LocalStore(str(tmp_path / "new"))
    lock = CheckpointLock.acquire(store, "p", identity=identity(11), alive=alive_set(11), renew=False)
    lock.release()
    assert not (tmp_path / "new").exists()
    (tmp_path / "old").mkdir()
    lock = CheckpointLock.acquire(LocalStore(str(tmp_path / "old")), "p", identity=identity(11), alive=alive_set(11),
                                  renew=False)
    assert not lock.record.created_directory
    lock.release()
    assert (tmp_path / "old").is_dir()


def test_a_stale_lock_is_taken_over_and_says_whose(tmp_path, caplog):
    store = LocalStore(str(tmp_path / "ckpt"))
    CheckpointLock.acquire(store, "crashed-job", identity=identity(21), alive=alive_set(21), renew=False)
    with caplog.at_level(logging.WARNING, logger="fissure.spark.checkpoint.lock"):
        lock = CheckpointLock.acquire(store, "next", identity=identity(22), alive=alive_set(22), renew=False)
    assert lock.generation == 2
    assert any("took over" in r.getMessage() and "'crashed-job'" in r.getMessage() and "pid 21" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("stale", [False, True])
def test_runs_racing_for_a_lock_have_one_winner(tmp_path, stale):
    """Twelve threads, each a run of its own (a pid of its own, all alive), race to acquire a free
    checkpoint, or to take over one whose holder is dead: exactly one wins, every time."""
    for attempt in range(5):
        store = LocalStore(str(tmp_path / f"ckpt{attempt}"))
        if stale:
            CheckpointLock.acquire(store, "dead", identity=identity(999), alive=alive_set(999), renew=False)
        racers = list(range(1, 13))
        alive = alive_set(*racers)
        start, outcomes = threading.Barrier(len(racers)), {}

        def race(pid):
            start.wait()
            try:
                outcomes[pid] = CheckpointLock.acquire(store, f"run{pid}", identity=identity(pid), alive=alive,
                                                       renew=False)
            except CheckpointLocked as error:
                outcomes[pid] = error

        threads = [threading.Thread(target=race, args=(pid,)) for pid in racers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        winners = [outcome for outcome in outcomes.values() if isinstance(outcome, CheckpointLock)]
        assert len(winners) == 1
        assert read_latest(store).record.token == winners[0].record.token
        assert all(f"pid {winners[0].record.holder.pid}" in str(outcome)
                   for outcome in outcomes.values() if isinstance(outcome, CheckpointLocked))


def test_a_holder_whose_lease_ran_out_loses_the_checkpoint_and_is_told(tmp_path):
    store = LocalStore(str(tmp_path / "ckpt"))
    remote = ProcessIdentity(pid=os.getpid(), host="elsewhere", boot_id="x", pid_namespace="y")
    holder = CheckpointLock.acquire(store, "slow", identity=remote, lease_s=0.2, alive=alive_set(), renew=True)
    told = threading.Event()
    holder.on_lost.append(lambda reason: told.set())
    # A run on another machine, its clock a minute on: the lease has run out for it.
    taker = CheckpointLock.acquire(store, "next", identity=identity(5), alive=alive_set(5), renew=False,
                                   clock=lambda: time.time() + 60)
    assert told.wait(5) and "'next'" in holder.lost
    with pytest.raises(Exception, match="took the checkpoint"):
        holder.check_held()
    holder.release()  # lost: writes nothing
    assert read_latest(store).record.token == taker.record.token
    assert (tmp_path / "ckpt" / LOCK_FOLDER).is_dir()


@pytest.mark.spark
def test_the_lock_works_through_hadoops_file_system(spark, tmp_path):
    """The store for HDFS and object stores, here on the local file system through Hadoop (its
    best-effort mode: the write read back); a local path resolves to the operating system's store."""
    from fissure.spark.checkpoint.files import HadoopStore, open_store

    local = open_store(spark, str(tmp_path / "ckpt"))
    assert isinstance(local, LocalStore) and local.location == str(tmp_path / "ckpt")
    store = HadoopStore(spark, f"file://{tmp_path}/remote", "settle", settle_s=0.01)
    assert store.make_directory() and not store.make_directory()
    assert store.create_exclusive("fissure/lock/x", "one") and not store.create_exclusive("fissure/lock/x", "two")
    assert store.read("fissure/lock/x") == "one" and store.names("fissure/lock") == ["x"]
    store.write("fissure/program.json", "{}")
    assert store.read("fissure/program.json") == "{}" and store.modified_s("fissure/lock/x") > 0
    store.delete("fissure/lock/x")
    assert store.read("fissure/lock/x") is None and store.names("missing") == []
    first = CheckpointLock.acquire(store, "p", identity=identity(11), alive=alive_set(11), renew=False)
    with pytest.raises(CheckpointLocked, match="pid 11"):
        CheckpointLock.acquire(store, "q", identity=identity(12), alive=alive_set(11), renew=False)
    store.touch(f"{LOCK_FOLDER}/{first.generation:010d}", time.time())
    first.release()
    assert read_latest(store).record.released
