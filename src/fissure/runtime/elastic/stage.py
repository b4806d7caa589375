"""Operators that wait, run on elastic threads inside their fused stage.

A stateless per-record operator declared `waits="io"` or `waits="gil-free"` (fissure.program.operators), or
switched on because its profile shows it waiting, carries a `WaitingOperator` in its fused `Step`.
When the fused stage (fissure.runtime.operators.fused) reaches such a step it hands the batch's records to
`WaitingOperator.run`, which runs them through the operator's `ElasticOperatorRunner`
(fissure.runtime.elastic.scheduler):

- one runner per operator per process (`WorkerRunners`, module-level), kept across Spark tasks
  and micro-batches: its threads park between batches and its policy keeps what it learned, so a
  batch much shorter than a period still counts towards the period that decides the next level;
- the records of the batch are the unit of work; each one goes through the very function the
  sequential path uses (`run_record_steps` on that one record), so a record that raises, or a
  map that returns something other than a dict, becomes the same dead letter (operator, error
  text, record, sequence number) as without threads, and the results come back in input order;
- the policy (trust-trend unless configured) picks the thread level every period of the real
  monotonic clock (injectable: `WorkerRunners.reset(clock=...)`).

Metrics: every waiting operator has an `OperatorBoard` in the worker: a few float64 slots in an
anonymous shared memory map, so that a runner in a PE child process (forked by the worker) and
the worker itself see the same slots. The runner writes its level, last period's throughput and
counts into it; the worker reads it after each task and sends a `ThreadLevelReport` to the driver
in a `ThreadLevelTally` (a Spark accumulator's value, see fissure.spark.query.elastic). The board also
carries the switch that turns an undeclared operator on when the driver's profile detects it
waiting (fissure.control.thread_level.verdict.detect_waiting).
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from fissure.control.thread_level.config import ElasticityConfig, POLICY_NAMES
from fissure.runtime.operators.fused import Step, run_record_steps
from fissure.runtime.records.fate import DeadLetter
from fissure.runtime.elastic.runner import ElasticOperatorRunner, ThreadLevelSample

log = logging.getLogger(__name__)

# The values of fissure.program.operators.Waits (the worker layer does not import the pipeline definition).
WAIT_KINDS = ("io", "gil-free")
RECORD_ACTIONS = ("map", "filter", "flat_map")


def policy_config(declared: str | None, config: ElasticityConfig | None = None) -> ElasticityConfig:
    """The policy's parameters for a waiting operator: `config` as given, else the defaults, without
    the CPU-usage check unless the operator is declared GIL-free. An operator waiting on I/O uses
    little CPU itself; on a small machine shared with Spark's own tasks the check would hold it at
    a low level for CPU that other processes use. GIL-free native code does use CPU: keep it."""
    if config is not None:
        return config
    return ElasticityConfig() if declared == "gil-free" else ElasticityConfig(cpu_usage_limit=None)


@dataclass(frozen=True)
class WaitingOperator:
    """How a stateless per-record step runs under the in-worker scheduler (`Step.waiting`).

    Attributes:
        operator: the operator's name.
        runner_key: names the operator's runner and board in a worker, the same for every task
            and micro-batch of the pipeline (e.g. "<pipeline>/<operator>").
        declared: "io" or "gil-free" as declared; None for an undeclared operator, which runs
            sequentially until the driver switches it on (`OperatorBoard.engaged`).
        policy: the thread-level policy, "trust-trend" or "elastic-operator".
        config: the policy's parameters (`policy_config`).
    """

    operator: str
    runner_key: str
    declared: str | None = None
    policy: str = "trust-trend"
    config: ElasticityConfig = field(default_factory=lambda: policy_config(None))

    def __post_init__(self) -> None:
        if self.declared is not None and self.declared not in WAIT_KINDS:
            raise ValueError(f"operator {self.operator!r}: waits must be one of {', '.join(WAIT_KINDS)}, "
                             f"got {self.declared!r}")
        if self.policy not in POLICY_NAMES:
            raise ValueError(f"operator {self.operator!r}: unknown thread-level policy {self.policy!r}; "
                             f"choose one of {', '.join(POLICY_NAMES)}")

    @classmethod
    def for_operator(cls, operator: str, runner_key: str, declared: str | None, policy: str = "trust-trend",
                     config: ElasticityConfig | None = None) -> WaitingOperator:
        return cls(operator, runner_key, declared, policy, policy_config(declared, config))

    def board(self) -> OperatorBoard:
        """This operator's shared slots in this process (allocated on first use: call it in the
        worker before a PE forks, so that its children write into the same slots)."""
        return operator_board(self.runner_key)

    def engaged(self) -> bool:
        """Whether the step runs under the scheduler now: declared, or switched on."""
        return self.declared is not None or self.board().engaged

    def run(self, step: Step, records: Sequence, seqs: Sequence[int],
            dead: list[DeadLetter]) -> tuple[list, list[int]]:
        """`step` over `records` on the operator's elastic threads: the records it emits with their
        sequence numbers, in input order; dead letters appended to `dead` in input order, exactly
        as `run_record_steps` would."""
        alone = (replace(step, waiting=None),)  # the sequential path, one record at a time
        board = self.board()
        with worker_runners().lease(self, board) as runner:
            if runner is None:  # another thread of this process runs it (never in a Spark worker)
                log.debug("operator %r: its runner is busy; this batch runs sequentially", self.operator)
                return run_record_steps(alone, records, seqs, dead)
            following: list = []
            following_seqs: list[int] = []
            for emitted, emitted_seqs, letters in runner.run(
                    (alone, record, seq) for record, seq in zip(records, seqs)):
                following.extend(emitted)
                following_seqs.extend(emitted_seqs)
                if letters:
                    dead.extend(letters)
            board.record_run(runner.policy.level, len(records))
        return following, following_seqs


def _run_one(item: tuple[tuple[Step], Any, int]) -> tuple[list, list[int], list[DeadLetter]]:
    """What a scheduler thread does with one record: the sequential path on that record alone."""
    steps, record, seq = item
    letters: list[DeadLetter] = []
    emitted, emitted_seqs = run_record_steps(steps, (record,), (seq,), letters)
    return emitted, emitted_seqs, letters


# -- the shared board of a waiting operator ---------------------------------------------------------

BOARD_FIELDS = ("engaged", "pid", "level", "throughput_per_s", "cpu_usage", "periods", "records", "updates")
(ENGAGED, PID, LEVEL, THROUGHPUT_PER_S, CPU_USAGE, PERIODS, RECORDS, UPDATES) = range(len(BOARD_FIELDS))


@dataclass(frozen=True)
class ThreadLevelReport:
    """A waiting operator's threads in one worker process, as last written to its board."""

    operator: str
    worker: str  # "host:pid" of the process that runs the operator's threads
    level: int  # thread level in force (the level the policy chose for the coming period)
    throughput_per_s: float | None  # operator calls finished per second in the last period; None: none yet
    cpu_usage: float | None  # the machine's CPU usage in the last period (0..1); None: unknown
    periods: int  # periods the policy has decided on so far
    records: int  # records run under the scheduler so far
    updates: int  # writes to the board so far: orders two reports of one worker


