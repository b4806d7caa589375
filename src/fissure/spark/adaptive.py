"""Adaptive execution on Spark: the plan realizer and the adaptive loop around a running query.

    report = fissure.run(pipeline, FileSource("logs/"), FileSink("out/"), adaptive=True,
                         checkpoint="ckpt/", run_dir="run/")
    report.timeline_json, report.timeline_png, report.switches

The decisions are `fissure.control.adaptive.controller.AdaptiveController`'s (pure); `run_adaptive`
(fissure.control.driver) feeds it one `BatchObservation` per micro-batch and hands every switch
to `SparkPlanRealizer`, the only piece that touches Spark. How a batch boundary is made exact:

- Every micro-batch is held at the entry of its `foreachBatch` call (`BatchGate`), before it has
  computed anything (a batch's stages run inside that call: the sink's action starts them), until
  the loop has observed and decided on every batch before it. Spark reports a batch's progress
  before the next batch begins (measured), so the loop always decides on batch N-1 while batch N
  waits, and whatever it decides takes effect exactly from batch N.
- In-PE switch (same regions and replicas, other pipeline cuts): the gate sets the new cuts as a
  Spark local property before it lets batch N run; the PEs of N's tasks re-cut themselves
  (`fissure.spark.live_cut`). No restart, nothing stops.
- Restart (other replicas or exchanges): the held batch N is abandoned (its `foreachBatch` raises
  before any action, so it computed and wrote nothing; only its offset-log entry exists; or the
  stop finds Spark still planning N, before its `foreachBatch`), the query stops, the state is
  repartitioned offline when the state partitions change (`fissure.spark.state`, which first drops
  N's entry: the repartitioner only takes a checkpoint whose last batch committed), and a query
  with the new physical plan starts on the same checkpoint. It re-runs batch N from its recorded
  offsets (or, after a repartition, reads that input in its next batch): nothing lost, and nothing
  written twice since batch N wrote nothing before.

A switch's cost is measured from the stop request to the moment the new query's first batch
reaches its `foreachBatch` (planned, about to compute); an in-PE switch costs what the driver
spends setting the cut (the PE forks its new processes inside the next batch's tasks, about a
millisecond each). Each switch is a `SwitchRecord` (stop, repartition, start, total seconds).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

from pyspark.sql import SparkSession

from fissure.control.adaptive.config import AdaptiveConfig, SwitchCosts
from fissure.control.adaptive.controller import AdaptiveController
from fissure.control.adaptive.decisions import Decision
from fissure.control.adaptive.observations import BatchObservation, OperatorProfile
from fissure.control.adaptive.search import ScoredPlan
from fissure.control.driver import Timeline, TimelineEntry, plot_timeline, run_adaptive
from fissure.control.model_correction import OPERATORS_TERM, Correction, scale_operators
from fissure.control.plan_change import SwitchKind, plan_fingerprint
from fissure.graph import OperatorEstimate, Pipeline
from fissure.model.spark_model import SparkConstants, evaluate_spark
from fissure.model.throughput import canonical_regions
from fissure.model.types import Kind, Machine, OperatorStats, Plan
from fissure.optimize.exhaustive import SearchTooLarge
from fissure.optimize.planners import default_max_threads, plan_chain
from fissure.optimize.spark_chain import SparkModelSettings
from fissure.profile.calibration import stored_spark_model
from fissure.profile.settings import ProfileSettings
from fissure.spark.compile import state_partitions_for
from fissure.spark.config import RunnerConfig
from fissure.spark.live_cut import PE_CUTS_PROPERTY, cuts_property, pe_cuts, same_physical_plan
from fissure.spark.plans import resolve_plan
from fissure.spark.runner import RunReport, Runner
from fissure.spark.session import create_session, default_parallelism
from fissure.spark.sinks import DeadLetterLog
from fissure.spark.sources import RateSource, SourceLike
from fissure.spark.state import Repartitioner, checkpoint_status, repartition_state, spark_repartitioner

log = logging.getLogger(__name__)

# Spark logs at ERROR when fissure stops a query at a batch boundary on purpose: the query's end
# (the abandoned batch's exception) and a broadcast cut short while it planned the next batch.
# Quiet while fissure stops the query itself.
_STOP_LOGGERS = ("org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
                 "org.apache.spark.broadcast.TorrentBroadcast")
POLL_S = 0.25  # how often the loop looks at a query that neither reports nor holds a batch


class BatchAbandoned(RuntimeError):
    """Raised inside `foreachBatch` to abandon a batch, before it computed anything, for a switch."""


class SwitchFailed(RuntimeError):
    """A switch could not be made; the previous plan runs again (on the same checkpoint)."""


class StreamEnded(RuntimeError):
    """A switch was asked for after the stream ended: there is no query left to switch."""


def canonical_plan(plan: Plan) -> Plan:
    """The plan with adjacent unreplicated regions merged: what the controller reasons about, and
    what fissure compiles here, so that an in-PE change is a change of cuts inside the same PEs."""
    return Plan(canonical_regions(plan), method=plan.method, notes=plan.notes)


# -- the batch boundary ---------------------------------------------------------------------------


class BatchGate:
    """One query's `foreachBatch` wrapper: holds each batch at its entry until the loop lets it run.

    Loop side: `held()`, `release(batch_id)`, `set_plan(...)` (the cuts the next released batches
    run), `abandon()` (the held batch, and any later one, raises `BatchAbandoned`), `wait()`.
    """

    def __init__(self, spark: SparkSession, plan: Plan, pipeline: Pipeline, clock: Callable[[], float]) -> None:
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

    def set_plan(self, plan: Plan, pipeline: Pipeline) -> None:
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


# -- the running query and its replacement ----------------------------------------------------------


@dataclass
class LiveQuery:
    """The query running one plan, and what the loop has taken from its progress reports."""

    plan: Plan
    runner: Runner
    gate: BatchGate
    delivered_through: int = -1  # newest batch id whose progress went to the loop
    ended_by_fissure: bool = False

    @property
    def query(self):
        return self.runner.query

    def failure(self) -> Exception | None:
        """The query's own error (a StreamingQueryException), if it ended with one fissure did not cause."""
        if self.ended_by_fissure or self.query is None:
            return None
        return self.query.exception()


