"""The micro-batch size policy, and how a file source's size is set from it (no JVM)."""

from __future__ import annotations

import pytest

from fissure import FileSource
from fissure.plan.batch_size import (MAX_RECORDS, MIN_RECORDS, BatchCost, BatchSizeDecision, choose_batch_records,
                                          model_batch_cost)
from fissure.spark.io.batch_admission import admit_file_sources, bytes_per_record
from fissure.testing import text_files
from repository import EXAMPLES


def test_the_batch_keeps_the_fixed_cost_at_the_share_asked():
    decision = choose_batch_records(BatchCost(fixed_s=1.0, per_record_s=20e-6))
    # F / (F + R c) <= 0.1  <=>  R >= 9 F / c = 450,000
    assert decision == BatchSizeDecision(
        450_000, pytest.approx(10.0), pytest.approx(0.1),
        "fixed cost 1.00 s a batch, 20.0 us a record: 450,000 records keep the fixed cost at 10 % of a batch "
        "or less")
    assert choose_batch_records(BatchCost(1.0, 20e-6), fixed_share=0.5).records == 50_000


def test_a_latency_bound_caps_the_batch_and_says_when_it_cannot_be_met():
    capped = choose_batch_records(BatchCost(1.0, 20e-6), latency_bound_s=3.0)
    assert capped.records == 100_000 and capped.predicted_batch_s == pytest.approx(3.0)
    assert capped.reason.startswith("latency bound 3 s: 100,000 records a batch")
    impossible = choose_batch_records(BatchCost(1.0, 20e-6), latency_bound_s=0.5)
    assert impossible.records == MIN_RECORDS
    assert "below what a batch of 1,000 records takes" in impossible.reason


def test_batches_stay_within_the_bounds_whatever_the_costs():
    assert choose_batch_records(BatchCost(0.0, 1e-3)).records == MIN_RECORDS
    assert choose_batch_records(BatchCost(100.0, 1e-9)).records == MAX_RECORDS
    with pytest.raises(ValueError, match="per_record_s > 0"):
        BatchCost(1.0, 0.0)
    with pytest.raises(ValueError, match="fixed_share"):
        choose_batch_records(BatchCost(1.0, 1e-5), fixed_share=1.0)


def test_bytes_per_record_come_from_the_first_file(tmp_path):
    source = text_files(tmp_path / "in", ["x" * 9] * 100, lines_per_file=50)  # 10 bytes a line
    assert bytes_per_record(source) == pytest.approx(10.0)
    csv = tmp_path / "csv"
    csv.mkdir()
    (csv / "a.csv").write_text("k,v\n" + "".join("aaaa,1\n" for _ in range(10)))
    assert bytes_per_record(FileSource(str(csv), format="csv", schema={"k": str, "v": int})) == pytest.approx(74 / 10)
    assert bytes_per_record(FileSource(str(tmp_path / "empty"))) is None


def test_file_sources_without_a_size_get_the_policys_size_in_bytes(tmp_path):
    sized = text_files(tmp_path / "sized", ["x" * 9] * 10, max_files_per_trigger=1)
    free = text_files(tmp_path / "free", ["x" * 19] * 10)  # 20 bytes a line
    empty = FileSource(str(tmp_path / "nothing-yet"))
    cost = BatchCost(1.0, 20e-6)
    sources, admissions = admit_file_sources({"sized": sized, "free": free, "empty": empty}, cost,
                                             fixed_share=0.1, latency_bound_s=None)
    assert sources["sized"] is sized and sources["empty"] is empty  # the user's size wins; no file: Spark's default
    assert [admission.source for admission in admissions] == ["free"]
    assert sources["free"].max_bytes_per_trigger == 450_000 * 20
    assert admissions[0].describe().startswith("batch size for free: 450,000 records (8,789 KiB at 20 B a record)")


def test_the_models_batch_cost_grows_with_the_plans_work():
    from fissure.model.spark_model import SparkConstants, SparkWorkload
    from fissure.model.types import Kind, OperatorStats, Plan, RegionPlan
    from fissure.plan.spark_chain import SparkModelSettings

    settings = SparkModelSettings(SparkConstants(), SparkWorkload())
    plan = Plan((RegionPlan((("a",),), 1),))
    light = model_batch_cost([OperatorStats("a", Kind.STATELESS, 10.0, 1.0)], plan, 2, settings)
    heavy = model_batch_cost([OperatorStats("a", Kind.STATELESS, 100.0, 1.0)], plan, 2, settings)
    assert light.fixed_s == pytest.approx(heavy.fixed_s) and light.fixed_s > 0
    assert heavy.per_record_s - light.per_record_s == pytest.approx(90e-6, rel=0.01)


