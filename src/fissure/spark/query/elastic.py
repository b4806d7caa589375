"""Waiting operators on Spark: elastic threads in the workers, their levels on the driver.

Operators declared `waits="io"` / `waits="gil-free"` run on elastic threads inside their fused
stage (fissure.runtime.elastic.stage). This module connects that to a run:

- compiling (`WorkerThreads`, used by fissure.spark.query.compile_graph): which steps carry a
  `WaitingOperator` (declared ones; with `RunnerConfig.detect_waiting_operators` every stateless
  per-record one, switched off until detected), with the run's policy and its parameters; and the
  wrapper `ElasticRegion` around each PE stage that has such steps;
- in the worker (`ElasticRegion`, around a compiled PE stage's mapInArrow function): binds the
  operators' boards before the PE forks its children, switches detected operators on or off from
  the batch's local property `fissure.elastic.switched`, and after the call adds each operator's
  `ThreadLevelReport` to the run's accumulator (PySpark ships it back with the task's result);
- on the driver (`ThreadLevels`, one per Runner): the accumulator, the foreachBatch wrapper that
  sets the switched operators before the batch runs and takes the batch's reports after it, and
  the per-batch `BatchThreadLevels` that the progress line and the run report show.

Detection: before every micro-batch the driver looks at the profiler's window of statistics and
switches on, for good, each candidate operator whose wall time per record is at least twice its
CPU time over enough timed records (`fissure.control.thread_level.verdict.detect_waiting`). Once its
threads run it, its profiled CPU time is the dealing thread's, so the verdict would not mean the
same any more: the switch stays.
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from fissure.control.thread_level.config import ElasticityConfig
from fissure.program.chain import Pipeline
from fissure.program.operators import Operator
from fissure.program.graph import StreamGraph
from fissure.model.types import Kind
from fissure.runtime.elastic.stage import (
    BatchThreadLevels,
    ThreadLevelTally,
    ThreadLevelTallyParam,
    WaitingOperator,
)
from fissure.control.thread_level.verdict import detect_waiting

log = logging.getLogger(__name__)

ELASTIC_SWITCHED_PROPERTY = "fissure.elastic.switched"
MAX_KEPT_BATCHES = 1000


def _runs_per_record(operator: Operator) -> bool:
    return operator.kind is Kind.STATELESS and not operator.per_batch


@dataclass(frozen=True)
class WorkerThreads:
    """What compiled PE stages need to run waiting operators on elastic threads.

    `accumulator`: the run's thread-level accumulator (None: levels are not reported); `detect`:
    give every stateless per-record operator a (switched off) `WaitingOperator`.
    """

    accumulator: object | None = None
    policy: str = "trust-trend"
    config: ElasticityConfig | None = None
    detect: bool = False
    # Names the run in every runner key: Python workers outlive a run, and a runner found under
    # the same key would carry the last run's thread level into the next run's first batch.
    run: str = ""

    def waiting_for(self, operator: Operator, pipeline: str) -> WaitingOperator | None:
        """The operator's `WaitingOperator` (None: it always runs sequentially)."""
        declared = operator.hints.waits.value if operator.hints.waits is not None else None
        if not _runs_per_record(operator) or (declared is None and not self.detect):
            return None
        key = f"{self.run}/{pipeline}/{operator.name}" if self.run else f"{pipeline}/{operator.name}"
        return WaitingOperator.for_operator(operator.name, key, declared,
                                            self.policy, self.config)

    def wrap_waiting(self, function: Callable, waiting: Sequence[WaitingOperator]) -> Callable:
        """`function` (a PE stage's mapInArrow function whose steps include `waiting`) wrapped in an
        `ElasticRegion` when there is any."""
        return ElasticRegion(function, waiting, self.accumulator) if waiting else function


def _task_switched_operators() -> set[str] | None:
    """The operators the driver switched on for this task's micro-batch (None: not set)."""
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        text = context.getLocalProperty(ELASTIC_SWITCHED_PROPERTY) if context is not None else None
        return set(json.loads(text)) if text else None
    except Exception as error:  # noqa: BLE001 - no task context or an unreadable value: no change
        log.info("elastic: cannot read %s (%s): detected operators keep their state", ELASTIC_SWITCHED_PROPERTY, error)
        return None


class ElasticRegion:
    """A compiled PE stage's mapInArrow function with its waiting operators' boards bound, detected
    operators switched, and their thread levels reported to the driver after each call."""

    def __init__(self, function: Callable[[Iterator], Iterator], waiting: Sequence[WaitingOperator],
                 accumulator) -> None:
        self.function = function
        self.waiting = tuple(waiting)
        self.accumulator = accumulator

    def __call__(self, batches: Iterator) -> Iterator:
        boards = [(waiting, waiting.board()) for waiting in self.waiting]  # before the PE forks
        switched = _task_switched_operators()
        if switched is not None:
            for waiting, board in boards:
                if waiting.declared is None:
                    board.engaged = waiting.operator in switched
        yield from self.function(batches)
        if self.accumulator is None:
            return
        try:
            host = socket.gethostname()
            tally = ThreadLevelTally(report for report in (board.report(waiting.operator, host)
                                                           for waiting, board in boards) if report is not None)
            if tally.reports:
                self.accumulator.add(tally)
        except Exception as error:  # noqa: BLE001 - metrics must never fail a task
            log.info("elastic: thread levels not reported (%s)", error)


