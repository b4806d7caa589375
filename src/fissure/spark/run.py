"""`fissure.run`: one call that runs any program, a chain or a graph, to its end.

    fissure.run(pipeline, FileSource("logs/"), FileSink("out/"), plan="planner")
    fissure.run(graph, {"lines": FileSource("logs/")}, {"alerts": FileSink("out/alerts")}, plan="planner",
                checkpoint="ckpt/", config=RunnerConfig(replanning="adaptive", timeout_s=600))

The program becomes its graph once (fissure.program.graph.as_graph), the one model every part of
the run takes, and its plan is resolved once: "sequential", the throughput model's pick
("planner": a graph is planned as the chain of its operators in execution order), a Plan or a
plan file. It runs on the one Runner (fissure.spark.query.runner), or under the adaptive loop
(`RunnerConfig(replanning="adaptive")`: re-plans while it runs, fissure.spark.adaptive.loop) or the
autopipelining loop (`replanning="autopipeline"`: places pipeline boundaries while it runs,
fissure.spark.adaptive.autopipelining). Every other setting is the config's (fissure.config).
"""

from __future__ import annotations

import difflib
import shutil
import tempfile
import time
from dataclasses import replace

from fissure.config import RunnerConfig
from fissure.model.types import Plan
from fissure.plan.stored_calibration import stored_spark_model
from fissure.program.chain import Pipeline
from fissure.program.graph import StreamGraph, as_graph
from fissure.spark.adaptive.loop import run_adaptive_on_spark
from fissure.spark.adaptive.queries import STOP_LOGGERS, quiet_spark_loggers
from fissure.spark.adaptive.batch_gate import POLL_S, BatchLimit
from fissure.spark.checkpoint.files import open_store
from fissure.spark.checkpoint.lock import CheckpointLock
from fissure.spark.adaptive.autopipelining import GraphAutopipeliner
from fissure.plan.plans import resolve_plan
from fissure.spark.query.run_end import RunTimedOut  # noqa: F401 - importable from fissure.run's module too
from fissure.spark.query.run_end import QueryRestarts, check_input_read
from fissure.spark.query.binding import bind_sources, input_records_once
from fissure.spark.query.report import RunReport
from fissure.spark.query.runner import Runner
from fissure.spark.session.create import create_session, default_parallelism, noted_failures
from fissure.spark.io.sources import check_before_spark, default_file_system

# fissure.run's keyword arguments before its settings moved into RunnerConfig: how each is set now.
MOVED_ARGUMENTS = {
    "spark": "spark=", "dead_letters": "dead_letters=", "estimates": "estimates=",
    "available_now": "available_now=", "timeout_s": "timeout_s=", "max_batches": "max_batches=",
    "progress": 'progress="auto" | "live" | "lines" | "off"', "profile": "profiling= (None: not profiled)",
    "profile_log": "profile_log=", "adaptive": 'replanning="adaptive"', "adaptive_config": "adaptation=",
    "run_dir": "run_dir=", "autopipeline": 'replanning="autopipeline"', "autopipeline_config": "autopipelining=",
    "boundaries": "boundaries=", "state_partitions": "state_partitions=",
}


