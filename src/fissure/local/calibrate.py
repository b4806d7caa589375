"""Calibrating a processing element's overheads on this machine.

The per-tuple cost δ of a pipeline boundary (a process boundary here, a thread switch in the
paper) comes from the paper's two-run method (Gedik et al., JPDC 2016, section 5.3.1): run two
stages of equal cost c once in one process (throughput T_s = 1 / (2c), eq. 16) and once in two
processes (T_p = 1 / (c + δ), eq. 15); then δ = 1/T_p - 1/(2 T_s) (eq. 17), without knowing c.

The pure functions come first (`boundary_calibration`, `call_overhead_us`); the measuring
harness below them runs real processing elements and is what benchmarks/pe_overheads.py and a
future `fissure calibrate` call. Timings depend on the machine's load: compare only within one
run and take medians.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa

from fissure.runtime.pe.element import ProcessingElement

Clock = Callable[[], float]


@dataclass(frozen=True)
class BoundaryCalibration:
    """The two-run method's result for one record size and batch size."""

    single_process_rate_per_s: float  # T_s: both stages in one process
    two_process_rate_per_s: float  # T_p: one stage per process
    stage_cost_us: float  # c = 1 / (2 T_s)
    boundary_overhead_us: float  # δ = 1/T_p - 1/(2 T_s)

    @property
    def speedup(self) -> float:
        """T_p / T_s: at most 2 for two balanced stages."""
        return self.two_process_rate_per_s / self.single_process_rate_per_s


def boundary_calibration(
    single_process_rate_per_s: float, two_process_rate_per_s: float
) -> BoundaryCalibration:
    """δ and c from the throughputs (tuples per second) of the two runs, eqs. 15-17."""
    for name, rate in (
        ("single_process_rate_per_s", single_process_rate_per_s),
        ("two_process_rate_per_s", two_process_rate_per_s),
    ):
        if not rate > 0:
            raise ValueError(f"{name} must be a throughput > 0 tuples/s, got {rate}")
    single_tuple_time_us = 1e6 / single_process_rate_per_s
    return BoundaryCalibration(
        single_process_rate_per_s=single_process_rate_per_s,
        two_process_rate_per_s=two_process_rate_per_s,
        stage_cost_us=single_tuple_time_us / 2,
        boundary_overhead_us=1e6 / two_process_rate_per_s - single_tuple_time_us / 2,
    )


def call_overhead_us(pipelined_call_s: Sequence[float], in_caller_call_s: Sequence[float]) -> float:
    """Fixed cost per call of going through child processes: the difference of the medians of
    the same tiny calls run with the stages split across processes and all in the caller."""
    if not pipelined_call_s or not in_caller_call_s:
        raise ValueError("call_overhead_us needs at least one timed call of each kind")
    return 1e6 * (statistics.median(pipelined_call_s) - statistics.median(in_caller_call_s))


# -- workload -------------------------------------------------------------------------------------


class BusyStage:
    """A stage that burns CPU in proportion to its rows (repeated multiplications, like the
    paper's busy operators) and passes the batch on unchanged."""

    def __init__(self, loops_per_row: int, name: str = "busy") -> None:
        if loops_per_row < 0:
            raise ValueError(f"BusyStage: loops_per_row must be >= 0, got {loops_per_row}")
        self.loops_per_row = loops_per_row
        self.name = name

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        product = 1.0
        for _ in range(self.loops_per_row * batch.num_rows):
            product *= 1.0000001
        return batch


def busy_loops_per_us(sample_rows: int = 2000, loops_per_row: int = 100, clock: Clock = time.perf_counter) -> float:
    """How many BusyStage loops this interpreter runs per microsecond (best of three)."""
    stage = BusyStage(loops_per_row)
    batch = records_batch(sample_rows, record_bytes=16)
    best_s = float("inf")
    for _ in range(3):
        started_s = clock()
        stage(batch)
        best_s = min(best_s, clock() - started_s)
    return sample_rows * loops_per_row / (best_s * 1e6)


def busy_stage_for_cost(cost_us_per_row: float, loops_per_us: float, name: str = "busy") -> BusyStage:
    return BusyStage(max(0, round(cost_us_per_row * loops_per_us)), name=name)