class ThreadLevels:
    """One query's waiting operators on the driver: the accumulator the workers report into, the
    switch of detected operators, and the thread levels after each micro-batch.

    `profile_summary()` gives the profiler's current window (None: no profile), for detection.
    """

    def __init__(self, spark, pipeline: Pipeline | StreamGraph, *, policy: str = "trust-trend",
                 config: ElasticityConfig | None = None, detect: bool = False,
                 profile_summary: Callable[[], object | None] | None = None, run: str = "") -> None:
        self.spark = spark
        declared = [operator.name for operator in pipeline.operators if operator.hints.waits is not None]
        self.candidates = tuple(operator.name for operator in pipeline.operators
                                if detect and _runs_per_record(operator) and operator.hints.waits is None)
        self.profile_summary = profile_summary
        accumulator = None
        if declared or self.candidates:
            accumulator = spark.sparkContext.accumulator(ThreadLevelTally(), ThreadLevelTallyParam())
        # The run's checkpoint names it: the same run's queries (adaptive restarts) keep their
        # workers' thread levels, another run's start afresh.
        run_token = hashlib.sha1(run.encode()).hexdigest()[:12] if run else ""
        self.worker = WorkerThreads(accumulator, policy, config, detect=bool(self.candidates), run=run_token)
        self.switched: dict[str, str] = {}  # detected operator -> the verdict's reason
        self._batches: list[BatchThreadLevels] = []
        self._lock = threading.Lock()

    def wrap(self, write: Callable) -> Callable:
        """The foreachBatch function `write`, with the switch set before and the levels taken after."""
        if self.worker.accumulator is None:
            return write

        def write_with_thread_levels(frame, batch_id: int) -> None:
            if self.candidates:
                self._switch_detected()
            before = self._read()
            try:
                write(frame, batch_id)
            finally:
                after = self._read()
                if before is not None and after is not None:
                    self._keep(BatchThreadLevels(int(batch_id), after.newer_than(before)))

        return write_with_thread_levels

    def _read(self) -> ThreadLevelTally | None:
        try:
            return self.worker.accumulator.value.copy()
        except Exception as error:  # noqa: BLE001 - metrics never stop the stream
            log.info("elastic: thread-level accumulator unreadable (%s); this batch goes without levels", error)
            return None

    def _switch_detected(self) -> None:
        summary = self.profile_summary() if self.profile_summary is not None else None
        for name in self.candidates:
            if name in self.switched:
                continue
            estimate = summary.operator(name) if summary is not None else None
            if estimate is None:
                log.debug("elastic: no profile of operator %r yet: it stays sequential", name)
                continue
            verdict = detect_waiting(name, wall_us_per_record=estimate.wall_us, cpu_us_per_record=estimate.cpu_us,
                                     timed_records=estimate.timed_records)
            if verdict.run_threaded:
                self.switched[name] = verdict.reason
                log.info("elastic: %s: it runs on elastic threads from this micro-batch on", verdict.reason)
            else:
                log.debug("elastic: %s: it stays sequential", verdict.reason)
        self.spark.sparkContext.setLocalProperty(ELASTIC_SWITCHED_PROPERTY, json.dumps(sorted(self.switched)))

    def _keep(self, levels: BatchThreadLevels) -> None:
        if levels.reports:
            log.info("elastic: batch %d thread levels %s", levels.batch_id, levels.text())
        with self._lock:
            self._batches.append(levels)
            del self._batches[:-MAX_KEPT_BATCHES]

    @property
    def batches(self) -> tuple[BatchThreadLevels, ...]:
        """The thread levels after each micro-batch so far (the newest MAX_KEPT_BATCHES)."""
        with self._lock:
            return tuple(self._batches)

    def levels_of(self, batch_id: int) -> dict[str, tuple[int, ...]] | None:
        """Operator -> the level of each worker that ran it during `batch_id` (None: none did)."""
        with self._lock:
            levels = next((levels for levels in reversed(self._batches) if levels.batch_id == batch_id), None)
        return levels.levels() if levels is not None and levels.reports else None

    def latest_text(self) -> str:
        """The latest batch's levels for the progress line (`enrich 8,6`), '' before any."""
        with self._lock:
            latest = next((levels for levels in reversed(self._batches) if levels.reports), None)
        return latest.text() if latest is not None else ""
