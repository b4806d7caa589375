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
from fissure.runtime.state.grouping_keys import BALANCED_KEYS, PLAIN_KEYS  # noqa: E402


def test_the_reported_splits_are_sparks_for_both_schemes():
    assert grouping_keys.splits() == {"plain over 2": [27, 37], "plain over 3": [32, 19, 13],
                                      "balanced over 2": [32, 32], "balanced over 3": [21, 22, 21]}


def test_a_plain_runs_new_checkpoint_keeps_the_plain_scheme_and_a_balanced_one_gets_balanced():
    plain, balanced = grouping_keys.checkpoint_under("plain"), grouping_keys.checkpoint_under("balanced")
    assert checkpoint_grouping_keys(LocalStore(plain), fresh=True) is PLAIN_KEYS
    assert checkpoint_grouping_keys(LocalStore(balanced), fresh=True) is BALANCED_KEYS
    assert not any(Path(balanced).iterdir())


def test_the_report_shows_each_workloads_medians_and_every_repeats_ratio():
    document = {"records": 1000, "files": 2, "files_per_batch": 1, "splits": grouping_keys.splits(),
                "workloads": {"hot-items": {"plan": "[a]x2(k)", "runs": {"plain": [100.0, 200.0], "balanced": [110.0, 180.0]},
                                            "medians": {"plain": 150.0, "balanced": 145.0},
                                            "balanced_over_plain": 1.0}}}
    text = grouping_keys.report(document)
    assert "| hot-items | `[a]x2(k)` | 150 | 145 | 1.000 | 1.100, 0.900 |" in text
    assert "| plain over 2 | 27 / 37 |" in text
    json.dumps(document)
