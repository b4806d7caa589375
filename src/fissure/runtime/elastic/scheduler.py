"""The in-worker dynamic scheduler.

`DynamicScheduler` is the dynamic threading model of Schneider & Wu, "Low-synchronization,
mostly lock-free, elastic scheduling for streaming runtimes" (IBM Streams 4.2), in Python:

- every operator input port (`Port`) has a bounded FIFO queue and the paper's SPSCEnforcer flags,
  here two non-blocking locks: one producer and one consumer at a time;
- a free list of ports (a deque: taken from the front, given back at the end, so the least
  recently served port comes first);
- scheduler threads run `schedule()` (Figure 3): find a port with work, take its consumer lock,
  run its queue empty, give it back; no work found means exponential back-off up to 10 ms;
- a push into a full queue calls `reSchedule()` (Figure 5): the pushing thread takes the consumer
  lock itself and runs up to RESCHED_LIMIT queued items, so a full queue never blocks for good;
- threads are created on demand, suspended and woken, never destroyed until shutdown; their
  suspended / stop flags are their own (the paper's thread-local values);
- `shutdown(drain=True)` waits until every queue is empty and no thread runs an item, then stops
  the threads; `shutdown(drain=False)` stops them after the item each is running.

Why it keeps order: a port has one consumer at a time, so it runs its items in queue order; its
producers push in submission order (one producer at a time). Python has the GIL, so "lock-free"
here means non-blocking try-locks and the atomic deque operations of CPython; threads pay off for
operators that wait on I/O or release the GIL (NumPy, compression, hashing), not for pure Python.

The runner that makes one operator elastic on it: fissure.runtime.elastic.runner.
"""

from __future__ import annotations


import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


log = logging.getLogger(__name__)


Handler = Callable[[Any], None]


class SchedulerStopped(RuntimeError):
    """The scheduler was shut down (or an operator failed) while an item still had to be pushed."""


class OperatorFailed(RuntimeError):
    """An operator raised on a scheduler thread; the original exception is the __cause__."""


@dataclass(frozen=True)
class SchedulerConfig:
    """Parameters of the dynamic scheduler.

    Attributes:
        queue_capacity: items a port's queue holds before a push into it calls reSchedule().
        reschedule_limit: RESCHED_LIMIT, items a pushing thread runs for a full queue before it
            tries its push again; None: a quarter of the queue's capacity, as in Streams.
        delay_threshold_s: DELAY_THRESHOLD, the longest a thread blocks when it found no work (the
            back-off starts at a hundredth of it and grows tenfold); Streams blocks up to 10 ms.
        join_timeout_s: how long shutdown waits for each thread (a stuck operator call cannot be
            interrupted; its thread is a daemon and is reported as stuck).
    """

    queue_capacity: int = 64
    reschedule_limit: int | None = None
    delay_threshold_s: float = 0.01
    join_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.queue_capacity < 1:
            raise ValueError(f"queue_capacity must be >= 1, got {self.queue_capacity}")
        if self.reschedule_limit is not None and self.reschedule_limit < 1:
            raise ValueError(f"reschedule_limit must be >= 1 or None, got {self.reschedule_limit}")
        if not self.delay_threshold_s > 0 or not self.join_timeout_s > 0:
            raise ValueError("delay_threshold_s and join_timeout_s must be > 0")


