"""The exact batch boundary of an adaptive run: `BatchGate` holds every micro-batch at the entry of
its `foreachBatch` call until the loop lets it run.

A micro-batch's work happens inside its `foreachBatch` call (the sink's action starts its
stages), so a batch held at the entry has computed nothing. The loop releases batch N only once
it has observed and decided on every batch before it; Spark reports a batch's progress before
the next batch begins (measured), so the loop decides on batch N-1 while batch N waits, and what
it decides takes effect exactly from batch N: new pipeline boundaries the runner sets as a Spark
local property when N's write starts (an in-PE switch, `Runner.set_boundaries`), or N abandoned
before it ran (`BatchAbandoned`: the query stops for a restart, and the next query runs N's input).

Spark mechanism with no pyspark import: it holds the foreachBatch calls of the queries the runs
start (fissure.spark.adaptive.queries, and fissure.spark.run's bounded runs).
"""

from __future__ import annotations

import threading
from collections.abc import Callable


from fissure.control.plan_change import plan_fingerprint
from fissure.model.types import Plan

POLL_S = 0.25  # how often the loop looks at a query that neither reports nor holds a batch


class BatchAbandoned(RuntimeError):
    """Raised inside `foreachBatch` to abandon a batch, before it computed anything, for a switch."""


class BatchGate:
    """One query's `foreachBatch` wrapper: holds each batch at its entry until the loop lets it run.

    Loop side: `held()`, `release(batch_id)`, `set_plan(...)` (the plan the next released batches
    run under), `abandon()` (the held batch, and any later one, raises `BatchAbandoned`), `wait()`.
    """

    def __init__(self, plan: Plan, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._held: int | None = None
        self._released: int | None = None
        self._abandoning = False
        self._open = False  # every batch runs without waiting (the loop has ended)
        self._fingerprint = plan_fingerprint(plan)
        self.first_entry_s: float | None = None  # the clock when the query's first batch arrived
        self.first_batch: int | None = None
        self.plan_of_batch: dict[int, str] = {}  # fingerprint each released batch ran under

    # -- the stream's side ----------------------------------------------------------------------
    def wrap(self, write: Callable) -> Callable:
        def gated_write(frame, batch_id: int) -> None:
            batch_id = int(batch_id)
            with self._cond:
                if self.first_entry_s is None:
                    self.first_entry_s, self.first_batch = self._clock(), batch_id
                self._held = batch_id
                self._cond.notify_all()
                while not self._abandoning and not self._open and self._released != batch_id:
                    self._cond.wait()
                self._held = None
                if self._abandoning:
                    self._cond.notify_all()
                    raise BatchAbandoned(f"fissure: batch {batch_id} abandoned before it ran; the query stops for a"
                                         f" plan switch and the next query runs its input")
                self.plan_of_batch[batch_id] = self._fingerprint
            try:
                write(frame, batch_id)
            finally:
                with self._cond:
                    self._cond.notify_all()

        return gated_write

    # -- the loop's side ------------------------------------------------------------------------
    def held(self) -> int | None:
        with self._cond:
            return self._held

    def release(self, batch_id: int) -> None:
        with self._cond:
            self._released = batch_id
            self._cond.notify_all()

    def set_plan(self, plan: Plan) -> None:
        """Batches released from now on run under `plan` (the same physical plan: in-PE switches)."""
        with self._cond:
            self._fingerprint = plan_fingerprint(plan)

    def open(self) -> None:
        """Let every batch run from now on, unheld (the end-of-input batch after the loop ended)."""
        with self._cond:
            self._open = True
            self._cond.notify_all()

    def abandon(self) -> None:
        with self._cond:
            self._abandoning = True
            self._cond.notify_all()

    def wait(self, timeout_s: float) -> None:
        with self._cond:
            self._cond.wait(timeout_s)


class BatchLimit:
    """A run that stops after `max_batches` micro-batches: wraps each query's `foreachBatch`,
    lets the first `max_batches` batches write, and holds any later one at its entry until the
    run stops (`stop()`), when it raises `BatchAbandoned`. That batch computed and wrote nothing
    and is never committed: a run started again on the checkpoint reads its input. A batch
    replayed after a restart on the checkpoint counts once.
    """

    def __init__(self, max_batches: int) -> None:
        if not isinstance(max_batches, int) or max_batches < 1:
            raise ValueError(f"max_batches must be a positive integer, got {max_batches!r}")
        self.max_batches = max_batches
        self._cond = threading.Condition()
        self._admitted: list[int] = []  # batch ids let write, in order
        self._stopping = False

    def wrap(self, write: Callable) -> Callable:
        def limited_write(frame, batch_id: int) -> None:
            batch_id = int(batch_id)
            with self._cond:
                if batch_id not in self._admitted:
                    if len(self._admitted) >= self.max_batches:
                        while not self._stopping:
                            self._cond.wait()
                        raise BatchAbandoned(f"fissure: batch {batch_id} not run: the run stops after "
                                             f"{self.max_batches} batches")
                    self._admitted.append(batch_id)
            write(frame, batch_id)

        return limited_write

    def last_batch(self) -> int | None:
        """The id of the last batch the limit lets write, once it has arrived (None: not yet)."""
        with self._cond:
            return self._admitted[-1] if len(self._admitted) >= self.max_batches else None

    def stop(self) -> None:
        """The run is stopping its query: a held batch raises instead of writing."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
