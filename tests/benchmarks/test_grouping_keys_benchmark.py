"""benchmarks/grouping_keys.py without Spark: the splits it reports and how a plain run's
checkpoint is made to keep the plain scheme."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from repository import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))

import grouping_keys  # noqa: E402

from fissure.spark.checkpoint.files import LocalStore  # noqa: E402
from fissure.spark.checkpoint.state_layout import checkpoint_grouping_keys  # noqa: E402
from fissure.runtime.state.grouping_keys import BALANCED_KEYS, PLAIN_KEYS, balanced_keys  # noqa: E402


def test_the_reported_splits_are_sparks_for_both_schemes():
    assert grouping_keys.splits() == {"plain over 2": [27, 37], "plain over 3": [32, 19, 13],
                                      "balanced over 2": [32, 32], "balanced over 3": [21, 22, 21]}


def test_each_runs_new_checkpoint_keeps_the_scheme_and_count_it_was_made_for(tmp_path):
    # a new checkpoint on 2 cores would get 8 balanced buckets: the record keeps each run on its 64
    for keys in (PLAIN_KEYS, BALANCED_KEYS, balanced_keys(8)):
        checkpoint = grouping_keys.checkpoint_under(keys, tmp_path)
        assert Path(checkpoint).parent == tmp_path
        assert checkpoint_grouping_keys(LocalStore(checkpoint), fresh=True, new_buckets=16) is keys
        assert [path.name for path in Path(checkpoint).rglob("*") if path.is_file()] == ["state_layout.json"]


def test_the_report_shows_each_workloads_medians_and_every_repeats_ratio():
    document = {"records": 1000, "files": 2, "files_per_batch": 1, "splits": grouping_keys.splits(),
                "workloads": {"hot-items": {"plan": "[a]x2(k)", "runs": {"plain": [100.0, 200.0], "balanced": [110.0, 180.0]},
                                            "medians": {"plain": 150.0, "balanced": 145.0},
                                            "balanced_over_plain": 1.0}}}
    text = grouping_keys.report(document)
    assert "| hot-items | `[a]x2(k)` | 150 | 145 | 1.000 | 1.100, 0.900 |" in text
    assert "| plain over 2 | 27 / 37 |" in text
    json.dumps(document)


def task_log_stages(stages: dict[int, list[tuple[int, int]]], without=()) -> list[dict]:
    """Completed stages as spark_stage_times.TaskLog gives them: stage id -> (shuffle records read,
    duration ms) per task; `without`: stages an earlier call already returned."""
    return [{"wall_ms": 0.0, "tasks": [{"duration_ms": duration, "shuffle_records": read, "input_records": 0}
                                       for read, duration in tasks]}
            for stage, tasks in stages.items() if stage not in without]


def test_keyed_tasks_sums_the_two_tasks_of_stages_reading_packed_rows_only():
    stages = {1: [(0, 500), (0, 400)],            # a scan: no shuffle read
              2: [(125_000, 900), (125_000, 950)],  # records, not packed rows
              3: [(64, 300), (66, 200)],           # a keyed stage
              4: [(130, 90), (0, 10)],             # an unkeyed stateful stage: one task empty
              5: [(40, 100), (40, 150)],           # another keyed stage
              6: [(5, 50)]}                        # one task
    assert grouping_keys.keyed_tasks(task_log_stages(stages, without={5})) == {"slower_ms": 300, "faster_ms": 200,
                                                                                "stages": 1}
    assert grouping_keys.keyed_tasks(task_log_stages(stages)) == {"slower_ms": 450, "faster_ms": 300, "stages": 2}


def test_the_report_has_the_keyed_tasks_table_when_measured():
    document = {"records": 1000, "files": 2, "files_per_batch": 1, "splits": grouping_keys.splits(),
                "workloads": {"hot-items": {"plan": "[a]x2(k)", "runs": {"plain": [100.0], "balanced": [110.0]},
                                            "medians": {"plain": 100.0, "balanced": 110.0},
                                            "balanced_over_plain": 1.1,
                                            "keyed_tasks": {"plain": {"slower_ms": 740, "faster_ms": 540, "stages": 2},
                                                            "balanced": {"slower_ms": 0, "faster_ms": 0, "stages": 0}}}}}
    text = grouping_keys.report(document)
    assert "| hot-items | plain | 2 | 740 | 540 | 1.370 | 370 |" in text
    assert "| hot-items | balanced |" not in text
