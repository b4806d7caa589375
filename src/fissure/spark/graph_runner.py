"""Running a stream graph on Spark: one streaming query, one checkpoint, every sink per batch id.

    report = fissure.run_graph(graph, sources={"lines": FileSource("logs/")},
                               sinks={"alerts": FileSink("out/alerts"), "per_host": MemorySink()},
                               plan="planner", checkpoint="ckpt/")

`plan` is a plan over the graph's operators in execution order (`StreamGraph.names`):
"sequential" (the default: every stage unreplicated, one process per PE), "planner" (the
throughput model's pick, as for a chain: the graph is planned as the chain of its operators in
execution order, each operator loaded with the records it receives in the graph), a Plan, a
JSON plan file or a dict of one.

The foreachBatch function persists each micro-batch once and writes every sink (and the
dead letters) from it, each keyed by the batch id: a batch replayed after a crash overwrites what
it wrote before, so with idempotent sinks (FileSink, MemorySink) every sink holds each result
exactly once across restarts from the checkpoint.

Pipeline boundaries (`boundaries`: operators whose input port starts a new process of its graph
PE; default: where the plan's pipelines start) are fixed at start, or changed between micro-batches with `set_boundaries` (the tasks of
the next batch read them from a Spark local property; no restart). With `autopipeline=True`
the runner profiles its PEs and applies the autopipelining optimizer's insertions itself,
evaluated by the control stage (fissure.spark.graph_autopipeline).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from fissure.graph import PipelineError
from fissure.spark.compile_graph import BOUNDARIES_PROPERTY, CompiledGraph, compile_graph, sink_frame
from fissure.model.types import Plan
from fissure.spark.config import RunnerConfig
from fissure.spark.elastic import ThreadLevels
from fissure.spark.plans import resolve_plan
from fissure.spark.runner import ship_operator_modules
from fissure.spark.session import QUERY_DEFAULTS, create_session, default_parallelism
from fissure.spark.sinks import DeadLetterLog, write_dead_letters
from fissure.spark.sources import SourceLike, open_source
from fissure.streamgraph import StreamGraph
from fissure.worker.columns import DEAD_OPERATOR
from fissure.worker.elastic_stage import BatchThreadLevels
from fissure.worker.graph_pe import ROUTE, plan_graph_stages, state_partitions_of
from fissure.worker.graph_profiling import GraphProfileTally, GraphProfileTallyParam


@dataclass(frozen=True)
class GraphBatch:
    """One micro-batch as the driver saw it: when it ran, under which boundaries, what it wrote."""

    batch_id: int
    wall_s: float
    boundaries: tuple[str, ...]
    sink_rows: Mapping[str, int]
    dead_letters: int


@dataclass(frozen=True)
class GraphRunReport:
    batches: tuple[GraphBatch, ...]
    dead_letters: int
    elapsed_s: float
    checkpoint: str
    boundaries: tuple[str, ...]  # in force at the end
    decisions: tuple = ()  # the autopipelining loop's decisions, in order (graph_autopipeline)
    plan: Plan | None = None  # the plan the query ran
    # Per batch: the thread level of each waiting operator in each worker (docs/elastic-scheduler.md).
    thread_levels: tuple[BatchThreadLevels, ...] = ()


@dataclass
class _BatchListener:
    on_batch: list[Callable[[GraphBatch], None]] = field(default_factory=list)


class GraphRunner:
    """Start, watch and stop the query of a stream graph. See the module docstring."""

    def __init__(self, graph: StreamGraph, sources: Mapping[str, SourceLike], sinks: Mapping[str, object], *,
                 plan: object = "sequential", boundaries: Iterable[str] | None = None,
                 checkpoint: str | None = None, spark: SparkSession | None = None,
                 dead_letters=None, config: RunnerConfig = RunnerConfig(), profile: bool = False,
                 state_partitions: int | None = None, query_name: str | None = None,
                 estimates=None) -> None:
        missing_sinks = [name for name in graph.sinks if name not in sinks]
        unknown_sinks = sorted(set(sinks) - set(graph.sinks))
        if missing_sinks or unknown_sinks:
            raise PipelineError(f"graph {graph.name!r} has sinks {', '.join(graph.sinks)}; bind each one by name: "
                                f"missing {', '.join(missing_sinks) or 'none'}, unknown {', '.join(unknown_sinks) or 'none'}")
        unknown_sources = sorted(set(sources) - set(graph.sources))
        if unknown_sources:
            raise PipelineError(f"graph {graph.name!r} has no source {', '.join(map(repr, unknown_sources))}; its "
                                f"sources are {', '.join(graph.sources)}")
        self.graph, self.sources, self.sinks, self.config = graph, dict(sources), dict(sinks), config
        self.spark = spark if spark is not None else create_session(config)
        self.plan = resolve_plan(plan, graph, default_parallelism(self.spark), estimates)
        if boundaries is None:
            boundaries = [node for stage in plan_graph_stages(graph, self.plan) for node in stage.boundaries]
        self.boundaries = tuple(sorted(set(boundaries)))
        self._temporary_checkpoint = checkpoint is None
        self.checkpoint = checkpoint or tempfile.mkdtemp(prefix="fissure-graph-checkpoint-")
        self.dead_letter_sink = dead_letters
        self.dead_letter_log = DeadLetterLog(kept=config.dead_letters_kept)
        self.profile = profile
        self.state_partitions = state_partitions or state_partitions_of(graph, self.plan,
                                                                        max(1, config.default_state_partitions))
        self.query_name = query_name
        self.accumulator = None
        self.compiled: CompiledGraph | None = None
        self.query = None
        self.threads: ThreadLevels | None = None  # waiting operators' thread levels (start())
        self.batches: list[GraphBatch] = []
        self.listeners = _BatchListener()
        self._lock = threading.Lock()
        self._started_at = 0.0

    # --- boundaries --------------------------------------------------------------------------
    def set_boundaries(self, boundaries: Iterable[str]) -> None:
        """Boundaries for the micro-batches that start from now on (no restart)."""
        chosen = tuple(sorted(set(boundaries)))
        stateless = {node.name for node in self.graph.nodes if node.stateless}
        unknown = sorted(set(chosen) - stateless)
        if unknown:
            raise PipelineError(f"boundaries {', '.join(unknown)} name no stateless operator of graph {self.graph.name!r}")
        with self._lock:
            self.boundaries = chosen

    def profile_tally(self) -> GraphProfileTally:
        """Everything the graph PEs reported so far (empty when not profiling)."""
        return self.accumulator.value.copy() if self.accumulator is not None else GraphProfileTally()

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self, available_now: bool = False):
        operators = [node.operator for node in self.graph.nodes if node.operator is not None]
        operators += [SimpleNamespace(fn=node.join.fn, state_factory=None) for node in self.graph.nodes if node.join]
        ship_operator_modules(SimpleNamespace(operators=operators))
        frames = {name: open_source(self.sources[name], self.spark) for name in self.graph.sources
                  if name in self.sources}
        for name, value in {**QUERY_DEFAULTS,
                            "spark.sql.streaming.stateStore.providerClass": self.config.state_store_provider,
                            "spark.sql.shuffle.partitions": str(self.state_partitions)}.items():
            self.spark.conf.set(name, value)
        if self.profile:
            self.accumulator = self.spark.sparkContext.accumulator(GraphProfileTally(), GraphProfileTallyParam())
        self.threads = ThreadLevels(self.spark, self.graph, policy=self.config.thread_policy,
                                    config=self.config.thread_elasticity)
        self.compiled = compile_graph(self.graph, frames, plan=self.plan, boundaries=self.boundaries,
                                      state_partitions=self.state_partitions, profile_accumulator=self.accumulator,
                                      threads=self.threads.worker)
        stream = self.compiled.frame.writeStream.foreachBatch(self.threads.wrap(self._write_batch)).option(
            "checkpointLocation", self.checkpoint)
        if self.query_name:
            stream = stream.queryName(self.query_name)
        if available_now:
            stream = stream.trigger(availableNow=True)
        elif self.config.trigger_interval_s > 0:
            stream = stream.trigger(processingTime=f"{self.config.trigger_interval_s} seconds")
        self._started_at = time.monotonic()
        self.query = stream.start()
        return self.query

    def _write_batch(self, frame, batch_id: int) -> None:
        batch_id = int(batch_id)
        with self._lock:
            boundaries = self.boundaries
        self.spark.sparkContext.setLocalProperty(BOUNDARIES_PROPERTY, json.dumps({self.graph.name: list(boundaries)}))
        started_s = time.monotonic()
        frame = frame.persist()
        try:
            dead_count = write_dead_letters(frame, batch_id, self.dead_letter_log, self.dead_letter_sink)
            counts = {self.compiled.layout.stream_of(row[ROUTE]): row["count"] for row in
                      frame.filter(F.col(DEAD_OPERATOR).isNull()).groupBy(ROUTE).count().collect()}
            sink_rows = {}
            for sink in self.graph.sinks:
                self.sinks[sink].write(sink_frame(self.compiled, self.graph, sink, frame), batch_id)
                sink_rows[sink] = int(counts.get(self.graph.node(sink).inputs[0], 0))
        finally:
            frame.unpersist()
        record = GraphBatch(batch_id, time.monotonic() - started_s, boundaries, sink_rows, dead_count)
        self.batches.append(record)
        for listener in list(self.listeners.on_batch):
            try:
                listener(record)
            except Exception as error:  # noqa: BLE001 - a listener must not fail the batch
                print(f"fissure: batch listener failed: {error!r}", file=sys.stderr)

    def process_all_available(self) -> None:
        self.query.processAllAvailable()

    def await_termination(self, timeout_s: float | None = None) -> bool:
        if timeout_s is None:
            self.query.awaitTermination()
            return True
        return bool(self.query.awaitTermination(timeout_s))

    def stop(self, decisions: tuple = ()) -> GraphRunReport:
        if self.query is not None and self.query.isActive:
            self.query.stop()
        report = GraphRunReport(tuple(self.batches), self.dead_letter_log.count,
                                time.monotonic() - self._started_at if self._started_at else 0.0,
                                self.checkpoint, self.boundaries, decisions, self.plan,
                                self.threads.batches if self.threads is not None else ())
        if self._temporary_checkpoint:
            shutil.rmtree(self.checkpoint, ignore_errors=True)
        return report


def run_graph(graph: StreamGraph, sources: Mapping[str, SourceLike], sinks: Mapping[str, object], *,
              plan: object = "sequential", boundaries: Iterable[str] | None = None, checkpoint: str | None = None, spark: SparkSession | None = None,
              dead_letters=None, config: RunnerConfig = RunnerConfig(), available_now: bool = True,
              timeout_s: float | None = None, profile: bool = False,
              state_partitions: int | None = None, autopipeline: bool = False,
              autopipeline_config=None, estimates=None) -> GraphRunReport:
    """Run `graph` from its bound sources to its bound sinks (all by name) under `plan` (see the
    module docstring) and return the report; available_now=True processes what the sources hold
    now and ends. autopipeline=True profiles
    the graph PEs and places pipeline boundaries while the query runs (starting from `boundaries`;
    `autopipeline_config`: a GraphAutopipelineConfig); the report lists its decisions."""
    runner = GraphRunner(graph, sources, sinks, plan=plan, boundaries=boundaries, checkpoint=checkpoint, spark=spark,
                         dead_letters=dead_letters, config=config, profile=profile or autopipeline,
                         state_partitions=state_partitions, estimates=estimates)
    loop = None
    if autopipeline:
        from fissure.spark.graph_autopipeline import GraphAutopipelineConfig, GraphAutopipeliner

        loop = GraphAutopipeliner(runner, autopipeline_config or GraphAutopipelineConfig()).attach()
    try:
        runner.start(available_now=available_now)
        runner.await_termination(timeout_s)
    finally:
        report = runner.stop(tuple(loop.decisions) if loop is not None else ())
    return report
