"""The adaptive loop's scenarios on the model-driven simulator (tests and benchmarks share them).

(a) `reach-best`: start sequential and reach the best static plan.
(b) `cost-change`: an operator's cost quadruples mid-run; the loop re-plans and recovers.
(c) `bad-injection`: an injected plan change that hurts is rolled back and never retried.
(d) `rate-drop`: the offered rate drops to a trickle, the loop releases threads, and takes them
    back when the rate returns.
(e) `model-mismatch` (beyond the first four): the model believes an exchange costs 2 us per
    tuple, it costs 40, so the planner's favourites hurt: the loop reverts and blacklists the
    first one, learns from the measurements that c_p is about 20 times what it believed
    (fissure.control.model_correction) and plans with the corrected model.

All of them run a five-operator chain (parse, enrich, filter, a keyed count, a stateful report)
on a 4-core model machine: a simulation of the model, not a Spark run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fissure.control.adaptive.config import AdaptiveConfig, SwitchCosts
from fissure.control.adaptive.controller import AdaptiveController
from fissure.control.adaptive.decisions import Decision
from fissure.control.driver import Timeline, run_adaptive
from fissure.control.simulate import SimulatedSystem, SimulationConfig, WorkloadPhase
from fissure.model.types import Kind, Machine, OperatorStats, Plan, RegionPlan

CHAIN = (
    OperatorStats("parse", Kind.STATELESS, 20.0, 1.0),
    OperatorStats("enrich", Kind.STATELESS, 40.0, 1.0),
    OperatorStats("filter", Kind.STATELESS, 5.0, 0.5),
    OperatorStats("count", Kind.PARTITIONED, 30.0, 0.2, key=("user",)),
    OperatorStats("report", Kind.STATEFUL, 10.0, 1.0),
)
MACHINE = Machine(cores=4, thread_switch_overhead_us=1.0, replication_cost_us=2.0)
SEQUENTIAL = Plan((RegionPlan((tuple(operator.name for operator in CHAIN),)),), method="sequential")
# Scenario (c)'s injected change: every operator in its own process, no replicas (-45 % here).
ALL_PIPELINED = Plan((RegionPlan(tuple((operator.name,) for operator in CHAIN)),), method="injected")
SCENARIO_NAMES = ("reach-best", "cost-change", "bad-injection", "rate-drop", "model-mismatch")


def with_cost(chain: tuple[OperatorStats, ...], name: str, factor: float) -> tuple[OperatorStats, ...]:
    return tuple(replace(op, cost_us=op.cost_us * factor) if op.name == name else op for op in chain)


@dataclass(frozen=True)
class Scenario:
    """One scenario: the simulated truth, what the controller is told, and what is injected."""

    name: str
    title: str
    simulation: SimulationConfig
    initial_plan: Plan = SEQUENTIAL
    declared: tuple[OperatorStats, ...] = CHAIN  # the chain the controller knows (costs are profiled)
    believed_machine: Machine | None = None  # the controller's model constants; None: the true ones
    config: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    switch_costs: SwitchCosts = field(default_factory=SwitchCosts)  # what the controller assumes
    injections: dict[int, Plan] = field(default_factory=dict)  # batch id -> plan
    change_s: float | None = None  # when the workload changes


@dataclass(frozen=True)
class ScenarioRun:
    scenario: Scenario
    timeline: Timeline
    decisions: tuple[Decision, ...]
    system: SimulatedSystem
    controller: AdaptiveController


def scenario(name: str, seed: int = 0, quick: bool = False) -> Scenario:
    """The scenario called `name` (one of SCENARIO_NAMES); `quick` shortens its phases."""
    scale = 0.6 if quick else 1.0
    if name == "reach-best":
        phases = (WorkloadPhase(0.0, CHAIN),)
        return Scenario(name, "(a) start sequential, reach the best static plan",
                        SimulationConfig(MACHINE, phases, 120.0 * scale, seed))
    if name == "cost-change":
        change_s = 90.0 * scale
        phases = (WorkloadPhase(0.0, CHAIN), WorkloadPhase(change_s, with_cost(CHAIN, "count", 4.0)))
        return Scenario(name, "(b) the keyed count's cost quadruples mid-run",
                        SimulationConfig(MACHINE, phases, change_s + 110.0 * scale, seed), change_s=change_s)
    if name == "bad-injection":
        phases = (WorkloadPhase(0.0, CHAIN),)
        return Scenario(name, "(c) an injected plan change that hurts",
                        SimulationConfig(MACHINE, phases, 150.0 * scale, seed),
                        injections={int(100 * scale): ALL_PIPELINED})
    if name == "rate-drop":
        drop_s, back_s = 100.0 * scale, 220.0 * scale
        phases = (WorkloadPhase(0.0, CHAIN, 60_000.0), WorkloadPhase(drop_s, CHAIN, 3_000.0),
                  WorkloadPhase(back_s, CHAIN, 60_000.0))
        return Scenario(name, "(d) the offered rate drops to a trickle, then returns",
                        SimulationConfig(MACHINE, phases, back_s + 80.0 * scale, seed), change_s=drop_s)
    if name == "model-mismatch":
        truth = replace(MACHINE, replication_cost_us=40.0)
        return Scenario(name, "(e) an exchange costs 40 us per tuple, the model believes 2",
                        SimulationConfig(truth, (WorkloadPhase(0.0, CHAIN),), 200.0 * scale, seed),
                        believed_machine=MACHINE)
    raise ValueError(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIO_NAMES)}")


def run_scenario(chosen: Scenario) -> ScenarioRun:
    """Run the controller on the simulated system until the scenario's time is up."""
    system = SimulatedSystem(chosen.simulation, chosen.initial_plan)
    controller = AdaptiveController(chosen.declared, chosen.believed_machine or chosen.simulation.machine,
                                    chosen.initial_plan, chosen.config, chosen.switch_costs)
    timeline = Timeline(title=f"{chosen.title} (model simulation, seed {chosen.simulation.seed})")
    decisions: list[Decision] = []
    run_adaptive(system, system, controller, system.clock, injections=chosen.injections, timeline=timeline,
                 on_decision=lambda decision, entry: decisions.append(decision))
    return ScenarioRun(chosen, timeline, tuple(decisions), system, controller)