@dataclass(frozen=True)
class StopResult:
    abandoned_batch: int | None
    stop_s: float


class QueryManager:
    """Starts the query of a plan on the run's checkpoint, and stops it at a batch boundary."""

    def __init__(self, pipeline: Pipeline, source: SourceLike, sink, *, spark: SparkSession, checkpoint: str,
                 dead_letters, config: RunnerConfig, available_now: bool, clock: Callable[[], float],
                 runner_options: Mapping[str, object] | None = None) -> None:
        self.pipeline = pipeline
        self.source = source
        self.sink = sink
        self.spark = spark
        self.checkpoint = checkpoint
        self.dead_letters = dead_letters
        self.dead_letter_log = DeadLetterLog(kept=config.dead_letters_kept)
        self.config = config
        self.available_now = available_now
        self.clock = clock
        self.runner_options = dict(runner_options or {})
        self.current: LiveQuery | None = None
        self.queries_started = 0
        self.fatal: str | None = None  # why no query runs after a failed switch

    def start(self, plan: Plan) -> LiveQuery:
        plan = canonical_plan(plan)
        runner = Runner(self.pipeline, self.source, self.sink, plan=plan, checkpoint=self.checkpoint,
                        spark=self.spark, dead_letters=self.dead_letters, config=self.config, progress=False,
                        **self.runner_options)
        runner.dead_letter_log = self.dead_letter_log  # one count over the run's queries
        gate = BatchGate(self.spark, plan, self.pipeline, self.clock)
        runner.wrap_batch = gate.wrap
        runner.start(available_now=self.available_now)
        self.queries_started += 1
        self.current = LiveQuery(plan, runner, gate)
        return self.current

    def stop_at_boundary(self) -> StopResult:
        """Stop the current query between two batches: the held batch (if any) is abandoned."""
        live, started = self.current, self.clock()
        if live is None:
            return StopResult(None, 0.0)
        live.ended_by_fissure = True
        with _quiet_spark_loggers(self.spark, _STOP_LOGGERS):
            live.gate.abandon()
            if live.query is not None and live.query.isActive:
                live.query.stop()
            live.runner.stop()  # the progress watcher; the checkpoint is the run's, never deleted here
        self.current = None
        abandoned = self._abandoned_batch(live)
        if abandoned is not None:
            log.info("adaptive: batch %d abandoned at the stop (it ran nothing; the next query runs its input)",
                     abandoned)
        return StopResult(abandoned, self.clock() - started)

    def _abandoned_batch(self, live: LiveQuery) -> int | None:
        """The batch the stop cut off: in the offset log, not committed, and never let run by the
        gate (held at its entry, or stopped while Spark was still planning it), so it computed nothing."""
        status = checkpoint_status(self.spark, self.checkpoint)
        if not status.has_uncommitted_batch or status.last_batch in live.gate.plan_of_batch:
            return None
        return status.last_batch

    def close(self) -> None:
        if self.current is not None:
            self.stop_at_boundary()


