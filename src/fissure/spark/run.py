"""`fissure.run`: one call that runs any program, a chain or a graph, adaptive or not, to its end.

    fissure.run(pipeline, FileSource("logs/"), FileSink("out/"), plan="planner")
    fissure.run(graph, {"lines": FileSource("logs/")}, {"alerts": FileSink("out/alerts")}, plan="planner")

Every program runs on the one Runner (fissure.spark.runner) under a plan: "sequential", the
throughput model's pick ("planner": a graph is planned as the chain of its operators in
execution order), a Plan or a plan file. `adaptive=True` re-plans while it runs
(fissure.spark.adaptive.loop); `autopipeline=True` places pipeline boundaries while it runs
(fissure.spark.adaptive.autopipelining). Settings not given as arguments come from `config`.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping

from pyspark.sql import SparkSession

from fissure.graph import OperatorEstimate, Pipeline, PipelineError
from fissure.profile.settings import ProfileSettings
from fissure.spark.adaptive.loop import run_adaptive_on_spark
from fissure.spark.adaptive.queries import STOP_LOGGERS, quiet_spark_loggers
from fissure.spark.adaptive.batch_gate import POLL_S, BatchLimit
from fissure.spark.checkpoint.files import open_store
from fissure.spark.checkpoint.lock import CheckpointLock
from fissure.spark.config import RunnerConfig
from fissure.spark.adaptive.autopipelining import GraphAutopipeliner
from fissure.spark.run_end import RunTimedOut  # noqa: F401 - fissure.spark.run.RunTimedOut, as before it moved
from fissure.spark.run_end import QueryRestarts, check_input_read
from fissure.plan.stored_calibration import stored_spark_model
from fissure.spark.runner import Runner, RunReport, bind_sources, input_records_once
from fissure.spark.session.create import create_session, noted_failures
from fissure.spark.io.sources import check_before_spark, default_file_system
from fissure.streamgraph import StreamGraph, as_graph


class _FromConfig:
    def __repr__(self) -> str:
        return "config.profiling"


FROM_CONFIG = _FromConfig()  # `profile=` left out: the config's profiling settings


def run(program: Pipeline | StreamGraph, source=None, sink=None, *, plan: object = "sequential",
        checkpoint: str | None = None, spark: SparkSession | None = None, dead_letters=None,
        estimates: Mapping[str, OperatorEstimate] | None = None, config: RunnerConfig = RunnerConfig(),
        available_now: bool = True, timeout_s: float | None = None, max_batches: int | None = None,
        progress: bool | str | None = None,
        profile: ProfileSettings | None | _FromConfig = FROM_CONFIG, profile_log: str | None = None,
        adaptive: bool = False, adaptive_config=None, run_dir: str | None = None,
        autopipeline: bool = False, autopipeline_config=None, boundaries: Iterable[str] | None = None,
        state_partitions: int | None = None) -> RunReport:
    """Run `program` from `source` to `sink` and return the run's report.

    For a graph, `source` and `sink` are dicts by name (or one object where it has one).
    available_now=True processes what the sources hold now and ends (file sources): a `timeout_s`
    that passes first, with input left unread, raises RunTimedOut saying what is left; otherwise
    the query runs until `timeout_s` passes (its normal end) or forever without it. A failure
    that is the machine's (a worker that died, an operator out of memory) starts the query again
    on its checkpoint within `config.restart_policy()` (fissure.lifecycle.failures). `max_batches`: the run ends after
    that many micro-batches (a later batch is left for a run on the checkpoint). `progress`: how
    progress shows on stderr (None: `config.progress`; False: not at all; fissure.lifecycle.progress).
    adaptive=True re-plans while it runs (`adaptive_config`: an AdaptiveConfig; `run_dir`: where its
    timeline goes) and returns an AdaptiveRunReport; autopipeline=True places pipeline boundaries
    while it runs, starting from `boundaries` (`autopipeline_config`: a GraphAutopipelineConfig; the
    report lists its decisions). Settings not given here come from `config` (RunnerConfig: profiling, threads,
    adaptation, autopipelining); profile=None turns profiling off.
    """
    if profile is FROM_CONFIG:
        profile = config.profiling
    adaptive_config = adaptive_config or config.adaptation
    autopipeline_config = autopipeline_config or config.autopipelining
    if adaptive and autopipeline:
        raise PipelineError("adaptive=True and autopipeline=True both re-cut the program while it runs; choose one")
    if adaptive:
        chain = program if isinstance(program, Pipeline) else as_graph(program).as_chain()
        with noted_failures():
            return run_adaptive_on_spark(chain if chain is not None else program, source, sink, plan=plan,
                                         checkpoint=checkpoint, spark=spark, dead_letters=dead_letters,
                                         estimates=estimates, config=config, available_now=available_now,
                                         timeout_s=timeout_s, max_batches=max_batches, progress=progress,
                                         profile=profile, profile_log=profile_log,
                                         adaptive_config=adaptive_config, run_dir=run_dir)
    limit = BatchLimit(max_batches) if max_batches is not None else None
    owned_checkpoint = checkpoint is None
    checkpoint = checkpoint or tempfile.mkdtemp(prefix="fissure-checkpoint-")
    lock = None
    try:
        with noted_failures():
            graph = as_graph(program)
            # A missing path or field fails now, not after Spark's start.
            check_before_spark(graph, bind_sources(graph, source),
                               default_file_system(spark, config.master, config.spark_conf))
            spark = spark if spark is not None else create_session(config)
            # A run that reads its input once plans for it (fissure.plan.plans.planner_plan).
            plans_for_input = available_now and isinstance(plan, str) and plan == "planner"
            input_records = (input_records_once(bind_sources(graph, source),
                                                beyond=stored_spark_model()[0].workload.batch_records)
                             if plans_for_input else None)
            # One lock for every query of the run: its restarts after a worker crash re-use it.
            lock = CheckpointLock.acquire(open_store(spark, checkpoint), graph.name, spark=spark,
                                          lease_s=config.checkpoint_lease_s)
            return _run_to_end(program, source, sink, limit=limit, checkpoint=checkpoint, spark=spark,
                               config=config, available_now=available_now, timeout_s=timeout_s,
                               runner_options=dict(plan=plan, dead_letters=dead_letters, estimates=estimates,
                                                   config=config, progress=progress, profile=profile,
                                                   profile_log=profile_log, boundaries=boundaries,
                                                   state_partitions=state_partitions,
                                                   profile_pieces=autopipeline, lock=lock,
                                                   input_records=input_records),
                               autopipeline=autopipeline, autopipeline_config=autopipeline_config)
    finally:
        if lock is not None:
            lock.release()
        if owned_checkpoint:
            shutil.rmtree(checkpoint, ignore_errors=True)


def _run_to_end(program, source, sink, *, limit: BatchLimit | None, checkpoint: str, spark, config: RunnerConfig,
                available_now: bool, timeout_s: float | None, runner_options: dict, autopipeline: bool,
                autopipeline_config, clock=time.monotonic) -> RunReport:
    """Run on the one Runner until the end, starting the query again on its checkpoint after a
    failure that is the machine's, not the program's (fissure.lifecycle.failures), as
    `config.restart_policy()` allows. `timeout_s` counts from the first start, restarts included."""
    restarts = QueryRestarts(config.restart_policy(), checkpoint, clock, runner_options.get("lock"))
    deadline = None if timeout_s is None else clock() + timeout_s
    while True:
        runner = Runner(program, source, sink, checkpoint=checkpoint, spark=spark, **runner_options)
        spark = runner.spark
        loop = GraphAutopipeliner(runner, autopipeline_config).attach() if autopipeline else None
        if limit is not None:
            runner.wrap_batch = limit.wrap
        try:
            runner.start(available_now=available_now)
            remaining_s = None if deadline is None else max(0.0, deadline - clock())
            if limit is None:
                ended = runner.await_termination(remaining_s)
                drained = ended and available_now
            elif await_batch_limit(runner, limit, remaining_s):
                ended = True  # the batches asked for are done: what is left is for a later run
                drained = False
                with quiet_spark_loggers(runner.spark, STOP_LOGGERS):
                    limit.stop()  # a held batch raises instead of writing
                    runner.query.stop()
            else:
                ended = not runner.query.isActive
                drained = available_now and ended
            if drained:  # the end of input: every window and expiry fires (not when stopped early)
                runner.finish_input()
        except Exception as error:
            runner.stop()
            if not restarts.allows(error):
                raise
            continue
        finally:
            if loop is not None:
                runner.decisions = tuple(loop.decisions)
        report = runner.stop()
        if not ended and available_now:
            check_input_read(runner, report, timeout_s)
        return report


def await_batch_limit(runner: Runner, limit: BatchLimit, timeout_s: float | None) -> bool:
    """Wait until the limit's last batch is committed (True: stop the query now), the query ends
    or `timeout_s` passes (False); raises the query's error."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not runner.await_termination(POLL_S):
        last = limit.last_batch()
        if last is not None and any(int(update["batchId"]) == last for update in runner.query.recentProgress):
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
    return False


def run_graph(graph: StreamGraph, sources, sinks, **options) -> RunReport:
    """`run(graph, sources, sinks, ...)`: the graph form, kept for programs written against it."""
    return run(graph, sources, sinks, **options)
