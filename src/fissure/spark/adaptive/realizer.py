"""Plan switches on a running query: `SparkPlanRealizer`, the `PlanRealizer` of the adaptive loop
on Spark (fissure.control.driver), and `SwitchRecord`, what each switch took.

- In-PE switch (same regions and replicas, other pipeline cuts): the runner sets the new pipeline
  boundaries as a Spark local property when the gate lets the next batch run; the PEs of that
  batch's tasks re-cut themselves (`Runner.set_boundaries`). No restart, nothing stops.
- Restart (other replicas or exchanges): the held batch N is abandoned (its `foreachBatch` raises
  before any action, so it computed and wrote nothing; only its offset-log entry exists; or the
  stop finds Spark still planning N, before its `foreachBatch`), the query stops, the state is
  repartitioned offline when the state partitions change (`fissure.spark.state.repartition`, which first drops
  N's entry: the repartitioner only takes a checkpoint whose last batch committed), and a query
  with the new physical plan starts on the same checkpoint. It re-runs batch N from its recorded
  offsets (or, after a repartition, reads that input in its next batch): nothing lost, and nothing
  written twice since batch N wrote nothing before. The new query is built (its Runner, the
  compiled graph, its DataFrame and foreachBatch function: `QueryManager.prepare`) on a thread
  of its own from the stop request on, so the build overlaps the stop and the repartition; its
  checks of the checkpoint and Spark's start wait for both.

A switch's cost is measured from the stop request to the moment the new query's first batch
reaches its `foreachBatch` (planned, about to compute); an in-PE switch costs what the driver
spends setting the cut (the PE forks its new processes inside the next batch's tasks, about a
millisecond each). Each switch is a `SwitchRecord` (stop, repartition, start, total seconds).

Spark mechanism with no pyspark import: it stops and starts the adaptive run's queries
(fissure.spark.adaptive.queries), for the adaptive run alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from fissure.control.plan_change import SwitchKind, plan_fingerprint
from fissure.program.chain import Pipeline
from fissure.model.types import Kind, Plan
from fissure.spark.adaptive.queries import LiveQuery, QueryManager, canonical_plan
from fissure.spark.adaptive.batch_gate import POLL_S
from fissure.spark.state.repartition import Repartitioner, repartition_state, spark_repartitioner
from fissure.model.throughput import canonical_regions
from fissure.program.graph import StreamGraph, as_graph
from fissure.compile.stages import plan_graph_stages, state_partitions_of

log = logging.getLogger(__name__)


def plan_boundaries(program: Pipeline | StreamGraph, plan: Plan) -> tuple[str, ...]:
    """The pipeline boundaries of a program's query under `plan` (compiled canonical)."""
    stages = plan_graph_stages(as_graph(program), Plan(canonical_regions(plan)))
    return tuple(sorted(node for stage in stages for node in stage.boundaries))


def same_physical_plan(first: Plan, second: Plan, program: Pipeline | StreamGraph) -> bool:
    """Whether the two plans compile to the same query up to the PEs' boundaries: the same
    canonical regions with the same replicas (so the same exchanges) and the same stages."""
    graph = as_graph(program)

    def layout(plan: Plan):
        regions = canonical_regions(plan)
        return ([(region.operators, region.replicas) for region in regions],
                [(stage.kind, stage.nodes, stage.replicas) for stage in plan_graph_stages(graph, Plan(regions))])

    return layout(first) == layout(second)


class SwitchFailed(RuntimeError):
    """A switch could not be made; the previous plan runs again (on the same checkpoint)."""


class StreamEnded(RuntimeError):
    """A switch was asked for after the stream ended: there is no query left to switch."""


@dataclass(frozen=True)
class SwitchRecord:
    """One switch the realizer made (or failed to make), timed with the run's clock.

    `total_s`: from the stop request (the apply call, in-PE) to the new query's first batch
    reaching its foreachBatch, or to the new cut being set in-PE; what the controller learns.
    A restart's `build_s` overlaps its `stop_s` and `repartition_s`; `total_s` is stop and
    repartition, any wait for the build beyond them, then `start_s`.
    """

    plan_before: str
    plan_after: str
    requested_kind: str  # the controller's classification of the change
    applied_as: str  # "in-pe", "restart" or "restart-with-state": what the realizer did
    total_s: float
    stop_s: float = 0.0
    repartition_s: float = 0.0
    start_s: float = 0.0  # new query started -> its first batch arrived
    state_partitions_before: int | None = None
    state_partitions_after: int | None = None
    abandoned_batch: int | None = None  # the batch the stop abandoned (re-run by the next query)
    first_batch: int | None = None  # the new query's first batch (None: none came in time)
    error: str | None = None  # a failed switch: why (the previous plan runs again)
    build_s: float = 0.0  # building the new query (compiled, its DataFrame), on its own thread during stop and repartition


