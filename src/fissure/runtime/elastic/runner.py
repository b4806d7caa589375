"""`ElasticOperatorRunner` wraps one such operator (stateless: one-to-one, or selective) for a
pipeline worker. It is the interface the Spark runner calls inside the Python worker:

    runner = ElasticOperatorRunner(enrich, name="enrich", policy="trust-trend")
    for result in runner.run(records):     # records: any iterable of records or Arrow batches
        ...                                 # results come in input order
    runner.timeline                         # (time, level, throughput, reason) per period

Inside, the operator gets one replica port per possible thread (as SPL's @parallel replicas under
the dynamic threading model): the caller's thread deals items round-robin into the replica
ports, the replicas push (sequence number, result) into a merge port whose handler puts results
back in input order. Every `period_s` of the injected clock spent inside run() (a period may span
several short runs) the runner measures the throughput (operator calls finished per second) and
the CPU usage,
asks the policy for the next thread level (fissure.control.thread_level) and applies it by waking
or suspending scheduler threads: a control loop (fissure.control.loop) whose collector is the
period meter and whose realizer is `SchedulerThreadLevel`. It steps once per period, never per
item. Between runs the threads park; close() ends them.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fissure.control.loop import ControlLoop, LoopTimeline
from fissure.control.thread_level.config import ElasticityConfig
from fissure.control.thread_level.decisions import PeriodMeasurement, ThreadLevelDecision, ThreadLevelPolicy
from fissure.control.thread_level.policies import StaticThreadLevel, make_policy
from fissure.runtime.elastic.scheduler import DynamicScheduler, Port, SchedulerConfig, SchedulerStopped

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class _CpuTimes:
    total: float
    idle: float  # idle + iowait


class SystemCpuUsage:
    """isCPUUsageAcceptable()'s input as in Streams: the machine's busy share from /proc/stat since
    the previous call (0..1); None where /proc/stat cannot be read (the check then passes)."""

    def __init__(self, path: str = "/proc/stat") -> None:
        self.path = path
        self._previous = self._read()

    def _read(self) -> _CpuTimes | None:
        try:
            with open(self.path) as stat:
                fields = [float(value) for value in stat.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        if len(fields) < 4:
            return None
        return _CpuTimes(total=sum(fields), idle=fields[3] + (fields[4] if len(fields) > 4 else 0.0))

    def __call__(self) -> float | None:
        current = self._read()
        previous, self._previous = self._previous, current
        if current is None or previous is None or current.total <= previous.total:
            return None
        busy = 1 - (current.idle - previous.idle) / (current.total - previous.total)
        return max(0.0, min(1.0, busy))


@dataclass(frozen=True)
class ThreadLevelSample:
    """One period of the runner's timeline: what was measured and what the policy decided."""

    time_s: float
    period_s: float  # time inside run() that the period covered
    level: int  # the level in force during the period
    level_in_force: int  # scheduler threads not parked at the end of the period
    throughput_per_s: float
    cpu_usage: float | None
    next_level: int
    reason: str


class SchedulerThreadLevel:
    """The thread-level loop's realizer: runs the scheduler at the decided level (wakes or
    suspends its threads); the seconds that took, None when the level stays."""

    __slots__ = ("scheduler", "clock")

    def __init__(self, clock: Callable[[], float]) -> None:
        self.scheduler: DynamicScheduler | None = None  # the runner's, while it has one
        self.clock = clock

    def apply(self, decision: ThreadLevelDecision) -> float | None:
        scheduler = self.scheduler
        if scheduler is None or decision.level == scheduler.thread_level:
            return None
        started = self.clock()
        scheduler.set_thread_level(decision.level)
        return self.clock() - started


@dataclass(frozen=True)
class _Envelope:
    sequence: int
    payload: Any


class _PeriodMeter:
    """The current period's time and results, counted inside run() only: a period may span
    several runs (Spark tasks shorter than a period), and the gaps between them do not count."""

    def __init__(self) -> None:
        self.carried_s = 0.0
        self.carried_results = 0
        self.segment_start_s = 0.0
        self.segment_start_results = 0

    def begin_segment(self, now_s: float, results: int) -> None:
        self.segment_start_s, self.segment_start_results = now_s, results

    def elapsed_s(self, now_s: float) -> float:
        return self.carried_s + now_s - self.segment_start_s

    def results(self, results_now: int) -> int:
        return self.carried_results + results_now - self.segment_start_results

    def end_segment(self, now_s: float, results: int) -> None:
        self.carried_s = self.elapsed_s(now_s)
        self.carried_results = self.results(results)

    def next_period(self, now_s: float, results: int) -> None:
        self.carried_s, self.carried_results = 0.0, 0
        self.begin_segment(now_s, results)


