"""Grouping key values on Spark: its own hash agrees with fissure's, a new checkpoint's keyed
stage gets half the buckets in each of its 2 tasks (fissure.runtime.state.grouping_keys), and a
checkpoint keeps its bucket count (fissure.spark.checkpoint.state_layout)."""

from __future__ import annotations

import json

import fissure
from fissure import Pipeline
from fissure.model.types import Plan, RegionPlan
from fissure.runtime.state.grouping_keys import BALANCED_BUCKET_VALUES, balanced_spread_values, spark_hash_int, \
    spark_partition
from fissure.spark.checkpoint.state_layout import STATE_LAYOUT_RECORD
from fissure.testing import text_files


def test_sparks_hash_of_every_value_is_the_one_fissure_computes(spark):
    values = [value for table in BALANCED_BUCKET_VALUES.values() for value in table]
    values += list(balanced_spread_values(7)) + [0, 1, -1, 2**31 - 1, -2**31]
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
    # local[2]: a new checkpoint gets 8 buckets (4 a core)
    assert json.loads((checkpoint / STATE_LAYOUT_RECORD).read_text()) == {"grouping_keys": "balanced-1", "buckets": 8}
    keyed = []
    for stage in log.get("/stages"):
        if stage["stageId"] in before or stage.get("status") != "COMPLETE" or not stage.get("shuffleReadRecords"):
            continue
        tasks = log.get(f"/stages/{stage['stageId']}/{stage['attemptId']}/taskList?length=10")
        keyed.append(sorted(task["taskMetrics"]["shuffleReadMetrics"]["recordsRead"] for task in tasks))
    # 2,000 words fill all 8 buckets: the keyed stage's packed rows (one per bucket and upstream
    # task: 16) split 8 / 8, give or take the few pass-through rows of the runs' reports; plain
    # bucket numbers would split them 6 / 10.
    assert sorted(sum(spark_partition(bucket, 2) == side for bucket in range(8)) for side in (0, 1)) == [3, 5]
    assert keyed and all(len(reads) == 2 and reads[1] - reads[0] <= 2 for reads in keyed), keyed
    assert any(sum(reads) >= 16 for reads in keyed), keyed


def running_count(state, record):
    state["n"] = state.get("n", 0) + 1
    return {"word": record["word"], "n": state["n"]}


def test_a_checkpoint_keeps_its_bucket_count_when_a_later_start_would_choose_another(spark, tmp_path):
    pipeline = (Pipeline("counts")
                .map("word", lambda record: {"word": record["value"]}, schema={"word": str}, reads=["value"])
                .partitioned("count", running_count, key="word", schema={"word": str, "n": int}))
    words = [f"w{number}" for number in range(40)]
    (tmp_path / "in").mkdir()
    checkpoint = tmp_path / "checkpoint"

    def run(batch: int, **settings) -> dict[str, int]:
        (tmp_path / "in" / f"part-{batch}.txt").write_text("".join(word + "\n" for word in words))
        sink = fissure.MemorySink()
        fissure.run(pipeline, fissure.FileSource(str(tmp_path / "in"), format="text"), sink,
                    checkpoint=str(checkpoint), config=fissure.RunnerConfig(spark=spark, progress="off", **settings))
        return {record["word"]: record["n"] for record in sink.records()}

    assert run(0, state_buckets=16) == {word: 1 for word in words}
    # the second start would give a new checkpoint 8 buckets: this one keeps its 16, and every key
    # finds its state (under 8 buckets, most keys would start again from 1)
    assert run(1) == {word: 2 for word in words}
    assert json.loads((checkpoint / STATE_LAYOUT_RECORD).read_text()) == {"grouping_keys": "balanced-1", "buckets": 16}
