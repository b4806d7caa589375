"""A Spark standalone cluster on loopback (master and two workers from the pyspark package's own
scripts) runs an example pipeline submitted from a separate driver process."""

from __future__ import annotations

import sys
import textwrap

import pytest

from spark_cluster_support import run_in_session, spark_env, standalone_cluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]

# The master's, the workers' and the executors' JVMs: less JIT compilation and a one-thread GC,
# as tests/test_spark_submit.py starts them (they run seconds of work on a small machine).
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


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
    fast_jvm = sys.argv[3]
    fissure.run(pipeline, source, sink, plan=plan, checkpoint=work + "/ckpt",
                config=fissure.RunnerConfig(master=master, spark_conf={"spark.executor.memory": "1g",
                                                                       "spark.executor.extraJavaOptions": fast_jvm},
                                            progress="off"))
    totals = {}
    for record in sink.records():
        totals[record["word"]] = max(totals.get(record["word"], 0), record["count"])
    print("TOTALS", sorted(totals.items()))
""")


def test_standalone_cluster_on_loopback_runs_a_pipeline(tmp_path):
    # Driver and executors import fissure as this process does (its PYTHONPATH, if any, too).
    env = spark_env(tmp_path, PYSPARK_PYTHON=sys.executable, SPARK_DAEMON_JAVA_OPTS=FAST_JVM)
    with standalone_cluster(tmp_path / "cluster", env, workers=2, cores=1) as cluster:
        script = tmp_path / "driver.py"
        script.write_text(DRIVER)
        driver = run_in_session([sys.executable, str(script), cluster.master_url, str(tmp_path), FAST_JVM], 400,
                                env=env)
        assert driver.returncode == 0, driver.stderr[-3000:] + cluster.logs()
        # 60 lines of three words: a 3x20, b 2x20, c 4x20
        assert "TOTALS [('a', 60), ('b', 40), ('c', 80)]" in driver.stdout
