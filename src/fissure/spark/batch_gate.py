"""The exact batch boundary of an adaptive run: `BatchGate` holds every micro-batch at the entry of
its `foreachBatch` call until the loop lets it run.

A micro-batch's work happens inside its `foreachBatch` call (the sink's action starts its
stages), so a batch held at the entry has computed nothing. The loop releases batch N only once
it has observed and decided on every batch before it; Spark reports a batch's progress before
the next batch begins (measured), so the loop decides on batch N-1 while batch N waits, and what
it decides takes effect exactly from batch N: new PE cuts as a Spark local property the gate sets
before it lets N run (an in-PE switch, `fissure.spark.live_cut`), or N abandoned before it ran
(`BatchAbandoned`: the query stops for a restart, and the next query runs N's input).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pyspark.sql import SparkSession

from fissure.control.plan_change import plan_fingerprint
from fissure.graph import Pipeline
from fissure.model.types import Plan
from fissure.spark.live_cut import PE_CUTS_PROPERTY, cuts_property, pe_cuts
from fissure.streamgraph import StreamGraph

POLL_S = 0.25  # how often the loop looks at a query that neither reports nor holds a batch


class BatchAbandoned(RuntimeError):
    """Raised inside `foreachBatch` to abandon a batch, before it computed anything, for a switch."""


class BatchGate:
    """One query's `foreachBatch` wrapper: holds each batch at its entry until the loop lets it run.

    Loop side: `held()`, `release(batch_id)`, `set_plan(...)` (the cuts the next released batches
    run), `abandon()` (the held batch, and any later one, raises `BatchAbandoned`), `wait()`.
    """

    def __init__(self, spark: SparkSession, plan: Plan, pipeline: Pipeline | StreamGraph, clock: Callable[[], float]) -> None:
        self._spark = spark
        self._clock = clock
        self._cond = threading.Condition()
        self._held: int | None = None
        self._released: int | None = None
        self._abandoning = False
        self._fingerprint, self._cuts = "", ""
        self.set_plan(plan, pipeline)
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
                while not self._abandoning and self._released != batch_id:
                    self._cond.wait()
                self._held = None
                if self._abandoning:
                    self._cond.notify_all()
                    raise BatchAbandoned(f"fissure: batch {batch_id} abandoned before it ran; the query stops for a"
                                         f" plan switch and the next query runs its input")
                self.plan_of_batch[batch_id] = self._fingerprint
                cuts = self._cuts
            self._spark.sparkContext.setLocalProperty(PE_CUTS_PROPERTY, cuts)
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

    def set_plan(self, plan: Plan, pipeline: Pipeline | StreamGraph) -> None:
        """Batches released from now on run `plan`'s cuts (the same physical plan: in-PE switches)."""
        cuts = cuts_property(pe_cuts(plan, pipeline))
        with self._cond:
            self._fingerprint, self._cuts = plan_fingerprint(plan), cuts

    def abandon(self) -> None:
        with self._cond:
            self._abandoning = True
            self._cond.notify_all()

    def wait(self, timeout_s: float) -> None:
        with self._cond:
            self._cond.wait(timeout_s)
