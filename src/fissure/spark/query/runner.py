"""Running a program on Spark: `Runner` starts its query, watches it (the progress line, the
profile, the waiting operators' threads) and stops it. `fissure.run` (fissure.spark.run) is the
one call that runs any program to its end.

    runner = Runner(pipeline, FileSource("logs/"), FileSink("out/"), plan="planner", checkpoint="ckpt/")
    runner = Runner(graph, {"lines": FileSource("logs/")}, {"alerts": FileSink("out/alerts")}, plan="planner",
                    config=RunnerConfig(spark=spark, progress="off"))
    runner.start(available_now=True); runner.await_termination(); report = runner.stop()

Every program, a chain (a Pipeline) or any other graph, compiles to one query over envelopes
(fissure.spark.query.compile_graph). One foreachBatch function writes the micro-batch's dead letters
and every sink, each keyed by the batch id: a batch replayed after a crash overwrites what it
wrote, so with idempotent sinks (FileSink, MemorySink) every sink holds each result exactly once
across restarts from the checkpoint.

The pipeline boundaries (operators whose input port starts a new process of their PE) are the
plan's, or `config.boundaries`, and change between micro-batches with `set_boundaries` (a Spark local
property the next batch's tasks read: no restart).

This module holds the Runner's life (start, end of input, stop, its report); its parts are mixed
in from beside it: the file sources prepared before the query starts (source_preparation), the
foreachBatch function (batch_writing), the driver's watch over the query (watching); what it hands
Spark (binding) and what it reports (report).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable


from fissure.config import RunnerConfig
from fissure.lifecycle.progress import ProgressState, check_progress_mode
from fissure.lifecycle.watchdog import Stall
from fissure.model.state_buckets import new_checkpoint_buckets
from fissure.profile.collector import ProfileCollector
from fissure.profile.log import profile_log_path
from fissure.profile.settings import ProfileSettings
from fissure.profile.window import BatchProfile, ProfileSummary
from fissure.program.chain import Pipeline
from fissure.program.fingerprint import program_fingerprint
from fissure.program.graph import StreamGraph, as_graph
from fissure.program.operators import PipelineError
from fissure.spark.io.batch_admission import SourceAdmission
from fissure.spark.checkpoint.files import open_store
from fissure.spark.checkpoint.guard import StartGuard
from fissure.spark.checkpoint.state_layout import checkpoint_grouping_keys, record_grouping_keys
from fissure.spark.checkpoint.lock import CheckpointLock
from fissure.spark.query.compile_graph import CompiledGraph, compile_graph
from fissure.spark.query.elastic import ThreadLevels
from fissure.spark.io.file_staging import FileStager, StagingThread, poll_interval
from fissure.spark.query.observed_metrics import Publication, observe_run
from fissure.plan.plans import describe_plan, resolve_plan
from fissure.spark.query.batch_writing import BatchWriting
from fissure.spark.query.binding import (DetachableBatchFunction, bind_sinks, bind_sources, check_serializable,
                                         resource_profiles, ship_operator_modules)
from fissure.spark.query.report import BatchListeners, BatchTime, GraphBatch, RunReport
from fissure.spark.query.source_preparation import SourcePreparation
from fissure.spark.query.progress_feed import ProgressFeed
from fissure.spark.query.watching import QueryWatching
from fissure.spark.session.create import QUERY_DEFAULTS, create_session, default_parallelism
from fissure.spark.io.sinks import DeadLetterLog
from fissure.spark.io.scan_split import apply_scan_split
from fissure.spark.io.sources import FileSource, check_before_spark, default_file_system, open_source
from fissure.spark.query.stages import WorkerProfiling
from fissure.spark.state.repartition import RepartitionRecovery, delete_checkpoint, recover_unfinished_repartition
from fissure.spark.query.time_log import TimeLog, end_of_input_folder, prepare_end_of_input_folder, write_end_of_input_marker
from fissure.compile.stages import plan_graph_stages, state_partitions_of
from fissure.runtime.profiling.profiler import ProfileTally, ProfileTallyParam
from fissure.runtime.operators.time_tally import TimeTally, TimeTallyParam

log = logging.getLogger(__name__)


class Runner(SourcePreparation, BatchWriting, QueryWatching):
    """One program, its sources and sinks, one plan, one checkpoint: a Spark streaming query.

    `program`: a Pipeline (then `source` and `sink` are one object each) or a StreamGraph (then
    dicts by name, or one object where it has one source or sink).

    `plan`: a Plan, "sequential" (default), "planner" (the throughput model's pick from the
    operators' estimates), a JSON plan file (`fissure plan --json` output) or a dict of one.
    `checkpoint`: where the query keeps its progress and state (None: a temporary one).
    `config` (RunnerConfig): every setting of the run, the one home of each, as `fissure.run`
    takes it: the session (`spark`; None: fissure creates `master`), `dead_letters`, `estimates`,
    `progress`, `query_name`, `profiling` and `profile_log` (the statistics are in
    `runner.profile_summary()`, under the progress line, and in the profile log, default
    `<checkpoint>/fissure/profile.jsonl` when a checkpoint is given; docs/profiling.md),
    `boundaries` and `state_partitions` (a graph's instead of the plan's). With
    `replanning="autopipeline"` the runner counts a graph's PEs node by node for the
    autopipelining loop (a chain then runs as its graph).

    The other arguments are not settings:
    `lock`: not a setting but an object the caller holds: the checkpoint's lock when it holds it
    for several queries (the adaptive loop, `fissure.run`'s restarts); without one, start()
    takes it and stop() releases it.
    `input_records`: not a setting but a measured fact: the whole input, when the run reads it
    once (`fissure.run` with available_now): the planner plans for one batch of it when that is
    smaller than the batch it assumes (fissure.plan.plans.planner_plan).
    """

    # Set before start() to wrap the foreachBatch function (fissure.spark.adaptive.batch_gate's gate).
    wrap_batch: Callable[[Callable], Callable] | None = None

    def __init__(self, program: Pipeline | StreamGraph, source, sink, *, plan: object = "sequential",
                 checkpoint: str | None = None, config: RunnerConfig = RunnerConfig(),
                 lock: CheckpointLock | None = None, input_records: float | None = None) -> None:
        self.graph = as_graph(program)  # the one model of the program: what plans name, what compiles
        self.sources = bind_sources(self.graph, source)
        self.sinks = bind_sinks(self.graph, sink)
        # A missing path or field fails now, not after Spark's start.
        check_before_spark(self.graph, self.sources, default_file_system(config.spark, config.master, config.spark_conf))
        self.config = config
        self.spark = config.spark if config.spark is not None else create_session(config)
        self.estimates = config.estimates
        self.plan = resolve_plan(plan, self.graph, default_parallelism(self.spark), self.estimates, input_records)
        self.admissions: tuple[SourceAdmission, ...] = ()  # batch sizes chosen at start()
        self.stagers: list[FileStager] = []  # file sources read through staging (fissure.spark.io.file_staging)
        self._staging: StagingThread | None = None
        self._staging_error: BaseException | None = None
        self.missing_files: list[str] = []
        boundaries = config.boundaries
        if boundaries is None:
            boundaries = [node for stage in plan_graph_stages(self.graph, self.plan) for node in stage.boundaries]
        self.boundaries = tuple(sorted(set(boundaries)))
        self.state_partitions = config.state_partitions or state_partitions_of(
            self.graph, self.plan, max(1, config.default_state_partitions))
        self.profile_pieces = config.replanning == "autopipeline"  # count node by node for the autopipelining loop
        # how the graph PEs count (fissure.spark.query.stages.PIECE_COUNTING_PROPERTY): the loop sets it
        self.piece_counting = "nodes" if self.profile_pieces else "off"
        self.accumulator = None  # the run's profile accumulator (a ProfileTally), when anything is counted
        self.listeners = BatchListeners()
        self.batch_log: list[GraphBatch] = []
        self._lock = threading.Lock()
        self._temporary_checkpoint = checkpoint is None
        self.checkpoint = checkpoint or tempfile.mkdtemp(prefix="fissure-checkpoint-")
        self.lock = lock  # the checkpoint's lock while the query runs
        self._owns_lock = lock is None
        self.dead_letter_sink = config.dead_letters
        self.dead_letter_log = DeadLetterLog(kept=config.dead_letters_kept)
        self.progress_mode = check_progress_mode(config.progress)
        self.progress_output = self._new_progress_output()
        self.query_name = config.query_name
        self.query = None
        self.progress_feed = ProgressFeed(lambda: self.query)
        self._batch_function: DetachableBatchFunction | None = None
        self.recovery: RepartitionRecovery | None = None  # an unfinished repartition start() finished
        self.compiled: CompiledGraph | None = None
        self._seen_batches: dict[int, int] = {}
        self._batch_seconds: dict[int, float] = {}
        self._last_progress: ProgressState | None = None
        self._started_at = 0.0
        self._watcher: threading.Thread | None = None
        self._stop_watching = threading.Event()
        profile = config.profiling
        self.profile_settings = profile if profile is not None and profile.enabled else None
        self.profile_log = config.profile_log or (None if self._temporary_checkpoint else str(profile_log_path(self.checkpoint)))
        self.profiler: ProfileCollector | None = None
        self.threads: ThreadLevels | None = None  # waiting operators' thread levels (start())
        # The plan and latest decision each batch publishes in observedMetrics["fissure"].
        self.publication = Publication(plan=describe_plan(self.plan, self.graph))
        self._table_drawn_at = 0.0
        self._advised_waiting: set[str] = set()  # operators told they wait undeclared
        # The watchdog: the batch running now (id, monotonic and wall-clock start), its reports.
        self.stall_policy = config.stall_policy()
        self.stalls: list[Stall] = []
        self._running_batch: tuple[int, float, float] | None = None
        self._stall_reported_s: float | None = None
        self._stall_text = ""
        # Time (fissure.spark.query.time_log): whether the program has time-aware operators, the
        # accumulator the stages report into, the batch clocks in the checkpoint.
        self.time_aware = self.graph.time_aware
        self.time_tally = None
        self.time_log: TimeLog | None = None
        self._end_of_input_next = False  # the next batch without a clock is the end of input
        # The first batch id of the end-of-input query (finish_input), None before it: its batches
        # are a query's start, not the run's steady state (RunReport.summary leaves them out).
        self._end_of_input_from: int | None = None
        self._stream_frame = None  # the observed envelope frame the query writes (started again at end of input)
        self.state_keys_peak: int | None = None
        self.late_records = 0
        self.watermark: float | None = None

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self, available_now: bool = False):
        """Compile the plan and start the query; returns the StreamingQuery.

        First the checkpoint's lock (fissure.spark.checkpoint.lock: another run holding it is
        CheckpointLocked), then the checks of fissure.spark.checkpoint.guard: whole logs, and the
        program's stateful operators against the checkpoint's record (ProgramChanged), before
        Spark starts the query. A checkpoint whose newest batch is a state repartition a dead
        process left unfinished is recovered then (`fissure.spark.state.repartition.recover_unfinished_repartition`:
        `self.recovery`). When starting fails, only what this start wrote into a checkpoint that
        held no stream is removed (`StartGuard.undo`), and a temporary checkpoint of the runner's.
        A query built beforehand (`prepare`) is started as built."""
        if self.lock is None:
            self.lock = CheckpointLock.acquire(open_store(self.spark, self.checkpoint), self.graph.name,
                                               spark=self.spark, lease_s=self.config.checkpoint_lease_s)
        self.lock.on_lost.append(self._on_lock_lost)
        try:
            self.lock.check_held()
            guard = StartGuard.open(self.lock.store)
        except BaseException:
            self._let_go_of_lock()
            raise
        try:
            guard.check_logs()
            return self._start(available_now, guard)
        except BaseException:
            if self.query is not None and self.query.isActive:
                self.query.stop()
            if not self._temporary_checkpoint:
                guard.undo()
            self._let_go_of_lock()
            if self._temporary_checkpoint:
                delete_checkpoint(self.spark, self.checkpoint)
            raise

    def _on_lock_lost(self, reason: str) -> None:
        if self.query is not None and self.query.isActive:
            self.query.stop()

    def _let_go_of_lock(self) -> None:
        """Stop listening to the lock; release it when this runner took it."""
        if self.lock is None:
            return
        if self._on_lock_lost in self.lock.on_lost:
            self.lock.on_lost.remove(self._on_lock_lost)
        if self._owns_lock:
            self.lock.release()
            self.lock = None

    def prepare(self, available_now: bool = False) -> bool:
        """Build the query start() would start (the plan compiled, its DataFrame and foreachBatch
        function, the sources opened and sized) without reading Spark's logs of the checkpoint or
        starting anything, so that it can be built while another query of the same run still runs
        or stops on the checkpoint: the adaptive loop's restart builds the next plan's query while
        the previous one stops and its state is repartitioned (fissure.spark.adaptive.realizer).
        start(available_now) then checks the checkpoint and starts the query as built.

        Only with the caller's `lock` and on a checkpoint that already holds a stream; elsewhere
        (False) nothing is built and start() builds it after its checks, as always, so that a
        failed first start removes exactly what it wrote (`StartGuard.undo`)."""
        if self.lock is None:
            return False
        self.lock.check_held()
        if StartGuard.open(self.lock.store).fresh:
            return False
        self._build(available_now, fresh=False)
        self._built_for = available_now
        return True

    _built_for: bool | None = None  # the available_now a prepared query was built for (None: none)

    def _start(self, available_now: bool, guard: StartGuard):
        if self._built_for != available_now or guard.fresh:
            self._build(available_now, guard.fresh)
        self._built_for = None
        return self._launch(available_now, guard)

    def _build(self, available_now: bool, fresh: bool) -> None:
        """Everything before the checkpoint's checks and Spark's start: nothing here reads Spark's
        logs of the checkpoint, sets the session's conf or starts a thread (`prepare`)."""
        ship_operator_modules(self.graph)
        check_serializable(self.graph)
        profiling = None
        if self.profile_settings is not None or self.profile_pieces:
            self.accumulator = self.spark.sparkContext.accumulator(ProfileTally(), ProfileTallyParam())
            settings = self.profile_settings or ProfileSettings()
            profiling = WorkerProfiling(self.accumulator, settings.timed_every_batches, settings.timed_every_records,
                                        operators=self.profile_settings is not None, pieces=self.profile_pieces)
        if self.profile_settings is not None:
            self.profiler = ProfileCollector(self.accumulator, describe_plan(self.plan, self.graph),
                                             self.profile_settings, self.profile_log)
        self.threads = ThreadLevels(self.spark, self.graph, policy=self.config.thread_policy,
                                    config=self.config.thread_elasticity, profile_summary=self.profile_summary,
                                    detect=self.config.detect_waiting_operators and self.profiler is not None,
                                    run=self.checkpoint)
        sources = self.sources
        if self.config.batch_size == "auto":
            sources, self.admissions = self._sized_sources(self.lock.store, available_now)
        sources = self._staged_sources(sources, fresh, available_now)
        frames = {name: open_source(sources[name], self.spark) for name in self.graph.sources if name in sources}
        # a file source: its scan splits each micro-batch over the cores (fissure.spark.io.scan_split)
        scan_spreads = isinstance(sources.get(self.graph.sources[0]), FileSource)
        self.time_tally = self.spark.sparkContext.accumulator(TimeTally(), TimeTallyParam())
        control_frame = None
        if self.time_aware:
            self.time_log = TimeLog(self.lock.store)
            prepare_end_of_input_folder(self.lock.store)
            control_frame = self.spark.readStream.text(end_of_input_folder(self.checkpoint))
        line_formats = {name: source.line_format() for name, source in sources.items()
                        if callable(getattr(source, "line_format", None))}
        self.grouping_keys = checkpoint_grouping_keys(self.lock.store, fresh,
                                                      self.config.state_buckets or new_checkpoint_buckets(self.cores))
        self.compiled = compile_graph(self.graph, frames, plan=self.plan, boundaries=self.boundaries,
                                      state_partitions=self.state_partitions, threads=self.threads.worker,
                                      profiling=profiling, resource_profile_for=resource_profiles(self.spark),
                                      line_formats=line_formats, state_access=self.config.state_access(),
                                      control_frame=control_frame, time_tally=self.time_tally,
                                      combine=self.config.combine_aggregates, grouping_keys=self.grouping_keys,
                                      scan_spreads=scan_spreads)
        frame = observe_run(self.compiled.frame, [operator.name for operator in self.graph.operators],
                            counted=self.profile_settings is not None)
        writer = self._write_batch
        if self.profiler is not None:
            writer = self.profiler.wrap(writer)
        writer = self._watched(self.threads.wrap(writer))  # inside the gate: a held batch is not a stuck one
        if self.wrap_batch is not None:
            writer = self.wrap_batch(writer)
        self._batch_function = DetachableBatchFunction(writer)
        self._stream_frame = frame

    def _launch(self, available_now: bool, guard: StartGuard):
        """The built query started: the session's query settings, the program checked against the
        checkpoint's record, an unfinished state repartition finished, then Spark's start."""
        apply_scan_split(self.spark.conf, self.cores, self.compiled.spread_by_scan)
        for name, value in {**QUERY_DEFAULTS,
                            "spark.sql.streaming.stateStore.providerClass": self.config.state_store_provider,
                            # Read only when the checkpoint is new: a checkpoint keeps its own value.
                            "spark.sql.shuffle.partitions": str(self.state_partitions)}.items():
            self.spark.conf.set(name, value)
        guard.check_program(program_fingerprint(self.graph, self.compiled.schemas))
        record_grouping_keys(self.lock.store, self.grouping_keys)
        self.recovery = recover_unfinished_repartition(self.spark, self.checkpoint)
        self._started_at = time.monotonic()
        self.progress_output = self._new_progress_output()  # the first batch's wait counts from here
        self.query = self._stream(available_now).start()
        if self.stagers and not available_now:
            self._staging = StagingThread(self.stagers, poll_interval(self.stagers), self._on_staging_error).start()
        self._watcher = threading.Thread(target=self._watch, name="fissure-progress", daemon=True)
        self._watcher.start()
        return self.query

    def _stream(self, available_now: bool):
        stream = self._stream_frame.writeStream.foreachBatch(self._batch_function).option(
            "checkpointLocation", self.checkpoint)
        if self.query_name:
            stream = stream.queryName(self.query_name)
        if available_now:
            stream = stream.trigger(availableNow=True)
        elif self.config.trigger_interval_s > 0:
            stream = stream.trigger(processingTime=f"{self.config.trigger_interval_s} seconds")
        return stream

    def finish_input(self) -> bool:
        """End of input, after an available-now query drained its sources and ended: one more
        micro-batch whose watermark passes every event (the largest + the program's horizon), so
        every window, session and expiry fires (fissure.spark.query.time_log). It reads a marker the
        runner writes into the checkpoint's control folder, and runs as a second available-now
        query on the same checkpoint: a crash in it replays that batch with the same clock.
        False (nothing done): no time-aware operator, or the query is still running."""
        self._require_started()
        if not self.time_aware or self.query.isActive:
            return False
        self._collect_progress()
        self._end_of_input_from = max(self._seen_batches, default=-1) + 1
        write_end_of_input_marker(self.lock.store)
        self._end_of_input_next = True
        self.query = self._stream(True).start()
        self.query.awaitTermination()
        if self.lock is not None:
            self.lock.check_held()
        return True

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Wait for the query to end (True) or the timeout to pass (False); raises the query's error."""
        self._require_started()
        if timeout_s is None:
            self.query.awaitTermination()
            ended = True
        else:
            ended = bool(self.query.awaitTermination(timeout_s))
        if self._staging_error is not None:
            raise self._staging_error  # an unreadable file with on_unreadable="stop"
        if self.lock is not None:
            self.lock.check_held()  # stopped because another run took the checkpoint over
        return ended

    def process_all_available(self) -> None:
        """Block until every record available at the source now has been processed."""
        self._require_started()
        self.query.processAllAvailable()

    def stop(self) -> RunReport:
        """Stop the query (if running) and the progress line; returns the report."""
        if self._staging is not None:
            self._staging.stop()
        if self.query is not None and self.query.isActive:
            self.query.stop()
        if self._batch_function is not None:
            self._batch_function.detach()
        self._write_unwritten_file_letters()
        self._stop_watching.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        self._collect_progress()
        if self.profiler is not None:
            self.profiler.flush()
        # The last batches may have ended after the watcher's last look.
        self.progress_output.close(self._last_progress)
        report = self.report()
        self._let_go_of_lock()
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
                         thread_levels=self.threads.batches if self.threads is not None else (),
                         batch_log=tuple(self.batch_log), boundaries=self.boundaries, decisions=self.decisions,
                         batch_times=self.batch_times(), admissions=self.admissions,
                         missing_files=tuple(self.missing_files),
                         plan_text=describe_plan(self.plan, self.graph), stalls=tuple(self.stalls),
                         state_keys=self.state_keys, state_keys_peak=self.state_keys_peak,
                         late_records=self.late_records, watermark=self.watermark,
                         end_of_input_from=self.end_of_input_from)

    @property
    def end_of_input_from(self) -> int | None:
        """The first batch id of the end-of-input query (finish_input), None before it ran."""
        return self._end_of_input_from

    def batch_times(self) -> tuple[BatchTime, ...]:
        return tuple(BatchTime(batch_id, self._seen_batches[batch_id], seconds)
                     for batch_id, seconds in sorted(self._batch_seconds.items()) if batch_id in self._seen_batches)

    # --- a graph's batches and boundaries -----------------------------------------------------
    decisions: tuple = ()  # set by the autopipelining loop when it stops

    def set_boundaries(self, boundaries: Iterable[str]) -> None:
        """A graph's pipeline boundaries for the micro-batches that start from now on (no restart)."""
        chosen = tuple(sorted(set(boundaries)))
        stateless = {node.name for node in self.graph.nodes if node.stateless}
        unknown = sorted(set(chosen) - stateless)
        if unknown:
            raise PipelineError(f"boundaries {', '.join(unknown)} name no stateless operator of graph "
                                f"{self.graph.name!r}")
        with self._lock:
            self.boundaries = chosen

    def count_pieces(self, counting: str) -> None:
        """How the graph PEs of the micro-batches that start from now on count: "nodes" (node by
        node, each operator unfused), "runs" (per fused run, fused as unprofiled) or "off"."""
        if counting not in ("nodes", "runs", "off"):
            raise ValueError(f"piece counting must be 'nodes', 'runs' or 'off', got {counting!r}")
        with self._lock:
            self.piece_counting = counting if self.profile_pieces else "off"

    @property
    def cores(self) -> int:
        """The task slots the query's tasks share (the autopipelining forecast's cores)."""
        return default_parallelism(self.spark)

    def publish(self, publication: Publication) -> None:
        """What the micro-batches that start from now on publish as their plan and latest decision
        (`observedMetrics["fissure"]`, fissure.spark.query.observed_metrics)."""
        with self._lock:
            self.publication = publication

    def profile_tally(self) -> ProfileTally:
        """Everything the stages reported so far (its `pieces`: node by node, with `profile_pieces`)."""
        return self.accumulator.value.copy() if self.accumulator is not None else ProfileTally()

    # --- profile -----------------------------------------------------------------------------
    def profile_summary(self) -> ProfileSummary | None:
        """The operators' statistics over the last `profile.window_batches` batches (None: not
        profiled). `summary.estimates()` feeds `pipeline.operator_stats(...)` and the planner."""
        return self.profiler.summary() if self.profiler is not None else None

    @property
    def batch_profiles(self) -> tuple[BatchProfile, ...]:
        """Every batch's profile so far (the newest MAX_KEPT_BATCHES)."""
        return self.profiler.batches if self.profiler is not None else ()