class _OrderedMerge:
    """The merge port's handler: puts replica results back in sequence order (runs exclusively)."""

    def __init__(self, selective: bool) -> None:
        self.selective = selective
        self.ready = threading.Event()
        self.reset()

    def reset(self) -> None:
        """A new run: sequence numbers start again at 0."""
        self.waiting: dict[int, Any] = {}
        self.next_sequence = 0
        self.merged = 0  # results put in order so far (read by the controlling thread)
        self.output: deque[Any] = deque()

    def __call__(self, envelope: _Envelope) -> None:
        self.waiting[envelope.sequence] = envelope.payload
        emitted = False
        while self.next_sequence in self.waiting:
            result = self.waiting.pop(self.next_sequence)
            self.next_sequence += 1
            if not (self.selective and result is None):
                self.output.append(result)
            self.merged += 1
            emitted = True
        if emitted:
            self.ready.set()


class ElasticOperatorRunner(Generic[T, R]):
    """Run one stateless operator on an elastic (or fixed) number of threads, results in order.

    Args:
        operator: the function applied to every item (a record, an Arrow batch, ...). It must be
            thread-safe: several threads call it at once. It should wait on I/O or release the GIL
            (threads do not speed up pure Python).
        name: the operator's name, used in thread names and error messages.
        selective: True if the operator returns None for an item it filters out; those Nones are
            not yielded. Otherwise every result, None included, is yielded.
        policy: "trust-trend", "elastic-operator" or a ThreadLevelPolicy object; ignored when
            static_threads is given.
        static_threads: run at this fixed thread level (no policy): for baselines and benchmarks.
        config: levels, period and policy parameters (ElasticityConfig; default 1..32 threads, 1 s).
        clock: the clock periods are measured with (seconds, monotonic); tests inject a fake one.
        cpu_usage: returns the machine's CPU usage (0..1) or None; default: /proc/stat.
        max_in_flight: items taken from the input but not yet yielded; default 2 x max_threads.
        queue_capacity: capacity of each replica port; default just enough for max_in_flight, so
            the caller's thread only runs items itself (reSchedule) when a replica falls behind.
        on_period: called with each ThreadLevelSample (metrics, timelines); must be quick.
        timeline_periods: how many of the latest periods `timeline` keeps (a worker lives long).
    """

    def __init__(
        self,
        operator: Callable[[T], R],
        *,
        name: str | None = None,
        selective: bool = False,
        policy: str | ThreadLevelPolicy = "trust-trend",
        static_threads: int | None = None,
        config: ElasticityConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        cpu_usage: Callable[[], float | None] | None = None,
        max_in_flight: int | None = None,
        queue_capacity: int | None = None,
        on_period: Callable[[ThreadLevelSample], None] | None = None,
        timeline_periods: int = 3600,
    ) -> None:
        if not callable(operator):
            raise TypeError(f"ElasticOperatorRunner needs a callable operator, got {operator!r}")
        self.operator = operator
        self.name = name or getattr(operator, "__name__", None) or type(operator).__name__
        self.selective = selective
        self.config = config or ElasticityConfig()
        if static_threads is not None and not 1 <= static_threads <= self.config.max_threads:
            raise ValueError(
                f"operator {self.name!r}: static_threads must be in 1..{self.config.max_threads} "
                f"(config.max_threads), got {static_threads}"
            )
        self.static_threads = static_threads
        if static_threads is None:
            self.policy: ThreadLevelPolicy | None = (
                make_policy(policy, self.config) if isinstance(policy, str) else policy
            )
        else:
            self.policy = None
        self.clock = clock
        self._threads = SchedulerThreadLevel(clock)
        policy_in_force = self.policy if self.policy is not None else StaticThreadLevel(static_threads)
        self._loop = ControlLoop(policy_in_force, self._threads, clock, timeline=LoopTimeline(max_steps=timeline_periods))
        self.cpu_usage = cpu_usage if cpu_usage is not None else SystemCpuUsage()
        self.replicas = self.config.max_threads
        self.max_in_flight = max_in_flight or 2 * self.replicas
        if self.max_in_flight < 1:
            raise ValueError(f"operator {self.name!r}: max_in_flight must be >= 1, got {max_in_flight}")
        self.queue_capacity = queue_capacity or max(2, math.ceil(self.max_in_flight / self.replicas))
        self.on_period = on_period
        self._timeline: collections.deque[ThreadLevelSample] = collections.deque(maxlen=timeline_periods)
        self._period = _PeriodMeter()
        self._merge = _OrderedMerge(selective)
        self._scheduler: DynamicScheduler | None = None
        self._replica_ports: list[Port] = []
        self._running = False

    @property
    def thread_level(self) -> int:
        """The thread level in force now (0 outside run())."""
        return self._scheduler.thread_level if self._scheduler is not None else 0

    @property
    def timeline(self) -> tuple[ThreadLevelSample, ...]:
        return tuple(self._timeline)

    def run(self, items: Iterable[T]) -> Iterator[R]:
        """Apply the operator to every item; yield the results in input order.

        A generator: the threads wake at the first next() and park when it ends, ready for the
        next run() (one per Spark task: the threads and the policy's data carry over). Closing it
        early (break, an exception downstream) stops the threads without draining; the next run()
        starts new ones. An exception of the operator is raised here as OperatorFailed, with the
        operator's exception as its cause.
        """
        if self._running:
            raise RuntimeError(f"operator {self.name!r}: run() is already in progress")
        self._running = True
        finished = False
        try:
            scheduler = self._scheduler or self._start_scheduler()
            self._merge.reset()
            scheduler.set_thread_level(self.static_threads or self.policy.level)
            yield from self._drive(items, scheduler)
            finished = True
        finally:
            self._running = False
            if finished:
                self._scheduler.suspend_all()
            else:
                self.close()

    def _start_scheduler(self) -> DynamicScheduler:
        """The ports: one replica per possible thread, and the merge that restores the order."""
        scheduler = DynamicScheduler(SchedulerConfig(queue_capacity=self.queue_capacity), name=f"fissure-{self.name}")
        merge_port = scheduler.add_port(f"{self.name}/merge", self._merge, capacity=self.max_in_flight)
        operator = self.operator

        def replica_handler(envelope: _Envelope) -> None:
            scheduler.push(merge_port, _Envelope(envelope.sequence, operator(envelope.payload)))

        self._replica_ports = [
            scheduler.add_port(f"{self.name}[{index}]", replica_handler) for index in range(self.replicas)
        ]
        scheduler.start(1)
        self._scheduler = self._threads.scheduler = scheduler
        # A runner dropped without close() must not leave its parked threads behind.
        self._finalizer = weakref.finalize(self, scheduler.shutdown, False)
        return scheduler

    def close(self) -> None:
        """Stop the threads (the end of the worker, or after a failure); run() may start new ones."""
        scheduler, self._scheduler = self._scheduler, None
        self._threads.scheduler = None
        if scheduler is None:
            return
        self._finalizer.detach()
        report = scheduler.shutdown(drain=False)
        if report.threads_stuck:
            log.warning("operator %r: %d thread(s) still inside the operator at shutdown", self.name, report.threads_stuck)

    def __enter__(self) -> ElasticOperatorRunner[T, R]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _drive(self, items: Iterable[T], scheduler: DynamicScheduler) -> Iterator[R]:
        """The caller's thread: deal items into the replica ports, yield merged results, and
        take a thread-level decision at the end of every period."""
        merge, ready, replica_ports = self._merge, self._merge.ready, self._replica_ports
        source = iter(items)
        fed = 0
        exhausted = False
        self._period.begin_segment(self.clock(), self._completed())
        while True:
            while merge.output:
                yield merge.output.popleft()
            scheduler.raise_if_failed()
            if exhausted and merge.merged == fed:
                self._period.end_segment(self.clock(), self._completed())
                return
            if not exhausted:
                self._maybe_decide(scheduler)
            if not exhausted and fed - merge.merged < self.max_in_flight:
                try:
                    item = next(source)
                except StopIteration:
                    exhausted = True
                    continue
                try:
                    scheduler.push(replica_ports[fed % self.replicas], _Envelope(fed, item))
                except SchedulerStopped:
                    scheduler.raise_if_failed()
                    raise
                fed += 1
                continue
            ready.clear()
            if not merge.output and merge.merged != fed:
                ready.wait(min(0.05, self.config.period_s / 4))

    def _completed(self) -> int:
        """Operator calls finished so far: counted where they finish, not where they are put back
        in order (a thread working through the replicas one by one releases them in bursts)."""
        return sum(port.executed for port in self._replica_ports)

    @property
    def loop_timeline(self) -> LoopTimeline[PeriodMeasurement, ThreadLevelDecision]:
        """The control loop's steps (fissure.control.loop), the latest `timeline_periods`."""
        return self._loop.timeline

    def _maybe_decide(self, scheduler: DynamicScheduler) -> None:
        """At the end of each period: measure, let the loop decide and apply the level."""
        now_s = self.clock()
        elapsed_s = self._period.elapsed_s(now_s)
        if elapsed_s < self.config.period_s:
            return
        completed = self._completed()
        throughput = self._period.results(completed) / elapsed_s
        self._period.next_period(now_s, completed)
        cpu = self.cpu_usage()
        level = scheduler.thread_level
        in_force = scheduler.level_in_force()
        measurement = PeriodMeasurement(
            now_s=now_s, throughput_per_s=throughput, cpu_usage=cpu,
            level_in_force=in_force if in_force != level else None,
        )
        decision = self._loop.step(measurement)[0].decision
        sample = ThreadLevelSample(
            time_s=now_s,
            period_s=elapsed_s,
            level=level,
            level_in_force=in_force,
            throughput_per_s=throughput,
            cpu_usage=cpu,
            next_level=decision.level,
            reason=decision.reason,
        )
        self._timeline.append(sample)
        if self.on_period is not None:
            self.on_period(sample)