def records_batch(rows: int, record_bytes: int, first_id: int = 0) -> pa.RecordBatch:
    """`rows` records of about `record_bytes` each: an int64 id and a binary payload."""
    payload_bytes = max(0, record_bytes - 8)
    payload = pa.array([b"r" * payload_bytes] * rows, type=pa.binary())
    return pa.record_batch({"id": pa.array(range(first_id, first_id + rows), pa.int64()), "payload": payload})


def records_batches(
    batch_count: int, batch_rows: int, record_bytes: int, max_distinct_bytes: int = 256 << 20
) -> list[pa.RecordBatch]:
    """`batch_count` batches of fresh-looking records; beyond `max_distinct_bytes` of data the
    list repeats earlier batches (same memory) instead of allocating more."""
    distinct_count = max(1, min(batch_count, max_distinct_bytes // max(1, batch_rows * record_bytes)))
    distinct = [records_batch(batch_rows, record_bytes, index * batch_rows) for index in range(distinct_count)]
    return [distinct[index % distinct_count] for index in range(batch_count)]


def identity_stage(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


# -- harness --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BoundaryMeasurement:
    """Alternating runs of one configuration and the calibration from their medians.

    The CPU figures (all processes of the PE, per row) do not count time spent waiting for a
    core, so on a busy machine they show the boundary's own cost better than the rates do:
    `boundary_cpu_us` is what the boundary adds on both sides together (about 2 δ when the
    sender and the receiver pay alike). NaN where /proc is not available.
    """

    record_bytes: int
    batch_rows: int
    total_rows: int
    single_process_rates_per_s: tuple[float, ...]
    two_process_rates_per_s: tuple[float, ...]
    single_process_cpu_us_per_row: tuple[float, ...]
    two_process_cpu_us_per_row: tuple[float, ...]
    calibration: BoundaryCalibration

    @property
    def boundary_cpu_us(self) -> float:
        return statistics.median(self.two_process_cpu_us_per_row) - statistics.median(
            self.single_process_cpu_us_per_row
        )


@dataclass(frozen=True)
class CallOverheadMeasurement:
    """Fixed costs of the process boundary that do not grow with the data."""

    batch_rows: int
    in_caller_call_s: tuple[float, ...]
    pipelined_call_s: tuple[float, ...]
    per_call_overhead_us: float  # one call with one small batch, two processes vs one
    empty_call_overhead_us: float  # a call with no input at all (just the end-of-call round trip)
    start_s: tuple[float, ...]  # building a two-pipeline PE (the fork) and closing it again


CpuClock = Callable[[Sequence[int]], float]


def cpu_seconds(child_pids: Sequence[int]) -> float:
    """CPU seconds used so far by this process and the given child processes (Linux /proc)."""
    total_s = time.process_time()
    for pid in child_pids:
        try:
            with open(f"/proc/{pid}/stat") as stat_file:
                fields = stat_file.read().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        total_s += (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS_PER_S  # utime + stime
    return total_s


_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class RunSample:
    rate_per_s: float  # steady state: rows after the first output batch / first to last output
    cpu_us_per_row: float  # all processes of the PE, the whole call


def run_once(
    element: ProcessingElement,
    batches: Sequence[pa.RecordBatch],
    clock: Clock = time.perf_counter,
    cpu_clock: CpuClock = cpu_seconds,
) -> RunSample:
    """One call of `element` over `batches`. The rate leaves out filling and draining the
    pipelines (before the first output, after the last), which the model's throughput does not
    include."""
    rows = sum(batch.num_rows for batch in batches)
    first_output_s = last_output_s = None
    rows_after_first = 0
    cpu_before_s = cpu_clock(element.child_pids)
    started_s = clock()
    for output in element.process(batches):
        last_output_s = clock()
        if first_output_s is None:
            first_output_s = last_output_s
        else:
            rows_after_first += output.num_rows
    ended_s = clock()
    cpu_us_per_row = 1e6 * (cpu_clock(element.child_pids) - cpu_before_s) / rows
    if not rows_after_first or last_output_s <= first_output_s:  # one output: no steady state
        return RunSample(rows / (ended_s - started_s), cpu_us_per_row)
    return RunSample(rows_after_first / (last_output_s - first_output_s), cpu_us_per_row)


def measure_boundary(
    record_bytes: int,
    batch_rows: int,
    stage_cost_us: float,
    total_rows: int,
    repeats: int = 3,
    loops_per_us: float | None = None,
    clock: Clock = time.perf_counter,
    cpu_clock: CpuClock = cpu_seconds,
) -> BoundaryMeasurement:
    """The two-run method: two busy stages of `stage_cost_us` per row, in one process and in
    two, `repeats` times each over the same pre-built batches, in an order rotated each repeat."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if loops_per_us is None:
        loops_per_us = busy_loops_per_us(clock=clock)
    first = busy_stage_for_cost(stage_cost_us, loops_per_us, "busy_1")
    second = busy_stage_for_cost(stage_cost_us, loops_per_us, "busy_2")
    batch_count = max(1, total_rows // batch_rows)
    batches = records_batches(batch_count, batch_rows, record_bytes)
    single_runs, two_runs = [], []
    with ProcessingElement([[first, second]]) as single, ProcessingElement([[first], [second]]) as two:
        for element in (single, two):  # warm-up: first-touch page faults, lazy imports
            run_once(element, batches[:2], clock, cpu_clock)
        for repeat in range(repeats):  # the order rotated each repeat: neither always runs first
            runs = {id(single): single_runs, id(two): two_runs}
            for element in ((single, two) if repeat % 2 == 0 else (two, single)):
                runs[id(element)].append(run_once(element, batches, clock, cpu_clock))
    return BoundaryMeasurement(
        record_bytes=record_bytes,
        batch_rows=batch_rows,
        total_rows=batch_count * batch_rows,
        single_process_rates_per_s=tuple(run.rate_per_s for run in single_runs),
        two_process_rates_per_s=tuple(run.rate_per_s for run in two_runs),
        single_process_cpu_us_per_row=tuple(run.cpu_us_per_row for run in single_runs),
        two_process_cpu_us_per_row=tuple(run.cpu_us_per_row for run in two_runs),
        calibration=boundary_calibration(
            statistics.median(run.rate_per_s for run in single_runs),
            statistics.median(run.rate_per_s for run in two_runs),
        ),
    )


def _time_calls(element: ProcessingElement, batches: list[pa.RecordBatch], calls: int, clock: Clock) -> list[float]:
    durations = []
    for _ in range(calls):
        started_s = clock()
        for _ in element.process(batches):
            pass
        durations.append(clock() - started_s)
    return durations


def measure_call_overhead(
    calls: int, batch_rows: int = 1, blocks: int = 5, starts: int = 5, clock: Clock = time.perf_counter
) -> CallOverheadMeasurement:
    """Per-call fixed cost: `calls` tiny calls, split in `blocks` alternating between two
    identity stages in the caller and the same stages in two processes."""
    batch = [records_batch(batch_rows, record_bytes=50)]
    in_caller, pipelined, empty_in_caller, empty_pipelined = [], [], [], []
    per_block = max(1, calls // blocks)
    with ProcessingElement([[identity_stage, identity_stage]]) as one, ProcessingElement(
        [[identity_stage], [identity_stage]]
    ) as two:
        for _ in range(blocks):
            in_caller += _time_calls(one, batch, per_block, clock)
            pipelined += _time_calls(two, batch, per_block, clock)
            empty_in_caller += _time_calls(one, [], per_block, clock)
            empty_pipelined += _time_calls(two, [], per_block, clock)
    start_s = []
    for _ in range(starts):
        started_s = clock()
        ProcessingElement([[identity_stage], [identity_stage]]).close()
        start_s.append(clock() - started_s)
    return CallOverheadMeasurement(
        batch_rows=batch_rows,
        in_caller_call_s=tuple(in_caller),
        pipelined_call_s=tuple(pipelined),
        per_call_overhead_us=call_overhead_us(pipelined, in_caller),
        empty_call_overhead_us=call_overhead_us(empty_pipelined, empty_in_caller),
        start_s=tuple(start_s),
    )
