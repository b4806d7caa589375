"""fissure as a user deploys it: a wheel built by the standard build tooling, installed into a
virtual environment that is shipped to the executors as an archive (`--archives
environment.tar.gz#environment`, `spark.pyspark.python=./environment/bin/python`), and an example
program handed to `spark-submit` against a standalone cluster on loopback (README.md, Running on
a cluster; docs/spark-runner.md, Clusters)."""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from spark_cluster_support import run_in_session, spark_env, standalone_cluster
from repository import REPOSITORY

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EXAMPLE = REPOSITORY / "examples" / "wordcount_files.py"


# Less JIT compilation and a one-thread GC: JVMs that start quickly on a small machine.
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def build_wheel(directory: Path) -> Path:
    """`python -m build --wheel` of a copy of the project (the source tree stays as it is), or
    `pip wheel --no-deps` (the same PEP 517 backend) where the build package is not installed."""
    source = directory / "source"
    shutil.copytree(REPOSITORY / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPOSITORY / name, source / name)
    dist = directory / "dist"
    if importlib.util.find_spec("build") is not None:
        command = [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(source)]
    else:
        command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dist), str(source)]
    built = run_in_session(command, 300)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-3000:]
    wheels = list(dist.glob("fissure-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def dependency_directories() -> list[str]:
    """Where this interpreter finds fissure's dependencies (pyspark, pyarrow, pandas, numpy)."""
    directories = list(site.getsitepackages())
    for module in ("pyspark", "pyarrow", "pandas", "numpy"):
        directories.append(str(Path(importlib.util.find_spec(module).origin).parents[1]))
    return list(dict.fromkeys(directories))


def make_environment(directory: Path, wheel: Path) -> Path:
    """A virtual environment with the wheel installed and packed as a .tar.gz, as venv-pack packs one.

    Its dependencies are this interpreter's, by a .pth file: on loopback every executor sees the
    same files, and the test needs no copy of PySpark. Their directories' own .pth files are not
    read, so an editable install of fissure there is not seen: fissure comes from the wheel only.
    """
    environment = directory / "environment"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(environment)], check=True, timeout=120)
    python = environment / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    Path(purelib, "fissure-test-dependencies.pth").write_text("\n".join(dependency_directories()) + "\n")
    installed = run_in_session([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                                "--no-index", str(wheel)], 300)
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-3000:]
    archive = directory / "environment.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(environment, arcname=".")
    return archive


def write_input(directory: Path, files: int, lines_per_file: int) -> collections.Counter:
    """Text files of words; returns how often each word occurs in all of them."""
    directory.mkdir()
    vocabulary = "stream spark python operator state key record batch plan fission".split()
    expected = collections.Counter()
    for index in range(files):
        lines = []
        for line in range(lines_per_file):
            words = [vocabulary[(index * 7 + line * 3 + position * position) % len(vocabulary)]
                     for position in range(1 + (index + line) % 6)]
            expected.update(words)
            lines.append(" ".join(words))
        (directory / f"part-{index}.txt").write_text("\n".join(lines) + "\n")
    return expected


def read_results(output: Path) -> dict[str, list[int]]:
    """Every result record the file sink wrote: the running counts of each word."""
    counts = collections.defaultdict(list)
    for part in output.glob("batch_id=*/part-*.json"):
        for line in part.read_text().splitlines():
            record = json.loads(line)
            counts[record["word"]].append(record["count"])
    return counts


def test_wheel_submitted_with_spark_submit_to_a_standalone_cluster(tmp_path):
    wheel = build_wheel(tmp_path / "build")
    version = wheel.name.split("-")[1]
    archive = make_environment(tmp_path, wheel)
    expected = write_input(tmp_path / "input", files=4, lines_per_file=50)
    output = tmp_path / "output"

    # No PYTHONPATH: the driver and the executors import fissure from the environment, nothing else.
    env = spark_env(tmp_path, keep_pythonpath=False, SPARK_DAEMON_JAVA_OPTS=FAST_JVM)
    with standalone_cluster(tmp_path / "cluster", env, workers=1, cores=2) as cluster:
        submit = [os.path.join(env["SPARK_HOME"], "bin", "spark-submit"), "--master", cluster.master_url,
                  "--archives", f"{archive}#environment",
                  # The driver's interpreter too: fissure's keyed state starts a Python process beside
                  # the driver, from the same setting; tmp_path (the working directory) holds the
                  # environment unpacked.
                  "--conf", "spark.pyspark.python=./environment/bin/python",
                  "--conf", "spark.ui.enabled=false",
                  "--driver-java-options", FAST_JVM, "--conf", f"spark.executor.extraJavaOptions={FAST_JVM}",
                  str(EXAMPLE), str(tmp_path / "input"), str(output), "--files-per-batch", "2"]
        try:
            run = run_in_session(submit, 420, env=env, cwd=tmp_path)
        except subprocess.TimeoutExpired as timeout:
            pytest.fail(f"spark-submit did not end in 420 s\n{(timeout.stderr or '')[-3000:]}\n{cluster.logs()}")
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:] + cluster.logs()

    lines = run.stdout.splitlines()
    # The driver ran the environment's interpreter and the wheel's fissure; each executor its own
    # copy of the archive, unpacked in the worker's directory for the application.
    python = sys.version.split()[0]
    site_packages = f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
    driver = [line for line in lines if line.startswith("driver: ")]
    environment = tmp_path / "environment"
    assert driver == [f"driver: python {python} at {environment}/bin/python, "
                      f"fissure {version} at {environment}/{site_packages}/fissure"]
    executors = [line for line in lines if line.startswith("executor: ")]
    assert executors, run.stdout
    worker_dirs = str(tmp_path / "worker-dirs")
    for line in executors:
        interpreter, _, package = line.removeprefix("executor: ").partition(", ")
        assert interpreter.startswith(f"python {python} at {worker_dirs}/app-"), line
        assert interpreter.endswith("/environment/bin/python"), line
        assert package.startswith(f"fissure {version} at {worker_dirs}/app-"), line
        assert package.endswith(f"/environment/{site_packages}/fissure"), line

    total_lines = 4 * 50
    assert f"{total_lines} lines in 2 micro-batches, plan " in run.stdout, run.stdout
    # Each occurrence of a word once: its records carry the counts 1, 2, ..., its total.
    counts = read_results(output)
    assert {word: sorted(seen) for word, seen in counts.items()} == {
        word: list(range(1, total + 1)) for word, total in expected.items()}
    printed = {line.split()[1]: int(line.split()[2]) for line in lines if line.startswith("TOTAL ")}
    assert printed == dict(expected)