class OperatorBoard:
    """One waiting operator's float64 slots in an anonymous shared memory map (visible across fork).

    Written by the process that runs the operator's runner (after each period and each run);
    `engaged` is written by the worker (the driver's switch for undeclared operators) and read by
    whichever process runs the step. Single writer per slot; a reader may see a report half
    written, which only mixes two consecutive samples of the same runner.
    """

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, len(BOARD_FIELDS) * 8)  # MAP_SHARED | MAP_ANONYMOUS
        self.values = memoryview(self._map).cast("d")
        self.values[CPU_USAGE] = math.nan

    @property
    def engaged(self) -> bool:
        return self.values[ENGAGED] > 0

    @engaged.setter
    def engaged(self, on: bool) -> None:
        self.values[ENGAGED] = 1.0 if on else 0.0

    def record_period(self, sample: ThreadLevelSample) -> None:
        """The runner's `on_period`: one period's measurement and the level decided."""
        values = self.values
        values[PID] = os.getpid()
        values[LEVEL] = sample.next_level
        values[THROUGHPUT_PER_S] = sample.throughput_per_s
        values[CPU_USAGE] = math.nan if sample.cpu_usage is None else sample.cpu_usage
        values[PERIODS] += 1
        values[UPDATES] += 1

    def record_run(self, level: int, records: int) -> None:
        values = self.values
        values[PID] = os.getpid()
        values[LEVEL] = level
        values[RECORDS] += records
        values[UPDATES] += 1

    def report(self, operator: str, host: str) -> ThreadLevelReport | None:
        """The last report (None: the operator has not run under the scheduler yet)."""
        values = self.values.tolist()
        if not values[UPDATES]:
            return None
        throughput = values[THROUGHPUT_PER_S] if values[PERIODS] else None
        return ThreadLevelReport(
            operator=operator, worker=f"{host}:{int(values[PID])}", level=int(values[LEVEL]),
            throughput_per_s=throughput, cpu_usage=None if math.isnan(values[CPU_USAGE]) else values[CPU_USAGE],
            periods=int(values[PERIODS]), records=int(values[RECORDS]), updates=int(values[UPDATES]))