class Port:
    """An operator input port: a bounded FIFO queue guarded like the paper's SPSCEnforcer."""

    __slots__ = ("name", "handler", "capacity", "reschedule_limit", "executed", "_queue", "_producer", "_consumer")

    def __init__(self, name: str, handler: Handler, capacity: int, reschedule_limit: int) -> None:
        self.name = name
        self.handler = handler
        self.capacity = capacity
        self.reschedule_limit = reschedule_limit
        self.executed = 0  # items its handler finished; only the consumer-lock holder adds to it
        self._queue: deque[Any] = deque()
        self._producer = threading.Lock()
        self._consumer = threading.Lock()

    def __len__(self) -> int:
        return len(self._queue)

    def __repr__(self) -> str:
        return f"Port({self.name!r}, {len(self._queue)}/{self.capacity} queued)"

    def try_push(self, item: Any) -> bool:
        """SPSCEnforcer::push: False when another producer holds the port or the queue is full."""
        if not self._producer.acquire(blocking=False):
            return False
        try:
            # Only this producer appends and consumers only remove, so the length check is safe.
            if len(self._queue) >= self.capacity:
                return False
            self._queue.append(item)
            return True
        finally:
            self._producer.release()

    def try_lock_consumer(self) -> bool:
        return self._consumer.acquire(blocking=False)

    def unlock_consumer(self) -> None:
        self._consumer.release()

    def pop(self) -> tuple[bool, Any]:
        """Next item, for the holder of the consumer lock only: (False, None) when empty."""
        try:
            return True, self._queue.popleft()
        except IndexError:
            return False, None

    def discard_all(self) -> int:
        count = len(self._queue)
        self._queue.clear()
        return count


class _ThreadState:
    """One scheduler thread's own flags (the paper keeps them thread-local, for scalability)."""

    __slots__ = ("index", "thread", "suspended", "stop", "parked", "busy", "wakeup")

    def __init__(self, index: int) -> None:
        self.index = index
        self.thread: threading.Thread | None = None
        self.suspended = False  # told to suspend
        self.stop = False  # told to stop (shutdown)
        self.parked = False  # actually waiting while suspended
        self.busy = False  # may be running an item (set before taking one)
        self.wakeup = threading.Condition(threading.Lock())


@dataclass(frozen=True)
class ShutdownReport:
    """What `DynamicScheduler.shutdown` did."""

    drained: bool  # every queue was empty and no item running when the threads were stopped
    discarded_items: int  # items left in queues (only when not drained)
    threads_stopped: int
    threads_stuck: int  # threads still inside an operator call after join_timeout_s


