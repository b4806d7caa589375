"""Kill the driver mid-stream (SIGKILL, separate process), restart on the same checkpoint: every
input record's result is in the sink exactly once, and keyed state counted every record once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from fissure.testing import record_files

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FILES = 12
RECORDS_PER_FILE = 20

DRIVER = textwrap.dedent("""
    import sys, time
    import fissure
    from fissure import Pipeline
    from fissure.spark.io.sinks import FileSink
    from fissure.spark.io.sources import FileSource

    def slow_tag(record):
        time.sleep(0.01)
        return {"user": record["user"], "i": record["i"]}

    def count(state, record):
        state["n"] = state.get("n", 0) + 1
        return {"user": record["user"], "i": record["i"], "n": state["n"]}

    inputs, sink, checkpoint, available_now = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    pipeline = (Pipeline("restart").map("slow_tag", slow_tag)
                .partitioned("count", count, key="user", schema={"user": str, "i": int, "n": int}))
    source = FileSource(inputs, format="json", schema={"user": str, "i": int}, max_files_per_trigger=1)
    config = fissure.RunnerConfig(master="local[2]", available_now=available_now, progress="off")
    fissure.run(pipeline, source, FileSink(sink), checkpoint=checkpoint, plan="sequential", config=config)
""")


def start_driver(script, inputs, sink, checkpoint, available_now):
    return subprocess.Popen([sys.executable, str(script), str(inputs), str(sink), str(checkpoint),
                             "1" if available_now else "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def committed_batches(sink):
    if not os.path.isdir(sink):
        return 0
    return sum(os.path.exists(os.path.join(sink, entry, "_SUCCESS")) for entry in os.listdir(sink))


def test_sigkill_then_restart_has_no_loss_and_no_duplicates(spark, tmp_path):
    records = [{"user": f"u{i % 4}", "i": i} for i in range(FILES * RECORDS_PER_FILE)]
    record_files(tmp_path / "in", records, {"user": str, "i": int}, records_per_file=RECORDS_PER_FILE)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    sink, checkpoint = tmp_path / "out", tmp_path / "ckpt"

    first = start_driver(script, tmp_path / "in", sink, checkpoint, available_now=False)
    deadline = time.monotonic() + 240
    while committed_batches(sink) < 3 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.2)
    assert first.poll() is None, "the first driver ended before it could be killed"
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    killed_after = committed_batches(sink)
    assert 3 <= killed_after < FILES

    second = start_driver(script, tmp_path / "in", sink, checkpoint, available_now=True)
    assert second.wait(timeout=300) == 0

    rows = spark.read.parquet(str(sink)).collect()
    assert sorted(row.i for row in rows) == list(range(FILES * RECORDS_PER_FILE))
    # The keyed state saw each record once: per user, the counts are exactly 1..n.
    per_user = {}
    for row in rows:
        per_user.setdefault(row.user, []).append(row.n)
    assert {user: sorted(counts) for user, counts in per_user.items()} == {
        f"u{u}": list(range(1, FILES * RECORDS_PER_FILE // 4 + 1)) for u in range(4)}
