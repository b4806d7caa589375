"""The cluster tests' processes never outlive the test process: a SIGTERM (a time limit) kills
their groups at once, and what a SIGKILLed test process left is reaped by the next session."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from spark_cluster_support import ProcessGroups, _started_at, reap_leftovers

HERE = Path(__file__).parent

# A test process that starts a long-running "daemon" with a child of its own, prints both pids, waits.
OWNER = textwrap.dedent("""
    import subprocess, sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from spark_cluster_support import ProcessGroups
    groups = ProcessGroups(Path(sys.argv[2]))
    daemon = groups.start(["sh", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    print(daemon.pid, daemon.stdout.readline().strip(), flush=True)
    time.sleep(300)
""")


def gone(pid: int, within_s: float = 10.0) -> bool:
    """The process ended (no such pid, or a zombie its parent has yet to reap)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def start_owner(pid_directory: Path) -> tuple[subprocess.Popen, int, int]:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(HERE), str(pid_directory)], stdout=subprocess.PIPE,
                             text=True)
    daemon, grandchild = map(int, owner.stdout.readline().split())
    return owner, daemon, grandchild


def test_a_terminated_test_process_kills_its_daemons_groups(tmp_path):
    owner, daemon, grandchild = start_owner(tmp_path)
    try:
        assert not gone(grandchild, within_s=0.2)
        owner.send_signal(signal.SIGTERM)
        assert owner.wait(timeout=20) == -signal.SIGTERM  # the handler ends it as the signal would
        assert gone(daemon) and gone(grandchild)
        assert list(tmp_path.glob("*.json")) == []
    finally:
        owner.kill()
        reap_leftovers(tmp_path)


def test_the_next_session_reaps_what_a_killed_test_process_left(tmp_path):
    owner, daemon, grandchild = start_owner(tmp_path)
    try:
        owner.send_signal(signal.SIGKILL)  # no handler runs
        owner.wait(timeout=20)
        assert not gone(grandchild, within_s=0.5)
        assert reap_leftovers(tmp_path) == [daemon]
        assert gone(daemon) and gone(grandchild)
        assert list(tmp_path.glob("*.json")) == []
    finally:
        reap_leftovers(tmp_path)


def test_a_reused_pid_is_left_alone(tmp_path):
    groups = ProcessGroups(tmp_path)
    stranger = groups.start(["sleep", "300"])
    try:
        record = tmp_path / f"{stranger.pid}.json"
        # As if a dead test process's group leader had had this pid, started at another time.
        record.write_text(json.dumps({"pgid": stranger.pid, "owner": 2 ** 22 + 1, "started": "1"}))
        assert _started_at(stranger.pid) != "1"
        assert reap_leftovers(tmp_path) == [] and not record.exists()
        assert stranger.poll() is None
    finally:
        groups.kill(stranger)
        stranger.wait(timeout=10)
