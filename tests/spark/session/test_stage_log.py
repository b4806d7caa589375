"""Grouping Spark's REST API jobs and stages into micro-batches (fissure.spark.session.stage_log)."""

from __future__ import annotations

import pytest

from fissure.spark.session.stage_log import StageLog, group_batches, job_batch, parse_timestamp

RUN = "65847977-0f1b-4b6b-8725-5501e51cbaf3"
OTHER_RUN = "11111111-0f1b-4b6b-8725-5501e51cbaf3"


def description(run: str, batch: int) -> str:
    return f"\nid = 2023a3f5-0427-4c98-9a63-bcfea7e1eb6b\nrunId = {run}\nbatch = {batch}"


def stamp(seconds: float) -> str:
    whole, fraction = divmod(round(seconds * 1000), 1000)
    return f"2026-11-24T03:57:{whole:02d}.{fraction:03d}GMT"


def job(job_id, run, batch, stage_ids, start, end):
    return {"jobId": job_id, "description": description(run, batch), "stageIds": stage_ids,
            "submissionTime": stamp(start), **({"completionTime": stamp(end)} if end is not None else {})}


def stage(stage_id, start, end, status="COMPLETE"):
    if status != "COMPLETE":
        return {"stageId": stage_id, "status": status}
    return {"stageId": stage_id, "status": status, "submissionTime": stamp(start), "completionTime": stamp(end)}


def test_timestamps_are_read_to_the_millisecond():
    assert parse_timestamp(stamp(1.25)) - parse_timestamp(stamp(0.5)) == pytest.approx(0.75)


def test_a_job_belongs_to_its_query_runs_batch_only():
    assert job_batch(description(RUN, 7), RUN) == 7
    assert job_batch(description(OTHER_RUN, 7), RUN) is None
    assert job_batch("count at <stdin>:1", RUN) is None
    assert job_batch(None, RUN) is None


def test_batches_take_their_first_jobs_completed_stages_in_order():
    jobs = [
        job(2, RUN, 1, [8, 6, 7], 10.0, 10.8),  # computes batch 1: stages listed out of order
        job(3, RUN, 1, [9, 10, 11], 10.85, 10.9),  # the sink's job: not the batch's stages
        job(4, RUN, 2, [12, 13, 14], 11.0, 11.5),
        job(5, OTHER_RUN, 1, [15], 11.0, 11.2),  # another query's batch 1
        job(6, RUN, 3, [16], 12.0, None),  # still running
    ]
    stages = {6: stage(6, 10.0, 10.2), 7: stage(7, 10.2, 10.6), 8: stage(8, 10.6, 10.75),
              9: stage(9, 0, 0, "SKIPPED"), 10: stage(10, 0, 0, "SKIPPED"), 11: stage(11, 10.86, 10.9),
              12: stage(12, 11.0, 11.1), 13: stage(13, 0, 0, "SKIPPED"), 14: stage(14, 11.1, 11.45),
              15: stage(15, 11.0, 11.2), 16: stage(16, 12.0, 12.1)}
    batches = group_batches(jobs, stages, RUN)
    assert sorted(batches) == [1, 2]
    assert batches[1].stage_s == pytest.approx((0.2, 0.4, 0.15))
    assert batches[1].jobs_s == pytest.approx(0.9)
    assert batches[2].stage_s == pytest.approx((0.1, 0.35))  # the skipped stage left out


def test_a_session_without_the_ui_gets_a_clear_error():
    class NoUi:
        class sparkContext:  # noqa: N801 - SparkSession's attribute
            uiWebUrl = None
            applicationId = "local-1"

    with pytest.raises(RuntimeError, match="STAGE_LOG_CONF"):
        StageLog(NoUi())


def test_every_batch_of_a_real_query_runs_the_stages_the_model_prices(spark, tmp_path):
    """A keyed then an unkeyed stateful operator, the keyed one in two partitions: Spark's
    computing job of every micro-batch has the stages the Spark model prices, no more, no fewer,
    each timed, and the batch's jobs take part of the batch's time."""
    import fissure
    from fissure import Pipeline
    from fissure.model.spark_model import evaluate_spark
    from fissure.model.types import Plan, RegionPlan
    from fissure.testing import record_files

    def count(state, record):
        state["n"] = state.get("n", 0) + 1
        return record

    rows = [{"k": f"k{i % 5}", "x": float(i)} for i in range(90)]
    source = record_files(tmp_path / "in", rows, {"k": str, "x": float}, records_per_file=30, max_files_per_trigger=1)
    pipeline = Pipeline("staged").map("m", lambda record: record).partitioned("s", count, key="k").stateful("g", count)
    plan = Plan((RegionPlan((("m",),), 1), RegionPlan((("s",),), 2), RegionPlan((("g",),), 1)))
    runner = fissure.Runner(pipeline, source, fissure.NoopSink(), plan=plan,
                            config=fissure.RunnerConfig(spark=spark, progress="off"),
                            checkpoint=str(tmp_path / "checkpoint"))
    runner.start(available_now=True)
    try:
        runner.await_termination()
    finally:
        runner.stop()
    batches = StageLog(spark).batches(str(runner.query.runId))
    assert sorted(batches) == [0, 1, 2]
    modelled = len(evaluate_spark(pipeline.operator_stats(), plan, 2).stages)
    durations = {profile.batch_id: profile.duration_s for profile in runner.batch_profiles}
    for batch_id, batch in batches.items():
        assert len(batch.stage_s) == modelled, batch
        assert all(seconds > 0 for seconds in batch.stage_s)
        assert sum(batch.stage_s) <= batch.jobs_s <= durations[batch_id]
