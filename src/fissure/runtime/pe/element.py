"""The processing element (PE): a region's pipelines, running at the same time in OS processes.

A region's operators run inside the Python worker of one Spark task. The region is cut into
pipelines (runs of consecutive stages). Pipeline 1 runs in the calling process (the Spark
worker, inside the `mapInArrow` function); pipelines 2..k each run in a child process forked by
the worker. Batches go from one pipeline to the next as Arrow IPC streams over OS pipes, so the
pipelines overlap in time: threads would not (the GIL), and neither would one Spark Python node
per pipeline (since Spark 4.0 a task drives all its Python nodes from one thread, SPARK-44705).

Guarantees of `ProcessingElement.process`:
- output order equals input order (each pipeline is one process: a FIFO chain);
- at most `max_batches_in_flight` input batches are inside the children at any time (credit
  based flow control), so a slow pipeline blocks the faster ones and memory stays bounded;
- child processes live across calls (Spark calls the mapInArrow function once per task per
  micro-batch and reuses the Python worker), and `processing_element_for` keeps one live PE
  per region across calls and replaces its processes when the region's cut changes;
- any failure (an exception escaping a stage, a child killed or crashed) fails the call with
  an exception naming the pipeline and the stage and carrying the child's traceback text;
  the processes are then stopped and the next call forks fresh ones.

Start method: fork, always. The Spark worker is itself a forked Python whose imports and
deserialized stages the children inherit for free; fork needs no pickling of the stages (so
closures work) and costs about a millisecond. spawn or forkserver would re-import pyarrow and
the user's code (about a second) and require picklable stages. See fissure.runtime.pe.child for
what keeps the child safe when the parent runs other threads at the fork.
"""

from __future__ import annotations

import atexit
import json
import os
import time
import weakref
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

import pyarrow as pa

from fissure.runtime.pe.stages import (
    PipelineCallStats,
    PipelineProcessDiedError,
    PipelineRunner,
    PipelineShape,
    ProcessingElementError,
    Stage,
    StageFailedError,
    StageFailure,
    StageFailureReport,
    stage_name,
)
from fissure.runtime.pe.processes import (ChildLink, ChildProcess, children_all_alive, describe_abnormal_exit,
                                          fork_children, stop_children)
from fissure.runtime.pe.wire import (DEFAULT_PIPE_CAPACITY_BYTES, Frame, FrameKind, PipeClosed, batch_frame_views,
                                     decode_batch, frame_views)

__all__ = [
    "CallStats",
    "PipelineCallStats",
    "PipelineProcessDiedError",
    "ProcessingElement",
    "ProcessingElementError",
    "Stage",
    "StageFailedError",
    "StageFailureReport",
    "close_live_elements",
    "pipelining_chunks",
]

CLOSE_GRACE_S = 2.0  # an idle child exits at once on EOF; this only bounds a stuck one
FAILURE_GRACE_S = 0.5  # after a failure, children still inside a stage are killed after this
FAILURE_REPORT_WAIT_S = 5.0  # how long a failure report may take to travel down the chain

_LIVE_ELEMENTS: "weakref.WeakSet[ProcessingElement]" = weakref.WeakSet()


@dataclass(frozen=True)
class CallStats:
    """The live profile of one completed call, per pipeline and for the PE as a whole."""

    wall_s: float
    peak_batches_in_flight: int
    caller_consuming_s: float  # suspended at `yield`: the caller (Spark) taking our output
    pipelines: tuple[PipelineCallStats, ...]


@dataclass
class _CallFlow:
    """Mutable state of the call in progress."""

    ready: deque = field(default_factory=deque)  # output batches received, not yet yielded
    batches_in_flight: int = 0
    peak_batches_in_flight: int = 0
    child_stats: tuple[PipelineCallStats, ...] | None = None  # set by the CALL_END frame
    caller_consuming_s: float = 0.0


