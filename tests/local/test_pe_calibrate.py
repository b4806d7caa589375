"""Calibration of the process boundary: the paper's two-run method and the per-call cost."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fissure.local.calibrate import (
    BusyStage,
    boundary_calibration,
    call_overhead_us,
    measure_boundary,
    measure_call_overhead,
    records_batch,
)


@given(
    stage_cost_us=st.floats(min_value=0.1, max_value=1000),
    boundary_overhead_us=st.floats(min_value=0, max_value=100),
)
def test_two_run_method_recovers_cost_and_overhead_from_model_throughputs(stage_cost_us, boundary_overhead_us):
    single_rate_per_s = 1e6 / (2 * stage_cost_us)  # eq. 16
    two_rate_per_s = 1e6 / (stage_cost_us + boundary_overhead_us)  # eq. 15
    calibration = boundary_calibration(single_rate_per_s, two_rate_per_s)
    assert calibration.stage_cost_us == pytest.approx(stage_cost_us)
    assert calibration.boundary_overhead_us == pytest.approx(boundary_overhead_us, abs=1e-6 * stage_cost_us)
    assert calibration.speedup == pytest.approx(2 * stage_cost_us / (stage_cost_us + boundary_overhead_us))


def test_two_run_method_rejects_rates_that_are_not_positive():
    with pytest.raises(ValueError, match="two_process_rate_per_s must be a throughput > 0"):
        boundary_calibration(1000.0, 0.0)
    with pytest.raises(ValueError, match="single_process_rate_per_s"):
        boundary_calibration(float("nan"), 10.0)


def test_call_overhead_is_the_difference_of_medians_in_microseconds():
    assert call_overhead_us([0.003, 0.001, 0.002], [0.0005, 0.0004, 0.9]) == pytest.approx(1500)
    with pytest.raises(ValueError, match="at least one timed call"):
        call_overhead_us([], [0.1])


def test_busy_stage_passes_the_batch_on_unchanged():
    batch = records_batch(rows=20, record_bytes=50)
    assert BusyStage(loops_per_row=3)(batch) is batch
    assert batch.num_rows == 20 and batch.schema.names == ["id", "payload"]
    assert batch.nbytes >= 20 * 50
    with pytest.raises(ValueError, match="loops_per_row must be >= 0"):
        BusyStage(-1)


def fake_clock(step_s: float = 0.001):
    ticks = itertools.count()
    return lambda: next(ticks) * step_s


def fake_cpu_clock():
    """0.01 CPU s more at every reading per process of the PE (the caller and its children)."""
    readings = itertools.count(1)
    return lambda child_pids: next(readings) * 0.01 * (1 + len(child_pids))


def test_boundary_harness_runs_both_configurations_and_calibrates_from_their_medians():
    measurement = measure_boundary(
        record_bytes=50, batch_rows=100, stage_cost_us=0.0, total_rows=1000, repeats=3,
        loops_per_us=1.0, clock=fake_clock(), cpu_clock=fake_cpu_clock(),
    )
    assert len(measurement.single_process_rates_per_s) == 3 == len(measurement.two_process_rates_per_s)
    assert measurement.total_rows == 1000
    # The fake clock ticks once per output batch: 9 batches after the first in 9 ms.
    for rate_per_s in measurement.single_process_rates_per_s + measurement.two_process_rates_per_s:
        assert rate_per_s == pytest.approx(900 / 0.009)
    assert measurement.calibration.stage_cost_us == pytest.approx(5.0)  # 1e6 / (2 * 100000)
    assert measurement.calibration.boundary_overhead_us == pytest.approx(5.0)
    # A run spans two consecutive readings: 0.01 s per process, one process against two.
    assert measurement.boundary_cpu_us == pytest.approx(1e6 * 0.01 * (2 - 1) / 1000)


def test_call_overhead_harness_times_every_call_and_start():
    measurement = measure_call_overhead(calls=10, blocks=2, starts=2, clock=fake_clock())
    assert len(measurement.in_caller_call_s) == 10 == len(measurement.pipelined_call_s)
    assert len(measurement.start_s) == 2
    assert measurement.per_call_overhead_us == pytest.approx(0.0)  # the fake clock is uniform
