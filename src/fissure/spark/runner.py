"""Running a pipeline on Spark: `Runner` (start, watch, stop) and `run` (one call, until done).

    report = fissure.run(pipeline, FileSource("logs/"), FileSink("out/"), plan="planner",
                         checkpoint="ckpt/", available_now=True)
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql import SparkSession

from fissure.graph import OperatorEstimate, Pipeline
from fissure.model.types import Plan
from fissure.spark.compile import CompiledQuery, compile_plan, state_partitions_for
from fissure.spark.config import RunnerConfig
from fissure.spark.plans import describe_plan, resolve_plan
from fissure.spark.session import QUERY_DEFAULTS, create_session, default_parallelism, is_local
from fissure.spark.sinks import BatchWriter, DeadLetterLog
from fissure.spark.sources import SourceLike, open_source


@dataclass(frozen=True)
class Progress:
    """The last completed micro-batch as the progress line shows it."""

    batch_id: int
    records_per_s: float  # input records processed per second in that batch
    input_records: int  # total over the run so far
    dead_letters: int  # total over the run so far
    plan: str

    def line(self) -> str:
        return (f"fissure | {self.records_per_s:,.0f} records/s | batch {self.batch_id} | "
                f"{self.input_records:,} records | {self.dead_letters} dead letters | plan {self.plan}")


@dataclass(frozen=True)
class RunReport:
    """What a finished (or stopped) run did."""

    plan: Plan
    batches: int
    input_records: int
    dead_letters: int
    elapsed_s: float
    checkpoint: str

    @property
    def records_per_s(self) -> float:
        return self.input_records / self.elapsed_s if self.elapsed_s > 0 else 0.0


def ship_operator_modules(pipeline: Pipeline) -> None:
    """Pickle the operators' own modules by value, so workers need not import them.

    A function is pickled by reference to its module; a module that lives in a script's folder
    (not installed, not fissure) would be missing in the Python workers of a cluster.
    """
    from pyspark import cloudpickle

    for operator in pipeline.operators:
        for fn in (operator.fn, operator.state_factory):
            module = sys.modules.get(getattr(fn, "__module__", None) or "")
            path = getattr(module, "__file__", None) or ""
            if (module is None or module.__name__ in ("__main__", "builtins") or "site-packages" in path
                    or module.__name__.split(".")[0] in ("fissure", "pyspark") or not path):
                continue
            cloudpickle.register_pickle_by_value(module)


def _resource_profiles(session: SparkSession):
    """ResourceProfile factory for PEs of several processes where Spark honours per-stage CPUs.

    Local mode refuses TaskResourceProfiles ("only supported for Standalone, Yarn and Kubernetes
    cluster for now when dynamic allocation is disabled"); there the plan's thread budget keeps
    replicas x processes within the cores instead.
    """
    conf = session.sparkContext.getConf()
    if is_local(session) or conf.get("spark.dynamicAllocation.enabled", "false") == "true":
        return lambda processes: None
    from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

    profiles = {}

    def profile_for(processes: int):
        if processes <= 1:
            return None
        if processes not in profiles:
            profiles[processes] = ResourceProfileBuilder().require(TaskResourceRequests().cpus(processes)).build
        return profiles[processes]

    return profile_for


class Runner:
    """One pipeline, one source, one sink, one plan, one checkpoint: a Spark streaming query.

    `plan`: a Plan, "sequential" (default), "planner" (the throughput model's pick from the
    operators' estimates), a JSON plan file (`fissure plan --json` output) or a dict of one.
    `spark`: an existing session; without one fissure creates `config.master` (local[*]).
    `dead_letters`: a sink for dead letters (e.g. FileSink); they are counted and the latest kept
    in `runner.dead_letter_log` either way.
    """

    def __init__(self, pipeline: Pipeline, source: SourceLike, sink, *, plan: object = "sequential",
                 checkpoint: str | None = None, spark: SparkSession | None = None,
                 dead_letters=None, estimates: Mapping[str, OperatorEstimate] | None = None,
                 config: RunnerConfig = RunnerConfig(), progress: bool | None = None,
                 query_name: str | None = None) -> None:
        self.pipeline = pipeline
        self.source = source
        self.sink = sink
        self.config = config
        self.spark = spark if spark is not None else create_session(config)
        self.plan = resolve_plan(plan, pipeline, default_parallelism(self.spark), estimates)
        self._temporary_checkpoint = checkpoint is None
        self.checkpoint = checkpoint or tempfile.mkdtemp(prefix="fissure-checkpoint-")
        self.dead_letter_sink = dead_letters
        self.dead_letter_log = DeadLetterLog(kept=config.dead_letters_kept)
        self.show_progress = sys.stderr.isatty() if progress is None else progress
        self.query_name = query_name
        self.query = None
        self.compiled: CompiledQuery | None = None
        self._seen_batches: dict[int, int] = {}
        self._last_progress: Progress | None = None
        self._started_at = 0.0
        self._watcher: threading.Thread | None = None
        self._stop_watching = threading.Event()

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self, available_now: bool = False):
        """Compile the plan and start the query; returns the StreamingQuery."""
        ship_operator_modules(self.pipeline)
        source_frame = open_source(self.source, self.spark)
        state_partitions = state_partitions_for(self.plan, self.pipeline, self.config.default_state_partitions)
        for name, value in {**QUERY_DEFAULTS,
                            "spark.sql.streaming.stateStore.providerClass": self.config.state_store_provider,
                            # Read only when the checkpoint is new: a checkpoint keeps its own value.
                            "spark.sql.shuffle.partitions": str(state_partitions)}.items():
            self.spark.conf.set(name, value)
        self.compiled = compile_plan(self.pipeline, self.plan, source_frame, state_partitions=state_partitions,
                                     resource_profile_for=_resource_profiles(self.spark))
        writer = BatchWriter(self.sink, self.dead_letter_sink, self.dead_letter_log,
                             list(self.compiled.result_schema.names))
        stream = self.compiled.frame.writeStream.foreachBatch(writer).option("checkpointLocation", self.checkpoint)
        if self.query_name:
            stream = stream.queryName(self.query_name)
        if available_now:
            stream = stream.trigger(availableNow=True)
        elif self.config.trigger_interval_s > 0:
            stream = stream.trigger(processingTime=f"{self.config.trigger_interval_s} seconds")
        self._started_at = time.monotonic()
        self.query = stream.start()
        self._watcher = threading.Thread(target=self._watch, name="fissure-progress", daemon=True)
        self._watcher.start()
        return self.query

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Wait for the query to end (True) or the timeout to pass (False); raises the query's error."""
        self._require_started()
        if timeout_s is None:
            self.query.awaitTermination()
            return True
        return bool(self.query.awaitTermination(timeout_s))

    def process_all_available(self) -> None:
        """Block until every record available at the source now has been processed."""
        self._require_started()
        self.query.processAllAvailable()

    def stop(self) -> RunReport:
        """Stop the query (if running) and the progress line; returns the report."""
        if self.query is not None and self.query.isActive:
            self.query.stop()
        self._stop_watching.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        self._collect_progress()
        if self.show_progress and self._last_progress is not None:
            print(file=sys.stderr)
        report = self.report()
        if self._temporary_checkpoint:
            shutil.rmtree(self.checkpoint, ignore_errors=True)
        return report

    def report(self) -> RunReport:
        return RunReport(plan=self.plan, batches=len(self._seen_batches),
                         input_records=sum(self._seen_batches.values()),
                         dead_letters=self.dead_letter_log.count,
                         elapsed_s=time.monotonic() - self._started_at if self._started_at else 0.0,
                         checkpoint=self.checkpoint)

    # --- progress ----------------------------------------------------------------------------
    @property
    def progress(self) -> Progress | None:
        return self._last_progress

    def _require_started(self) -> None:
        if self.query is None:
            raise RuntimeError("the runner has not started: call start() first")

    def _collect_progress(self) -> None:
        if self.query is None:
            return
        newest = None
        for update in self.query.recentProgress:
            batch_id = int(update["batchId"])
            self._seen_batches[batch_id] = int(update.get("numInputRows") or 0)
            if newest is None or batch_id >= int(newest["batchId"]):
                newest = update
        if newest is not None:
            self._last_progress = Progress(
                batch_id=int(newest["batchId"]),
                records_per_s=float(newest.get("processedRowsPerSecond") or 0.0),
                input_records=sum(self._seen_batches.values()),
                dead_letters=self.dead_letter_log.count,
                plan=describe_plan(self.plan),
            )

    def _watch(self) -> None:
        shown = None
        while not self._stop_watching.wait(self.config.progress_interval_s):
            try:
                self._collect_progress()
            except Exception:  # noqa: BLE001 - the query ending mid-poll: nothing to show
                continue
            if self.show_progress and self._last_progress is not None and self._last_progress != shown:
                shown = self._last_progress
                print("\r" + shown.line() + "   ", end="", file=sys.stderr, flush=True)
            if self.query is not None and not self.query.isActive:
                break


def run(pipeline: Pipeline, source: SourceLike, sink, *, plan: object = "sequential",
        checkpoint: str | None = None, spark: SparkSession | None = None, dead_letters=None,
        estimates: Mapping[str, OperatorEstimate] | None = None, config: RunnerConfig = RunnerConfig(),
        available_now: bool = True, timeout_s: float | None = None, progress: bool | None = None) -> RunReport:
    """Run `pipeline` from `source` to `sink` and return the report.

    available_now=True processes what the source holds now and ends (file sources); otherwise the
    query runs until `timeout_s` passes (or forever without it).
    """
    runner = Runner(pipeline, source, sink, plan=plan, checkpoint=checkpoint, spark=spark,
                    dead_letters=dead_letters, estimates=estimates, config=config, progress=progress)
    runner.start(available_now=available_now)
    try:
        runner.await_termination(timeout_s)
    finally:
        report = runner.stop()
    return report