MAX_BOARDS = 256
_BOARDS: OrderedDict[str, OperatorBoard] = OrderedDict()
_BOARDS_LOCK = threading.Lock()


def operator_board(runner_key: str) -> OperatorBoard:
    """The board of `runner_key` in this process; a forked child finds its parent's (inherited)."""
    with _BOARDS_LOCK:
        board = _BOARDS.get(runner_key)
        if board is None:
            board = _BOARDS[runner_key] = OperatorBoard()
            while len(_BOARDS) > MAX_BOARDS:
                _BOARDS.popitem(last=False)
        else:
            _BOARDS.move_to_end(runner_key)
        return board


# -- the runners of this process ------------------------------------------------------------------


@dataclass
class _RunnerEntry:
    runner: ElasticOperatorRunner
    busy: threading.Lock = field(default_factory=threading.Lock)


class WorkerRunners:
    """The `ElasticOperatorRunner` of every waiting operator in this process, kept across Spark
    tasks and micro-batches (worker reuse keeps the process), least recently used closed beyond
    `max_runners`. Runners of another configuration of the same operator are separate.

    `clock` and `cpu_usage` are what new runners measure with (tests inject fakes with `reset`).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 cpu_usage: Callable[[], float | None] | None = None, max_runners: int = 64) -> None:
        self.clock = clock
        self.cpu_usage = cpu_usage
        self.max_runners = max_runners
        self._entries: OrderedDict[tuple, _RunnerEntry] = OrderedDict()
        self._lock = threading.Lock()
        self._inherited: list[_RunnerEntry] = []

    @contextmanager
    def lease(self, waiting: WaitingOperator, board: OperatorBoard):
        """The operator's runner for one run (created on first use); None while another thread of
        this process runs it."""
        entry = self._entry(waiting, board)
        if not entry.busy.acquire(blocking=False):
            yield None
            return
        try:
            yield entry.runner
        finally:
            entry.busy.release()

    def runner(self, waiting: WaitingOperator) -> ElasticOperatorRunner | None:
        """The operator's runner in this process, if it has one (tests, metrics)."""
        with self._lock:
            entry = self._entries.get(self._key(waiting))
        return entry.runner if entry is not None else None

    @staticmethod
    def _key(waiting: WaitingOperator) -> tuple:
        return waiting.runner_key, waiting.policy, waiting.config

    def _entry(self, waiting: WaitingOperator, board: OperatorBoard) -> _RunnerEntry:
        key = self._key(waiting)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry
            runner = ElasticOperatorRunner(
                _run_one, name=waiting.operator, policy=waiting.policy, config=waiting.config,
                clock=self.clock, cpu_usage=self.cpu_usage, on_period=board.record_period)
            entry = self._entries[key] = _RunnerEntry(runner)
            evicted = [self._entries.popitem(last=False)[1] for _ in range(len(self._entries) - self.max_runners)]
        for old in evicted:
            old.runner.close()
        return entry

    def reset(self, clock: Callable[[], float] | None = None, cpu_usage: Callable[[], float | None] | None = None) -> None:
        """Close every runner; new ones measure with `clock` and `cpu_usage` (default: real ones)."""
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
            self.clock = clock or time.monotonic
            self.cpu_usage = cpu_usage
        for entry in entries:
            entry.runner.close()

    def forget_inherited(self) -> None:
        """In a forked child: the parent's runners have no threads here, and their locks may have
        been held at the fork. Keep them referenced (never closed, never collected) and start anew."""
        self._inherited.extend(self._entries.values())
        self._entries = OrderedDict()
        self._lock = threading.Lock()


