"""One contract for every control loop that runs while a program runs: observe, decide, realize.

    timeline = run_loop(observations, policy, realizer, clock)

The shape of Flink's Kubernetes autoscaler, which runs all of its decisions through a metric
collector, an evaluator and an executor:

- the collector: an iterable of observations, one per tick (a micro-batch, a window of them, a
  period of the worker's clock); the loop ends when it does. An observation carries the injected
  clock's `now_s` and a one-line `summary()`. A source that blocks for its next batch becomes
  one with `iter(source.next_batch, None)`.
- the policy (`Policy.decide(observation) -> decision`): a decision is a frozen value with its
  `reason` and a one-line `summary()`. The policy may keep state between ticks, but reads no
  clock, sleeps never and touches no engine: what it knows comes in with the observations.
- the realizer (`Realizer.apply(decision) -> cost_s`): the mechanism. It carries the decision out
  at the tick boundary and returns the seconds that cost, or None when the decision asked for no
  change and nothing was done. If it raises, what was in force before must still be.

`ControlLoop.step(observation)` is the one driver: it asks the policy, hands the decision to the
realizer and records a `LoopStep` (tick, time, observation, decision, reason, cost) in the
`LoopTimeline`. `run_loop` pulls the observations and steps; a loop whose ticks are pushed to it
(a runner's end-of-batch callback, a worker's period) calls `step` itself.

A policy may also have, and the driver then uses:
- `realized(decision, cost_s)`: the realizer carried the decision out at that cost (the adaptive
  loop learns what switches cost);
- `failed(decision, error, now_s) -> decision | None`: the realizer raised; the policy's answer
  is recorded, not realized (what was in force before still is). Without it the error propagates;
- `follow_up(observation) -> decision | None`: one more decision on the same tick, asked after
  the first is realized (a plan the adaptive loop is made to try).

The loops behind it: the adaptive loop (`fissure.control.driver.AdaptivePolicy`, realized on Spark
by `SparkPlanRealizer`), autopipelining (`fissure.control.autopipeline_control.AutopipelinePolicy`,
realized by setting a graph runner's pipeline boundaries) and the thread level of a waiting
operator (`fissure.control.thread_level`, realized by waking or suspending scheduler threads in
the Python worker, and by `fissure elastic-sim` on synthetic curves). `RecordingRealizer` is the
fake for tests.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

log = logging.getLogger(__name__)


class Observation(Protocol):
    """What a collector hands the loop each tick."""

    @property
    def now_s(self) -> float: ...

    def summary(self) -> str: ...


class Decision(Protocol):
    """What a policy answers: a frozen value with its reason."""

    @property
    def reason(self) -> str: ...

    def summary(self) -> str: ...


O = TypeVar("O", bound=Observation)
D = TypeVar("D", bound=Decision)


class Policy(Protocol[O, D]):
    """Decides on each observation (see the module docstring for the optional hooks)."""

    def decide(self, observation: O) -> D: ...


class Realizer(Protocol[D]):
    """Carries decisions out; returns the seconds that cost, or None when nothing was done."""

    def apply(self, decision: D) -> float | None: ...


@dataclass(frozen=True, slots=True)
class LoopStep(Generic[O, D]):
    """One decision of a loop, with the tick it was made on and what carrying it out cost."""

    tick: int  # 0 for the first observation
    time_s: float  # the observation's now_s
    observation: O
    decision: D
    cost_s: float | None  # None: nothing was carried out (no change asked, or the realizer failed)

    @property
    def reason(self) -> str:
        return self.decision.reason

    @property
    def observed(self) -> str:
        return self.observation.summary()

    def to_dict(self) -> dict[str, Any]:
        return {"tick": self.tick, "time_s": self.time_s, "observed": self.observed,
                "decision": self.decision.summary(), "reason": self.reason, "cost_s": self.cost_s}


class LoopTimeline(Generic[O, D]):
    """Every step of a loop, in order; the latest `max_steps` of them when bounded (a loop that
    lives as long as a worker)."""

    def __init__(self, max_steps: int | None = None) -> None:
        self._steps: deque[LoopStep[O, D]] = deque(maxlen=max_steps)

    def append(self, step: LoopStep[O, D]) -> None:
        self._steps.append(step)

    def __len__(self) -> int:
        return len(self._steps)

    @property
    def steps(self) -> tuple[LoopStep[O, D], ...]:
        return tuple(self._steps)

    def decisions(self) -> list[D]:
        return [step.decision for step in self._steps]

    def realized(self) -> list[LoopStep[O, D]]:
        """The steps whose decision the realizer carried out."""
        return [step for step in self._steps if step.cost_s is not None]

    def to_dict(self) -> dict[str, Any]:
        return {"steps": [step.to_dict() for step in self._steps]}


class ControlLoop(Generic[O, D]):
    """The driver: one `step` per observation (see the module docstring).

    `clock` times the policy's answer to a realizer failure; `on_step` sees every step as it is
    recorded (a live progress line, a loop's own timeline).
    """

    def __init__(self, policy: Policy[O, D], realizer: Realizer[D], clock: Callable[[], float], *,
                 timeline: LoopTimeline[O, D] | None = None,
                 on_step: Callable[[LoopStep[O, D]], None] | None = None) -> None:
        self.policy, self.realizer, self.clock = policy, realizer, clock
        self.timeline = timeline if timeline is not None else LoopTimeline()
        self.on_step = on_step
        self.ticks = 0
        # The optional hooks, looked up once: a worker's loop steps every period.
        self._realized = getattr(policy, "realized", None)
        self._failed = getattr(policy, "failed", None)
        self._follow_up = getattr(policy, "follow_up", None)

    def step(self, observation: O) -> tuple[LoopStep[O, D], ...]:
        """Decide on `observation`, realize the decision, record it; the steps of this tick."""
        tick = self.ticks
        self.ticks += 1
        steps = self._realize(tick, observation, self.policy.decide(observation))
        if self._follow_up is not None:
            more = self._follow_up(observation)
            if more is not None:
                steps += self._realize(tick, observation, more)
        return steps

    def _realize(self, tick: int, observation: O, decision: D) -> tuple[LoopStep[O, D], ...]:
        try:
            cost_s = self.realizer.apply(decision)
        except Exception as error:
            if self._failed is None:
                raise
            answer = self._failed(decision, error, self.clock())
            steps = (self._record(tick, observation, decision, None),)
            if answer is not None:
                steps += (self._record(tick, observation, answer, None),)
            return steps
        if cost_s is not None and self._realized is not None:
            self._realized(decision, cost_s)
        return (self._record(tick, observation, decision, cost_s),)

    def _record(self, tick: int, observation: O, decision: D, cost_s: float | None) -> LoopStep[O, D]:
        step = LoopStep(tick, observation.now_s, observation, decision, cost_s)
        self.timeline.append(step)
        if self.on_step is not None:
            self.on_step(step)
        return step


def run_loop(observations: Iterable[O], policy: Policy[O, D], realizer: Realizer[D], clock: Callable[[], float], *,
             timeline: LoopTimeline[O, D] | None = None,
             on_step: Callable[[LoopStep[O, D]], None] | None = None) -> LoopTimeline[O, D]:
    """Step through every observation until the collector ends; the timeline of every decision."""
    loop = ControlLoop(policy, realizer, clock, timeline=timeline, on_step=on_step)
    for observation in observations:
        loop.step(observation)
    return loop.timeline


class RealizerFailure(RuntimeError):
    """Raised by the recording fakes for the decisions they were told to refuse."""


class RecordingRealizer(Generic[D]):
    """The contract's fake realizer: records every decision it carried out.

    `cost_s(decision)`: the seconds it reports (None: nothing done); default 0.0 for every
    decision. Decisions for which `fail_for(decision)` is true raise `RealizerFailure` and are
    not recorded.
    """

    def __init__(self, cost_s: Callable[[D], float | None] = lambda decision: 0.0,
                 fail_for: Callable[[D], bool] = lambda decision: False) -> None:
        self.cost_s, self.fail_for = cost_s, fail_for
        self.applied: list[D] = []

    def apply(self, decision: D) -> float | None:
        if self.fail_for(decision):
            raise RealizerFailure(f"refusing {decision.summary()} (told to)")
        cost_s = self.cost_s(decision)
        if cost_s is not None:
            self.applied.append(decision)
        return cost_s
