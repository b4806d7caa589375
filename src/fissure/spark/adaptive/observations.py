"""What the adaptive loop observes on Spark: `SparkObservations`, its `ObservationSource`, one
`BatchObservation` per micro-batch of the live query from Spark's progress reports, and
`OperatorProfiles`, the per-batch operator statistics (the profiler's where it measured them,
the pipeline's declared estimates otherwise). The source also releases every held batch once
every batch before it is observed: the loop's side of the `BatchGate`. It marks each query's
first batch with input (`BatchObservation.query_start`), which the controller never measures.

Spark mechanism with no pyspark import: it reads the progress reports of the queries that
fissure.spark.adaptive.queries starts, for the adaptive run alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from fissure.control.adaptive.observations import BatchObservation, OperatorProfile
from fissure.control.plan_change import plan_fingerprint
from fissure.model.types import OperatorStats
from fissure.profile.window import summarize
from fissure.spark.adaptive.queries import LiveQuery, QueryManager
from fissure.spark.adaptive.batch_gate import POLL_S
from fissure.spark.query.report import BatchTime
from fissure.spark.query.runner import Runner
from fissure.control.adaptive.spark_model_search import CombinedBatch, SparkModelSearch

log = logging.getLogger(__name__)


class OperatorProfiles:
    """Per-batch operator statistics for the controller: the profiler's where it measured an
    operator's cost and selectivity, the pipeline's declared estimates (hints) otherwise."""

    def __init__(self, chain: Sequence[OperatorStats], settings=None) -> None:
        self.chain = tuple(chain)
        self.settings = settings
        self._warned = False
        self.last_keys_per_batch: dict[str, float] = {}  # stateful operators' key groups, last batch
        # combined operators' records in, partials merged and the keys (and windows) they held, last batch
        self.last_partials: dict[str, tuple[float, float, float]] = {}

    def declared(self, records_in: int) -> tuple[OperatorProfile, ...]:
        return tuple(OperatorProfile(stats, max(0, records_in)) for stats in self.chain)

    def for_batch(self, runner: Runner, update, records_in: int) -> tuple[OperatorProfile, ...]:
        measured = self._measured(runner, update)
        return tuple(measured.get(stats.name) or OperatorProfile(stats, max(0, records_in)) for stats in self.chain)

    def _measured(self, runner: Runner, update) -> dict[str, OperatorProfile]:
        self.last_keys_per_batch, self.last_partials = {}, {}
        profiler = getattr(runner, "profiler", None)
        if profiler is None:
            return {}
        try:
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
            if estimate is not None and estimate.partials_per_batch:
                self.last_partials[stats.name] = (estimate.records_in, estimate.partials_per_batch,
                                                  estimate.combine_groups_per_batch or 0.0)
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
                 max_batches: int | None = None, search: SparkModelSearch | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.queries = queries
        self.profiles = profiles
        self.search = search  # told every batch's shape (records, keys)
        self.cores = cores
        self.offered_rate_per_s = offered_rate_per_s
        self.deadline_s = deadline_s
        if max_batches is not None and (not isinstance(max_batches, int) or max_batches < 1):
            raise ValueError(f"max_batches must be a positive integer, got {max_batches!r}")
        self.max_batches = max_batches  # the run ends after this many batches
        self.clock = clock
        self.batches = 0
        self.input_records = 0
        self.times: list[BatchTime] = []  # every batch observed, over the run's queries
        self.timed_out = False  # the deadline ended the run with the query still running

    def next_batch(self) -> BatchObservation | None:
        if self.max_batches is not None and self.batches >= self.max_batches:
            return None  # the next batch stays held at its gate; closing the queries abandons it
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
                    if self.queries.restart_after_failure(live, failure):
                        continue
                    raise failure
                return None
            if self.deadline_s is not None and self.clock() >= self.deadline_s:
                self.timed_out = True
                return None
            live.gate.wait(POLL_S)

    def _next_update(self, live: LiveQuery):
        newer = live.runner.progress_feed.newer_than(live.delivered_through)
        return min(newer, key=lambda update: int(update["batchId"])) if newer else None

    def _observation(self, live: LiveQuery, update) -> BatchObservation:
        batch_id = int(update["batchId"])
        live.delivered_through = batch_id
        records = int(update["numInputRows"] or 0)
        durations = update["durationMs"] or {}
        duration_s = float(durations.get("triggerExecution", 0.0)) / 1e3
        throughput = float(update["processedRowsPerSecond"] or 0.0) if records > 0 else None
        # The query's first batch with input pays its start (planning, the workers' forks, the
        # state store's load); the controller discards it, whatever restarted the query.
        query_start = records > 0 and not live.measured_input
        live.measured_input = live.measured_input or records > 0
        self.batches += 1
        self.input_records += records
        self.times.append(BatchTime(batch_id, records, duration_s))
        operators = self.profiles.for_batch(live.runner, update, records)
        if self.search is not None:
            combined = CombinedBatch(self.profiles.last_partials, self.profiles.chain, live.plan, self.cores) \
                if self.profiles.last_partials else None
            self.search.observe_batch(records, self.profiles.last_keys_per_batch, combined)
        return BatchObservation(
            batch_id=batch_id, now_s=self.clock(), records_in=records, duration_s=duration_s,
            throughput_per_s=throughput, operators=operators,
            offered_rate_per_s=self.offered_rate_per_s, backlog_records=None, cores=self.cores,
            plan_in_force=live.gate.plan_of_batch.get(batch_id, plan_fingerprint(live.plan)),
            thread_levels=live.runner.threads.levels_of(batch_id) if live.runner.threads is not None else None,
            query_start=query_start)
