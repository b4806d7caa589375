"""benchmarks/spark_chain.py's and benchmarks/profiling_overhead.py's own logic, without Spark: the
random sample of plans the model did not shortlist, the report's labelled baselines, and the
profiling overhead taken from the ratio of medians."""

from __future__ import annotations

import json
import sys

from repository import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))

import profiling_overhead  # noqa: E402
import spark_chain  # noqa: E402
from fissure.plan.plans import describe_plan  # noqa: E402

RESULTS = BENCHMARKS / "results"


def test_the_random_sample_leaves_out_the_shortlist_and_repeats_with_its_seed():
    plans = spark_chain.valid_plans(spark_chain.cpu_pipeline(4), 4)
    shortlist = plans[:8]
    sample = spark_chain.random_sample(plans, shortlist, 8, seed=0)
    texts = [describe_plan(plan) for plan in sample]
    assert len(set(texts)) == 8
    assert not set(texts) & {describe_plan(plan) for plan in shortlist}
    assert texts == [describe_plan(plan) for plan in spark_chain.random_sample(plans, shortlist, 8, seed=0)]
    assert texts != [describe_plan(plan) for plan in spark_chain.random_sample(plans, shortlist, 8, seed=1)]


def test_the_random_sample_is_at_most_the_plans_left():
    plans = spark_chain.valid_plans(spark_chain.cpu_pipeline(2), 2)
    assert len(spark_chain.random_sample(plans, plans[:1], 100, seed=0)) == len(plans) - 1


class Arguments:
    repeats, screen_share, screen_from, finalists = 3, 0.25, None, 3


def test_the_report_labels_both_handwritten_programs_and_the_random_best():
    result = {"plans_enumerated": 671, "plans_screened": 8,
              "records_per_s": {"handwritten-repartitioned": 3000.0, "handwritten-one-partition": 2000.0,
                                "sequential": 1800.0, "planner": 3300.0, "random-best": 2500.0},
              "plans": {"sequential": "[a,b]", "planner": "[a,b]x2", "random-best": "[a]x2 -> [b]"},
              "best_other_plan": "[a]x2 -> [b]", "random_sample_seed": 0,
              "random_sample_records_per_s": {"[a]x2 -> [b]": 700.0, "[a] -> [b]": 600.0},
              "planner_over_handwritten_repartitioned": 1.1, "planner_over_handwritten_one_partition": 1.65,
              "planner_over_sequential": 1.83, "planner_over_best_other": 1.32, "planner_over_best_random": 1.32}
    text = spark_chain.report(Arguments(), {"cpu": result})
    assert "| handwritten-repartitioned | UDFs in one stage, repartitioned to the cores | 3,000 |" in text
    assert "| handwritten-one-partition | UDFs in one stage, one partition per batch (naive) | 2,000 |" in text
    assert "a random sample of 2 of the plans it did not shortlist (seed 0)" in text
    assert "| random-best | [a]x2 -> [b] | 2,500 |" in text
    assert "planner_over_handwritten_one_partition: 1.65" in text
    assert "planner_over_best_random: 1.32" in text


def test_the_profiling_overhead_is_one_minus_the_ratio_of_medians():
    document = json.loads((RESULTS / "profiling_overhead.json").read_text())
    document["overhead"] = {"light": {
        "runs_per_s": {"profiled": [90.0, 95.0, 100.0], "unprofiled": [100.0, 100.0, 80.0]},
        "pair_ratios": [0.9, 1.02, 1.25], "profiled_over_unprofiled": 1.02, "overhead_pair_ratios": -0.02,
        "phase_ms_median": {"addBatch": {"profiled": 1050.0, "unprofiled": 1000.0}}}}
    text = profiling_overhead.report(document, "profiling_overhead")
    assert "| light | 95 | 100 | 0.950 | +5.0 % | 0.900, 1.020, 1.250 | -2.0 % | 1.050 |" in text
