"""Running a chain on Spark: `Runner` starts its query, watches it (the progress line, the
profile) and stops it. `fissure.run` (fissure.spark.run) is the one call that runs any program.

    runner = Runner(pipeline, FileSource("logs/"), FileSink("out/"), plan="planner", checkpoint="ckpt/")
    runner.start(available_now=True); runner.await_termination(); report = runner.stop()
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pyspark.sql import SparkSession

from fissure.graph import OperatorEstimate, Pipeline
from fissure.model.types import Plan
from fissure.profile.collector import ProfileCollector
from fissure.profile.log import profile_log_path
from fissure.profile.settings import ProfileSettings
from fissure.profile.window import BatchProfile, ProfileSummary, render_table
from fissure.spark.compile import CompiledQuery, WorkerProfiling, compile_plan, state_partitions_for
from fissure.spark.config import RunnerConfig
from fissure.spark.elastic import ThreadLevels
from fissure.spark.plans import describe_plan, plan_line, resolve_plan
from fissure.spark.session import QUERY_DEFAULTS, create_session, default_parallelism, is_local
from fissure.spark.sinks import BatchWriter, DeadLetterLog
from fissure.spark.sources import SourceLike, open_source
from fissure.worker.elastic_stage import BatchThreadLevels
from fissure.worker.profiling import ProfileTally, ProfileTallyParam


@dataclass(frozen=True)
class Progress:
    """The last completed micro-batch as the progress line shows it."""

    batch_id: int
    records_per_s: float  # input records processed per second in that batch
    input_records: int  # total over the run so far
    dead_letters: int  # total over the run so far
    plan: str
    threads: str = ""  # waiting operators' thread level per worker after the batch: "enrich 8,6"

    def line(self, max_chars: int | None = None) -> str:
        """The line; longer than `max_chars` (a terminal's width), its plan is abbreviated."""
        threads = f"threads {self.threads} | " if self.threads else ""
        return plan_line(f"fissure | {self.records_per_s:,.0f} records/s | batch {self.batch_id} | "
                         f"{self.input_records:,} records | {self.dead_letters} dead letters | {threads}plan ",
                         self.plan, max_chars)


def terminal_columns() -> int | None:
    """The width available to the progress line on a terminal (None: not a terminal)."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns - 1 if sys.stderr.isatty() else None
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class RunReport:
    """What a finished (or stopped) run did."""

    plan: Plan
    batches: int
    input_records: int
    dead_letters: int
    elapsed_s: float
    checkpoint: str
    profile: ProfileSummary | None = None  # the operators' statistics over the last batches
    # Per batch: the thread level of each waiting operator in each worker (docs/elastic-scheduler.md).
    thread_levels: tuple[BatchThreadLevels, ...] = ()

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
    `profile`: how operators are profiled on the live stream (None: not at all); the statistics
    are in `runner.profile_summary()`, under the progress line, and in the profile log
    (`profile_log`, default `<checkpoint>/fissure/profile.jsonl` when a checkpoint is given) that
    `fissure profile` reads. See docs/profiling.md.
    """

    # Set before start() to wrap the foreachBatch function (fissure.spark.adaptive's batch gate).
    wrap_batch: Callable[[Callable], Callable] | None = None

    def __init__(self, pipeline: Pipeline, source: SourceLike, sink, *, plan: object = "sequential",
                 checkpoint: str | None = None, spark: SparkSession | None = None,
                 dead_letters=None, estimates: Mapping[str, OperatorEstimate] | None = None,
                 config: RunnerConfig = RunnerConfig(), progress: bool | None = None,
                 query_name: str | None = None, profile: ProfileSettings | None = ProfileSettings(),
                 profile_log: str | None = None) -> None:
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
        self.profile_settings = profile if profile is not None and profile.enabled else None
        self.profile_log = profile_log or (None if self._temporary_checkpoint else str(profile_log_path(self.checkpoint)))
        self.profiler: ProfileCollector | None = None
        self.threads: ThreadLevels | None = None  # waiting operators' thread levels (start())
        self._table_lines = 0
        self._table_drawn_at = 0.0

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
        profiling = None
        if self.profile_settings is not None:
            accumulator = self.spark.sparkContext.accumulator(ProfileTally(), ProfileTallyParam())
            self.profiler = ProfileCollector(accumulator, describe_plan(self.plan, self.pipeline),
                                             self.profile_settings, self.profile_log)
            profiling = WorkerProfiling(accumulator, self.profile_settings.timed_every_batches,
                                        self.profile_settings.timed_every_records)
        self.threads = ThreadLevels(self.spark, self.pipeline, policy=self.config.thread_policy,
                                    config=self.config.thread_elasticity, profile_summary=self.profile_summary,
                                    detect=self.config.detect_waiting_operators and self.profiler is not None)
        self.compiled = compile_plan(self.pipeline, self.plan, source_frame, state_partitions=state_partitions,
                                     resource_profile_for=_resource_profiles(self.spark), profiling=profiling,
                                     threads=self.threads.worker)
        writer = BatchWriter(self.sink, self.dead_letter_sink, self.dead_letter_log,
                             list(self.compiled.result_schema.names))
        if self.profiler is not None:
            writer = self.profiler.wrap(writer)
        writer = self.threads.wrap(writer)
        if self.wrap_batch is not None:
            writer = self.wrap_batch(writer)
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
        if self.profiler is not None:
            self.profiler.flush()
        if self.show_progress and self._last_progress is not None:
            # The last batches may have ended after the watcher's last look.
            self._draw(self._last_progress.line(terminal_columns()))
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
                         checkpoint=self.checkpoint,
                         profile=self.profile_summary() if self.profiler is not None else None,
                         thread_levels=self.threads.batches if self.threads is not None else ())

    # --- profile -----------------------------------------------------------------------------
    def profile_summary(self) -> ProfileSummary | None:
        """The operators' statistics over the last `profile.window_batches` batches (None: not
        profiled). `summary.estimates()` feeds `pipeline.operator_stats(...)` and the planner."""
        return self.profiler.summary() if self.profiler is not None else None

    @property
    def batch_profiles(self) -> tuple[BatchProfile, ...]:
        """Every batch's profile so far (the newest MAX_KEPT_BATCHES)."""
        return self.profiler.batches if self.profiler is not None else ()

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
        updates = self.query.recentProgress
        if self.profiler is not None:
            self.profiler.on_progress(updates)
        for update in updates:
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
                plan=describe_plan(self.plan, self.pipeline),
                threads=self.threads.latest_text() if self.threads is not None else "",
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
                self._draw(shown.line(terminal_columns()))
            elif self.show_progress and self._last_progress is None:
                self._draw(plan_line(f"fissure | first batch running for {time.monotonic() - self._started_at:.0f} s "
                                     f"(Spark starts its Python workers) | plan ",
                                     describe_plan(self.plan, self.pipeline), terminal_columns()))
            if self.query is not None and not self.query.isActive:
                break


    def _draw(self, line: str) -> None:
        """The progress line; with profiling, the statistics table above it, redrawn in place
        every `table_interval_s` (ANSI cursor moves: the line and the table stay put)."""
        now = time.monotonic()
        table = None
        if self.profiler is not None and now - self._table_drawn_at >= self.profile_settings.table_interval_s:
            summary = self.profiler.summary()
            if summary.batches:
                kinds = {operator.name: operator.kind.value for operator in self.pipeline.operators}
                table = render_table(summary, kinds)
                self._table_drawn_at = now
        if table is None:
            print("\r" + line + "\x1b[K", end="", file=sys.stderr, flush=True)
            return
        up = f"\x1b[{self._table_lines}F" if self._table_lines else "\r"
        print(up + "\x1b[J" + table + "\n" + line, end="", file=sys.stderr, flush=True)
        self._table_lines = table.count("\n") + 1
