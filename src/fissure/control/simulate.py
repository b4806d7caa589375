"""A model-driven stand-in for a running query: for tests and the scenario benchmarks.

`SimulatedSystem` is both the loop's `ObservationSource` and its `PlanRealizer`. Its truth is
the throughput model (`fissure.model.throughput.evaluate`) on the *true* operator statistics of
the workload phase in force, which may change at given times (an operator's cost quadruples,
the offered rate drops); the controller sees only what a profiler would report:

- per batch, the records taken (a full batch when the source always has data, else what arrived
  since the last batch, up to `max_batch_records`; a batch that drained the source waits for
  `trigger_interval_s`), processed at the plan's model throughput
  times seeded noise; the first batch after a switch (and the run's first) runs
  `restart_slowdown` times slower (restart effects);
- the measured throughput (records per second of processing), the offered rate (noisy) and the
  backlog when the source has a rate, and per-operator estimates: the true cost and selectivity
  times seeded noise, backed by the tuples that reached the operator;
- a switch loses `switch_costs.cost_s(kind)` seconds of processing, during which the input keeps
  arriving.

Nothing here is timed: time is a `FakeClock` the simulator advances. These runs answer "does the
loop decide well if the model is right about the system", not how Spark behaves.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from fissure.control.adaptive.config import SwitchCosts
from fissure.control.adaptive.observations import BatchObservation, OperatorProfile
from fissure.control.adaptive.search import ScoredPlan
from fissure.control.driver import RealizedSwitch
from fissure.control.plan_change import SwitchKind, plan_fingerprint
from fissure.model.throughput import evaluate
from fissure.model.types import Machine, OperatorStats, Plan
from fissure.plan.planners import PlanResult, plan_chain


class FakeClock:
    """The injected clock of tests and simulations: it moves only when told to."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s

    def __call__(self) -> float:
        return self._now_s

    def advance(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ValueError(f"a clock only moves forward, got {seconds} s")
        self._now_s += seconds


@dataclass(frozen=True)
class WorkloadPhase:
    """The true workload from `start_s` on."""

    start_s: float
    operators: tuple[OperatorStats, ...]
    offered_rate_per_s: float | None = None  # None: the source always has a full batch waiting


@dataclass(frozen=True)
class SimulationConfig:
    """The simulated system.

    Attributes:
        machine: the true machine constants (cores, delta, c_p) the model runs with.
        phases: the workload over time, in order of `start_s`; the first starts at 0.
        duration_s: the run ends at the first batch boundary after this time.
        seed: seeds every noise draw.
        throughput_noise: relative standard deviation of a batch's processing speed.
        operator_noise: relative standard deviation of a per-batch operator estimate.
        rate_noise: relative standard deviation of the reported offered rate.
        max_batch_records: the most records one batch takes (maxOffsetsPerTrigger and the like).
        trigger_interval_s: a batch that leaves no backlog behind lasts at least this long (the
            source's next poll); with a backlog the next batch starts at once.
        restart_slowdown: how much slower the first batch after a switch runs.
        switch_costs: the seconds of processing each kind of switch truly loses.
    """

    machine: Machine
    phases: tuple[WorkloadPhase, ...]
    duration_s: float
    seed: int = 0
    throughput_noise: float = 0.03
    operator_noise: float = 0.05
    rate_noise: float = 0.02
    max_batch_records: int = 20_000
    trigger_interval_s: float = 1.0
    restart_slowdown: float = 1.5
    switch_costs: SwitchCosts = field(default_factory=SwitchCosts)

    def __post_init__(self) -> None:
        if not self.phases or self.phases[0].start_s != 0:
            raise ValueError("a simulation needs phases, the first starting at 0 s")
        starts = [phase.start_s for phase in self.phases]
        if starts != sorted(starts):
            raise ValueError(f"phases must be in order of start_s, got {starts}")
        if self.max_batch_records < 1 or not self.trigger_interval_s > 0 or not self.restart_slowdown >= 1:
            raise ValueError("need max_batch_records >= 1, trigger_interval_s > 0, restart_slowdown >= 1")


class SimulatedSystem:
    """A query whose throughput is the model's: an `ObservationSource` and a `PlanRealizer`."""

    def __init__(self, config: SimulationConfig, initial_plan: Plan, clock: FakeClock | None = None) -> None:
        self.config = config
        self.clock = clock or FakeClock()
        self._plan = initial_plan
        self._random = random.Random(config.seed)
        self._batch_id = -1
        self._fresh = True  # the next batch is the first under its plan
        self._backlog = 0.0
        self._arrived_until_s = self.clock()
        self.switches: list[RealizedSwitch] = []

    @property
    def plan(self) -> Plan:
        return self._plan

    # -- the truth ------------------------------------------------------------------------------
    def phase_at(self, time_s: float) -> WorkloadPhase:
        current = self.config.phases[0]
        for phase in self.config.phases:
            if phase.start_s <= time_s:
                current = phase
        return current

    def capacity_per_s(self, plan: Plan, time_s: float) -> float:
        """The model's throughput of `plan` on the true workload at `time_s`."""
        return evaluate(self.phase_at(time_s).operators, plan, self.config.machine).throughput_per_s

    def best_static(self, time_s: float, method: str = "optimal") -> PlanResult:
        """The best plan for the true workload at `time_s` (the scenarios' yardstick)."""
        return plan_chain(self.phase_at(time_s).operators, self.config.machine, method)

    # -- PlanRealizer -----------------------------------------------------------------------------
    def apply(self, plan: Plan, kind: SwitchKind) -> float:
        cost_s = self.config.switch_costs.cost_s(kind)
        self.clock.advance(cost_s)
        self._plan = plan
        self._fresh = True
        self.switches.append(RealizedSwitch(plan_fingerprint(plan), kind, cost_s))
        return cost_s

    # -- ObservationSource ------------------------------------------------------------------------
    def next_batch(self) -> BatchObservation | None:
        config = self.config
        start_s = self.clock()
        if start_s >= config.duration_s:
            return None
        phase = self.phase_at(start_s)
        rated = phase.offered_rate_per_s is not None
        if rated:
            self._backlog += self._arrivals(self._arrived_until_s, start_s)
            self._arrived_until_s = start_s
            records = int(min(self._backlog, config.max_batch_records))
            self._backlog -= records
        else:
            records = config.max_batch_records
        processing_s = 0.0
        throughput = None
        if records > 0:
            capacity = self.capacity_per_s(self._plan, start_s)
            speed = max(0.2, 1 + config.throughput_noise * self._random.gauss(0, 1))
            slowdown = config.restart_slowdown if self._fresh else 1.0
            processing_s = records / capacity * slowdown / speed
            throughput = records / processing_s
        self._fresh = False
        # Spark's default trigger: the next batch starts at once while data waits; a batch that
        # drained the source waits for the trigger interval (the source's next poll).
        caught_up = rated and self._backlog < 1
        wall_s = max(processing_s, config.trigger_interval_s) if caught_up else processing_s
        if wall_s <= 0:
            wall_s = config.trigger_interval_s
        self.clock.advance(wall_s)
        self._batch_id += 1
        offered = None
        if rated:
            offered = phase.offered_rate_per_s * max(0.0, 1 + config.rate_noise * self._random.gauss(0, 1))
        return BatchObservation(
            batch_id=self._batch_id,
            now_s=self.clock(),
            records_in=records,
            duration_s=processing_s,
            throughput_per_s=throughput,
            operators=self._profiles(phase.operators, records),
            offered_rate_per_s=offered,
            backlog_records=int(self._backlog) if rated else None,
            cores=config.machine.cores,
            plan_in_force=plan_fingerprint(self._plan),
        )

    def _arrivals(self, from_s: float, to_s: float) -> float:
        """Records arriving between two times, phase by phase."""
        total = 0.0
        phases = self.config.phases
        for index, phase in enumerate(phases):
            end_s = phases[index + 1].start_s if index + 1 < len(phases) else math.inf
            low, high = max(from_s, phase.start_s), min(to_s, end_s)
            if high > low and phase.offered_rate_per_s is not None:
                total += phase.offered_rate_per_s * (high - low)
        return total

    def _profiles(self, operators: Sequence[OperatorStats], records: int) -> tuple[OperatorProfile, ...]:
        """Noisy per-operator estimates, each backed by the tuples that reached the operator."""
        if records <= 0:
            return ()
        noise = self.config.operator_noise
        profiles = []
        reaching = float(records)
        for operator in operators:
            samples = int(reaching)
            if samples > 0:
                cost = operator.cost_us * max(0.0, 1 + noise * self._random.gauss(0, 1))
                selectivity = operator.selectivity * max(0.0, 1 + noise * self._random.gauss(0, 1))
                stats = OperatorStats(operator.name, operator.kind, cost, selectivity, operator.key, operator.max_scale,
                                      combined=operator.combined)
                profiles.append(OperatorProfile(stats, samples))
            reaching *= operator.selectivity
        return tuple(profiles)


class TablePlanSearch:
    """A `PlanSearch` fake for tests: candidate plans and their predictions from a table.

    Every plan given is a candidate, predicted as given; a plan not given has no prediction
    (ValueError, as a planner that cannot evaluate a plan would).
    """

    def __init__(self, *scored: ScoredPlan) -> None:
        self._table = {plan_fingerprint(entry.plan): entry for entry in scored}

    def predict_per_s(self, operators: Sequence[OperatorStats], plan: Plan, machine: Machine) -> float:
        fingerprint = plan_fingerprint(plan)
        if fingerprint not in self._table:
            raise ValueError(f"no prediction for {fingerprint}")
        return self._table[fingerprint].predicted_throughput_per_s

    def candidates(self, operators: Sequence[OperatorStats], machine: Machine) -> tuple[ScoredPlan, ...]:
        return tuple(self._table.values())
