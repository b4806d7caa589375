"""The autopipelining loop of a running graph: profile -> optimize -> insert -> evaluate, live.

After every micro-batch (the Runner calls `on_batch` at the end of its foreachBatch), the
loop counts batches into a window. When a window of `profile_batches` batches is complete it
reads what the graph PEs reported in it (fissure.runtime.profiling.pieces), and:
- profiling: builds mu(t), mu(o, t) (fissure.profile.graph_profile), runs the optimizer
  (`plan_autopipelining`) and the control stage's `decide_after_optimization`; an INSERT adds the
  ports as pipeline boundaries from the next batch on (`Runner.set_boundaries`: a Spark local
  property, no restart), a HALT ends the loop;
- evaluating: compares each new port's throughput (records into it per second of batch wall
  time) with the window before the insertion through `evaluate_round`, batch by batch against
  the spread this run's windows measured under unchanged cuts (fissure.control.noise): the ports
  that did not gain beyond the noise are removed again and blacklisted; CONTINUE goes back to
  profiling, HALT ends the loop.
The decisions (`AutopipelineControlDecision`, each with its reason) are kept in order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fissure.control.noise import NoiseEstimate
from fissure.control.autopipeline_control import (
    AutopipelineControlConfig, AutopipelineControlDecision, ControlAction, InsertionRound,
    decide_after_optimization, evaluate_round,
)
from fissure.plan.autopipeline import DEFAULT_BETA, plan_autopipelining
from fissure.profile.graph_profile import autopipeline_profile, piece_measurements, port_throughput_per_s
from fissure.streamgraph import NodeKind
from fissure.runtime.profiling.profiler import ProfileTally


@dataclass(frozen=True)
class GraphAutopipelineConfig:
    profile_batches: int = 3  # micro-batches per measurement window
    beta: float = DEFAULT_BETA
    # settle_s 0: the window after an insertion already ran entirely under the new boundaries.
    control: AutopipelineControlConfig = field(default_factory=lambda: AutopipelineControlConfig(settle_s=0.0))

    def __post_init__(self) -> None:
        if self.profile_batches < 1:
            raise ValueError(f"profile_batches must be >= 1, got {self.profile_batches}")


@dataclass(frozen=True)
class LoopDecision:
    batch_id: int
    boundaries_after: tuple[str, ...]
    decision: AutopipelineControlDecision


class GraphAutopipeliner:
    """Drives `runner` (a Runner that counts node by node: `profile_pieces=True`); see the module
    docstring."""

    def __init__(self, runner, config: GraphAutopipelineConfig = GraphAutopipelineConfig(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not runner.profile_pieces:
            raise ValueError("autopipelining needs the runner's node-by-node counts: Runner(..., profile_pieces=True)")
        self.runner, self.config, self.clock = runner, config, clock
        graph = runner.graph
        self.input_port_count = sum(1 for node in graph.nodes if node.kind not in (NodeKind.SOURCE, NodeKind.SINK))
        self.blacklist: frozenset[str] = frozenset()
        self.decisions: list[LoopDecision] = []
        self.phase = "profiling"  # "evaluating", "halted"
        self._round: InsertionRound | None = None
        self._window: list = []
        self._snapshot = ProfileTally()
        self._batch_snapshot = ProfileTally()
        self._batch_rates: list[dict[str, float]] = []  # per batch of the window: records/s per port
        self.noise = NoiseEstimate()  # the spread of a port's rate per batch under unchanged cuts
        self.last_profile = None

    def attach(self) -> GraphAutopipeliner:
        self.runner.listeners.on_batch.append(self.on_batch)
        return self

    def _first_nodes(self) -> list[str]:
        stages = self.runner.compiled.stages if self.runner.compiled is not None else ()
        return [stage.nodes[0] for stage in stages if stage.kind == "pe"]

    def on_batch(self, batch) -> None:
        if self.phase == "halted":
            return
        now = self.runner.profile_tally()
        self._batch_rates.append(port_throughput_per_s(piece_measurements(now.minus(self._batch_snapshot).pieces),
                                                       batch.wall_s))
        self._batch_snapshot = now
        self._window.append(batch)
        if len(self._window) < self.config.profile_batches:
            return
        measurements = piece_measurements(now.minus(self._snapshot).pieces)
        wall_s = sum(item.wall_s for item in self._window)
        samples = {port: tuple(rates[port] for rates in self._batch_rates if port in rates)
                   for port in {port for rates in self._batch_rates for port in rates}}
        self._snapshot = now
        self._window = []
        self._batch_rates = []
        throughput = port_throughput_per_s(measurements, wall_s)
        if not measurements:
            return
        if self.phase == "profiling":
            self._optimize(batch.batch_id, measurements, throughput, samples)
        else:
            self._evaluate(batch.batch_id, throughput, samples)
        for rates in samples.values():  # every window ran under unchanged cuts
            self.noise = self.noise.with_window(rates)

    def _optimize(self, batch_id: int, measurements, throughput, samples) -> None:
        profile = autopipeline_profile(self.runner.graph, measurements, stage_first_nodes=self._first_nodes(),
                                       beta=self.config.beta, blacklist=self.blacklist)
        self.last_profile = profile
        decision = decide_after_optimization(plan_autopipelining(profile), self.blacklist)
        boundaries = set(self.runner.boundaries)
        if decision.action is ControlAction.INSERT:
            self._round = InsertionRound(decision.insert, self.clock(),
                                         {port: throughput.get(port, float("nan")) for port in decision.insert},
                                         {port: samples.get(port, ()) for port in decision.insert})
            boundaries |= set(decision.insert)
            self.phase = "evaluating"
        else:
            self.phase = "halted"
        self._apply(batch_id, boundaries, decision)

    def _evaluate(self, batch_id: int, throughput, samples) -> None:
        decision = evaluate_round(self._round, throughput, self.clock(), self.blacklist, self.input_port_count,
                                  self.config.control, samples_after=samples, noise=self.noise)
        if decision.action is ControlAction.WAIT:
            self.decisions.append(LoopDecision(batch_id, tuple(self.runner.boundaries), decision))
            return
        self.blacklist = decision.blacklist
        self.phase = "halted" if decision.action is ControlAction.HALT else "profiling"
        self._apply(batch_id, set(self.runner.boundaries) - set(decision.revert), decision)

    def _apply(self, batch_id: int, boundaries: set[str], decision: AutopipelineControlDecision) -> None:
        self.runner.set_boundaries(boundaries)
        self.decisions.append(LoopDecision(batch_id, tuple(sorted(boundaries)), decision))
