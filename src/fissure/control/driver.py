"""The adaptive loop behind the loop contract (fissure.control.loop), and its timeline.

    timeline = run_adaptive(source, realizer, controller, clock)
    timeline.write_json("run.json"); plot_timeline(timeline, "run.png")

`source.next_batch()` gives one `BatchObservation` per micro-batch (None when the stream ends);
`AdaptivePolicy` is the `AdaptiveController` as a loop policy (with the plans it is made to try),
and `PlanSwitchRealizer` hands every switch a decision carries to a `PlanRealizer` at the batch
boundary, which returns what the switch cost. `run_adaptive` runs them through `run_loop`. The
Spark realizer (stop the query, repartition state, restart on the checkpoint; or re-cut a PE's
processes) lives in the spark layer; `RecordingPlanRealizer` is the fake for tests, and
`fissure.control.simulate` a model-driven system that is both a source and a realizer. Every
decision goes into a `Timeline` (per batch: time, throughput, plan in force, decision and
reason) with a JSON export and a PNG plot.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

from fissure.control.adaptive.config import SwitchCosts
from fissure.control.adaptive.controller import AdaptiveController
from fissure.control.adaptive.decisions import Action, Decision, Phase
from fissure.control.adaptive.observations import BatchObservation, usable
from fissure.control.loop import LoopStep, RealizerFailure, run_loop
from fissure.control.plan_change import SwitchKind, plan_fingerprint
from fissure.model.types import Plan

log = logging.getLogger(__name__)


class ObservationSource(Protocol):
    def next_batch(self) -> BatchObservation | None:
        """The next micro-batch's measurements; None when the stream has ended."""
        ...


class PlanRealizer(Protocol):
    """What touches the engine: applies a plan at a batch boundary.

    `apply` returns the seconds of processing the switch cost (None: `PlanSwitchRealizer` times
    the call).
    When it raises, the previous plan must still be in force.
    """

    def apply(self, plan: Plan, kind: SwitchKind) -> float | None: ...


@dataclass(frozen=True)
class RealizedSwitch:
    plan: str  # fingerprint
    kind: SwitchKind
    cost_s: float


class RecordingPlanRealizer:
    """The test fake of a `PlanRealizer`: records every switch and reports the cost `costs` gives
    its kind.

    Plans whose fingerprint is in `fail_for` raise `RealizerFailure` (and are not recorded).
    """

    def __init__(self, costs: SwitchCosts | None = None, fail_for: Collection[str] = ()) -> None:
        self.costs = costs or SwitchCosts()
        self.fail_for = frozenset(fail_for)
        self.switches: list[RealizedSwitch] = []

    def apply(self, plan: Plan, kind: SwitchKind) -> float:
        fingerprint = plan_fingerprint(plan)
        if fingerprint in self.fail_for:
            raise RealizerFailure(f"refusing {fingerprint} (told to)")
        cost_s = self.costs.cost_s(kind)
        self.switches.append(RealizedSwitch(fingerprint, kind, cost_s))
        return cost_s


@dataclass(frozen=True)
class TimelineEntry:
    """One decision, with the batch it was made on."""

    batch_id: int
    time_s: float
    throughput_per_s: float | None
    records_in: int
    offered_rate_per_s: float | None
    plan: str  # fingerprint of the plan the batch ran under
    threads: int  # threads of that plan
    action: str
    reason: str
    plan_after: str  # fingerprint of the plan in force once the decision is realized
    switch_kind: str | None = None
    switch_cost_s: float | None = None  # as the realizer measured it
    # Operators on elastic threads -> their thread level in each worker after the batch.
    thread_levels: dict[str, list[int]] | None = None