def test_a_sample_is_needed_unless_the_whole_input_runs_in_one_batch_whatever_it_would_measure():
    from fissure.plan.batch_size import sample_needed

    # LogWatch's example: 2,022 lines, and the declared costs admit 392,675 a batch.
    small = sample_needed(2_022, 392_675, reads_input_once=True)
    assert not small.needed and "2,022 records, runs in one batch" in small.reason
    # Within the minimum batch, whatever the declared costs say.
    assert not sample_needed(900, 1_000, reads_input_once=True).needed
    # Operators ten times costlier than declared would split this input.
    assert sample_needed(50_000, 392_675, reads_input_once=True).needed
    # A run that follows its sources may get any amount of input later; an unknown size is no proof.
    assert sample_needed(10, 392_675, reads_input_once=False).needed
    assert sample_needed(None, 392_675, reads_input_once=True).needed


def test_the_planner_plans_for_the_whole_input_of_a_run_that_reads_it_once_when_it_is_smaller(monkeypatch):
    import sys

    import fissure.plan.plans

    from fissure.plan.plans import describe_plan, planned_batch_records, planner_plan

    assert planned_batch_records(10_000, None) == 10_000  # more may come, or unknown
    assert planned_batch_records(10_000, 50_000) == 10_000
    assert planned_batch_records(10_000, 2_022.4) == 2_022
    sys.path.insert(0, str(EXAMPLES))
    import logwatch

    pipeline = logwatch.build_pipeline()
    # Read through a source whose scan does not spread the first stage (not a file source), the
    # example's 2,022 lines get no replicated region (no numbering stage, no round-robin, one
    # state partition), where the batches a longer run admits replicate the parsing region.
    monkeypatch.setattr(fissure.plan.plans, "spreading_scan", lambda program: False)
    unknown = describe_plan(planner_plan(pipeline, 2), pipeline)
    small = describe_plan(planner_plan(pipeline, 2, input_records=2_022), pipeline)
    assert "x2" in unknown and "x2" not in small


def test_the_planner_ranks_plans_at_the_batch_their_runs_admit_not_only_at_the_assumed_one(monkeypatch):
    import sys
    from dataclasses import replace

    import fissure.plan.plans

    from fissure.model.types import Machine
    from fissure.plan import plan_chain
    from fissure.plan.plans import planner_plan
    from fissure.plan.stored_calibration import stored_spark_model

    sys.path.insert(0, str(EXAMPLES))
    import logwatch

    pipeline = logwatch.build_pipeline()
    operators = pipeline.operator_stats()
    # a source whose scan does not spread the first stage: there the plans differ by batch size
    monkeypatch.setattr(fissure.plan.plans, "spreading_scan", lambda program: False)
    settings, _ = stored_spark_model()
    settings = replace(settings, workload=replace(settings.workload, scan_spreads=False))
    assumed = settings.workload.batch_records

    def plan_at(records: int):
        workload = replace(settings.workload, batch_records=records)
        return plan_chain(operators, Machine(cores=2), method="heuristic", spark=replace(settings, workload=workload)).plan

    at_assumed = plan_at(assumed)
    admitted = choose_batch_records(model_batch_cost(operators, at_assumed, 2, settings)).records
    assert admitted > 10 * assumed
    assert planner_plan(pipeline, 2) == plan_at(admitted)
    # a run whose whole input is one small batch has that batch only: at 3,000 records the model
    # ranks four pipelines first, at the admitted batch the replicas
    small = 3000
    assert plan_at(small).regions[0].replicas == 1 and plan_at(admitted).regions[0].replicas == 2
    assert planner_plan(pipeline, 2, input_records=small) == plan_at(small)
    assert planner_plan(pipeline, 2, input_records=assumed) == at_assumed


def test_the_input_is_counted_only_until_it_passes_what_the_decision_needs(tmp_path):
    from fissure.spark.io.batch_admission import input_records

    source = text_files(tmp_path / "in", [f"line {i:04d}" for i in range(3000)], lines_per_file=1000)
    assert input_records(source) == pytest.approx(3000)
    partial = input_records(source, beyond=1500)
    assert 1500 < partial < 3000  # two files of three listed
    assert input_records(FileSource(str(tmp_path / "empty"))) is None