class DynamicScheduler:
    """Ports, a free list, and an elastic set of scheduler threads that run the ports' items.

    Register every port with `add_port` before `start` (the port table is read-only afterwards, as
    in the paper). Any thread may `push`; only the controlling thread calls `set_thread_level` and
    `shutdown`.
    """

    def __init__(self, config: SchedulerConfig | None = None, name: str = "fissure-scheduler") -> None:
        self.config = config or SchedulerConfig()
        self.name = name
        self._ports: list[Port] = []
        self._free_ports: deque[Port] = deque()
        self._threads: list[_ThreadState] = []
        self._local = threading.local()  # .state: the _ThreadState of a scheduler thread
        self._level = 0
        self._started = False
        self._stopping = False  # the global fallback of isFinished() for threads we do not own
        self._error: BaseException | None = None
        self._error_port: str | None = None
        self._error_lock = threading.Lock()
        self._work_signal = threading.Condition(threading.Lock())
        self._idle_waiters = 0
        self._outside_executions = 0  # items run by threads that are not scheduler threads
        self._outside_lock = threading.Lock()

    # -- setup -------------------------------------------------------------------------------
    def add_port(self, name: str, handler: Handler, capacity: int | None = None) -> Port:
        """Register an operator input port whose items `handler` runs, one at a time, in order."""
        if self._started:
            raise RuntimeError(f"scheduler {self.name!r}: add port {name!r} before start()")
        capacity = capacity or self.config.queue_capacity
        limit = self.config.reschedule_limit or max(1, capacity // 4)
        port = Port(name, handler, capacity, limit)
        self._ports.append(port)
        self._free_ports.append(port)
        return port

    def start(self, level: int) -> None:
        if self._started:
            raise RuntimeError(f"scheduler {self.name!r} already started")
        self._started = True
        self.set_thread_level(level)

    # -- elasticity ----------------------------------------------------------------------------
    @property
    def thread_level(self) -> int:
        return self._level

    def threads_created(self) -> int:
        return len(self._threads)

    def level_in_force(self) -> int:
        """Threads not parked: the level, plus suspended threads still finishing an item."""
        return sum(1 for state in self._threads if not state.parked and not state.stop)

    def set_thread_level(self, level: int) -> None:
        """Run `level` scheduler threads: wake or create the first ones, suspend the rest."""
        if level < 1:
            raise ValueError(f"scheduler {self.name!r}: thread level must be >= 1, got {level}")
        if self._stopping:
            raise SchedulerStopped(f"scheduler {self.name!r} is shut down")
        while len(self._threads) < level:
            self._create_thread()
        for state in self._threads[:level]:
            if state.suspended:
                with state.wakeup:
                    state.suspended = False
                    state.wakeup.notify()
        for state in self._threads[level:]:
            state.suspended = True
        self._level = level
        self._notify_idle(all_threads=True)  # blocked threads notice a suspension sooner

    def suspend_all(self) -> None:
        """Park every thread (between two runs): no thread polls for work until the next level."""
        for state in self._threads:
            state.suspended = True
        self._level = 0
        self._notify_idle(all_threads=True)

    def _create_thread(self) -> None:
        state = _ThreadState(len(self._threads))
        state.thread = threading.Thread(
            target=self._thread_main, args=(state,), name=f"{self.name}-{state.index}", daemon=True
        )
        self._threads.append(state)
        state.thread.start()

    # -- the scheduler thread: schedule(), findWorkBlocking(), findWorkNonBlocking() ---------------
    def _thread_main(self, state: _ThreadState) -> None:
        self._local.state = state
        try:
            self._schedule(state)
        except SchedulerStopped:
            pass  # an operator failed (recorded for raise_if_failed) or the scheduler stopped
        finally:
            state.busy = False

    def _schedule(self, state: _ThreadState) -> None:
        """Figure 3: run a found port's queue empty, then give the port back to the free list."""
        while True:
            found = self._find_work_blocking(state)
            if found is None:
                return
            port, item = found
            try:
                self._execute(port, item)
                while not (state.suspended or state.stop):
                    has_item, item = port.pop()
                    if not has_item:
                        break
                    self._execute(port, item)
            finally:
                port.unlock_consumer()
                self._free_ports.append(port)
                state.busy = False

    def _find_work_blocking(self, state: _ThreadState) -> tuple[Port, Any] | None:
        """Figure 4, blocking part: suspend when told, else look for work, else back off."""
        delay_s = self.config.delay_threshold_s / 100
        while not state.stop:
            if state.suspended:
                self._suspend(state)
                continue
            found = self._find_work_non_blocking(state)
            if found is not None:
                return found
            self._block(delay_s)
            delay_s = min(delay_s * 10, self.config.delay_threshold_s)
        return None

    def _find_work_non_blocking(self, state: _ThreadState) -> tuple[Port, Any] | None:
        """Figure 4: walk the free list once, from the front; a port found busy or empty goes to
        the back. Gives up at the first empty pop or when the first port comes round again."""
        state.busy = True  # before taking an item, so that a drain never misses it
        first = self._pop_free_port()
        if first is None:
            state.busy = False
            return None
        found = self._take_item(first)
        if found is not None:
            return found
        self._free_ports.append(first)
        while True:
            port = self._pop_free_port()
            if port is None:
                break
            found = self._take_item(port)
            if found is not None:
                return found
            self._free_ports.append(port)
            if port is first:
                break
        state.busy = False
        return None

    def _pop_free_port(self) -> Port | None:
        try:
            return self._free_ports.popleft()
        except IndexError:
            return None

    @staticmethod
    def _take_item(port: Port) -> tuple[Port, Any] | None:
        """Exclusive consumption: the consumer lock and an item, or nothing (lock released)."""
        if not port.try_lock_consumer():
            return None
        has_item, item = port.pop()
        if has_item:
            return port, item
        port.unlock_consumer()
        return None

    def _suspend(self, state: _ThreadState) -> None:
        with state.wakeup:
            state.parked = True
            while state.suspended and not state.stop:
                state.wakeup.wait()
            state.parked = False

    def _block(self, delay_s: float) -> None:
        with self._work_signal:
            self._idle_waiters += 1
            self._work_signal.wait(delay_s)
            self._idle_waiters -= 1

    def _notify_idle(self, all_threads: bool = False) -> None:
        if self._idle_waiters:  # read without the lock: a missed wake-up costs one back-off delay
            with self._work_signal:
                if all_threads:
                    self._work_signal.notify_all()
                else:
                    self._work_signal.notify()

    # -- pushing: push(), reSchedule() --------------------------------------------------------------
    def push(self, port: Port, item: Any) -> None:
        """Figure 5: queue `item` on `port`; on a full queue run some of its items here first."""
        if self._stopping:
            raise SchedulerStopped(f"scheduler {self.name!r} is shut down: cannot push into {port.name!r}") from self._error
        if port.try_push(item):
            self._notify_idle()
            return
        self._reschedule(port, item)

    def _reschedule(self, port: Port, item: Any) -> None:
        state: _ThreadState | None = getattr(self._local, "state", None)
        while not port.try_push(item):
            if self._is_finished(state):
                raise SchedulerStopped(
                    f"scheduler {self.name!r} stopped while pushing into port {port.name!r}"
                ) from self._error
            if not port.try_lock_consumer():
                time.sleep(0)  # the port's consumer is running: let it make room
                continue
            if state is None:
                with self._outside_lock:
                    self._outside_executions += 1
            try:
                processed = 0
                while processed < port.reschedule_limit and not self._is_finished(state):
                    has_item, queued = port.pop()
                    if not has_item:
                        break
                    self._execute(port, queued)
                    processed += 1
                    if state is not None and state.suspended:
                        break
            finally:
                port.unlock_consumer()
                if state is None:
                    with self._outside_lock:
                        self._outside_executions -= 1
        self._notify_idle()

    def _is_finished(self, state: _ThreadState | None) -> bool:
        """isFinished(): the thread's own stop flag, or the global one for threads we do not own."""
        return state.stop if state is not None else self._stopping

    def _execute(self, port: Port, item: Any) -> None:
        try:
            port.handler(item)
            port.executed += 1
        except SchedulerStopped:
            raise
        except BaseException as error:  # noqa: BLE001 - recorded, the whole scheduler stops
            self._fail(port, error)
            raise SchedulerStopped(f"operator at port {port.name!r} failed: {error!r}") from error

    def _fail(self, port: Port, error: BaseException) -> None:
        with self._error_lock:
            if self._error is None:
                self._error, self._error_port = error, port.name
        log.error("scheduler %s: the handler of port %r raised %r; stopping", self.name, port.name, error)
        self._request_stop()

    def raise_if_failed(self) -> None:
        """Raise OperatorFailed (cause: the operator's exception) when a handler has raised."""
        if self._error is not None:
            raise OperatorFailed(
                f"scheduler {self.name!r}: the operator at port {self._error_port!r} raised "
                f"{type(self._error).__name__}: {self._error}"
            ) from self._error

    # -- shutdown -------------------------------------------------------------------------------
    def is_idle(self) -> bool:
        """Every queue empty and no thread (scheduler or outside) running an item."""
        return (
            all(len(port) == 0 for port in self._ports)
            and not any(state.busy for state in self._threads)
            and self._outside_executions == 0
        )

    def wait_idle(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.is_idle():
            if self._error is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.0005)
        return True

    def _request_stop(self) -> None:
        """Tell every thread to stop, one by one (their flags are their own), and wake them."""
        self._stopping = True
        for state in self._threads:
            with state.wakeup:
                state.stop = True
                state.wakeup.notify()
        self._notify_idle(all_threads=True)

    def shutdown(self, drain: bool = True, timeout_s: float | None = None) -> ShutdownReport:
        """Stop the threads; with drain, first wait (up to timeout_s) until all work is done."""
        drained = drain and self._started and self.wait_idle(timeout_s or self.config.join_timeout_s)
        self._request_stop()
        stuck = 0
        for state in self._threads:
            assert state.thread is not None
            if state.thread is threading.current_thread():
                continue
            state.thread.join(self.config.join_timeout_s)
            if state.thread.is_alive():
                stuck += 1
                log.warning("scheduler %s: thread %s still inside an operator call", self.name, state.thread.name)
        discarded = sum(port.discard_all() for port in self._ports)
        return ShutdownReport(
            drained=drained and discarded == 0,
            discarded_items=discarded,
            threads_stopped=len(self._threads) - stuck,
            threads_stuck=stuck,
        )
