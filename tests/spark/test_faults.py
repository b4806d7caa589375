"""Fault injection: `kill -9` of a subprocess driver at seeded random moments, during an adaptive
plan switch and during its state repartition, then restarts on the same checkpoint until the
input is consumed; every sink is compared with the plain-Python word count (every input's
result once, every word's counts exactly 1..n, no batch written by two runs). "corrupt-gzip"
puts a truncated .gz among the input files (one dead letter naming it, the rest exact).
"concurrent+written-in-place" follows the input directory: once a batch committed, a second
driver started on the running one's checkpoint must be refused, naming the first; then a file is
written in place (in two halves) while the first runs, which is killed once a batch read it; the
restart takes its lock over, and the sinks hold the whole file's results once.

The killed drivers are processes of their own; the drivers that must end by themselves (the
restarts, the second driver, the corrupt file's one driver) run in the test's process on its
SparkSession: the same program on the same checkpoint, without a JVM to start. Four input files
of 24 records, one a batch: a "random" kill comes up to 1.5 s after the first committed batch,
while the three others run (about 0.6 s each on a quiet two-core machine, longer under load).
benchmarks/reliability.py runs more kill points, every driver a process, and writes the figure
to benchmarks/results/reliability.md."""

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
    ("sequential", "graph", "concurrent+written-in-place", 16),
    ("sequential", "windows", "window-emission", 17),
    ("replicated", "windows", "expiry", 18),
    ("sequential", "chain", "corrupt-gzip", 19),
])
def test_a_killed_driver_restarted_on_its_checkpoint_loses_and_duplicates_nothing(spark, tmp_path, plan, program,
                                                                                 moment, seed):
    outcome = run_case(tmp_path, plan, program, moment, seed, files=4, per_file=24, max_delay_s=1.5, spark=spark)
    assert outcome.killed, "the driver ended before the kill point"
    assert outcome.passed, outcome.detail
