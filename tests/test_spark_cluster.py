"""A Spark standalone cluster on loopback (master and two workers from the pyspark package's own
scripts) runs an example pipeline submitted from a separate driver process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port, deadline_s):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.5)
    return False


DRIVER = textwrap.dedent("""
    import sys
    import fissure
    from fissure import Pipeline
    from fissure.model.types import Plan, RegionPlan
    from fissure.testing import text_files

    def words(record):
        return [{"word": word} for word in record["value"].split()]

    def count(state, record):
        state["n"] = state.get("n", 0) + 1
        return {"word": record["word"], "count": state["n"]}

    master, work = sys.argv[1], sys.argv[2]
    pipeline = (Pipeline("cluster").flat_map("words", words, schema={"word": str})
                .partitioned("count", count, key="word", schema={"word": str, "count": int}))
    source = text_files(work + "/in", ["a b a", "b c a", "c c c"] * 20, lines_per_file=20)
    sink = fissure.MemorySink()
    plan = Plan((RegionPlan((("words",),), 2), RegionPlan((("count",),), 2)))
    fissure.run(pipeline, source, sink, plan=plan, checkpoint=work + "/ckpt",
                config=fissure.RunnerConfig(master=master, spark_conf={"spark.executor.memory": "1g"}),
                progress=False)
    totals = {}
    for record in sink.records():
        totals[record["word"]] = max(totals.get(record["word"], 0), record["count"])
    print("TOTALS", sorted(totals.items()))
""")


def test_standalone_cluster_on_loopback_runs_a_pipeline(tmp_path):
    import pyspark

    spark_home = os.path.dirname(pyspark.__file__)
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    env = {**os.environ, "SPARK_HOME": spark_home, "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(tmp_path / "work")}
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    daemons = [subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                 "--port", str(port), "--webui-port", str(free_port())],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        assert wait_for_port(port, 60), "the standalone master did not start"
        for _ in range(2):
            daemons.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
                 "--cores", "1", "--memory", "1g", "--webui-port", str(free_port())],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        script = tmp_path / "driver.py"
        script.write_text(DRIVER)
        driver = subprocess.run([sys.executable, str(script), master_url, str(tmp_path)], env=env,
                                capture_output=True, text=True, timeout=400)
        assert driver.returncode == 0, driver.stderr[-3000:]
        # 60 lines of three words: a 3x20, b 2x20, c 4x20
        assert "TOTALS [('a', 60), ('b', 40), ('c', 80)]" in driver.stdout
    finally:
        for daemon in reversed(daemons):
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()
