"""Stages of a processing element, how one pipeline runs them, and how their failures are told.

A stage is a callable taking one `pyarrow.RecordBatch` (never empty) and returning any of:
- a `pyarrow.RecordBatch` (of any schema: stages may add, drop or retype columns);
- a `pyarrow.Table` (sent on as its record batches);
- an iterable of `RecordBatch` (list, tuple, generator: one input may yield several outputs);
- `None` (nothing to pass on: the whole batch was filtered out).
Batches with zero rows are dropped after every stage, so the next stage never sees one and the
processing element never yields one. The outputs of a stage, in order, feed the next stage one
batch at a time; the order of rows is kept from input to output.

The processing element never pickles stages: child processes are forked, so they inherit the
stages (closures, open resources, module state) as they were when the processes started.
"""

from __future__ import annotations

import functools
import os
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Union

import pyarrow as pa

StageOutput = Union[pa.RecordBatch, pa.Table, Iterable[pa.RecordBatch], None]
Stage = Callable[[pa.RecordBatch], StageOutput]

_ALLOWED_OUTPUTS = "a pyarrow.RecordBatch, a pyarrow.Table, None, or an iterable of RecordBatch"


def stage_name(stage: Stage) -> str:
    """A readable name for a stage: its `name` attribute, its function name, the repr of a
    callable object whose class defines one (e.g. "FusedStage(parse | filter)"), its class name."""
    explicit = getattr(stage, "name", None)
    if isinstance(explicit, str) and explicit:
        return explicit
    if isinstance(stage, functools.partial):
        return f"partial({stage_name(stage.func)})"
    qualified = getattr(stage, "__qualname__", None)
    if isinstance(qualified, str):
        return qualified
    if type(stage).__repr__ is not object.__repr__:
        described = repr(stage)
        return described if len(described) <= _MAX_NAME_CHARS else described[: _MAX_NAME_CHARS - 3] + "..."
    return type(stage).__qualname__


_MAX_NAME_CHARS = 160


@dataclass(frozen=True)
class PipelineShape:
    """Where a pipeline sits in its processing element; for error messages and statistics."""

    pipeline_number: int  # 1-based; pipeline 1 runs in the calling process
    pipeline_count: int
    stage_names: tuple[str, ...]


@dataclass(frozen=True)
class StageFailureReport:
    """What the processing element knows of an exception that escaped a stage."""

    pipeline_number: int
    pipeline_count: int
    stage_number: int  # 1-based within the pipeline; 0: the pipeline's runtime, not a stage
    stage_name: str
    error_type: str
    error_message: str
    traceback_text: str
    pid: int

    def to_json_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        where = f"pipeline {self.pipeline_number} of {self.pipeline_count}"
        if self.pipeline_number > 1:
            where += f" (child process {self.pid})"
        what = (
            f"stage {self.stage_number} {self.stage_name!r}"
            if self.stage_number
            else "the pipeline runtime"
        )
        return (
            f"{where}, {what} raised {self.error_type}: {self.error_message}\n"
            f"Traceback in process {self.pid}:\n{self.traceback_text.rstrip()}\n"
            "Hint: bad records should become dead-letter rows inside the operator; an exception "
            "that escapes a stage fails the whole call (and the Spark task, which Spark retries)."
        )


@dataclass(frozen=True)
class PipelineCallStats:
    """What one pipeline did during one call: the live profile of its process."""

    pipeline_number: int
    pid: int
    batches_in: int = 0
    rows_in: int = 0
    rows_out: int = 0
    busy_s: float = 0.0  # inside the stages
    waiting_for_input_s: float = 0.0  # starved: waiting for the upstream (or the input iterator)
    blocked_on_output_s: float = 0.0  # backpressure: waiting for the downstream to take batches

    @classmethod
    def from_json_dict(cls, values: dict) -> "PipelineCallStats":
        return cls(**values)

    def to_json_dict(self) -> dict:
        return asdict(self)


