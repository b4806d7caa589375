"""A Spark standalone cluster on loopback for tests: a master and workers started from the pyspark
package's own `bin/spark-class`, each a process of the test, stopped when the block ends (also when
it fails). Their logs go to files under the given directory."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


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
        daemons.append(subprocess.Popen([spark_class, *arguments], env=env, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True))

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
                kill_group(daemon)
                daemon.wait(timeout=10)
        for log in logs:
            log.close()


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL a process started with start_new_session=True and whatever it started."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def run_in_session(command: list[str], timeout_s: float, **popen) -> subprocess.CompletedProcess:
    """subprocess.run in a process group of its own: on timeout the whole group is killed (a
    spark-submit's JVM and the Python driver it starts), then TimeoutExpired is raised."""
    process = subprocess.Popen(command, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, **popen)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(process)
        stdout, stderr = process.communicate()
        raise subprocess.TimeoutExpired(command, timeout_s, output=stdout, stderr=stderr) from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