@dataclass
class Timeline:
    """Every decision of a run, in order, and what the runs' batches measured."""

    entries: list[TimelineEntry] = field(default_factory=list)
    title: str = "fissure adaptive run"

    def record(self, observation: BatchObservation, plan: Plan, decision: Decision, cost_s: float | None) -> TimelineEntry:
        switch = decision.switch if cost_s is not None else None
        entry = TimelineEntry(
            batch_id=observation.batch_id,
            time_s=observation.now_s,
            throughput_per_s=usable(observation.throughput_per_s),
            records_in=observation.records_in,
            offered_rate_per_s=usable(observation.offered_rate_per_s),
            plan=plan_fingerprint(plan),
            threads=plan.threads,
            action=decision.action.value,
            reason=decision.reason,
            plan_after=decision.plan_in_force,
            switch_kind=switch.kind.value if switch is not None else None,
            switch_cost_s=cost_s,
            thread_levels={name: list(levels) for name, levels in observation.thread_levels.items()}
            if observation.thread_levels else None,
        )
        self.entries.append(entry)
        return entry

    def switches(self) -> list[TimelineEntry]:
        """The entries whose decision the realizer carried out."""
        return [entry for entry in self.entries if entry.switch_kind is not None]

    def batches(self) -> list[TimelineEntry]:
        """One entry per batch (the last decision made on it)."""
        last: dict[int, TimelineEntry] = {}
        for entry in self.entries:
            last[entry.batch_id] = entry
        return list(last.values())

    def to_dict(self) -> dict:
        return {"title": self.title, "entries": [asdict(entry) for entry in self.entries]}

    def write_json(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(self.to_dict(), handle, indent=1)
            handle.write("\n")


class AdaptivePolicy:
    """The `AdaptiveController` as a loop policy: it decides on every batch; a plan in `injections`
    (batch id -> plan) is tried from that batch on, as soon as no evaluation runs and the batch's
    decision switched nothing (scenario (c), or an operator's request)."""

    def __init__(self, controller: AdaptiveController, injections: Mapping[int, Plan] | None = None) -> None:
        self.controller = controller
        self._pending = dict(sorted((injections or {}).items()))
        self._last: Decision | None = None
        self.ran_under: Plan = controller.plan  # the plan the last observed batch ran under

    def decide(self, observation: BatchObservation) -> Decision:
        self.ran_under = self.controller.plan
        self._last = self.controller.observe(observation)
        return self._last

    def follow_up(self, observation: BatchObservation) -> Decision | None:
        due = next((batch_id for batch_id in self._pending if batch_id <= observation.batch_id), None)
        if due is None or self._last is None or self._last.switch is not None \
                or self.controller.phase is Phase.EVALUATING:
            return None
        plan = self._pending.pop(due)
        return self.controller.inject(plan, observation.batch_id, observation.now_s, f"injected at batch {due}")

    def realized(self, decision: Decision, cost_s: float) -> None:
        self.controller.switch_applied(decision.switch.kind, cost_s)

    def failed(self, decision: Decision, error: Exception, now_s: float) -> Decision:
        """A failed switch leaves the old plan in force: the controller blacklists the change, or
        halts when the switch was one back."""
        log.exception("adaptive: the realizer failed to apply %s", decision.switch.change.after)
        return self.controller.switch_failed(decision.batch_id, now_s, f"{type(error).__name__}: {error}")


class PlanSwitchRealizer:
    """The adaptive loop's realizer: hands the switch a decision carries to a `PlanRealizer`;
    a decision without one changes nothing. A cost the plan realizer does not report is timed
    with `clock`."""

    def __init__(self, plans: PlanRealizer, clock: Callable[[], float]) -> None:
        self.plans, self.clock = plans, clock

    def apply(self, decision: Decision) -> float | None:
        switch = decision.switch
        if switch is None:
            return None
        started = self.clock()
        cost_s = usable(self.plans.apply(switch.plan, switch.kind))
        return cost_s if cost_s is not None else max(0.0, self.clock() - started)


def run_adaptive(
    source: ObservationSource,
    realizer: PlanRealizer,
    controller: AdaptiveController,
    clock: Callable[[], float],
    *,
    injections: Mapping[int, Plan] | None = None,
    on_decision: Callable[[Decision, TimelineEntry], None] | None = None,
    timeline: Timeline | None = None,
) -> Timeline:
    """Feed every batch to the controller and realize its switches until the source ends.

    `injections` maps a batch id to a plan the loop is made to try from that batch on (as soon as
    no evaluation runs): scenario (c), or an operator's request. `on_decision` sees every
    decision with its timeline entry as it is made (`fissure run` shows the plan in force and
    the last decision).
    """
    timeline = timeline if timeline is not None else Timeline()
    policy = AdaptivePolicy(controller, injections)

    def record(step: LoopStep[BatchObservation, Decision]) -> None:
        entry = timeline.record(step.observation, policy.ran_under, step.decision, step.cost_s)
        if on_decision is not None:
            on_decision(step.decision, entry)

    run_loop(iter(source.next_batch, None), policy, PlanSwitchRealizer(realizer, clock), clock, on_step=record)
    return timeline


# -- the plot --------------------------------------------------------------------------------------

_MARKERS = {
    Action.APPLY.value: ("tab:green", "-"),
    Action.RELEASE.value: ("tab:purple", "-"),
    Action.KEEP.value: ("tab:blue", ":"),
    Action.REVERT.value: ("tab:red", "-"),
    Action.HALT.value: ("black", "-"),
    Action.REOPEN.value: ("tab:orange", "--"),
}


@dataclass(frozen=True)
class ReferenceLine:
    """A horizontal line on the throughput panel, e.g. the best static plan of a phase."""

    label: str | None  # None: not in the legend (a repeated line)
    throughput_per_s: float
    from_s: float | None = None
    to_s: float | None = None


def plot_timeline(timeline: Timeline, path: str | os.PathLike, references: Sequence[ReferenceLine] = ()) -> None:
    """Throughput per batch with the decisions marked, and the threads of the plan in force."""
    try:
        import matplotlib
    except ImportError as error:  # matplotlib is a development dependency only
        raise RuntimeError("plot_timeline needs matplotlib: pip install fissure[dev]") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = timeline.batches()
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True, height_ratios=[3, 1])
    measured = [(entry.time_s, entry.throughput_per_s) for entry in batches if entry.throughput_per_s is not None]
    if measured:
        top.plot([t for t, _ in measured], [v for _, v in measured], ".", color="tab:gray", markersize=4,
                 label="measured throughput")
    offered = [(entry.time_s, entry.offered_rate_per_s) for entry in batches if entry.offered_rate_per_s is not None]
    if offered:
        top.plot([t for t, _ in offered], [v for _, v in offered], "-", color="tab:cyan", linewidth=1,
                 label="offered rate")
    start = batches[0].time_s if batches else 0.0
    end = batches[-1].time_s if batches else 1.0
    for line in references:
        low = start if line.from_s is None else line.from_s
        high = end if line.to_s is None else line.to_s
        top.hlines(line.throughput_per_s, low, high, colors="tab:olive", linestyles="--", label=line.label)
    seen: set[str] = set()
    for entry in timeline.entries:
        if entry.action not in _MARKERS:
            continue
        color, style = _MARKERS[entry.action]
        label = None if entry.action in seen else entry.action
        seen.add(entry.action)
        top.axvline(entry.time_s, color=color, linestyle=style, linewidth=1, label=label)
    top.set_ylabel("records/s")
    top.set_title(timeline.title)
    if top.get_legend_handles_labels()[0]:  # a timeline with no labelled line draws no empty legend
        top.legend(loc="best", fontsize=7)
    bottom.step([entry.time_s for entry in batches], [entry.threads for entry in batches], where="pre",
                color="tab:brown", label="plan")
    operators = sorted({name for entry in batches for name in entry.thread_levels or {}})
    for name in operators:  # waiting operators: their highest thread level over the workers
        levels = [(entry.time_s, max(entry.thread_levels[name])) for entry in batches
                  if entry.thread_levels and entry.thread_levels.get(name)]
        bottom.step([t for t, _ in levels], [level for _, level in levels], where="pre", label=f"{name} (elastic)")
    if operators:
        bottom.legend(loc="best", fontsize=7)
    bottom.set_ylabel("threads")
    bottom.set_xlabel("time (s)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
