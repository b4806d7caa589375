"""benchmarks/state_buckets.py without Spark: the counts it accepts and the report it writes."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from repository import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))

import state_buckets  # noqa: E402


def test_counts_are_ones_a_checkpoint_may_hold_with_64_the_base_of_the_ratios():
    assert state_buckets.counts_argument("64,8, 2") == (2, 8, 64)
    for text in ("8,16", "8,12,64", "eight"):
        with pytest.raises(argparse.ArgumentTypeError):
            state_buckets.counts_argument(text)


def test_the_report_shows_each_counts_median_ratio_to_64_every_repeat_and_tasks():
    document = {"records": 1000, "files": 2, "files_per_batch": 1, "counts": [8, 64], "new_checkpoint_buckets": 8,
                "workloads": {"hot-items": {
                    "plan": "[a]x2(k)", "runs": {"8 buckets": [120.0, 90.0], "64 buckets": [100.0, 100.0]},
                    "medians": {"8 buckets": 105.0, "64 buckets": 100.0}, "over_64": {"8 buckets": 1.05},
                    "keyed_tasks": {"8 buckets": {"slower_ms": 300, "faster_ms": 200, "stages": 2},
                                    "64 buckets": {"slower_ms": 0, "faster_ms": 0, "stages": 0}}}}}
    text = state_buckets.report(document)
    assert "| hot-items | `[a]x2(k)` | 105 | 100 | 1.050 |" in text
    assert "| hot-items | 8 buckets | 1.200, 0.900 | 2 | 150 | 100 |" in text
    assert "| hot-items | 64 buckets | - | 0 | - | - |" in text
    assert "A new checkpoint on 2 cores gets 8 buckets." in text
    json.dumps(document)
