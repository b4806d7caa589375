"""The queries of an adaptive run: `QueryManager` starts the query of a plan on the run's
checkpoint (behind a `BatchGate`) and stops it at a batch boundary, the held batch abandoned;
`LiveQuery` is the query running one plan. Every query runs the plan's canonical form
(`canonical_plan`), so an in-PE change is a change of cuts inside the same PEs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from pyspark.sql import SparkSession

from fissure.program.chain import Pipeline
from fissure.model.throughput import canonical_regions
from fissure.model.types import Plan
from fissure.spark.adaptive.batch_gate import BatchGate
from fissure.config import RunnerConfig
from fissure.spark.query.observed_metrics import Publication
from fissure.spark.query.run_end import QueryRestarts
from fissure.spark.query.runner import Runner
from fissure.spark.io.sinks import DeadLetterLog
from fissure.spark.io.sources import SourceLike
from fissure.spark.state.repartition import CheckpointStatus, checkpoint_status
from fissure.program.graph import StreamGraph

log = logging.getLogger(__name__)

# Spark logs at ERROR when fissure stops a query at a batch boundary on purpose: the query's end
# (the abandoned batch's exception) and a broadcast cut short while it planned the next batch.
# Quiet while fissure stops the query itself.
STOP_LOGGERS = ("org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
                 "org.apache.spark.broadcast.TorrentBroadcast")


def canonical_plan(plan: Plan) -> Plan:
    """The plan with adjacent unreplicated regions merged: what the controller reasons about, and
    what fissure compiles here, so that an in-PE change is a change of cuts inside the same PEs."""
    return Plan(canonical_regions(plan), method=plan.method, notes=plan.notes)


@dataclass
class LiveQuery:
    """The query running one plan, and what the loop has taken from its progress reports."""

    plan: Plan
    runner: Runner
    gate: BatchGate
    delivered_through: int = -1  # newest batch id whose progress went to the loop
    measured_input: bool = False  # a batch of this query with input went to the loop
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
    checkpoint: CheckpointStatus | None = None  # the checkpoint after the stop (None: no query was running)


@dataclass(frozen=True)
class PreparedQuery:
    """A plan's query built and not started (`QueryManager.prepare`), with the gate it will run behind."""

    plan: Plan
    runner: Runner
    gate: BatchGate


