"""`fissure.run`: one call that runs any program, a chain or a graph, adaptive or not, to its end.

    fissure.run(pipeline, FileSource("logs/"), FileSink("out/"), plan="planner")
    fissure.run(graph, {"lines": FileSource("logs/")}, {"alerts": FileSink("out/alerts")}, plan="planner")

A chain (a `Pipeline`, or a `StreamGraph` with one source, one sink and its operators one after
the other) runs on the chain runner (fissure.spark.runner), which also re-plans while it runs
(`adaptive=True`) and places waiting operators on elastic threads. Any other graph runs on the
graph runner (fissure.spark.graph_runner), planned the same way (`plan="planner"`), with live
pipeline boundaries and the autopipelining loop (`autopipeline=True`), which a chain gets too:
it then runs as the graph of one source and one sink.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import SparkSession

from fissure.graph import OperatorEstimate, Pipeline, PipelineError
from fissure.profile.settings import ProfileSettings
from fissure.spark.adaptive import run_adaptive_on_spark
from fissure.spark.config import RunnerConfig
from fissure.spark.graph_runner import run_graph
from fissure.spark.runner import Runner
from fissure.streamgraph import StreamGraph, as_graph


def _bound(program: StreamGraph, value, role: str, names: tuple[str, ...]) -> Mapping:
    """The program's sources or sinks by name: a mapping as given, one object for the only one."""
    if isinstance(value, Mapping):
        return value
    if len(names) == 1 and value is not None:
        return {names[0]: value}
    raise PipelineError(f"graph {program.name!r} has {role}s {', '.join(names)}; pass a dict of them by name "
                        f"({{{names[0]!r}: ...}})")


class _FromConfig:
    def __repr__(self) -> str:
        return "config.profiling"


FROM_CONFIG = _FromConfig()  # `profile=` left out: the config's profiling settings


def run(program: Pipeline | StreamGraph, source=None, sink=None, *, plan: object = "sequential",
        checkpoint: str | None = None, spark: SparkSession | None = None, dead_letters=None,
        estimates: Mapping[str, OperatorEstimate] | None = None, config: RunnerConfig = RunnerConfig(),
        available_now: bool = True, timeout_s: float | None = None, progress: bool | None = None,
        profile: ProfileSettings | None | _FromConfig = FROM_CONFIG, profile_log: str | None = None,
        adaptive: bool = False, adaptive_config=None, run_dir: str | None = None,
        autopipeline: bool = False, autopipeline_config=None, boundaries=None):
    """Run `program` from `source` to `sink` and return the run's report.

    For a graph, `source` and `sink` are dicts by name (or one object where it has one).
    available_now=True processes what the sources hold now and ends (file sources); otherwise the
    query runs until `timeout_s` passes (or forever without it). adaptive=True re-plans while it
    runs (`adaptive_config`: an AdaptiveConfig; `run_dir`: where its timeline goes) and returns an
    AdaptiveRunReport; autopipeline=True places pipeline boundaries while it runs
    (`autopipeline_config`: a GraphAutopipelineConfig) and returns a GraphRunReport. Settings not
    given here come from `config` (RunnerConfig: profiling, threads, adaptation, autopipelining);
    profile=None turns profiling off.
    """
    if profile is FROM_CONFIG:
        profile = config.profiling
    adaptive_config = adaptive_config or config.adaptation
    autopipeline_config = autopipeline_config or config.autopipelining
    chain = program if isinstance(program, Pipeline) else as_graph(program).as_chain()
    if chain is not None and not autopipeline:
        if isinstance(program, StreamGraph):
            source = next(iter(source.values())) if isinstance(source, Mapping) else source
            sink = next(iter(sink.values())) if isinstance(sink, Mapping) else sink
        if adaptive:
            return run_adaptive_on_spark(chain, source, sink, plan=plan, checkpoint=checkpoint, spark=spark,
                                         dead_letters=dead_letters, estimates=estimates, config=config,
                                         available_now=available_now, timeout_s=timeout_s, progress=progress,
                                         profile=profile, profile_log=profile_log, adaptive_config=adaptive_config,
                                         run_dir=run_dir)
        runner = Runner(chain, source, sink, plan=plan, checkpoint=checkpoint, spark=spark,
                        dead_letters=dead_letters, estimates=estimates, config=config, progress=progress,
                        profile=profile, profile_log=profile_log)
        runner.start(available_now=available_now)
        try:
            runner.await_termination(timeout_s)
        finally:
            report = runner.stop()
        return report
    graph = as_graph(program)
    if adaptive:
        raise PipelineError(f"graph {graph.name!r} is not a chain: adaptive re-planning runs chains (one source, "
                            f"one sink, operators one after the other); run it with plan='planner' instead")
    return run_graph(graph, _bound(graph, source, "source", graph.sources), _bound(graph, sink, "sink", graph.sinks),
                     plan=plan, boundaries=boundaries, checkpoint=checkpoint, spark=spark, dead_letters=dead_letters,
                     config=config, available_now=available_now, timeout_s=timeout_s, estimates=estimates,
                     autopipeline=autopipeline, autopipeline_config=autopipeline_config,
                     profile=profile is not None and profile.enabled)