_RUNNERS = WorkerRunners()


def _after_fork_in_child() -> None:
    global _BOARDS_LOCK
    _BOARDS_LOCK = threading.Lock()  # the boards themselves are shared with the parent: keep them
    _RUNNERS.forget_inherited()


os.register_at_fork(after_in_child=_after_fork_in_child)


def worker_runners() -> WorkerRunners:
    """This process's runners."""
    return _RUNNERS


# -- what reaches the driver -------------------------------------------------------------------


class ThreadLevelTally:
    """An accumulator's value: the newest `ThreadLevelReport` per (worker, operator)."""

    def __init__(self, reports: Iterable[ThreadLevelReport] = ()) -> None:
        self.reports: dict[tuple[str, str], ThreadLevelReport] = {}
        for report in reports:
            self.add(report)

    def add(self, report: ThreadLevelReport) -> None:
        key = (report.worker, report.operator)
        known = self.reports.get(key)
        if known is None or report.updates > known.updates:
            self.reports[key] = report

    def merge(self, other: ThreadLevelTally) -> ThreadLevelTally:
        for report in other.reports.values():
            self.add(report)
        return self

    def copy(self) -> ThreadLevelTally:
        return ThreadLevelTally(self.reports.values())

    def newer_than(self, earlier: ThreadLevelTally) -> tuple[ThreadLevelReport, ...]:
        """The reports written since `earlier` (a copy taken before): the workers that ran."""
        return tuple(sorted(
            (report for key, report in self.reports.items()
             if key not in earlier.reports or report.updates > earlier.reports[key].updates),
            key=lambda report: (report.operator, report.worker)))


class ThreadLevelTallyParam:
    """Spark AccumulatorParam (duck-typed) of a `ThreadLevelTally`."""

    def zero(self, value: ThreadLevelTally) -> ThreadLevelTally:
        return ThreadLevelTally()

    def addInPlace(self, value: ThreadLevelTally, term: ThreadLevelTally) -> ThreadLevelTally:  # noqa: N802
        return value.merge(term)


@dataclass(frozen=True)
class BatchThreadLevels:
    """The waiting operators' thread levels after one micro-batch: one report per worker that
    ran a waiting operator during the batch."""

    batch_id: int
    reports: tuple[ThreadLevelReport, ...]

    def levels(self) -> dict[str, tuple[int, ...]]:
        """Operator -> the thread level of each worker that ran it."""
        levels: dict[str, tuple[int, ...]] = {}
        for report in self.reports:
            levels[report.operator] = levels.get(report.operator, ()) + (report.level,)
        return levels

    def text(self) -> str:
        """For the progress line: `enrich 8,6` (one level per worker)."""
        return " ".join(f"{operator} {','.join(map(str, levels))}" for operator, levels in self.levels().items())
