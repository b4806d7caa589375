"""The autopipelining loop of a running graph: profile -> optimize -> insert -> evaluate, live.

The loop contract (fissure.control.loop) with its collector and realizer on a graph `Runner`:
- the collector: after every micro-batch (the Runner calls `on_batch` at the end of its
  foreachBatch) it counts the batch into a window; when a window of `profile_batches` batches is
  complete it reads what the graph PEs reported in it (fissure.runtime.profiling.pieces) and steps
  the loop with an `AutopipelineWindow`: each port's throughput (records into it per second of
  batch wall time), per batch and over the window, and the pieces' measurements;
- the policy: `AutopipelinePolicy` (fissure.control.autopipeline_control): profiling builds
  mu(t), mu(o, t) (fissure.profile.graph_profile) and runs the optimizer; evaluating compares each
  new port's throughput with the window before the insertion, batch by batch against the spread
  this run's windows measured under unchanged cuts (fissure.control.noise);
- the realizer: `RunnerBoundaries` adds an INSERT's ports as pipeline boundaries from the next
  batch on and removes a verdict's reverted ones (`Runner.set_boundaries`: a Spark local
  property, no restart), and sets how the graph PEs count (`Runner.count_pieces`): per fused run
  while screening, node by node (unfused) once a PROFILE says a cut may pay, not at all after HALT.
A cut is tried only when the model's bound on its gain beats the noise (the policy's timings:
fissure.profile.graph_profile.task_timings, fissure.control.cut_forecast); its trial window then
lasts the INSERT's `trial_batches`, the other windows `profile_batches`.
The decisions (`AutopipelineControlDecision`, each with its reason) are kept in order, with the
boundaries in force after each (`LoopDecision`).

Spark mechanism with no pyspark import: its collector reads the graph runner's batches and its
realizer sets the runner's boundaries as a Spark local property; fissure.spark.run drives it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from fissure.config import GraphAutopipelineConfig
from fissure.control.autopipeline_control import (
    AutopipelineControlDecision, AutopipelinePolicy, AutopipelineWindow, ControlAction,
)
from fissure.control.loop import ControlLoop, LoopStep
from fissure.control.noise import NoiseEstimate
from fissure.plan.autopipeline import AutopipelineProfile
from fissure.profile.graph_profile import (
    autopipeline_profile, piece_measurements, port_throughput_per_s, task_timings,
)
from fissure.program.nodes import NodeKind
from fissure.runtime.pe.element import pipelining_chunk_count
from fissure.runtime.profiling.profiler import ProfileTally


@dataclass(frozen=True)
class LoopDecision:
    batch_id: int
    boundaries_after: tuple[str, ...]
    decision: AutopipelineControlDecision


class RunnerBoundaries:
    """The autopipelining loop's realizer: a decision's ports become (INSERT) or stop being
    (a verdict's `revert`) pipeline boundaries of the runner's next batches. WAIT changes nothing."""

    def __init__(self, runner, clock: Callable[[], float], screens: bool = False) -> None:
        self.runner, self.clock, self.screens = runner, clock, screens

    def apply(self, decision: AutopipelineControlDecision) -> float | None:
        if decision.action is ControlAction.WAIT:
            return None
        started = self.clock()
        if decision.action is ControlAction.PROFILE:
            self._count("nodes")
            return self.clock() - started
        boundaries = set(self.runner.boundaries)
        if decision.action is ControlAction.INSERT:
            boundaries |= set(decision.insert)
        else:
            boundaries -= set(decision.revert)
        self.runner.set_boundaries(boundaries)
        if decision.action is ControlAction.HALT:
            self._count("off")  # nothing reads the counts any more: the graph PEs fuse, uncounted
        elif decision.action is ControlAction.CONTINUE and self.screens:
            self._count("runs")  # the next round starts with a fused screening window
        return self.clock() - started

    def _count(self, counting: str) -> None:
        if hasattr(self.runner, "count_pieces"):
            self.runner.count_pieces(counting)


class GraphAutopipeliner:
    """Drives `runner` (a Runner that counts node by node: its config's
    `replanning="autopipeline"`); see the module docstring."""

    def __init__(self, runner, config: GraphAutopipelineConfig = GraphAutopipelineConfig(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not runner.profile_pieces:
            raise ValueError("autopipelining needs the runner's node-by-node counts: "
                             "Runner(..., config=RunnerConfig(replanning='autopipeline'))")
        self.runner, self.config, self.clock = runner, config, clock
        graph = runner.graph
        input_port_count = sum(1 for node in graph.nodes if node.kind not in (NodeKind.SOURCE, NodeKind.SINK))
        self.cores = int(getattr(runner, "cores", 1) or 1)
        self.policy = AutopipelinePolicy(input_port_count, self._profile_of, config.control, self._timings_of)
        self.realizer = RunnerBoundaries(runner, clock, screens=self.policy.screens)
        self.loop = ControlLoop(self.policy, self.realizer, clock, on_step=self._record)
        self.decisions: list[LoopDecision] = []
        self._window: list = []
        self._snapshot = ProfileTally()
        self._batch_snapshot = ProfileTally()
        self._batch_rates: list[dict[str, float]] = []  # per batch of the window: records/s per port
        self._window_batches = config.profile_batches  # the window being collected: a trial's may be shorter

    # -- the policy's state, read-only --------------------------------------------------------------
    @property
    def phase(self) -> str:
        return self.policy.phase

    @property
    def blacklist(self) -> frozenset[str]:
        return self.policy.blacklist

    @property
    def noise(self) -> NoiseEstimate:
        return self.policy.noise

    @property
    def last_profile(self) -> AutopipelineProfile | None:
        return self.policy.last_profile

    @property
    def input_port_count(self) -> int:
        return self.policy.input_port_count

    def attach(self) -> GraphAutopipeliner:
        self.runner.listeners.on_batch.append(self.on_batch)
        if self.policy.screens:
            self.realizer._count("runs")  # the first window only screens: the graph PEs stay fused
        return self

    def _measured(self, tally) -> list:
        """The window's pieces as the phase reads them: node by node, except while screening,
        which reads totals (per fused run when counted so)."""
        measurements = piece_measurements(tally.pieces)
        if self.policy.phase == "screening":
            return [item for item in measurements if item.by_runs] or measurements
        return [item for item in measurements if not item.by_runs]

    def _first_nodes(self) -> tuple[str, ...]:
        stages = self.runner.compiled.stages if self.runner.compiled is not None else ()
        return tuple(stage.nodes[0] for stage in stages if stage.kind == "pe")

    def _profile_of(self, window: AutopipelineWindow, blacklist: frozenset[str]) -> AutopipelineProfile:
        return autopipeline_profile(self.runner.graph, window.measurements, stage_first_nodes=window.stage_first_nodes,
                                    beta=self.config.beta, blacklist=blacklist)

    def _timings_of(self, window: AutopipelineWindow):
        return task_timings(self.runner.graph, window.measurements, batches=window.batch_count, cores=self.cores,
                            stage_first_nodes=window.stage_first_nodes, chunk_count=pipelining_chunk_count,
                            batch_wall_s=window.wall_s or None)

    def on_batch(self, batch) -> None:
        """The collector: count the batch into the window; step the loop when the window is full."""
        if self.policy.phase == "halted":
            return
        now = self.runner.profile_tally()
        self._batch_rates.append(port_throughput_per_s(self._measured(now.minus(self._batch_snapshot)), batch.wall_s))
        self._batch_snapshot = now
        self._window.append(batch)
        if len(self._window) < self._window_batches:
            return
        measurements = self._measured(now.minus(self._snapshot))
        wall_s = sum(item.wall_s for item in self._window)
        samples = {port: tuple(rates[port] for rates in self._batch_rates if port in rates)
                   for port in {port for rates in self._batch_rates for port in rates}}
        batches = len(self._window)
        self._snapshot = now
        self._window = []
        self._batch_rates = []
        if not measurements:
            return
        self.loop.step(AutopipelineWindow(batch.batch_id, self.clock(), port_throughput_per_s(measurements, wall_s),
                                          samples, tuple(measurements), self._first_nodes(), batches, wall_s))

    def _record(self, step: LoopStep[AutopipelineWindow, AutopipelineControlDecision]) -> None:
        self.decisions.append(LoopDecision(step.observation.batch_id, tuple(self.runner.boundaries), step.decision))
        self._window_batches = step.decision.trial_batches or self.config.profile_batches
