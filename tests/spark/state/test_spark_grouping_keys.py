"""Grouping key values on Spark: its own hash agrees with fissure's, and a new checkpoint's keyed
stage gets half the buckets in each of its 2 tasks (fissure.runtime.state.grouping_keys)."""

from __future__ import annotations

import json

import fissure
from fissure import Pipeline
from fissure.model.types import Plan, RegionPlan
from fissure.runtime.state.grouping_keys import BALANCED_BUCKET_VALUES, balanced_spread_values, spark_hash_int
from fissure.spark.checkpoint.state_layout import STATE_LAYOUT_RECORD
from fissure.testing import text_files


def test_sparks_hash_of_every_value_is_the_one_fissure_computes(spark):
    values = list(BALANCED_BUCKET_VALUES) + list(balanced_spread_values(7)) + [0, 1, -1, 2**31 - 1, -2**31]
    frame = spark.createDataFrame([(value,) for value in values], "v int")
    assert [row.h for row in frame.selectExpr("hash(v) AS h").collect()] == [spark_hash_int(value) for value in values]


def test_a_new_checkpoints_keyed_stage_splits_the_buckets_evenly_over_its_two_tasks(spark, tmp_path):
    from fissure.spark.session.stage_log import StageLog

    def count(state, record):
        state["n"] = state.get("n", 0) + 1
        return None

    lines = [" ".join(f"w{(line * 13 + position) % 2000}" for position in range(10)) for line in range(400)]
    source = text_files(str(tmp_path / "in"), lines, lines_per_file=400, max_files_per_trigger=1)
    pipeline = (Pipeline("balanced")
                .flat_map("words", lambda record: [{"word": word} for word in record["value"].split()],
                          schema={"word": str}, reads=["value"])
                .partitioned("count", count, key="word", schema={"word": str}))
    log = StageLog(spark)
    before = {stage["stageId"] for stage in log.get("/stages")}
    checkpoint = tmp_path / "checkpoint"
    plan = Plan((RegionPlan((("words",), ("count",)), 2),))  # 2 state partitions
    fissure.run(pipeline, source, fissure.MemorySink(), plan=plan, checkpoint=str(checkpoint),
                config=fissure.RunnerConfig(spark=spark, progress="off"))
    assert json.loads((checkpoint / STATE_LAYOUT_RECORD).read_text()) == {"grouping_keys": "balanced-1"}
    keyed = []
    for stage in log.get("/stages"):
        if stage["stageId"] in before or stage.get("status") != "COMPLETE" or not stage.get("shuffleReadRecords"):
            continue
        tasks = log.get(f"/stages/{stage['stageId']}/{stage['attemptId']}/taskList?length=10")
        keyed.append(sorted(task["taskMetrics"]["shuffleReadMetrics"]["recordsRead"] for task in tasks))
    # 2,000 words fill all 64 buckets: the keyed stage's packed rows (one per bucket and upstream
    # task: 128) split 64 / 64, give or take the few pass-through rows of the runs' reports; plain
    # bucket numbers would split them 54 / 74.
    assert keyed and all(len(reads) == 2 and reads[1] - reads[0] <= 2 for reads in keyed), keyed
    assert any(sum(reads) >= 128 for reads in keyed), keyed
