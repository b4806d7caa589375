"""Fault injection: `kill -9` of a subprocess driver at seeded random moments, during an adaptive
plan switch and during its state repartition, then restarts on the same checkpoint until the
input is consumed; every sink is compared with the plain-Python word count (every input's
result once, every word's counts exactly 1..n, no batch written by two runs). The "concurrent"
point starts a second driver on the checkpoint of a running one: it must be refused, naming the
first, which is then killed and its lock taken over by the restart. "corrupt-gzip" puts a
truncated .gz among the input files (one dead letter naming it, the rest exact) and
"written-in-place" writes a file in place while a following driver runs (read once, whole).
benchmarks/reliability.py runs more kill points and writes the figure to
benchmarks/results/reliability.md."""

from __future__ import annotations

import pytest

from fault_injection import run_case

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.mark.parametrize("plan, program, moment, seed", [
    ("sequential", "chain", "random", 11),
    ("planner", "chain", "random", 12),
    ("replicated", "graph", "random", 13),
    ("adaptive", "chain", "repartition", 14),
    ("adaptive", "graph", "switch", 15),
    ("sequential", "graph", "concurrent", 16),
    ("sequential", "windows", "window-emission", 17),
    ("replicated", "windows", "expiry", 18),
    ("sequential", "chain", "corrupt-gzip", 19),
    ("sequential", "graph", "written-in-place", 20),
])
def test_a_killed_driver_restarted_on_its_checkpoint_loses_and_duplicates_nothing(tmp_path, plan, program, moment,
                                                                                 seed):
    outcome = run_case(tmp_path, plan, program, moment, seed)
    assert outcome.killed, "the driver ended before the kill point"
    assert outcome.passed, outcome.detail