class _quiet_spark_loggers:
    """Set some JVM loggers' level to OFF for a while (log4j2), and put them back."""

    def __init__(self, spark: SparkSession, names: Sequence[str]) -> None:
        self._spark, self._names, self._levels = spark, tuple(names), {}

    def __enter__(self):
        try:
            jvm = self._spark._jvm
            for name in self._names:
                self._levels[name] = jvm.org.apache.logging.log4j.LogManager.getLogger(name).getLevel()
                jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, jvm.org.apache.logging.log4j.Level.OFF)
        except Exception as error:  # noqa: BLE001 - logging only
            log.debug("adaptive: cannot quiet Spark's loggers: %s", error)
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            for name, level in self._levels.items():
                self._spark._jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
        except Exception as error:  # noqa: BLE001 - logging only
            log.debug("adaptive: cannot restore Spark's loggers: %s", error)


# -- the realizer -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SwitchRecord:
    """One switch the realizer made (or failed to make), timed with the run's clock.

    `total_s`: from the stop request (the apply call, in-PE) to the new query's first batch
    reaching its foreachBatch, or to the new cut being set in-PE; what the controller learns.
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
    def pipeline(self) -> Pipeline:
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
        live.gate.set_plan(plan, self.pipeline)
        live.plan = plan
        cost_s = self.clock() - started
        self.switches.append(SwitchRecord(before, plan_fingerprint(plan), kind.value, SwitchKind.IN_PE.value, cost_s))
        log.info("adaptive: in-PE switch %s -> %s from the next batch (no restart)", before, plan_fingerprint(plan))
        return cost_s

    def _restart(self, live: LiveQuery, plan: Plan, kind: SwitchKind) -> float:
        started = self.clock()
        before, after = plan_fingerprint(live.plan), plan_fingerprint(plan)
        stop = self.queries.stop_at_boundary()
        partitions_before = checkpoint_status(self.queries.spark, self.queries.checkpoint).state_partitions
        partitions_after = state_partitions_for(plan, self.pipeline, self.queries.config.default_state_partitions)
        keyed = any(operator.kind is not Kind.STATELESS for operator in self.pipeline.operators)
        rescale = keyed and partitions_before is not None and partitions_before != partitions_after
        repartition_s = 0.0
        try:
            if rescale:
                outcome = repartition_state(self.queries.spark, self.queries.checkpoint, partitions_after,
                                            abandoned_batch=stop.abandoned_batch, repartition=self.repartition,
                                            clock=self.clock)
                repartition_s = outcome.duration_s
            start_at = self.clock()
            new = self.queries.start(plan)
        except Exception as error:  # noqa: BLE001 - any failure: the previous plan runs again
            reason = f"{type(error).__name__}: {error}"
            self._restart_previous(live.plan, reason)
            self.switches.append(SwitchRecord(
                before, after, kind.value, _applied_as(rescale), self.clock() - started, stop.stop_s, repartition_s,
                state_partitions_before=partitions_before, state_partitions_after=partitions_after,
                abandoned_batch=stop.abandoned_batch, error=reason))
            raise SwitchFailed(f"could not switch {before} -> {after} ({reason}); {before} runs again") from error
        arrived = self._first_batch(new)
        record = SwitchRecord(
            before, after, kind.value, _applied_as(rescale), arrived - started, stop.stop_s, repartition_s,
            arrived - start_at, partitions_before, partitions_after if rescale else partitions_before,
            stop.abandoned_batch, new.gate.first_batch)
        self.switches.append(record)
        log.info("adaptive: %s switch %s -> %s took %.1f s (stop %.1f, repartition %.1f, start to first batch %.1f)",
                 record.applied_as, before, after, record.total_s, record.stop_s, record.repartition_s, record.start_s)
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


# -- observations -----------------------------------------------------------------------------------


class OperatorProfiles:
    """Per-batch operator statistics for the controller: the profiler's where it measured an
    operator's cost and selectivity, the pipeline's declared estimates (hints) otherwise."""

    def __init__(self, chain: Sequence[OperatorStats], settings=None) -> None:
        self.chain = tuple(chain)
        self.settings = settings
        self._warned = False
        self.last_keys_per_batch: dict[str, float] = {}  # stateful operators' key groups, last batch

    def declared(self, records_in: int) -> tuple[OperatorProfile, ...]:
        return tuple(OperatorProfile(stats, max(0, records_in)) for stats in self.chain)

    def for_batch(self, runner: Runner, update, records_in: int) -> tuple[OperatorProfile, ...]:
        measured = self._measured(runner, update)
        return tuple(measured.get(stats.name) or OperatorProfile(stats, max(0, records_in)) for stats in self.chain)

    def _measured(self, runner: Runner, update) -> dict[str, OperatorProfile]:
        self.last_keys_per_batch = {}
        profiler = getattr(runner, "profiler", None)
        if profiler is None:
            return {}
        try:
            from fissure.profile.window import summarize

            profiler.on_progress([update])
            batch_id = int(update["batchId"])
            batch = next((item for item in reversed(runner.batch_profiles) if item.batch_id == batch_id), None)
            if batch is None:
                return {}
            summary = summarize([batch], self.settings) if self.settings is not None else summarize([batch])
        except Exception as error:  # noqa: BLE001 - profiles are optional: the hints stand in
            if not self._warned:
                log.info("adaptive: no operator profiles (%s): planning on the declared estimates", error)
                self._warned = True
            return {}
        measured = {}
        for stats in self.chain:
            estimate = summary.operator(stats.name)
            if estimate is not None and estimate.key_groups_per_batch:
                self.last_keys_per_batch[stats.name] = estimate.key_groups_per_batch
            if estimate is None or estimate.cost_us is None or estimate.selectivity is None:
                continue
            # The tuples it processed: its cost rests on a timed sample of them (the profiler's choice).
            measured[stats.name] = OperatorProfile(
                replace(stats, cost_us=estimate.cost_us, selectivity=estimate.selectivity), estimate.records_in)
        return measured


class SparkObservations:
    """The loop's `ObservationSource`: one `BatchObservation` per micro-batch of the live query,
    from Spark's progress reports; releases each held batch once every batch before it is observed."""

    def __init__(self, queries: QueryManager, profiles: OperatorProfiles, *, cores: int,
                 offered_rate_per_s: float | None = None, deadline_s: float | None = None,
                 search: SparkModelSearch | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.queries = queries
        self.profiles = profiles
        self.search = search  # told every batch's shape (records, keys)
        self.cores = cores
        self.offered_rate_per_s = offered_rate_per_s
        self.deadline_s = deadline_s
        self.clock = clock
        self.batches = 0
        self.input_records = 0

    def next_batch(self) -> BatchObservation | None:
        while True:
            live = self.queries.current
            if live is None:
                raise RuntimeError(self.queries.fatal or "no query runs")
            held = live.gate.held()  # first: a held batch N means N-1's progress is there already
            update = self._next_update(live)
            if update is not None:
                return self._observation(live, update)
            if held is not None:
                live.gate.release(held)
                continue
            if not live.query.isActive:
                update = self._next_update(live)
                if update is not None:
                    return self._observation(live, update)
                failure = live.failure()
                if failure is not None:
                    raise failure
                return None
            if self.deadline_s is not None and self.clock() >= self.deadline_s:
                return None
            live.gate.wait(POLL_S)

    def _next_update(self, live: LiveQuery):
        newer = [update for update in live.query.recentProgress if int(update["batchId"]) > live.delivered_through]
        return min(newer, key=lambda update: int(update["batchId"])) if newer else None

    def _observation(self, live: LiveQuery, update) -> BatchObservation:
        batch_id = int(update["batchId"])
        live.delivered_through = batch_id
        records = int(update["numInputRows"] or 0)
        durations = update["durationMs"] or {}
        duration_s = float(durations.get("triggerExecution", 0.0)) / 1e3
        throughput = float(update["processedRowsPerSecond"] or 0.0) if records > 0 else None
        self.batches += 1
        self.input_records += records
        operators = self.profiles.for_batch(live.runner, update, records)
        if self.search is not None:
            self.search.observe_batch(records, self.profiles.last_keys_per_batch)
        return BatchObservation(
            batch_id=batch_id, now_s=self.clock(), records_in=records, duration_s=duration_s,
            throughput_per_s=throughput, operators=operators,
            offered_rate_per_s=self.offered_rate_per_s, backlog_records=None, cores=self.cores,
            plan_in_force=live.gate.plan_of_batch.get(batch_id, plan_fingerprint(live.plan)),
            thread_levels=live.runner.threads.levels_of(batch_id) if live.runner.threads is not None else None)


# -- the loop on Spark ------------------------------------------------------------------------------


class SparkModelSearch:
    """The controller's `PlanSearch` on Spark: candidates and predictions from the Spark model
    (fissure.model.spark_model: stages one after another, fixed costs per batch, stage, task and
    state partition), with the stored calibration's constants (`fissure calibrate`) or the
    defaults. The micro-batches' shape (records per batch, keys per batch) follows what the run
    measures (`observe_batch`), since the fixed costs per batch weigh by it.

    Candidates: the planner at every thread budget 1..M, and the pipelining-only and fission-only
    optima at M (as `fissure.control.adaptive.search.ChainPlanSearch` does with the paper's model).

    A `CorrectablePlanSearch` (fissure.control.model_correction): its terms are the operators'
    work and every Spark model constant; `with_factors` gives the same search with the constants
    (and the operators' costs) scaled by what the loop learned from the measured plans.
    """

    def __init__(self, settings: SparkModelSettings | None = None, method: str = "heuristic",
                 max_threads: int | None = None, alternatives: tuple[str, ...] = ("pipelining-only", "fission-only"),
                 window_batches: int = 20) -> None:
        self.settings = settings if settings is not None else stored_spark_model()[0]
        self.method, self.max_threads, self.alternatives = method, max_threads, alternatives
        self._records: list[int] = []
        self._keys: dict[str, list[float]] = {}
        self._window = window_batches

    def observe_batch(self, records_in: int, keys_per_batch: Mapping[str, float]) -> None:
        """One batch's size and the key groups its stateful operators saw (window of the latest)."""
        if records_in > 0:
            self._records = (self._records + [records_in])[-self._window:]
        for name, keys in keys_per_batch.items():
            self._keys[name] = (self._keys.get(name, []) + [keys])[-self._window:]

    def current_settings(self, factors: Mapping[str, float] | None = None) -> SparkModelSettings:
        """The settings for the batches seen so far; with `factors`, its constants scaled by them."""
        workload = self.settings.workload
        if self._records:
            workload = replace(workload, batch_records=max(1, round(_median(self._records))))
        if self._keys:
            workload = replace(workload, keys_per_batch={**workload.keys_per_batch,
                                                         **{name: _median(values) for name, values in self._keys.items()}})
        constants = self.settings.constants
        if factors:
            constants = constants.with_values(**{name: getattr(constants, name) * factors[name]
                                                 for name in SparkConstants.names() if name in factors})
        return replace(self.settings, workload=workload, constants=constants)

    def predict_per_s(self, operators: Sequence[OperatorStats], plan: Plan, machine: Machine,
                      factors: Mapping[str, float] | None = None) -> float:
        settings = self.current_settings(factors)
        operators = scale_operators(operators, factors or {})
        return evaluate_spark(operators, plan, machine.cores, settings.constants, settings.workload).throughput_per_s

    def candidates(self, operators: Sequence[OperatorStats], machine: Machine,
                   factors: Mapping[str, float] | None = None) -> tuple[ScoredPlan, ...]:
        settings = self.current_settings(factors)
        operators = scale_operators(operators, factors or {})
        budget = self.max_threads or default_max_threads(machine.cores)
        runs = [(self.method, threads) for threads in range(1, budget + 1)] + [(m, budget) for m in self.alternatives]
        found: dict[str, ScoredPlan] = {}
        for method, threads in runs:
            try:
                result = plan_chain(operators, machine, method, max_threads=threads, spark=settings)
            except SearchTooLarge:
                log.info("adaptive: no %s candidate, its search is too large", method)
                continue
            found.setdefault(plan_fingerprint(result.plan), ScoredPlan(result.plan, result.throughput_per_s))
        return tuple(found.values())

    # -- CorrectablePlanSearch ------------------------------------------------------------------
    def correction_terms(self) -> tuple[str, ...]:
        return (OPERATORS_TERM, *SparkConstants.names())

    def seconds_per_record(self, operators: Sequence[OperatorStats], plan: Plan, machine: Machine,
                           factors: Mapping[str, float]) -> float:
        return 1.0 / self.predict_per_s(operators, plan, machine, factors)

    def with_factors(self, factors: Mapping[str, float]) -> CorrectedSparkModelSearch:
        return CorrectedSparkModelSearch(self, dict(factors))


@dataclass(frozen=True)
class CorrectedSparkModelSearch:
    """A `SparkModelSearch` seen through the factors the loop learned (its batch shape stays live)."""

    search: SparkModelSearch
    factors: Mapping[str, float]

    def predict_per_s(self, operators: Sequence[OperatorStats], plan: Plan, machine: Machine) -> float:
        return self.search.predict_per_s(operators, plan, machine, self.factors)

    def candidates(self, operators: Sequence[OperatorStats], machine: Machine) -> tuple[ScoredPlan, ...]:
        return self.search.candidates(operators, machine, self.factors)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@dataclass(frozen=True)
class AdaptiveRunReport(RunReport):
    """A RunReport with the adaptive loop's timeline, switches and where they were written."""

    timeline: Timeline | None = None
    switches: tuple[SwitchRecord, ...] = ()
    timeline_json: str | None = None
    timeline_png: str | None = None
    queries: int = 0  # streaming queries started (1 + restarts)
    correction: str | None = None  # the model correction learned from the measured plans, described


class LiveLine:
    """`fissure run`'s live line: throughput, batch, records, plan in force, last decision."""

    def __init__(self, queries: QueryManager, observations: SparkObservations, show: bool) -> None:
        self.queries, self.observations, self.show = queries, observations, show
        self.last: str | None = None

    def __call__(self, decision: Decision, entry: TimelineEntry) -> None:
        rate = f"{entry.throughput_per_s:,.0f}" if entry.throughput_per_s is not None else "-"
        self.last = (f"fissure | {rate} records/s | batch {entry.batch_id} | {self.observations.input_records:,} records"
                     f" | {self.queries.dead_letter_log.count} dead letters | plan {decision.plan_in_force}"
                     f" | {decision.action.value}: {decision.reason}")
        if self.show:
            width = shutil.get_terminal_size((160, 20)).columns - 1
            print("\r" + self.last[:width] + "\x1b[K", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.show and self.last is not None:
            print(file=sys.stderr)


def run_adaptive_on_spark(
    pipeline: Pipeline, source: SourceLike, sink, *, plan: object = "sequential", checkpoint: str | None = None,
    spark: SparkSession | None = None, dead_letters=None, estimates: Mapping[str, OperatorEstimate] | None = None,
    config: RunnerConfig = RunnerConfig(), available_now: bool = True, timeout_s: float | None = None,
    progress: bool | None = None, profile: ProfileSettings | None = ProfileSettings(), profile_log: str | None = None,
    adaptive_config: AdaptiveConfig | None = None,
    switch_costs: SwitchCosts | None = None, run_dir: str | None = None, injections: Mapping[int, object] | None = None,
    repartition: Repartitioner = spark_repartitioner, clock: Callable[[], float] = time.monotonic,
    on_decision: Callable[[Decision, TimelineEntry], None] | None = None,
) -> AdaptiveRunReport:
    """Run `pipeline` on Spark and re-plan while it runs (see the module docstring).

    Starts from `plan` (as `fissure.run` takes it) and feeds every micro-batch to an
    `AdaptiveController` (`adaptive_config`, `switch_costs`). `injections` maps a batch id to a plan
    the loop is made to try from there (evaluated, kept or reverted like any candidate). Writes
    `timeline.json` (every decision with its reason, and every switch with its measured cost) and
    `timeline.png` into `run_dir` (default: a new temporary directory). `profile`, `profile_log`:
    the runner's profiling (None: none); operators without a measured profile are planned on their
    declared estimates. `repartition` replaces Spark's state repartitioner
    (tests). `on_decision(decision, entry)` sees every decision as it is made.
    """
    origin = clock()

    def run_clock() -> float:  # seconds since the run started: the timeline's time axis
        return clock() - origin

    session = spark if spark is not None else create_session(config)
    cores = default_parallelism(session)
    initial = canonical_plan(resolve_plan(plan, pipeline, cores, estimates))
    chain = pipeline.operator_stats(estimates)
    settings = adaptive_config or AdaptiveConfig()
    search = SparkModelSearch(method=settings.planning_method, max_threads=settings.max_threads)
    controller = AdaptiveController(chain, Machine(cores=cores), initial, adaptive_config, switch_costs, search)
    owned_checkpoint = checkpoint is None
    checkpoint = checkpoint or tempfile.mkdtemp(prefix="fissure-checkpoint-")
    run_dir = run_dir or tempfile.mkdtemp(prefix="fissure-run-")
    os.makedirs(run_dir, exist_ok=True)
    runner_options = {"profile": profile, "profile_log": profile_log}
    queries = QueryManager(pipeline, source, sink, spark=session, checkpoint=checkpoint, dead_letters=dead_letters,
                           config=config, available_now=available_now, clock=run_clock, runner_options=runner_options)
    realizer = SparkPlanRealizer(queries, repartition=repartition, clock=run_clock)
    started = run_clock()
    observations = SparkObservations(
        queries, OperatorProfiles(chain, profile), cores=cores,
        offered_rate_per_s=float(source.rows_per_second) if isinstance(source, RateSource) else None,
        deadline_s=None if available_now or timeout_s is None else started + timeout_s, search=search, clock=run_clock)
    live_line = LiveLine(queries, observations, sys.stderr.isatty() if progress is None else progress)

    def decided(decision: Decision, entry: TimelineEntry) -> None:
        live_line(decision, entry)
        if on_decision is not None:
            on_decision(decision, entry)

    planned = {int(batch): canonical_plan(resolve_plan(target, pipeline, cores, estimates))
               for batch, target in (injections or {}).items()}
    timeline = Timeline(title=f"fissure adaptive run: {pipeline.name} on Spark ({cores} cores)")
    queries.start(initial)
    try:
        run_adaptive(observations, realizer, controller, run_clock, injections=planned, on_decision=decided,
                     timeline=timeline)
    finally:
        queries.close()
        live_line.close()
    correction = controller.correction
    paths = write_timeline(timeline, realizer.switches, run_dir, initial, controller.plan, correction)
    report = AdaptiveRunReport(
        plan=controller.plan, batches=observations.batches, input_records=observations.input_records,
        dead_letters=queries.dead_letter_log.count, elapsed_s=run_clock() - started, checkpoint=checkpoint,
        timeline=timeline, switches=tuple(realizer.switches), timeline_json=paths[0], timeline_png=paths[1],
        queries=queries.queries_started, correction=correction.describe() if correction is not None else None)
    if owned_checkpoint:
        shutil.rmtree(checkpoint, ignore_errors=True)
    return report


def write_timeline(timeline: Timeline, switches: Sequence[SwitchRecord], run_dir: str, initial: Plan,
                   final: Plan, correction: Correction | None = None) -> tuple[str, str | None]:
    """`timeline.json` (decisions, switches, the model correction learned) and `timeline.png` in
    `run_dir`; the PNG is skipped, with a log line, without matplotlib."""
    json_path = os.path.join(run_dir, "timeline.json")
    document = {**timeline.to_dict(), "initial_plan": plan_fingerprint(initial), "final_plan": plan_fingerprint(final),
                "switches": [asdict(switch) for switch in switches]}
    if correction is not None:
        document["model_correction"] = {"factors": dict(correction.factors), "plans": correction.plans,
                                        "error_before": correction.error_before,
                                        "error_after": correction.error_after, "summary": correction.describe()}
    with open(json_path, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=1)
        handle.write("\n")
    png_path = os.path.join(run_dir, "timeline.png")
    try:
        plot_timeline(timeline, png_path)
    except RuntimeError as error:
        log.info("adaptive: no timeline plot: %s", error)
        png_path = None
    return json_path, png_path
