"""Adaptive execution on Spark: the adaptive loop around a running query, `run_adaptive_on_spark`.

    report = fissure.run(pipeline, FileSource("logs/"), FileSink("out/"), checkpoint="ckpt/",
                         config=RunnerConfig(replanning="adaptive", run_dir="run/"))
    report.timeline_json, report.timeline_png, report.switches

The decisions are `fissure.control.adaptive.controller.AdaptiveController`'s (pure); `run_adaptive`
(fissure.control.driver) feeds it one `BatchObservation` per micro-batch from `SparkObservations`
(fissure.spark.adaptive.observations) and hands every switch to `SparkPlanRealizer`
(fissure.spark.adaptive.realizer), which re-cuts the PEs or restarts the query on its checkpoint
through the `QueryManager` (fissure.spark.adaptive.queries). Every batch waits at its `BatchGate`
(fissure.spark.adaptive.batch_gate) until the loop has decided on the batches before it, so a switch takes
effect exactly at a batch boundary. Plans come from the Spark model (`SparkModelSearch`,
fissure.control.adaptive.spark_model_search). The run writes `timeline.json` and `timeline.png` and returns
an `AdaptiveRunReport`; `DecisionProgress` shows its progress meanwhile
(fissure.lifecycle.progress_output).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

from fissure.control.adaptive.config import SwitchCosts
from fissure.control.adaptive.controller import AdaptiveController
from fissure.control.adaptive.decisions import Decision
from fissure.control.driver import Timeline, TimelineEntry, plot_timeline, run_adaptive
from fissure.control.model_correction import Correction
from fissure.control.plan_change import parse_fingerprint, plan_fingerprint
from fissure.lifecycle.progress import ProgressState, check_progress_mode
from fissure.program.chain import Pipeline
from fissure.model.types import Machine, Plan
from fissure.spark.adaptive.observations import OperatorProfiles, SparkObservations
from fissure.spark.adaptive.queries import QueryManager, canonical_plan
from fissure.spark.adaptive.realizer import SparkPlanRealizer, SwitchRecord
from fissure.spark.checkpoint.files import open_store
from fissure.spark.checkpoint.lock import CheckpointLock
from fissure.config import RunnerConfig
from fissure.spark.query.observed_metrics import Publication
from fissure.plan.plans import describe_plan, resolve_plan, spark_model_for
from fissure.lifecycle.progress_output import ProgressOutput
from fissure.spark.query.run_end import check_input_read
from fissure.spark.query.report import RunReport
from fissure.spark.query.binding import bind_sources
from fissure.spark.session.create import create_session, default_parallelism
from fissure.spark.io.sources import RateSource, SourceLike, check_before_spark, default_file_system
from fissure.control.adaptive.spark_model_search import SparkModelSearch
from fissure.spark.state.repartition import Repartitioner, spark_repartitioner
from fissure.program.graph import StreamGraph, as_graph

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdaptiveRunReport(RunReport):
    """A RunReport with the adaptive loop's timeline, switches and where they were written."""

    timeline: Timeline | None = None
    switches: tuple[SwitchRecord, ...] = ()
    timeline_json: str | None = None
    timeline_png: str | None = None
    queries: int = 0  # streaming queries started (1 + restarts)
    correction: str | None = None  # the model correction learned from the measured plans, described

    def describe(self) -> str:
        """The RunReport's key figures, then the plan switches, the queries and the timeline."""
        timeline = f", timeline {self.timeline_json}" if self.timeline_json else ""
        return (f"{super().describe()}, {len(self.switches)} switch{'' if len(self.switches) == 1 else 'es'}, "
                f"{self.queries} quer{'y' if self.queries == 1 else 'ies'}{timeline}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"


class DecisionProgress:
    """`fissure run`'s progress during an adaptive run, with the fields a plain run's progress has
    (fissure.spark.query.runner): throughput, batch, records, dead letters, the waiting operators'
    thread levels, the plan in force described with its keys, the operator table when one is due;
    and the last decision. In the form and at the moments `output`'s policy chooses."""

    def __init__(self, queries: QueryManager, observations: SparkObservations, output: ProgressOutput,
                 program: Pipeline | StreamGraph | None = None) -> None:
        self.queries, self.observations, self.output = queries, observations, output
        self.program = program  # names the keys of the plan's replicated regions
        self.last: ProgressState | None = None

    def __call__(self, decision: Decision, entry: TimelineEntry) -> None:
        live = self.queries.current
        self.last = ProgressState(batch_id=entry.batch_id, records_per_s=entry.throughput_per_s,
                                  input_records=self.observations.input_records,
                                  dead_letters=self.queries.dead_letter_log.count,
                                  plan=described_fingerprint(decision.plan_in_force, self.program),
                                  threads=levels_text(entry.thread_levels),
                                  decision=f"{decision.action.value}: {decision.reason}")
        self.output.show(self.last, table=live.runner.due_table if live is not None else None)

    def close(self) -> None:
        self.output.close(self.last)


def described_fingerprint(fingerprint: str, program: Pipeline | StreamGraph | None) -> str:
    """A plan fingerprint (`[a,b]x2`) as the progress line describes plans: with the key of each
    replicated region (`[a,b]x2(host)`, fissure.plan.plans.describe_plan)."""
    try:
        return describe_plan(parse_fingerprint(fingerprint), program)
    except ValueError:
        return fingerprint


def levels_text(levels: Mapping[str, Sequence[int]] | None) -> str:
    """Thread levels per operator as the progress line shows them: `enrich 8,6`."""
    return " ".join(f"{operator} {','.join(map(str, values))}" for operator, values in (levels or {}).items())


def run_adaptive_on_spark(
    pipeline: Pipeline | StreamGraph, source: SourceLike, sink, *, plan: object = "sequential", checkpoint: str | None = None,
    config: RunnerConfig = RunnerConfig(), switch_costs: SwitchCosts | None = None,
    injections: Mapping[int, object] | None = None, repartition: Repartitioner = spark_repartitioner,
    clock: Callable[[], float] = time.monotonic, on_decision: Callable[[Decision, TimelineEntry], None] | None = None,
) -> AdaptiveRunReport:
    """Run `pipeline` on Spark and re-plan while it runs (see the module docstring).

    Starts from `plan` (as `fissure.run` takes it) and feeds every micro-batch to an
    `AdaptiveController`. Every setting is `config`'s (RunnerConfig), as `fissure.run` takes it:
    the session (`spark`), `dead_letters`, `estimates`, how long the run goes (`available_now`,
    `timeout_s`, `max_batches`: the run ends after that many micro-batches, the next one, held at
    its gate, left for a run on the checkpoint), `progress`, `profiling` and `profile_log`
    (operators without a measured profile are planned on their declared estimates), the loop's
    parameters (`adaptation`) and `run_dir`, where `timeline.json` (every decision with its
    reason, and every switch with its measured cost) and `timeline.png` go (default: a new
    temporary directory). The loop cuts the plan's boundaries and sizes its state partitions
    itself: a config that sets `boundaries` or `state_partitions` is refused.

    The other arguments are not settings:
    `switch_costs`: not a setting but the controller's prior, measured defaults its own switches
    correct (SwitchCosts), given by tests that need other starting points.
    `injections`: not a setting but a benchmark's and a test's seam: a batch id to a plan the loop
    is made to try from there (evaluated, kept or reverted like any candidate).
    `repartition`: not a setting but a test seam replacing Spark's state repartitioner.
    `clock`: not a setting but the time source (a test's fake clock).
    `on_decision`: not a setting but a callback, `on_decision(decision, entry)`, that sees every
    decision as it is made.

    As in a plain run (fissure.spark.run): a failure that is the machine's starts the plan in force
    again on the checkpoint within `config.restart_policy()` (a bounded run's end-of-input batch
    too, QueryManager.finish_input), and a bounded run (available_now=True) that `timeout_s` ends
    with input left raises RunTimedOut.
    """
    given = [name for name in ("boundaries", "state_partitions") if getattr(config, name) is not None]
    if given:
        raise ValueError(f"{' and '.join(given)} would be dropped: the adaptive loop cuts its plan's boundaries and "
                         f"sizes its state partitions itself; leave {' and '.join(given)} out of the config")
    spark, estimates = config.spark, config.estimates
    available_now, timeout_s = config.available_now, config.timeout_s
    check_before_spark(as_graph(pipeline), bind_sources(as_graph(pipeline), source),
                       default_file_system(spark, config.master, config.spark_conf))
    origin = clock()

    def run_clock() -> float:  # seconds since the run started: the timeline's time axis
        return clock() - origin

    session = spark if spark is not None else create_session(config)
    cores = default_parallelism(session)
    initial = canonical_plan(resolve_plan(plan, pipeline, cores, estimates))
    chain = pipeline.operator_stats(estimates)
    settings = config.adaptation
    search = SparkModelSearch(spark_model_for(pipeline), method=settings.planning_method,
                              max_threads=settings.max_threads)
    controller = AdaptiveController(chain, Machine(cores=cores), initial, settings, switch_costs, search)
    owned_checkpoint = checkpoint is None
    checkpoint = checkpoint or tempfile.mkdtemp(prefix="fissure-checkpoint-")
    run_dir = config.run_dir or tempfile.mkdtemp(prefix="fissure-run-")
    os.makedirs(run_dir, exist_ok=True)
    # One lock for every query of the run: a switch's restart re-uses it (fissure.spark.checkpoint.lock).
    lock = CheckpointLock.acquire(open_store(session, checkpoint), pipeline.name, spark=session,
                                  lease_s=config.checkpoint_lease_s)
    queries = QueryManager(pipeline, source, sink, spark=session, checkpoint=checkpoint,
                           dead_letters=config.dead_letters, config=config, available_now=available_now,
                           clock=run_clock, runner_options={"lock": lock})
    realizer = SparkPlanRealizer(queries, repartition=repartition, clock=run_clock)
    started = run_clock()
    observations = SparkObservations(
        queries, OperatorProfiles(chain, config.profiling), cores=cores,
        offered_rate_per_s=float(source.rows_per_second) if isinstance(source, RateSource) else None,
        deadline_s=None if timeout_s is None else started + timeout_s, max_batches=config.max_batches,
        search=search, clock=run_clock)
    progress_output = ProgressOutput(check_progress_mode(config.progress),
                                     interval_s=config.progress_lines_interval_s, clock=clock)
    decision_progress = DecisionProgress(queries, observations, progress_output, pipeline)

    def decided(decision: Decision, entry: TimelineEntry) -> None:
        # Before the loop releases the next batch: that batch's progress report carries it.
        queries.publish(Publication(plan=decision.plan_in_force, decision=decision.action.value,
                                    decision_reason=decision.reason, decision_batch=entry.batch_id))
        decision_progress(decision, entry)
        if on_decision is not None:
            on_decision(decision, entry)

    planned = {int(batch): canonical_plan(resolve_plan(target, pipeline, cores, estimates))
               for batch, target in (injections or {}).items()}
    timeline = Timeline(title=f"fissure adaptive run: {pipeline.name} on Spark ({cores} cores)")
    timed_out_runner = None  # a bounded run's timeout ended it: its query's runner counts the input left
    end_of_input_from = None  # the end-of-input query's first batch (RunReport.end_of_input_from)
    try:
        queries.start(initial)
        run_adaptive(observations, realizer, controller, run_clock, injections=planned, on_decision=decided,
                     timeline=timeline)
        lock.check_held()  # the loop ended because another run took the checkpoint over
        live = queries.current
        if available_now and live is not None and live.query is not None and not live.query.isActive \
                and live.query.exception() is None and live.runner.time_aware:
            queries.finish_input()  # every window and expiry fires (fissure.spark.query.time_log)
            end_of_input_from = queries.current.runner.end_of_input_from if queries.current is not None else None
        if available_now and observations.timed_out and live is not None:
            timed_out_runner = live.runner
    finally:
        queries.close()
        decision_progress.close()
        lock.release()
    correction = controller.correction
    paths = write_timeline(timeline, realizer.switches, run_dir, initial, controller.plan, correction)
    report = AdaptiveRunReport(
        plan=controller.plan, batches=observations.batches, input_records=observations.input_records,
        dead_letters=queries.dead_letter_log.count, elapsed_s=run_clock() - started, checkpoint=checkpoint,
        timeline=timeline, switches=tuple(realizer.switches), timeline_json=paths[0], timeline_png=paths[1],
        queries=queries.queries_started, correction=correction.describe() if correction is not None else None,
        batch_log=tuple(queries.batch_log), batch_times=tuple(observations.times), admissions=queries.admissions,
        plan_text=describe_plan(controller.plan, pipeline), end_of_input_from=end_of_input_from,
        **time_summary(queries.batch_log))
    try:
        if timed_out_runner is not None:
            check_input_read(timed_out_runner, report, timeout_s)
    finally:
        if owned_checkpoint:
            shutil.rmtree(checkpoint, ignore_errors=True)
    return report


def time_summary(batch_log: Sequence) -> dict:
    """A run's state_keys (after the last batch that reported them), state_keys_peak, late_records
    and watermark, from its queries' batch records."""
    keys = [batch.state_keys for batch in batch_log if batch.state_keys is not None]
    marks = [batch.watermark for batch in batch_log if batch.watermark is not None]
    return {"state_keys": keys[-1] if keys else None, "state_keys_peak": max(keys) if keys else None,
            "late_records": sum(batch.late_records for batch in batch_log), "watermark": marks[-1] if marks else None}


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