class ProcessingElement:
    """Runs a list of pipelines (each a list of stages) over a stream of Arrow record batches.

    `pipelines[0]` runs in the calling process, every later pipeline in its own child process,
    forked when the PE is built. See the module docstring for the guarantees and
    fissure.runtime.pe.stages for
    what a stage may return. Not thread-safe: one call at a time, from one thread (the thread
    that built the PE should live as long as the PE: on Linux the children are killed when it
    exits, PR_SET_PDEATHSIG).
    """

    def __init__(
        self,
        pipelines: Sequence[Sequence[Stage]],
        *,
        name: str = "processing element",
        max_batches_in_flight: int | None = None,
        pipe_capacity_bytes: int | None = DEFAULT_PIPE_CAPACITY_BYTES,
    ) -> None:
        self.name = name
        self._pipelines = _validated_pipelines(pipelines, name)
        self._shapes = tuple(
            PipelineShape(number, len(self._pipelines), tuple(stage_name(s) for s in stages))
            for number, stages in enumerate(self._pipelines, start=1)
        )
        if max_batches_in_flight is None:
            max_batches_in_flight = 2 * len(self._pipelines)
        if max_batches_in_flight < 1:
            raise ValueError(f"{name}: max_batches_in_flight must be >= 1, got {max_batches_in_flight}")
        self.max_batches_in_flight = max_batches_in_flight
        self._pipe_capacity_bytes = pipe_capacity_bytes
        self._first = PipelineRunner(self._pipelines[0], self._shapes[0])
        self._children: tuple[ChildProcess, ...] = ()
        self._link: ChildLink | None = None
        self._owner_pid = os.getpid()
        self._busy = False
        self._closed = False
        self.start_count = 0  # how many times the child processes were forked
        self.forced_kill_count = 0  # children that had to be SIGKILLed when stopped
        self.last_call_stats: CallStats | None = None
        _LIVE_ELEMENTS.add(self)
        self._start_children()

    # -- public ---------------------------------------------------------------------------

    @property
    def pipeline_count(self) -> int:
        return len(self._pipelines)

    @property
    def pipeline_shapes(self) -> tuple[PipelineShape, ...]:
        return self._shapes

    @property
    def child_pids(self) -> tuple[int, ...]:
        """Pids of the live child processes, pipeline 2 first; empty when none run."""
        return tuple(child.pid for child in self._children)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def busy(self) -> bool:
        """True while a call's iterator is open (started and neither exhausted nor closed)."""
        return self._busy

    def process(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Stream `batches` through all pipelines; yields the outputs in input order.

        A generator: nothing runs until the first `next()`. Consume it to the end (or close
        it); closing it early stops the children, and the next call forks new ones. Raises
        StageFailedError or PipelineProcessDiedError (both ProcessingElementError) on failure.
        """
        self._begin_call()
        flow = _CallFlow()
        started_s = time.perf_counter()
        try:
            if self._children:
                yield from self._process_pipelined(iter(batches), flow)
            else:
                yield from self._process_in_caller(iter(batches), flow)
        except BaseException:
            self._stop_children(FAILURE_GRACE_S)
            raise
        finally:
            self._busy = False
        self.last_call_stats = CallStats(
            wall_s=time.perf_counter() - started_s,
            peak_batches_in_flight=flow.peak_batches_in_flight,
            caller_consuming_s=flow.caller_consuming_s,
            pipelines=(self._first.call_stats(),) + (flow.child_stats or ()),
        )

    def close(self) -> None:
        """Stop the child processes (EOF first, SIGKILL after a grace period) and reap them."""
        self._closed = True
        self._stop_children(CLOSE_GRACE_S)
        _LIVE_ELEMENTS.discard(self)

    def __enter__(self) -> "ProcessingElement":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        cut = " | ".join(", ".join(shape.stage_names) for shape in self._shapes)
        return f"ProcessingElement({self.name!r}, pipelines: {cut}, children: {self.child_pids})"

    # -- the call ----------------------------------------------------------------------------

    def _begin_call(self) -> None:
        if self._closed:
            raise ProcessingElementError(
                f"{self.name} is closed; build a new one (processing_element_for does it for you)"
            )
        if os.getpid() != self._owner_pid:
            raise ProcessingElementError(
                f"{self.name} was built in process {self._owner_pid}, not in this forked copy "
                f"({os.getpid()}); build a new processing element here"
            )
        if self._busy:
            raise ProcessingElementError(
                f"{self.name} is already in a call: consume or close the iterator of the previous "
                "process() call first"
            )
        if self.pipeline_count > 1 and not self._children_all_alive():
            self._stop_children(FAILURE_GRACE_S)  # reaps what died between calls
            self._start_children()
        self._busy = True
        self._first.counters.reset()

    def _next_input(self, batches: Iterator[pa.RecordBatch]) -> pa.RecordBatch | None:
        """The next non-empty input batch, or None at the end of the input."""
        while True:
            waiting_since_s = time.perf_counter()
            batch = next(batches, None)
            self._first.counters.waiting_for_input_s += time.perf_counter() - waiting_since_s
            if batch is None:
                return None
            if not isinstance(batch, pa.RecordBatch):
                raise TypeError(
                    f"{self.name}: process() needs an iterator of pyarrow.RecordBatch, got "
                    f"{type(batch).__name__}; convert tables with Table.to_batches()"
                )
            if batch.num_rows:
                return batch

    def _run_first_pipeline(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        try:
            return self._first.run(batch)
        except StageFailure as failure:
            raise StageFailedError(failure.report) from failure.__cause__

    def _process_in_caller(
        self, batches: Iterator[pa.RecordBatch], flow: _CallFlow
    ) -> Iterator[pa.RecordBatch]:
        while (batch := self._next_input(batches)) is not None:
            flow.ready.extend(self._run_first_pipeline(batch))
            yield from self._yield_ready(flow)

    def _process_pipelined(
        self, batches: Iterator[pa.RecordBatch], flow: _CallFlow
    ) -> Iterator[pa.RecordBatch]:
        while (whole := self._next_input(batches)) is not None:
            for batch in pipelining_chunks(whole, self.pipeline_count):
                self._feed(batch, flow)
                yield from self._yield_ready(flow)
        self._send(frame_views(FrameKind.CALL_END), flow)
        while flow.child_stats is None:
            self._receive(flow, block=True)
            yield from self._yield_ready(flow)
        yield from self._yield_ready(flow)

    def _feed(self, batch: pa.RecordBatch, flow: _CallFlow) -> None:
        """Run pipeline 1 on `batch` and hand its output to the children (waiting for credit)."""
        counters = self._first.counters
        outputs = self._run_first_pipeline(batch)
        if not outputs:
            return
        views = [view for output in outputs for view in batch_frame_views(output)]
        views += frame_views(FrameKind.GROUP_END)
        blocked_since_s = time.perf_counter()
        while flow.batches_in_flight >= self.max_batches_in_flight:
            self._receive(flow, block=True)
        self._send(views, flow)
        counters.blocked_on_output_s += time.perf_counter() - blocked_since_s
        flow.batches_in_flight += 1
        flow.peak_batches_in_flight = max(flow.peak_batches_in_flight, flow.batches_in_flight)

    def _yield_ready(self, flow: _CallFlow) -> Iterator[pa.RecordBatch]:
        while flow.ready:
            suspended_since_s = time.perf_counter()
            yield flow.ready.popleft()
            flow.caller_consuming_s += time.perf_counter() - suspended_since_s

    def _send(self, views: list[memoryview], flow: _CallFlow) -> None:
        """Write a whole frame sequence to pipeline 2, reading results meanwhile (no deadlock)."""
        link = self._live_link()
        link.feed.add(views)
        while True:
            try:
                if link.feed.write_available():
                    return
            except PipeClosed:
                self._fail()
            link.wait(want_write=True)
            self._receive(flow, block=False)

    def _live_link(self) -> ChildLink:
        if self._link is None:
            raise ProcessingElementError(
                f"{self.name} was closed during a call (a new cut for its region replaces it)"
            )
        return self._link

    def _receive(self, flow: _CallFlow, block: bool) -> None:
        link = self._live_link()
        if block:
            link.wait(want_write=False)
        try:
            frames = link.results.read_available()
        except PipeClosed:
            self._fail()
        for frame in frames:
            self._handle_result(frame, flow)

    def _handle_result(self, frame: Frame, flow: _CallFlow) -> None:
        if frame.kind is FrameKind.BATCH:
            flow.ready.append(decode_batch(frame.payload))
        elif frame.kind is FrameKind.GROUP_END:
            flow.batches_in_flight -= 1
        elif frame.kind is FrameKind.CALL_END:
            flow.child_stats = tuple(
                PipelineCallStats.from_json_dict(values)
                for values in json.loads(frame.payload.to_pybytes())
            )
        elif frame.kind is FrameKind.FAILURE:
            self._fail(_report_from(frame))

    # -- failures ----------------------------------------------------------------------------

    def _fail(self, report: StageFailureReport | None = None) -> NoReturn:
        """Stop the children and raise the most precise error there is; never returns."""
        if report is None:
            report = self._wait_for_failure_report()
        children = self._children
        killed_by_us, exit_statuses = self._stop_children(FAILURE_GRACE_S)
        if report is not None:
            raise StageFailedError(report)
        for child in children:
            how = describe_abnormal_exit(exit_statuses.get(child.pid))
            if how is not None and child.pid not in killed_by_us:
                raise PipelineProcessDiedError(child.shape, child.pid, how)
        raise ProcessingElementError(
            f"{self.name}: the pipeline processes {[child.pid for child in children]} "
            "closed their pipes without reporting why. Hint: a stage may have closed file "
            "descriptors it does not own."
        )

    def _wait_for_failure_report(self) -> StageFailureReport | None:
        """After a broken pipe: a failure report may still be travelling down the chain."""
        deadline_s = time.monotonic() + FAILURE_REPORT_WAIT_S
        link = self._link
        while time.monotonic() < deadline_s:
            try:
                frames = link.results.read_available()
            except PipeClosed:
                return None
            for frame in frames:
                if frame.kind is FrameKind.FAILURE:
                    return _report_from(frame)
            link.wait(want_write=False, timeout_s=deadline_s - time.monotonic())
        return None

    # -- processes ---------------------------------------------------------------------------

    def _start_children(self) -> None:
        if self.pipeline_count == 1:
            return
        self._children, self._link = fork_children(self._pipelines, self._shapes, self._pipe_capacity_bytes)
        self.start_count += 1

    def _children_all_alive(self) -> bool:
        return children_all_alive(self._children)

    def _stop_children(self, grace_s: float) -> tuple[set[int], dict[int, int | None]]:
        """Close the pipes, give the children `grace_s` to exit, SIGKILL the rest, reap all.

        Returns the pids killed here and every child's wait status (None: reaped elsewhere).
        """
        children, link = self._children, self._link
        self._children, self._link = (), None
        killed, exit_statuses = stop_children(children, link, grace_s, self._owner_pid)
        self.forced_kill_count += len(killed)
        return killed, exit_statuses


def _report_from(frame: Frame) -> StageFailureReport:
    return StageFailureReport(**json.loads(frame.payload.to_pybytes()))


def _validated_pipelines(
    pipelines: Sequence[Sequence[Stage]], name: str
) -> tuple[tuple[Stage, ...], ...]:
    if isinstance(pipelines, (str, bytes)) or not isinstance(pipelines, Sequence) or not pipelines:
        raise ValueError(f"{name}: pipelines must be a non-empty list of lists of stages")
    validated = []
    for number, stages in enumerate(pipelines, start=1):
        if isinstance(stages, (str, bytes)) or not isinstance(stages, Sequence) or not stages:
            raise ValueError(
                f"{name}: pipeline {number} must be a non-empty list of stages, got {stages!r}"
            )
        for stage_number, stage in enumerate(stages, start=1):
            if not callable(stage):
                raise TypeError(
                    f"{name}: pipeline {number}, stage {stage_number} is a "
                    f"{type(stage).__name__}, not a callable RecordBatch -> RecordBatch"
                )
        validated.append(tuple(stages))
    return tuple(validated)


# Pipelines overlap only across batches: a micro-batch that reaches the PE as one large Arrow
# batch (Spark sends up to 10,000 rows per batch) would pass the pipelines one after another.
# It is cut into CHUNKS_PER_PIPELINE x pipelines chunks of at least MIN_CHUNK_ROWS rows, so the
# pipelines fill within a few chunks while a chunk's fixed cost (~0.1 ms) stays small.
CHUNKS_PER_PIPELINE = 4
MIN_CHUNK_ROWS = 128


def pipelining_chunk_count(rows: int, pipeline_count: int) -> int:
    """How many chunks `pipelining_chunks` cuts a batch of `rows` rows into."""
    size = max(MIN_CHUNK_ROWS, -(-rows // (CHUNKS_PER_PIPELINE * pipeline_count)))
    return 1 if rows <= size else -(-rows // size)


def pipelining_chunks(batch: pa.RecordBatch, pipeline_count: int) -> list[pa.RecordBatch]:
    """`batch` cut into consecutive zero-copy slices that let `pipeline_count` pipelines overlap."""
    chunks = CHUNKS_PER_PIPELINE * pipeline_count
    rows = max(MIN_CHUNK_ROWS, -(-batch.num_rows // chunks))
    if batch.num_rows <= rows:
        return [batch]
    return [batch.slice(offset, rows) for offset in range(0, batch.num_rows, rows)]


def close_live_elements() -> None:
    """Close every PE this process built; also runs at interpreter exit."""
    for element in list(_LIVE_ELEMENTS):
        element.close()


def _forget_inherited_elements() -> None:
    """In a process forked from one that owns PEs: those PEs and their children are not ours."""
    _LIVE_ELEMENTS.clear()


os.register_at_fork(after_in_child=_forget_inherited_elements)
atexit.register(close_live_elements)