class SparkPlanRealizer:
    """Applies plan switches to the running query (the `PlanRealizer` of fissure.control.driver).

    In-PE changes (same canonical regions, replicas and PE segments) take effect from the next
    batch without a restart; anything else stops the query at a batch boundary, repartitions the
    keyed state when the state partitions change, and starts the new plan on the same checkpoint.
    A failed restart starts the previous plan again and raises `SwitchFailed`.
    """

    def __init__(self, queries: QueryManager, *, repartition: Repartitioner = spark_repartitioner,
                 first_batch_timeout_s: float = 120.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.queries = queries
        self.repartition = repartition
        self.first_batch_timeout_s = first_batch_timeout_s
        self.clock = clock
        self.switches: list[SwitchRecord] = []

    @property
    def pipeline(self) -> Pipeline | StreamGraph:
        return self.queries.pipeline

    def apply(self, plan: Plan, kind: SwitchKind) -> float:
        live = self.queries.current
        if live is None or live.query is None or not live.query.isActive:
            raise StreamEnded("the stream has ended: no query left to switch")
        plan = canonical_plan(plan)
        if same_physical_plan(live.plan, plan, self.pipeline):
            return self._in_pe(live, plan, kind)
        return self._restart(live, plan, kind)

    def _in_pe(self, live: LiveQuery, plan: Plan, kind: SwitchKind) -> float:
        started = self.clock()
        before = plan_fingerprint(live.plan)
        live.gate.set_plan(plan)
        live.runner.set_boundaries(plan_boundaries(self.pipeline, plan))
        live.plan = plan
        cost_s = self.clock() - started
        self.switches.append(SwitchRecord(before, plan_fingerprint(plan), kind.value, SwitchKind.IN_PE.value, cost_s))
        log.info("adaptive: in-PE switch %s -> %s from the next batch (no restart)", before, plan_fingerprint(plan))
        return cost_s

    def _restart(self, live: LiveQuery, plan: Plan, kind: SwitchKind) -> float:
        started = self.clock()
        before, after = plan_fingerprint(live.plan), plan_fingerprint(plan)
        partitions_after = state_partitions_of(self.pipeline, plan, self.queries.config.default_state_partitions)
        keyed = any(self.pipeline.kind_of(name) is not Kind.STATELESS for name in self.pipeline.names)
        # The new query is built (compiled, its DataFrame and foreachBatch function) while the old
        # one stops and its state is repartitioned: nothing of the build reads Spark's logs.
        building = self.queries.prepare_in_background(plan)
        try:
            stop = self.queries.stop_at_boundary()
        except BaseException:
            building.wait()
            raise
        partitions_before = stop.checkpoint.state_partitions if stop.checkpoint is not None else None
        rescale = keyed and partitions_before is not None and partitions_before != partitions_after
        repartition_s = 0.0
        try:
            if rescale:
                outcome = repartition_state(self.queries.spark, self.queries.checkpoint, partitions_after,
                                            abandoned_batch=stop.abandoned_batch, repartition=self.repartition,
                                            clock=self.clock, status=stop.checkpoint)
                repartition_s = outcome.duration_s
            prepared = building.result()
            start_at = self.clock()
            new = self.queries.start(plan, prepared)
        except Exception as error:  # noqa: BLE001 - any failure: the previous plan runs again
            building.wait()  # the build has ended before the previous plan starts again
            reason = f"{type(error).__name__}: {error}"
            self._restart_previous(live.plan, reason)
            self.switches.append(SwitchRecord(
                before, after, kind.value, _applied_as(rescale), self.clock() - started, stop.stop_s, repartition_s,
                state_partitions_before=partitions_before, state_partitions_after=partitions_after,
                abandoned_batch=stop.abandoned_batch, error=reason, build_s=building.build_s or 0.0))
            raise SwitchFailed(f"could not switch {before} -> {after} ({reason}); {before} runs again") from error
        arrived = self._first_batch(new)
        record = SwitchRecord(
            before, after, kind.value, _applied_as(rescale), arrived - started, stop.stop_s, repartition_s,
            arrived - start_at, partitions_before, partitions_after if rescale else partitions_before,
            stop.abandoned_batch, new.gate.first_batch, build_s=building.build_s or 0.0)
        self.switches.append(record)
        log.info("adaptive: %s switch %s -> %s took %.1f s (stop %.1f, repartition %.1f, start to first batch %.1f;"
                 " the new query built in %.1f s meanwhile)", record.applied_as, before, after, record.total_s,
                 record.stop_s, record.repartition_s, record.start_s, record.build_s)
        return record.total_s

    def _restart_previous(self, plan: Plan, reason: str) -> None:
        log.warning("adaptive: switch failed (%s); restarting %s", reason, plan_fingerprint(plan))
        try:
            self.queries.start(plan)
        except Exception as error:
            self.queries.fatal = (f"the switch failed ({reason}) and the previous plan {plan_fingerprint(plan)}"
                                  f" could not be restarted either: {type(error).__name__}: {error}")
            raise RuntimeError(self.queries.fatal) from error

    def _first_batch(self, live: LiveQuery) -> float:
        """The clock when the new query's first batch arrived (or when waiting for it ended)."""
        deadline = self.clock() + self.first_batch_timeout_s
        while live.gate.first_entry_s is None and live.query.isActive and self.clock() < deadline:
            live.gate.wait(POLL_S)
        if live.gate.first_entry_s is None:
            log.info("adaptive: no batch of the new query within %.0f s (no input?)", self.first_batch_timeout_s)
            return self.clock()
        return live.gate.first_entry_s


def _applied_as(rescale: bool) -> str:
    return (SwitchKind.RESTART_WITH_STATE if rescale else SwitchKind.RESTART).value