def run(program: Pipeline | StreamGraph, source=None, sink=None, *, plan: object = "sequential",
        checkpoint: str | None = None, config: RunnerConfig = RunnerConfig(), **moved) -> RunReport:
    """Run `program` from `source` to `sink` and return the run's report.

    For a graph, `source` and `sink` are dicts by name (or one object where it has one). `plan`:
    "sequential", "planner", a Plan, a JSON plan file or a dict of one. `checkpoint`: where the
    run keeps its progress and state (a run on it goes on from there; None: a temporary one).
    Everything else is `config` (RunnerConfig): the session, how long the run goes
    (`available_now`, `timeout_s`, `max_batches`), dead letters, progress, profiling, and
    re-planning while it runs (`replanning`: "off", "adaptive", "autopipeline").

    A bounded run (available_now) whose `timeout_s` passes first, with input left unread, raises
    RunTimedOut saying what is left. A failure that is the machine's (a worker that died, an
    operator out of memory) starts the query again on its checkpoint within
    `config.restart_policy()` (fissure.lifecycle.failures). An adaptive run returns an
    AdaptiveRunReport; an autopipelining run's report lists the loop's decisions.
    """
    if moved:
        raise TypeError(moved_arguments_error(moved))
    graph = as_graph(program)  # the one model of the program every part of the run takes
    if config.replanning == "adaptive":
        with noted_failures():
            return run_adaptive_on_spark(graph, source, sink, plan=plan, checkpoint=checkpoint, config=config)
    owned_checkpoint = checkpoint is None
    checkpoint = checkpoint or tempfile.mkdtemp(prefix="fissure-checkpoint-")
    lock = None
    try:
        with noted_failures():
            # A missing path or field fails now, not after Spark's start.
            check_before_spark(graph, bind_sources(graph, source),
                               default_file_system(config.spark, config.master, config.spark_conf))
            spark = config.spark if config.spark is not None else create_session(config)
            resolved = _resolve_once(plan, graph, source, spark, config)
            # One lock for every query of the run: its restarts after a worker crash re-use it.
            lock = CheckpointLock.acquire(open_store(spark, checkpoint), graph.name, spark=spark,
                                          lease_s=config.checkpoint_lease_s)
            return _run_to_end(graph, source, sink, plan=resolved, checkpoint=checkpoint, spark=spark,
                               config=config, lock=lock)
    finally:
        if lock is not None:
            lock.release()
        if owned_checkpoint:
            shutil.rmtree(checkpoint, ignore_errors=True)


def moved_arguments_error(moved: dict) -> str:
    """What fissure.run says to a keyword argument it does not take: where that setting is now."""
    settings = [f"{name}= is RunnerConfig({MOVED_ARGUMENTS[name]})" for name in moved if name in MOVED_ARGUMENTS]
    unknown = [name for name in moved if name not in MOVED_ARGUMENTS]
    parts = []
    if settings:
        parts.append(f"fissure.run takes the program, source, sink, plan=, checkpoint= and config=; "
                     f"{'; '.join(settings)}: pass config=RunnerConfig(...) (or replace(config, ...))")
    for name in unknown:
        close = difflib.get_close_matches(name, ["plan", "checkpoint", "config", *MOVED_ARGUMENTS], n=1)
        parts.append(f"fissure.run got an unexpected keyword argument {name!r}"
                     + (f"; did you mean {close[0]}=?" if close else ""))
    return ". ".join(parts)


def _resolve_once(plan: object, graph: StreamGraph, source, spark, config: RunnerConfig) -> Plan:
    """The run's plan, resolved once for all its queries. A run that reads its input once plans
    for it (fissure.plan.plans.planner_plan)."""
    plans_for_input = config.available_now and isinstance(plan, str) and plan == "planner"
    input_records = (input_records_once(bind_sources(graph, source),
                                        beyond=stored_spark_model()[0].workload.batch_records)
                     if plans_for_input else None)
    return resolve_plan(plan, graph, default_parallelism(spark), config.estimates, input_records)


def _run_to_end(graph: StreamGraph, source, sink, *, plan: Plan, checkpoint: str, spark, config: RunnerConfig,
                lock: CheckpointLock, clock=time.monotonic) -> RunReport:
    """Run on the one Runner until the end, starting the query again on its checkpoint after a
    failure that is the machine's, not the program's (fissure.lifecycle.failures), as
    `config.restart_policy()` allows. `config.timeout_s` counts from the first start, restarts included."""
    limit = BatchLimit(config.max_batches) if config.max_batches is not None else None
    available_now, timeout_s = config.available_now, config.timeout_s
    restarts = QueryRestarts(config.restart_policy(), checkpoint, clock, lock)
    deadline = None if timeout_s is None else clock() + timeout_s
    config = replace(config, spark=spark)  # the session fissure.run created, for every query of the run
    while True:
        runner = Runner(graph, source, sink, plan=plan, checkpoint=checkpoint, config=config, lock=lock)
        autopipelined = config.replanning == "autopipeline"
        loop = GraphAutopipeliner(runner, config.autopipelining).attach() if autopipelined else None
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
        if last is not None and any(int(update["batchId"]) == last for update in runner.progress_feed.updates()):
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
    return False


def run_graph(graph: StreamGraph, sources, sinks, **options) -> RunReport:
    """`run(graph, sources, sinks, ...)`: the graph form, kept for programs written against it."""
    return run(graph, sources, sinks, **options)
