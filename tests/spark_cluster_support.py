"""A Spark standalone cluster on loopback for tests: a master and workers started from the pyspark
package's own `bin/spark-class`, each a process of the test, stopped when the block ends (also when
it fails). Their logs go to files under the given directory.

No process outlives the test run, however it ends: every daemon (and every command run with
`run_in_session`) starts in a process group of its own (`ProcessGroups`), which is killed when
the block ends, when the test process exits (atexit) and when it receives SIGTERM, SIGINT or
SIGHUP (a time limit, ^C, a closed terminal). Each group is also written to a pid file while it
runs; a test process killed with SIGKILL runs no handler, so the next test session kills what
such a process left (`reap_leftovers`, from conftest.py), checking each pid's start time first
so that a reused pid is left alone."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# Pid files of the process groups the test processes started and have not stopped yet.
PID_DIRECTORY = Path(tempfile.gettempdir()) / f"fissure-test-groups-{os.getuid()}"
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _started_at(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat): the same across its
    exec (spark-class's bash becomes java), another for a process that reuses the pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ProcessGroups:
    """The process groups this test process started (one per `start`), killed on demand, at exit
    and on a terminating signal."""

    def __init__(self, pid_directory: Path = PID_DIRECTORY) -> None:
        self.pid_directory = pid_directory
        self.running: dict[int, subprocess.Popen] = {}
        self._lock = threading.Lock()
        self._installed = False

    def start(self, command: list[str], **popen) -> subprocess.Popen:
        """Popen of `command` as the leader of a new process group (and session), recorded."""
        self._install()
        process = subprocess.Popen(command, start_new_session=True, **popen)
        self.pid_directory.mkdir(parents=True, exist_ok=True)
        record = {"pgid": process.pid, "owner": os.getpid(), "started": _started_at(process.pid)}
        (self.pid_directory / f"{process.pid}.json").write_text(json.dumps(record))
        with self._lock:
            self.running[process.pid] = process
        return process

    def kill(self, process: subprocess.Popen) -> None:
        """SIGKILL the process's whole group and forget it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        self.forget(process)

    def forget(self, process: subprocess.Popen) -> None:
        """The group ended (or was killed): drop its pid file."""
        with self._lock:
            self.running.pop(process.pid, None)
        with contextlib.suppress(FileNotFoundError):
            (self.pid_directory / f"{process.pid}.json").unlink()

    def kill_all(self) -> None:
        with self._lock:
            processes = list(self.running.values())
        for process in processes:
            self.kill(process)
        for process in processes:
            with contextlib.suppress(Exception):
                process.wait(timeout=10)

    def _install(self) -> None:
        if self._installed:
            return
        self._installed = True
        atexit.register(self.kill_all)
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread; atexit still holds
        for number in HANDLED_SIGNALS:
            previous = signal.getsignal(number)
            signal.signal(number, self._on_signal(number, previous))

    def _on_signal(self, number: int, previous):
        def handler(signum, frame):
            self.kill_all()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_IGN:
                return
            else:  # the default action: end this process with the same signal
                signal.signal(number, signal.SIG_DFL)
                os.kill(os.getpid(), number)
        return handler


GROUPS = ProcessGroups()


def reap_leftovers(pid_directory: Path = PID_DIRECTORY) -> list[int]:
    """Kill the process groups that test processes now gone left running (they were killed with
    SIGKILL); the groups killed. A group whose leader's start time is no longer the recorded one
    (its pid was reused) is only forgotten."""
    killed = []
    for pid_file in sorted(pid_directory.glob("*.json")):
        try:
            record = json.loads(pid_file.read_text())
            pgid, owner, started = int(record["pgid"]), int(record["owner"]), record["started"]
        except (OSError, ValueError, KeyError, TypeError):
            pid_file.unlink(missing_ok=True)
            continue
        if _alive(owner) and owner != os.getpid():
            continue  # another test session's, still running
        if started is not None and _started_at(pgid) == started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
                killed.append(pgid)
        pid_file.unlink(missing_ok=True)
    return killed


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, deadline_s: float) -> bool:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.5)
    return False


def spark_home() -> str:
    """The Spark inside the pyspark package (its bin/spark-class and bin/spark-submit)."""
    import pyspark

    return os.path.dirname(pyspark.__file__)


def spark_env(directory: Path, keep_pythonpath: bool = True, **extra: str) -> dict[str, str]:
    """This process's environment for Spark's scripts: the pyspark package's Spark, everything bound
    to 127.0.0.1, no configuration directory of the machine's. PYTHONPATH reaches every executor's
    Python workers (Spark adds the worker's own to theirs): keep_pythonpath=False drops it."""
    conf_dir = directory / "spark-conf"
    conf_dir.mkdir(parents=True, exist_ok=True)
    env = {name: value for name, value in os.environ.items() if keep_pythonpath or name != "PYTHONPATH"}
    env.update({"SPARK_HOME": spark_home(), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_CONF_DIR": str(conf_dir),
                "SPARK_WORKER_DIR": str(directory / "worker-dirs")})
    env.update(extra)
    return env


@dataclass
class Cluster:
    master_url: str
    directory: Path

    def logs(self, characters: int = 2000) -> str:
        """The end of every daemon's log, for an assertion's message."""
        parts = []
        for log in sorted(self.directory.glob("*.log")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-characters:]}")
        return "\n".join(parts)


@contextlib.contextmanager
def standalone_cluster(directory: Path, env: dict[str, str], workers: int = 2, cores: int = 1,
                       memory: str = "1g", start_timeout_s: float = 60):
    """A master on a free loopback port and `workers` workers of `cores` cores each; yields a Cluster."""
    directory.mkdir(parents=True, exist_ok=True)
    spark_class = os.path.join(env["SPARK_HOME"], "bin", "spark-class")
    # No REST submission server: it would take the fixed port 6066.
    env = {**env, "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    daemons: list[subprocess.Popen] = []
    logs = []

    def start(name, arguments):
        log = open(directory / f"{name}.log", "wb")
        logs.append(log)
        daemons.append(GROUPS.start([spark_class, *arguments], env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL))

    try:
        start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                         "--webui-port", str(free_port())])
        if not wait_for_port(port, start_timeout_s):
            raise RuntimeError(f"the standalone master did not start in {start_timeout_s} s:\n"
                               + Cluster(master_url, directory).logs())
        for index in range(workers):
            start(f"worker-{index}", ["org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
                                      "--cores", str(cores), "--memory", memory, "--webui-port", str(free_port())])
        yield Cluster(master_url, directory)
    finally:
        # Workers first (each stops its executors), then the master.
        for daemon in reversed(daemons):
            daemon.terminate()
        for daemon in reversed(daemons):
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            # What the daemon started (its executors' JVMs) goes with it.
            kill_group(daemon)
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.wait(timeout=10)
        for log in logs:
            log.close()


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL a process started in a group of its own (GROUPS.start) and whatever it started."""
    GROUPS.kill(process)


def run_in_session(command: list[str], timeout_s: float, **popen) -> subprocess.CompletedProcess:
    """subprocess.run in a process group of its own: on timeout the whole group is killed (a
    spark-submit's JVM and the Python driver it starts), then TimeoutExpired is raised."""
    process = GROUPS.start(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, **popen)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(process)
        stdout, stderr = process.communicate()
        raise subprocess.TimeoutExpired(command, timeout_s, output=stdout, stderr=stderr) from None
    finally:
        kill_group(process)  # what the command left running in its group
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