class BackgroundPreparation:
    """A query being built on a thread of its own while the caller stops the current one
    (`QueryManager.prepare_in_background`). `result()` waits for it and raises what the build raised;
    `build_s` is how long the build took (set once it ended)."""

    def __init__(self, build: Callable[[], PreparedQuery], clock: Callable[[], float]) -> None:
        self._build, self._clock = build, clock
        self._prepared: PreparedQuery | None = None
        self._error: BaseException | None = None
        self.build_s: float | None = None
        self._thread = threading.Thread(target=self._run, name="fissure-prepare-query", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        started = self._clock()
        try:
            self._prepared = self._build()
        except BaseException as error:  # noqa: BLE001 - handed to the caller by result()
            self._error = error
        finally:
            self.build_s = self._clock() - started

    def wait(self) -> None:
        """Wait until the build has ended, whatever its outcome."""
        self._thread.join()

    def result(self) -> PreparedQuery:
        self.wait()
        if self._error is not None:
            raise self._error
        return self._prepared


class QueryManager:
    """Starts the query of a plan on the run's checkpoint, stops it at a batch boundary, and starts
    it again after the machine's failure as the run's restart policy allows (`restarts`)."""

    def __init__(self, pipeline: Pipeline | StreamGraph, source: SourceLike, sink, *, spark: SparkSession, checkpoint: str,
                 dead_letters, config: RunnerConfig, available_now: bool, clock: Callable[[], float],
                 runner_options: Mapping[str, object] | None = None) -> None:
        self.pipeline = pipeline
        self.source = source
        self.sink = sink
        self.spark = spark
        self.checkpoint = checkpoint
        self.dead_letters = dead_letters
        self.dead_letter_log = DeadLetterLog(kept=config.dead_letters_kept)
        self.batch_log: list = []  # every query's GraphBatch records, in order
        self.config = config
        self.available_now = available_now
        self.clock = clock
        self.runner_options = dict(runner_options or {})
        self.current: LiveQuery | None = None
        self.queries_started = 0
        self.admissions: tuple = ()  # the batch sizes the latest query's runner chose
        self.fatal: str | None = None  # why no query runs after a failed switch
        self.publication: Publication | None = None  # the latest decision, published by every query's batches
        self.restarts = QueryRestarts(config.restart_policy(), checkpoint, clock, self.runner_options.get("lock"))

    def prepare(self, plan: Plan) -> PreparedQuery:
        """The query of `plan` built, not started (Runner.prepare): nothing of it reads Spark's logs
        of the checkpoint, so it can be built while the current query stops. `start(plan, prepared)`
        starts it."""
        prepared = self._new_query(plan)
        prepared.runner.prepare(available_now=self.available_now)
        return prepared

    def prepare_in_background(self, plan: Plan) -> BackgroundPreparation:
        """`prepare(plan)` on a thread of its own, started now (a switch's restart: fissure.spark.adaptive.realizer)."""
        return BackgroundPreparation(lambda: self.prepare(plan), self.clock)

    def start(self, plan: Plan, prepared: PreparedQuery | None = None) -> LiveQuery:
        """Start the query of `plan` on the checkpoint: the one `prepare` built, or a new one."""
        plan = canonical_plan(plan)
        if prepared is None or prepared.plan != plan:
            prepared = self._new_query(plan)
        runner, gate = prepared.runner, prepared.gate
        if self.publication is not None:
            runner.publish(self.publication)
        runner.start(available_now=self.available_now)
        self.admissions = runner.admissions
        self.queries_started += 1
        self.current = LiveQuery(plan, runner, gate)
        return self.current

    def _new_query(self, plan: Plan) -> PreparedQuery:
        plan = canonical_plan(plan)
        # The loop shows the run's progress (DecisionProgress), not each query.
        config = replace(self.config, spark=self.spark, dead_letters=self.dead_letters, progress="off")
        runner = Runner(self.pipeline, self.source, self.sink, plan=plan, checkpoint=self.checkpoint, config=config,
                        **self.runner_options)
        runner.dead_letter_log = self.dead_letter_log  # one count over the run's queries
        runner.batch_log = self.batch_log
        gate = BatchGate(plan, self.clock)
        runner.wrap_batch = gate.wrap
        return PreparedQuery(plan, runner, gate)

    def restart_after_failure(self, live: LiveQuery, error: Exception) -> bool:
        """After `live` failed with `error`: when the run's restart policy allows it (True), start the
        plan in force again on the checkpoint, as a plan switch does; the failed batch is replayed.
        False: the run ends with `error`, noted when it was the machine's failure."""
        if not self.restarts.allows(error):
            return False
        self.stop_at_boundary()
        self.start(live.plan)
        return True

    def finish_input(self) -> None:
        """The end of input of a bounded run whose loop has ended (Runner.finish_input: one more
        batch, in which every window and expiry fires), its gate open. A failure of that batch is
        handled as any batch's: after the machine's failure, as the restart policy allows, the plan
        in force starts again on the checkpoint, the new available-now query replays the failed
        batch (its clock, end of input included, is in the checkpoint) and the end of input runs
        again; anything else ends the run with the error."""
        live = self.current
        while live is not None:
            try:
                live.gate.open()
                if live.query is not None and live.query.isActive:
                    live.query.awaitTermination()  # a restarted query replaying the failed batch
                live.runner.finish_input()
                return
            except Exception as error:
                if not self.restart_after_failure(live, error):
                    raise
                live = self.current

    def publish(self, publication: Publication) -> None:
        """The plan in force and the latest decision, for the batches released from now on
        (observedMetrics["fissure"]); a query started later publishes it too."""
        self.publication = publication
        if self.current is not None:
            self.current.runner.publish(publication)

    def stop_at_boundary(self) -> StopResult:
        """Stop the current query between two batches: the held batch (if any) is abandoned."""
        live, started = self.current, self.clock()
        if live is None:
            return StopResult(None, 0.0)
        live.ended_by_fissure = True
        with quiet_spark_loggers(self.spark, STOP_LOGGERS):
            live.gate.abandon()
            if live.query is not None and live.query.isActive:
                live.query.stop()
            live.runner.stop()  # the progress watcher; the checkpoint is the run's, never deleted here
        self.current = None
        status = checkpoint_status(self.spark, self.checkpoint)
        abandoned = abandoned_batch(status, live.gate)
        if abandoned is not None:
            log.info("adaptive: batch %d abandoned at the stop (it ran nothing; the next query runs its input)",
                     abandoned)
        return StopResult(abandoned, self.clock() - started, status)

    def close(self) -> None:
        if self.current is not None:
            self.stop_at_boundary()


def abandoned_batch(status: CheckpointStatus, gate: BatchGate) -> int | None:
    """The batch the stop cut off: in the offset log, not committed, and never let run by the
    gate (held at its entry, or stopped while Spark was still planning it), so it computed nothing."""
    if not status.has_uncommitted_batch or status.last_batch in gate.plan_of_batch:
        return None
    return status.last_batch


# py4j logs, with its traceback, the error a held batch raises in its foreachBatch call when
# fissure stops the query; without a logging setup Python prints that on stderr.
PY4J_CALLBACK_LOGGER = "py4j.clientserver"


class quiet_spark_loggers:
    """Set some JVM loggers' level to OFF for a while (log4j2), and py4j's callback logger in
    Python, and put them back."""

    def __init__(self, spark: SparkSession, names: Sequence[str]) -> None:
        self._spark, self._names, self._levels = spark, tuple(names), {}
        self._py4j_level = logging.NOTSET

    def __enter__(self):
        py4j = logging.getLogger(PY4J_CALLBACK_LOGGER)
        self._py4j_level = py4j.level
        py4j.setLevel(logging.CRITICAL + 1)
        try:
            jvm = self._spark._jvm
            for name in self._names:
                self._levels[name] = jvm.org.apache.logging.log4j.LogManager.getLogger(name).getLevel()
                jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, jvm.org.apache.logging.log4j.Level.OFF)
        except Exception as error:  # noqa: BLE001 - logging only
            log.debug("adaptive: cannot quiet Spark's loggers: %s", error)
        return self

    def __exit__(self, *exc_info) -> None:
        logging.getLogger(PY4J_CALLBACK_LOGGER).setLevel(self._py4j_level)
        try:
            for name, level in self._levels.items():
                self._spark._jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
        except Exception as error:  # noqa: BLE001 - logging only
            log.debug("adaptive: cannot restore Spark's loggers: %s", error)
