"""Running a program on Spark: `Runner` starts its query, watches it (the progress line, the
profile, the waiting operators' threads) and stops it. `fissure.run` (fissure.spark.run) is the
one call that runs any program to its end.

    runner = Runner(pipeline, FileSource("logs/"), FileSink("out/"), plan="planner", checkpoint="ckpt/")
    runner = Runner(graph, {"lines": FileSource("logs/")}, {"alerts": FileSink("out/alerts")}, plan="planner")
    runner.start(available_now=True); runner.await_termination(); report = runner.stop()

Every program, a chain (a Pipeline) or any other graph, compiles to one query over envelopes
(fissure.spark.query.compile_graph). One foreachBatch function writes the micro-batch's dead letters
and every sink, each keyed by the batch id: a batch replayed after a crash overwrites what it
wrote, so with idempotent sinks (FileSink, MemorySink) every sink holds each result exactly once
across restarts from the checkpoint.

The pipeline boundaries (operators whose input port starts a new process of their PE) are the
plan's, or `boundaries`, and change between micro-batches with `set_boundaries` (a Spark local
property the next batch's tasks read: no restart).
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from pyspark.sql import Observation, SparkSession
from pyspark.sql import functions as F

from fissure.graph import OperatorEstimate, Pipeline, PipelineError
from fissure.lifecycle.progress import ProgressState, requested_mode, watermark_text
from fissure.lifecycle.watchdog import Stall, judge_batch, report_due, stuck_operator
from fissure.model.types import Plan
from fissure.plan.stored_calibration import stored_spark_model
from fissure.profile.collector import ProfileCollector
from fissure.profile.log import profile_log_path
from fissure.profile.settings import ProfileSettings
from fissure.profile.window import BatchProfile, ProfileSummary, render_table, waiting_advice
from fissure.program_fingerprint import program_fingerprint
from fissure.lifecycle.batch_size import BatchCost, SampleDecision, choose_batch_records, sample_needed
from fissure.spark.io.batch_admission import (SAMPLE_RECORD, SourceAdmission, admit_file_sources, first_file,
                                              input_records, model_batch_cost, needs_size, recorded_sample,
                                              sample_record, sample_rows)
from fissure.spark.checkpoint.files import LocalStore, open_store
from fissure.spark.checkpoint.guard import StartGuard, batch_ids
from fissure.spark.io.file_staging import (FileStager, SettleRule, StagingThread, batch_files, missing_files,
                                           poll_interval, staged, staging_applies, staging_path)
from fissure.spark.checkpoint.lock import CheckpointLock
from fissure.spark.query.compile_graph import CompiledGraph, compile_graph, sink_frame
from fissure.spark.query.observed_metrics import Publication, observe_run
from fissure.spark.query.stages import BOUNDARIES_PROPERTY, PUBLISHED_PROPERTY, WorkerProfiling
from fissure.spark.config import RunnerConfig
from fissure.spark.query.elastic import ThreadLevels
from fissure.plan.plans import describe_plan, resolve_plan
from fissure.lifecycle.progress_output import ProgressOutput
from fissure.spark.session.create import QUERY_DEFAULTS, create_session, default_parallelism, is_local, read_heartbeats
from fissure.spark.io.sinks import DeadLetterLog, write_dead_letters
from fissure.spark.io.sources import FileSource, check_before_spark, default_file_system, open_source
from fissure.spark.state.repartition import RepartitionRecovery, delete_checkpoint, recover_unfinished_repartition
from fissure.spark.query.time_log import (BATCH_CLOCK_PROPERTY, TimeLog, end_of_input_folder, prepare_end_of_input_folder,
                                          write_end_of_input_marker)
from fissure.runtime.operators.time_tally import TimeTally, TimeTallyParam
from fissure.runtime.operators.timed import LATE
from fissure.runtime.operators.watermark import BatchClock, next_clock
from fissure.streamgraph import StreamGraph, as_graph
from fissure.local.cost_sample import measure_sample_isolated
from fissure.runtime.elastic.stage import BatchThreadLevels
from fissure.runtime.records.columns import DEAD_ERROR, DEAD_OPERATOR, DEAD_RECORD, SEQ
from fissure.runtime.records.envelopes import ROUTE
from fissure.compile.stages import plan_graph_stages, state_partitions_of
from fissure.runtime.profiling.profiler import ProfileTally, ProfileTallyParam

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraphBatch:
    """One micro-batch as the driver saw it: how long its writes took, under which pipeline
    boundaries it ran, its dead letters and the records it wrote to the sinks."""

    batch_id: int
    wall_s: float
    boundaries: tuple[str, ...]
    dead_letters: int
    output_records: int = 0
    late_records: int = 0  # dead letters with the reason Late
    watermark: float | None = None  # the event-time watermark the batch ran with (None: no event time)
    state_keys: int | None = None  # keys holding state after the batch, over the stateful operators


@dataclass(frozen=True)
class BatchTime:
    """One micro-batch as Spark reported it: records taken from the sources, seconds it took."""

    batch_id: int
    input_records: int
    duration_s: float


@dataclass
class BatchListeners:
    """Called with each GraphBatch at the end of its foreachBatch (the autopipelining loop)."""

    on_batch: list[Callable[[GraphBatch], None]] = field(default_factory=list)


@dataclass(frozen=True)
class RunReport:
    """What a finished (or stopped) run did. Its repr is one short line of the key figures
    (`describe()`); the batch logs and profiles are in the fields."""

    plan: Plan
    batches: int
    input_records: int
    dead_letters: int
    elapsed_s: float
    checkpoint: str
    profile: ProfileSummary | None = None  # the operators' statistics over the last batches
    # Per batch: the thread level of each waiting operator in each worker (docs/elastic-scheduler.md).
    thread_levels: tuple[BatchThreadLevels, ...] = ()
    # A graph's: every batch with its sinks' rows, the boundaries at the end, the autopipelining
    # loop's decisions in order (fissure.spark.adaptive.autopipelining).
    batch_log: tuple[GraphBatch, ...] = ()
    boundaries: tuple[str, ...] = ()
    decisions: tuple = ()
    batch_times: tuple[BatchTime, ...] = ()  # every batch Spark reported, in batch order
    admissions: tuple[SourceAdmission, ...] = ()  # batch sizes fissure chose for file sources
    # Files a batch's source log listed that were gone when the batch ran (Spark reads them as empty).
    missing_files: tuple[str, ...] = ()
    plan_text: str = ""  # the plan described when the report was made, with its keys: `[a|b]x2(user)`
    stalls: tuple[Stall, ...] = ()  # the watchdog's reports of stuck batches (fissure.lifecycle.watchdog)
    # Keys holding state after the last batch, summed over the stateful operators (their buckets
    # this run called; None: no stateful operator ran), and the most after any batch.
    state_keys: int | None = None
    state_keys_peak: int | None = None  # the most after any batch
    late_records: int = 0  # dead letters with the reason Late
    watermark: float | None = None  # where the event-time watermark ended (None: no event time)

    @property
    def output_records(self) -> int:
        """Records written to the sinks (every sink's, summed; a replayed batch's once per write)."""
        return sum(batch.output_records for batch in self.batch_log)

    @property
    def described_plan(self) -> str:
        """The plan as the progress line and `fissure run` show it (`plan_text`, else the plan
        described without its keys)."""
        return self.plan_text or describe_plan(self.plan)

    def summary(self, plan: str | None = None) -> dict:
        """The run as `fissure run --json` prints it (docs/commands.md); `plan`: the plan as
        described (default: the report's own description, `described_plan`)."""
        plan = self.described_plan if plan is None else plan
        times = sorted(self.batch_times, key=lambda time: time.batch_id)
        later = times[1:]
        later_s = sum(time.duration_s for time in later)
        return {"plan": plan, "batches": self.batches, "input_records": self.input_records,
                "output_records": self.output_records, "dead_letters": self.dead_letters,
                "elapsed_s": round(self.elapsed_s, 3),
                "first_batch_s": round(times[0].duration_s, 3) if times else None,
                "steady_records_per_s": round(sum(time.input_records for time in later) / later_s, 1)
                if later and later_s > 0 else None,
                "state_keys": self.state_keys, "state_keys_peak": self.state_keys_peak,
                "late_records": self.late_records, "missing_files": list(self.missing_files)}

    @property
    def records_per_s(self) -> float:
        return self.input_records / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def describe(self) -> str:
        """The key figures on one line: plan, batches, records in and out, dead letters, elapsed
        seconds, throughput."""
        missing = (f", {len(self.missing_files)} input file{'' if len(self.missing_files) == 1 else 's'} missing"
                   if self.missing_files else "")
        return (f"plan {self.described_plan}, {self.batches} batch{'' if self.batches == 1 else 'es'}, "
                f"{self.input_records:,} records in, {self.output_records:,} out, {self.dead_letters:,} dead "
                f"letter{'' if self.dead_letters == 1 else 's'}{missing}, {self.elapsed_s:.1f} s, "
                f"{self.records_per_s:,.0f} records/s")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"


def ship_operator_modules(program: Pipeline | StreamGraph) -> None:
    """Pickle the operators' own modules by value, so workers need not import them.

    A function is pickled by reference to its module; a module that lives in a script's folder
    (not installed, not fissure) would be missing in the Python workers of a cluster.
    """
    from pyspark import cloudpickle

    functions = [fn for operator in program.operators for fn in (operator.fn, operator.state_factory)]
    if isinstance(program, StreamGraph):
        functions += [node.join.fn for node in program.nodes if node.join is not None]
    for fn in functions:
        module = sys.modules.get(getattr(fn, "__module__", None) or "")
        path = getattr(module, "__file__", None) or ""
        if (module is None or module.__name__ in ("__main__", "builtins") or "site-packages" in path
                or module.__name__.split(".")[0] in ("fissure", "pyspark") or not path):
            continue
        cloudpickle.register_pickle_by_value(module)


def check_serializable(program: Pipeline | StreamGraph) -> None:
    """Every operator's function and state_factory pickle as Spark will send them to its workers;
    one that does not fails here, named, before any query starts."""
    from pyspark import cloudpickle

    for operator in program.operators:
        for role, fn in (("function", operator.fn), ("state_factory", operator.state_factory)):
            if fn is None:
                continue
            try:
                cloudpickle.dumps(fn)
            except Exception as error:  # noqa: BLE001 - any pickling failure is the same to the user
                raise PipelineError(
                    f"operator {operator.name!r}: its {role} cannot be serialized for Spark's workers"
                    f" ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); a closure"
                    f" must not capture open files, locks, sockets, sessions or generators") from error


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


def _bound(graph: StreamGraph, given, role: str, names: tuple[str, ...]) -> dict:
    """A graph's sources or sinks by name: a mapping as given (every name bound, no other), or one
    object where the graph has one."""
    if not isinstance(given, Mapping):
        if len(names) == 1 and given is not None:
            return {names[0]: given}
        raise PipelineError(f"graph {graph.name!r} has {role}s {', '.join(names)}; pass a dict of them by name "
                            f"({{{names[0]!r}: ...}})")
    missing = [name for name in names if name not in given]
    unknown = sorted(set(given) - set(names))
    if role == "sink" and (missing or unknown):
        raise PipelineError(f"graph {graph.name!r} has sinks {', '.join(names)}; bind each one by name: "
                            f"missing {', '.join(missing) or 'none'}, unknown {', '.join(unknown) or 'none'}")
    if unknown:
        raise PipelineError(f"graph {graph.name!r} has no {role} {', '.join(map(repr, unknown))}; its {role}s are "
                            f"{', '.join(names)}")
    return dict(given)


def input_records_once(sources: Mapping[str, object], beyond: float | None = None) -> float | None:
    """The records a run that reads its sources once will read, when every source is a local file
    source (None otherwise: unknown, or more may come); each source counted until it passes `beyond`."""
    if not sources or not all(isinstance(source, FileSource) for source in sources.values()):
        return None
    counts = [input_records(source, beyond=beyond) for source in sources.values()]
    return None if any(count is None for count in counts) else float(sum(counts))


def bind_sources(graph: StreamGraph, given) -> dict:
    """A graph's sources by name, as `Runner` binds them (PipelineError naming the fix)."""
    return _bound(graph, given, "source", graph.sources)


class DetachableBatchFunction:
    """The function a query's `foreachBatch` calls, cut from the Runner once its query stopped.

    PySpark keeps every `foreachBatch` function in py4j's callback pool for the session's life.
    A function that holds the Runner holds its `query` proxy, and so the stopped Java query with
    its plans: measured on PySpark 4.3, each stopped query of a four-operator chain kept 4.1 MiB of
    the driver's heap (benchmarks/driver_heap.py), and a session that ran 134 LogWatch and
    synthetic queries (a benchmark; the adaptive loop starts a query per restart) ran out of its
    1 GiB. Detached, the pooled function holds nothing.
    """

    def __init__(self, function: Callable) -> None:
        self._function: Callable | None = function

    def __call__(self, frame, batch_id: int):
        function = self._function
        if function is None:
            raise RuntimeError(f"fissure: micro-batch {batch_id} reached the foreachBatch of a stopped query")
        return function(frame, batch_id)

    def detach(self) -> None:
        self._function = None


class Runner:
    """One program, its sources and sinks, one plan, one checkpoint: a Spark streaming query.

    `program`: a Pipeline (then `source` and `sink` are one object each) or a StreamGraph (then
    dicts by name, or one object where it has one source or sink).

    `plan`: a Plan, "sequential" (default), "planner" (the throughput model's pick from the
    operators' estimates), a JSON plan file (`fissure plan --json` output) or a dict of one.
    `spark`: an existing session; without one fissure creates `config.master` (local[*]).
    `dead_letters`: a sink for dead letters (e.g. FileSink); they are counted and the latest kept
    in `runner.dead_letter_log` either way.
    `progress`: how progress shows on stderr: None, as `config.progress` says ("auto": a live line
    on a terminal, timestamped lines elsewhere); False, not at all; True, shown (in the form the
    configured mode, or "auto", gives); or a mode by name (fissure.lifecycle.progress).
    `profile`: how operators are profiled on the live stream (None: not at all); the statistics
    are in `runner.profile_summary()`, under the progress line, and in the profile log
    (`profile_log`, default `<checkpoint>/fissure/profile.jsonl` when a checkpoint is given) that
    `fissure profile` reads. See docs/profiling.md.
    `boundaries`: a graph's pipeline boundaries instead of the plan's; `state_partitions`: instead
    of the plan's (the most replicas of a keyed region); `profile_pieces`: count a graph's PEs node
    by node for the autopipelining loop (a chain then runs as its graph).
    `lock`: the checkpoint's lock when the caller holds it for several queries (the adaptive loop,
    `fissure.run`'s restarts); without one, start() takes it and stop() releases it.
    `input_records`: the whole input, when the run reads it once (`fissure.run` with
    available_now): the planner plans for one batch of it when that is smaller than the batch it
    assumes (fissure.plan.plans.planner_plan).
    """

    # Set before start() to wrap the foreachBatch function (fissure.spark.adaptive.batch_gate's gate).
    wrap_batch: Callable[[Callable], Callable] | None = None

    def __init__(self, program: Pipeline | StreamGraph, source, sink, *, plan: object = "sequential",
                 checkpoint: str | None = None, spark: SparkSession | None = None,
                 dead_letters=None, estimates: Mapping[str, OperatorEstimate] | None = None,
                 config: RunnerConfig = RunnerConfig(), progress: bool | str | None = None,
                 query_name: str | None = None, profile: ProfileSettings | None = ProfileSettings(),
                 profile_log: str | None = None, boundaries: Iterable[str] | None = None,
                 state_partitions: int | None = None, profile_pieces: bool = False,
                 lock: CheckpointLock | None = None, input_records: float | None = None) -> None:
        self.program = program
        self.graph = as_graph(program)
        chain = program if isinstance(program, Pipeline) else self.graph.as_chain()
        self.pipeline = chain if chain is not None else self.graph  # what plans name
        self.sources = _bound(self.graph, source, "source", self.graph.sources)
        self.sinks = _bound(self.graph, sink, "sink", self.graph.sinks)
        # A missing path or field fails now, not after Spark's start.
        check_before_spark(self.graph, self.sources, default_file_system(spark, config.master, config.spark_conf))
        self.config = config
        self.spark = spark if spark is not None else create_session(config)
        self.estimates = estimates
        self.plan = resolve_plan(plan, self.pipeline, default_parallelism(self.spark), estimates, input_records)
        self.admissions: tuple[SourceAdmission, ...] = ()  # batch sizes chosen at start()
        self.stagers: list[FileStager] = []  # file sources read through staging (fissure.spark.io.file_staging)
        self._staging: StagingThread | None = None
        self._staging_error: BaseException | None = None
        self.missing_files: list[str] = []
        if boundaries is None:
            boundaries = [node for stage in plan_graph_stages(self.graph, self.plan) for node in stage.boundaries]
        self.boundaries = tuple(sorted(set(boundaries)))
        self.state_partitions = state_partitions or state_partitions_of(
            self.graph, self.plan, max(1, config.default_state_partitions))
        self.profile_pieces = profile_pieces  # count node by node for the autopipelining loop
        self.accumulator = None  # the run's profile accumulator (a ProfileTally), when anything is counted
        self.listeners = BatchListeners()
        self.batch_log: list[GraphBatch] = []
        self._lock = threading.Lock()
        self._temporary_checkpoint = checkpoint is None
        self.checkpoint = checkpoint or tempfile.mkdtemp(prefix="fissure-checkpoint-")
        self.lock = lock  # the checkpoint's lock while the query runs
        self._owns_lock = lock is None
        self.dead_letter_sink = dead_letters
        self.dead_letter_log = DeadLetterLog(kept=config.dead_letters_kept)
        self.progress_mode = requested_mode(progress, config.progress)
        self.progress_output = self._new_progress_output()
        self.query_name = query_name
        self.query = None
        self._batch_function: DetachableBatchFunction | None = None
        self.recovery: RepartitionRecovery | None = None  # an unfinished repartition start() finished
        self.compiled: CompiledGraph | None = None
        self._seen_batches: dict[int, int] = {}
        self._batch_seconds: dict[int, float] = {}
        self._last_progress: ProgressState | None = None
        self._started_at = 0.0
        self._watcher: threading.Thread | None = None
        self._stop_watching = threading.Event()
        self.profile_settings = profile if profile is not None and profile.enabled else None
        self.profile_log = profile_log or (None if self._temporary_checkpoint else str(profile_log_path(self.checkpoint)))
        self.profiler: ProfileCollector | None = None
        self.threads: ThreadLevels | None = None  # waiting operators' thread levels (start())
        # The plan and latest decision each batch publishes in observedMetrics["fissure"].
        self.publication = Publication(plan=describe_plan(self.plan, self.pipeline))
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
        self.time_aware = any(getattr(operator.time, "time_aware", False) for operator in self.graph.operators)
        self.time_tally = None
        self.time_log: TimeLog | None = None
        self._end_of_input_next = False  # the next batch without a clock is the end of input
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
        held no stream is removed (`StartGuard.undo`), and a temporary checkpoint of the runner's."""
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

    def _start(self, available_now: bool, guard: StartGuard):
        ship_operator_modules(self.program)
        check_serializable(self.program)
        state_partitions = self.state_partitions
        for name, value in {**QUERY_DEFAULTS,
                            "spark.sql.streaming.stateStore.providerClass": self.config.state_store_provider,
                            # Read only when the checkpoint is new: a checkpoint keeps its own value.
                            "spark.sql.shuffle.partitions": str(state_partitions)}.items():
            self.spark.conf.set(name, value)
        profiling = None
        if self.profile_settings is not None or self.profile_pieces:
            self.accumulator = self.spark.sparkContext.accumulator(ProfileTally(), ProfileTallyParam())
            settings = self.profile_settings or ProfileSettings()
            profiling = WorkerProfiling(self.accumulator, settings.timed_every_batches, settings.timed_every_records,
                                        operators=self.profile_settings is not None, pieces=self.profile_pieces)
        if self.profile_settings is not None:
            self.profiler = ProfileCollector(self.accumulator, describe_plan(self.plan, self.pipeline),
                                             self.profile_settings, self.profile_log)
        self.threads = ThreadLevels(self.spark, self.pipeline, policy=self.config.thread_policy,
                                    config=self.config.thread_elasticity, profile_summary=self.profile_summary,
                                    detect=self.config.detect_waiting_operators and self.profiler is not None,
                                    run=self.checkpoint)
        sources = self.sources
        if self.config.batch_size == "auto":
            sources, self.admissions = self._sized_sources(self.lock.store, available_now)
        sources = self._staged_sources(sources, guard.fresh, available_now)
        frames = {name: open_source(sources[name], self.spark) for name in self.graph.sources if name in sources}
        self.time_tally = self.spark.sparkContext.accumulator(TimeTally(), TimeTallyParam())
        control_frame = None
        if self.time_aware:
            self.time_log = TimeLog(self.lock.store)
            prepare_end_of_input_folder(self.lock.store)
            control_frame = self.spark.readStream.text(end_of_input_folder(self.checkpoint))
        line_formats = {name: source.line_format() for name, source in sources.items()
                        if callable(getattr(source, "line_format", None))}
        self.compiled = compile_graph(self.graph, frames, plan=self.plan, boundaries=self.boundaries,
                                      state_partitions=state_partitions, threads=self.threads.worker, profiling=profiling,
                                      resource_profile_for=_resource_profiles(self.spark), line_formats=line_formats,
                                      state_access=self.config.state_access(), control_frame=control_frame,
                                      time_tally=self.time_tally, combine=self.config.combine_aggregates)
        guard.check_program(program_fingerprint(self.graph, self.compiled.schemas))
        self.recovery = recover_unfinished_repartition(self.spark, self.checkpoint)
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
        write_end_of_input_marker(self.lock.store)
        self._end_of_input_next = True
        self.query = self._stream(True).start()
        self.query.awaitTermination()
        if self.lock is not None:
            self.lock.check_held()
        return True

    def _staged_sources(self, sources: Mapping[str, object], fresh: bool, available_now: bool) -> dict:
        """The file sources read through a staging directory in the checkpoint, which gets each
        file once it is settled and readable (fissure.spark.io.file_staging); the others as given.
        An available-now run first waits for the files still being written."""
        store = self.lock.store
        checkpoint = store.location if isinstance(store, LocalStore) else None
        staged_sources, self.stagers = dict(sources), []
        for name, source in sources.items():
            if not isinstance(source, FileSource):
                continue
            direct = staging_applies(source, checkpoint, fresh, name)
            if direct is not None:
                if source.settle_s is not None:
                    log.warning("fissure: source %s is read as Spark lists it, files still being written included "
                                "(%s)", name, direct)
                continue
            stager = FileStager(name, source.local_path(), staging_path(checkpoint, name), source.format,
                                SettleRule(float(source.settle_s)), source.on_unreadable)
            if available_now:
                stager.stage_all(poll_interval([stager]))
            else:
                stager.poll()
            self.stagers.append(stager)
            staged_sources[name] = staged(source, stager.staging)
        return staged_sources

    def _on_staging_error(self, error: BaseException) -> None:
        self._staging_error = error
        if self.query is not None and self.query.isActive:
            self.query.stop()

    def _sized_sources(self, store, available_now: bool = False):
        """The sources with a batch size on each file source given none (fissure.spark.io.batch_admission);
        `store`: the checkpoint's files (where the measured operator costs are kept);
        `available_now`: the run reads only what the sources hold now."""
        if not any(needs_size(source) for source in self.sources.values()):
            return self.sources, ()  # no model to evaluate, no calibration file to read
        settings, _ = stored_spark_model()
        cores = default_parallelism(self.spark)
        declared = model_batch_cost(self.pipeline.operator_stats(self.estimates), self.plan, cores, settings)
        estimates, costs = self._sampled_estimates(store, self._sample_decision(declared, available_now))
        cost = (declared if estimates is self.estimates else
                model_batch_cost(self.pipeline.operator_stats(estimates), self.plan, cores, settings))
        sources, admissions = admit_file_sources(self.sources, cost, fixed_share=self.config.batch_fixed_share,
                                                 latency_bound_s=self.config.batch_latency_bound_s, costs=costs)
        for admission in admissions:
            log.info("%s", admission.describe())
        return sources, admissions

    def _sample_decision(self, declared: BatchCost, available_now: bool) -> SampleDecision:
        """Whether the operators' costs need measuring before the batches are sized
        (fissure.lifecycle.batch_size.sample_needed): not when the run reads its sources' input
        once and all of it fits in one batch whatever a sample would measure."""
        sized = [source for source in self.sources.values() if needs_size(source)]
        records = choose_batch_records(declared, fixed_share=self.config.batch_fixed_share,
                                       latency_bound_s=self.config.batch_latency_bound_s).records
        reads_once = available_now and len(sized) == len(self.sources)
        counts = [input_records(source, beyond=records) for source in sized] if reads_once else [None]
        total = None if any(count is None for count in counts) else sum(counts)
        return sample_needed(total, records, reads_once)

    def _sampled_estimates(self, store, decision: SampleDecision | None = None
                           ) -> tuple[Mapping[str, OperatorEstimate] | None, str]:
        """Operator estimates for sizing batches: measured on the first records of each file
        source (fissure.local.cost_sample), under the ones the caller gave; and where they came from.
        A program that fails on its sample keeps its declared costs (its batches will say why).

        The sample runs the user's operators (in a forked process of the driver), so it runs once
        per checkpoint and says so: the costs are kept in the checkpoint (`SAMPLE_RECORD`), and a
        later start of the same program on it (a restart after a crash, a resumed run) reads them."""
        if not self.config.batch_sample_costs:
            return self.estimates, SourceAdmission.costs
        waiting = [operator.name for operator in self.graph.operators if operator.hints.waits is not None]
        if waiting:
            return self.estimates, f"{SourceAdmission.costs} (no sample: {', '.join(waiting)} declare waits=)"
        operators = [operator.name for operator in self.graph.operators]
        sample = recorded_sample(store.read(SAMPLE_RECORD), operators)
        if sample is not None:
            kept = sample.describe() + " (at the checkpoint's first start)"
            return {**sample.estimates, **(self.estimates or {})}, kept
        if decision is not None and not decision.needed:
            return self.estimates, f"{SourceAdmission.costs} (no sample: {decision.reason})"
        try:
            rows, schemas, files = {}, {}, []
            for name, source in self.sources.items():
                sampled = sample_rows(source) if isinstance(source, FileSource) else None
                if sampled is not None:
                    rows[name], schemas[name] = sampled
                    files.append(str(first_file(source)))
            if not rows:
                return self.estimates, SourceAdmission.costs
            print(f"fissure: measuring the operators' costs on the first records of {', '.join(files)} to size the "
                  f"micro-batches: runs the program's operators in a separate process, once per checkpoint "
                  f"(off: --no-cost-sample, RunnerConfig(batch_sample_costs=False))", file=sys.stderr)
            sample = measure_sample_isolated(self.graph, rows, schemas)
        except Exception as error:  # noqa: BLE001 - any failure of the user's code or files on the sample
            log.warning("measuring operator costs on a sample failed (%s); batch sizes follow the declared costs",
                        error)
            return self.estimates, f"{SourceAdmission.costs} (measuring them on a sample failed: {error})"
        try:
            store.write(SAMPLE_RECORD, sample_record(sample, operators))
        except OSError as error:  # the costs still serve this start; the next one measures again
            log.warning("could not keep the measured operator costs in the checkpoint (%s)", error)
        return {**sample.estimates, **(self.estimates or {})}, sample.describe()

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
                         plan_text=describe_plan(self.plan, self.pipeline), stalls=tuple(self.stalls),
                         state_keys=self.state_keys, state_keys_peak=self.state_keys_peak,
                         late_records=self.late_records, watermark=self.watermark)

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

    def publish(self, publication: Publication) -> None:
        """What the micro-batches that start from now on publish as their plan and latest decision
        (`observedMetrics["fissure"]`, fissure.spark.query.observed_metrics)."""
        with self._lock:
            self.publication = publication

    def profile_tally(self) -> ProfileTally:
        """Everything the stages reported so far (its `pieces`: node by node, with `profile_pieces`)."""
        return self.accumulator.value.copy() if self.accumulator is not None else ProfileTally()

    def _write_batch(self, frame, batch_id: int) -> None:
        """The foreachBatch function: the boundaries for the batch's tasks, then the micro-batch
        persisted once, its dead letters and every sink written from it."""
        batch_id = int(batch_id)
        with self._lock:
            boundaries, publication = self.boundaries, self.publication
        context = self.spark.sparkContext
        context.setLocalProperty(BOUNDARIES_PROPERTY, json.dumps({self.graph.name: list(boundaries)}))
        context.setLocalProperty(PUBLISHED_PROPERTY, publication.text())
        clock = self._batch_clock(batch_id)
        if clock is not None:
            context.setLocalProperty(BATCH_CLOCK_PROPERTY, clock.to_json())
        started_s = time.monotonic()
        self._report_missing_files(batch_id)
        frame = frame.persist()
        try:
            dead_count, written, late = self._write_sinks(frame, batch_id)
        finally:
            frame.unpersist()
        state_keys = self._after_batch(batch_id, clock, late)
        record = GraphBatch(batch_id, time.monotonic() - started_s, boundaries, dead_count, written, late,
                            clock.event.current if clock is not None and clock.event is not None else None, state_keys)
        self.batch_log.append(record)
        for listener in list(self.listeners.on_batch):
            try:
                listener(record)
            except Exception as error:  # noqa: BLE001 - a listener must not fail the batch
                print(f"fissure: batch listener failed: {error!r}", file=sys.stderr)

    def _batch_clock(self, batch_id: int) -> BatchClock | None:
        """The clock micro-batch `batch_id` runs with: the one written before it ran, when it runs
        again; else made from the batch before's and written to the checkpoint before it runs."""
        if not self.time_aware:
            return None
        recorded = self.time_log.clock(batch_id)
        if recorded is not None:
            self._end_of_input_next = self._end_of_input_next and not recorded.end_of_input
            return recorded
        layout = self.compiled.time
        fields = layout.fields.values()
        clock = next_clock(batch_id, self.time_log.last_before(batch_id), layout.lateness, layout.horizon,
                           event_time=any(field is not None for field in fields),
                           processing_time=any(field is None for field in fields), now_s=time.time(),
                           end_of_input=self._end_of_input_next)
        self._end_of_input_next = False
        self.time_log.write(clock)
        return clock

    def _after_batch(self, batch_id: int, clock: BatchClock | None, late: int) -> int | None:
        """After a batch wrote its sinks: its largest event time into its clock (the next batch's
        watermark), the run's state keys and late records."""
        tally = self.time_tally.value if self.time_tally is not None else TimeTally()
        if clock is not None:
            self.time_log.write(clock.ran(tally.largest.get(batch_id)))
            if clock.event is not None:
                self.watermark = clock.event.current
        self.late_records += late
        if not tally.keys:
            return None
        state_keys = sum(keys for _, keys in tally.keys.values())
        self.state_keys_peak = max(self.state_keys_peak or 0, state_keys)
        return state_keys

    @property
    def state_keys(self) -> int | None:
        """Keys holding state now, summed over the stateful operators (the buckets the run has
        called: every bucket of a time-aware operator; a plain partitioned operator's buckets
        once they got records in this run)."""
        tally = self.time_tally.value if self.time_tally is not None else None
        return sum(keys for _, keys in tally.keys.values()) if tally is not None and tally.keys else None

    def _write_sinks(self, frame, batch_id: int) -> tuple[int, int, int]:
        """Every sink's rows and the dead letters of a persisted micro-batch; (dead letters,
        records written). One observation counts both on the first action over the batch: a
        sink that reads every row (FileSink, MemorySink, NoopSink) when the first sink is one,
        which makes the dead-letter job unnecessary in a batch without dead letters; else the
        dead-letter job, which runs every batch."""
        observation = Observation(f"fissure_batch_{batch_id}")
        live = F.col(DEAD_OPERATOR).isNull()
        routes = [self.compiled.layout.route_of(self.graph.sink_node(sink).inputs[0]) for sink in self.graph.sinks]
        observed = frame.observe(observation, F.count_if(~live).alias("dead"),
                                 F.count_if(~live & F.col(DEAD_ERROR).startswith(f"{LATE}:")).alias("late"),
                                 *[F.count_if(live & (F.col(ROUTE) == route)).alias(f"sink{index}")
                                   for index, route in enumerate(routes)])
        first, *others = self.graph.sinks
        letters = [file.letter() for stager in self.stagers for file in stager.letters_for(batch_id)]
        if getattr(self.sinks[first], "reads_every_row", False):
            self.sinks[first].write(sink_frame(self.compiled, self.graph, first, observed), batch_id)
            counts = observation.get
            dead_count = write_dead_letters(frame, batch_id, self.dead_letter_log, self.dead_letter_sink,
                                            count=int(counts["dead"]), extra=letters)
        else:
            dead_count = write_dead_letters(observed, batch_id, self.dead_letter_log, self.dead_letter_sink,
                                            extra=letters)
            counts = observation.get
            self.sinks[first].write(sink_frame(self.compiled, self.graph, first, frame), batch_id)
        for sink in others:
            self.sinks[sink].write(sink_frame(self.compiled, self.graph, sink, frame), batch_id)
        return (dead_count, sum(int(counts[f"sink{index}"]) for index in range(len(routes))),
                int(counts["late"] or 0))

    def _report_missing_files(self, batch_id: int) -> None:
        """Warn of the files Spark's source log lists for the batch that are gone (deleted after
        Spark listed them: Spark reads a missing file as empty, silently), and keep them for the report."""
        store = self.lock.store if self.lock is not None else None
        if store is None:
            return
        try:
            gone = missing_files(batch_files(store.read, store.names, batch_id))
        except OSError:
            return
        new = [path for path in gone if path not in self.missing_files]
        if new:
            self.missing_files.extend(new)
            message = (f"fissure: batch {batch_id}: {len(new)} input file(s) listed for it no longer exist and are "
                       f"read as empty: {', '.join(new[:5])}{' ...' if len(new) > 5 else ''}")
            log.warning("%s", message)
            print(message, file=sys.stderr)

    def _write_unwritten_file_letters(self) -> None:
        """Dead letters of unreadable files no batch has written (no batch ran after they were
        found): written now under the next batch's id, which writes them again if it runs."""
        if not self.stagers or self.lock is None:
            return
        committed = batch_ids(self.lock.store, "commits")
        next_batch = committed[-1] + 1 if committed else 0
        pending = [file for stager in self.stagers for file in stager.unreadable() if file.batch is None]
        if not pending:
            return
        letters = [file.letter() for stager in self.stagers for file in stager.letters_for(next_batch)]
        try:
            frame = self.spark.createDataFrame([(*letter, -1) for letter in letters],
                                               f"{DEAD_OPERATOR} string, {DEAD_ERROR} string, "
                                               f"{DEAD_RECORD} string, {SEQ} long")
            write_dead_letters(frame, next_batch, self.dead_letter_log, self.dead_letter_sink, count=len(letters))
        except Exception as error:  # noqa: BLE001 - a stopped session: the letters stay for the next run
            log.warning("fissure: could not write the dead letters of unreadable files: %s", error)

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
    def progress(self) -> ProgressState | None:
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
            self._batch_seconds[batch_id] = float((update.get("durationMs") or {}).get("triggerExecution") or 0) / 1e3
            if newest is None or batch_id >= int(newest["batchId"]):
                newest = update
        if newest is not None:
            self._last_progress = ProgressState(
                batch_id=int(newest["batchId"]),
                records_per_s=float(newest.get("processedRowsPerSecond") or 0.0),
                input_records=sum(self._seen_batches.values()),
                dead_letters=self.dead_letter_log.count,
                plan=describe_plan(self.plan, self.pipeline),
                threads=self.threads.latest_text() if self.threads is not None else "",
                time=watermark_text(self.watermark, time.time()),
            )

    def _watched(self, writer: Callable) -> Callable:
        """The foreachBatch function noting which batch runs since when (the batch's tasks run
        within it: its sinks' writes compute the micro-batch)."""
        def watched(frame, batch_id):
            self._running_batch = (int(batch_id), time.monotonic(), time.time())
            try:
                return writer(frame, batch_id)
            finally:
                self._running_batch, self._stall_reported_s, self._stall_text = None, None, ""
        return watched

    def check_stall(self, now_s: float | None = None) -> Stall | None:
        """The watchdog's look at the batch running now: a Stall when one is due to be reported
        (fissure.lifecycle.watchdog), also logged as a warning and shown on the progress line."""
        running = self._running_batch
        if running is None:
            return None
        batch_id, started_s, started_wall_s = running
        now_s = time.monotonic() if now_s is None else now_s
        predicted = [admission.decision.predicted_batch_s for admission in self.admissions]
        verdict = judge_batch(now_s - started_s, [batch.wall_s for batch in self.batch_log],
                              max(predicted) if predicted else None, self.stall_policy)
        if not report_due(verdict, self._stall_reported_s):
            return None
        beat = stuck_operator(read_heartbeats(), started_wall_s)
        stall = Stall(batch_id, verdict.elapsed_s, verdict.expected_s, beat.operator if beat else None,
                      time.time() - beat.since_s if beat else None, beat.pid if beat else None, verdict.reason)
        self._stall_reported_s = verdict.elapsed_s
        self._stall_text = (f"batch {batch_id} stuck {stall.elapsed_s:.0f} s"
                            + (f" in {stall.operator!r}" if stall.operator else ""))
        self.stalls.append(stall)
        log.warning("fissure: %s", stall.describe())
        return stall

    def _watch(self) -> None:
        while not self._stop_watching.wait(self.config.progress_interval_s):
            try:
                self._collect_progress()
                self.check_stall()
            except Exception:  # noqa: BLE001 - the query ending mid-poll: nothing to show
                continue
            self.progress_output.show(self._progress_state(), table=self.due_table)
            if self.query is not None and not self.query.isActive:
                break

    def _new_progress_output(self) -> ProgressOutput:
        return ProgressOutput(self.progress_mode, interval_s=self.config.progress_lines_interval_s)

    def _progress_state(self) -> ProgressState:
        """The newest completed batch's progress, or the first batch still running."""
        if self._last_progress is not None:
            return replace(self._last_progress, stall=self._stall_text)
        return ProgressState(batch_id=None, records_per_s=None, input_records=0,
                             dead_letters=self.dead_letter_log.count, plan=describe_plan(self.plan, self.pipeline),
                             stall=self._stall_text)

    def due_table(self) -> str | None:
        """With profiling, the operators' statistics table every `table_interval_s` (None: not due)."""
        now = time.monotonic()
        if self.profiler is None or now - self._table_drawn_at < self.profile_settings.table_interval_s:
            return None
        summary = self.profiler.summary()
        if not summary.batches:
            return None
        self._table_drawn_at = now
        kinds = {name: self.pipeline.kind_of(name).value for name in self.pipeline.names}
        declared = [operator.name for operator in self.graph.operators if operator.hints.waits is not None]
        for advice in waiting_advice(summary, declared):
            operator = advice.split(" waits:")[0]
            if operator not in self._advised_waiting:  # once a run, whatever the table's interval
                self._advised_waiting.add(operator)
                log.warning("fissure: %s", advice)
        return render_table(summary, kinds, declared)