class CallCounters:
    """Mutable tallies of one pipeline during the current call, frozen by `snapshot`."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.batches_in = self.rows_in = self.rows_out = 0
        self.busy_s = self.waiting_for_input_s = self.blocked_on_output_s = 0.0

    def snapshot(self, pipeline_number: int) -> PipelineCallStats:
        return PipelineCallStats(
            pipeline_number=pipeline_number,
            pid=os.getpid(),
            batches_in=self.batches_in,
            rows_in=self.rows_in,
            rows_out=self.rows_out,
            busy_s=self.busy_s,
            waiting_for_input_s=self.waiting_for_input_s,
            blocked_on_output_s=self.blocked_on_output_s,
        )


class ProcessingElementError(RuntimeError):
    """A processing element could not process a call; its processes are restarted on the next."""


class StageFailedError(ProcessingElementError):
    """An exception escaped a stage, in the calling process or in a pipeline's child process."""

    def __init__(self, report: StageFailureReport) -> None:
        super().__init__(report.describe())
        self.report = report

    def __reduce__(self):
        return (type(self), (self.report,))


class PipelineProcessDiedError(ProcessingElementError):
    """A pipeline's child process ended without reporting an exception (killed, crashed)."""

    def __init__(self, shape: PipelineShape, pid: int, how: str) -> None:
        stages = ", ".join(shape.stage_names)
        super().__init__(
            f"pipeline {shape.pipeline_number} of {shape.pipeline_count} (child process {pid}, "
            f"stages: {stages}) {how} in the middle of a call. Hint: SIGKILL usually means the "
            "out-of-memory killer or a kill from outside; SIGSEGV a crash in native code."
        )
        self.shape = shape
        self.pid = pid
        self.how = how

    def __reduce__(self):
        return (type(self), (self.shape, self.pid, self.how))


class StageFailure(Exception):
    """Internal: carries a failure report from where a stage raised to where it is sent on."""

    def __init__(self, report: StageFailureReport) -> None:
        super().__init__(report.error_message)
        self.report = report


def failure_report(
    shape: PipelineShape, stage_number: int, stage_label: str, error: BaseException
) -> StageFailureReport:
    return StageFailureReport(
        pipeline_number=shape.pipeline_number,
        pipeline_count=shape.pipeline_count,
        stage_number=stage_number,
        stage_name=stage_label,
        error_type=type(error).__qualname__,
        error_message=str(error),
        traceback_text="".join(traceback.format_exception(error)),
        pid=os.getpid(),
    )


def _nonempty_batches(output: StageOutput, label: str) -> list[pa.RecordBatch]:
    if output is None:
        return []
    if isinstance(output, pa.RecordBatch):
        return [output] if output.num_rows else []
    if isinstance(output, pa.Table):
        return [batch for batch in output.to_batches() if batch.num_rows]
    if isinstance(output, (str, bytes, dict)) or not isinstance(output, Iterable):
        raise TypeError(f"stage {label!r} returned {type(output).__name__}; a stage must return {_ALLOWED_OUTPUTS}")
    batches = []
    for item in output:
        if not isinstance(item, pa.RecordBatch):
            raise TypeError(
                f"stage {label!r} yielded {type(item).__name__}; a stage must return {_ALLOWED_OUTPUTS}"
            )
        if item.num_rows:
            batches.append(item)
    return batches


class PipelineRunner:
    """Runs one pipeline's stages over input batches, one batch at a time, and tallies the call."""

    def __init__(self, stages: Sequence[Stage], shape: PipelineShape) -> None:
        self.stages = tuple(stages)
        self.shape = shape
        self.counters = CallCounters()

    def run(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        """The non-empty outputs of one input batch, in order.

        Raises StageFailure naming the stage if one raises or returns something not allowed.
        """
        started_s = time.perf_counter()
        try:
            outputs = self._run_stages(batch)
        finally:
            self.counters.busy_s += time.perf_counter() - started_s
        self.counters.batches_in += 1
        self.counters.rows_in += batch.num_rows
        self.counters.rows_out += sum(output.num_rows for output in outputs)
        return outputs

    def _run_stages(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        batches = [batch]
        for stage_number, (stage, label) in enumerate(zip(self.stages, self.shape.stage_names), 1):
            outputs: list[pa.RecordBatch] = []
            for item in batches:
                try:
                    outputs.extend(_nonempty_batches(stage(item), label))
                except Exception as error:
                    report = failure_report(self.shape, stage_number, label, error)
                    raise StageFailure(report) from error
            if not outputs:
                return []
            batches = outputs
        return batches

    def call_stats(self) -> PipelineCallStats:
        return self.counters.snapshot(self.shape.pipeline_number)
