"""Evaluate, blacklist, halt: what autopipelining does after each round of insertions.

Tang and Gedik, TPDS 2013, Section 5. After the optimizer's threads are inserted, the throughput
of every port that received one is measured. If all of them went up, the insertions stay and
the next round starts. Otherwise the ports that did not improve lose their new thread and join
the blacklist, which the optimizer excludes from then on; when the blacklisted share of all
input ports exceeds alpha, the process halts. It also halts when the optimizer finds nothing.

"Went up" is judged against the noise this run measured (fissure.control.noise): a port's rate
must rise beyond the band that the spread of its per-batch rates could give with
`keep_confidence`. The paper keeps any increase (`keep_confidence=None`, `min_gain=0`); on this
project's 2-core machine that kept a cut for a 2.6 % rise and ran the graph at 0.77 of no cut.

Before a trial, the model is asked what the cut can gain at most (fissure.control.cut_forecast):
a cut between operators that compute, on a task with no free core, cannot gain, and trying it
cost the LogWatch graph 11 % of its throughput (0.89 of no cut). `decide_screen` halts on a
window run fused when no task could gain beyond the noise, `decide_trials` tries only the
proposed cuts whose bound beats the noise band, for as few batches as the bound allows.

Every decision is a frozen value with its reason; the clock and the measurements come in as
arguments. A missing or NaN measurement means "no change yet" and a log line.

`AutopipelinePolicy` is the whole stage as a policy of the loop contract (fissure.control.loop):
one `AutopipelineWindow` of micro-batches in, one decision out; screen -> profile -> optimize ->
insert -> evaluate -> keep or revert and blacklist -> screen again ... -> halt. Its realizer on
Spark sets a graph runner's pipeline boundaries (fissure.spark.adaptive.autopipelining).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from fissure.control.cut_forecast import (
    TaskTiming, TrialForecast, best_cut_gain, delivered, forecast_trial, task_gain,
)
from fissure.control.noise import NoiseEstimate, judge_gain, noise_band
from fissure.plan.autopipeline import AutopipelinePlan, AutopipelineProfile, plan_autopipelining

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AutopipelineControlConfig:
    """The control stage's settings, with their defaults."""

    # Halt once more than this share of all input ports is blacklisted. The paper leaves the
    # value open; half keeps going while most of the graph is still worth trying.
    alpha: float = 0.5
    # Time the runtime gets after an insertion before its throughput is judged (the paper's
    # adaptation period in Section 8.2.4).
    settle_s: float = 5.0
    # Relative gain a port's throughput must show to count as "increased", at least. The paper
    # uses any increase (0.0); the noise band below is the rule, this a floor under it.
    min_gain: float = 0.0
    # A port's gain must be beyond what this run's noise could give with this confidence
    # (fissure.control.noise); None: any gain over `min_gain` counts, as in the paper.
    keep_confidence: float | None = 0.9
    # The relative spread of one batch's rate assumed until the run has measured its own.
    assumed_noise: float = 0.10
    # Try a cut only when the model's bound on its gain beats the noise band a trial must pass
    # (fissure.control.cut_forecast), with a trial as short as the bound allows; False: try every
    # cut the optimizer proposes for a whole window, as the paper does. Needs the policy's timings.
    forecast_trials: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(
                f"alpha must be in [0, 1] (a share of the input ports), got {self.alpha}"
            )
        if not self.settle_s >= 0.0:
            raise ValueError(f"settle_s must be >= 0 seconds, got {self.settle_s}")
        if not self.min_gain >= 0.0:
            raise ValueError(f"min_gain must be >= 0 (0.05 means 5 %), got {self.min_gain}")
        if self.keep_confidence is not None and not 0.5 <= self.keep_confidence < 1:
            raise ValueError(f"keep_confidence must be in [0.5, 1) or None, got {self.keep_confidence}")
        if not (math.isfinite(self.assumed_noise) and self.assumed_noise > 0):
            raise ValueError(f"assumed_noise must be a relative spread > 0, got {self.assumed_noise}")


class ControlAction(str, Enum):
    PROFILE = "profile"  # count node by node for the next window: the screening found a cut may pay
    INSERT = "insert"  # apply the optimizer's insertions
    WAIT = "wait"  # change nothing yet: settling, or measurements missing
    CONTINUE = "continue"  # keep `keep`, remove `revert`, then optimize again
    HALT = "halt"  # remove `revert` and stop adapting


@dataclass(frozen=True)
class InsertionRound:
    """The ports that got a new thread in one round, when, and their throughput before it."""

    operators: tuple[str, ...]
    applied_at_s: float
    throughput_before_per_s: Mapping[str, float]
    samples_before: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # per-batch rates per port


@dataclass(frozen=True)
class AutopipelineControlDecision:
    """What to do with the threads of a round; `blacklist` is the whole blacklist afterwards."""

    action: ControlAction
    reason: str
    blacklist: frozenset[str]
    insert: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    revert: tuple[str, ...] = ()
    trial_batches: int = 0  # INSERT: the micro-batches the trial lasts (0: a whole window)
    not_tried: tuple[str, ...] = ()  # ports the optimizer proposed that could not pay beyond the noise
    bounds: tuple[float | None, ...] = ()  # INSERT: each port's bound on its gain (None: not timed), as `insert`

    def summary(self) -> str:
        """One line for a loop's timeline: `insert big`, `continue: keep big, revert small`."""
        if self.insert:
            return f"{self.action.value} {','.join(self.insert)}"
        verdicts = [f"{label} {','.join(ports)}" for label, ports in (("keep", self.keep), ("revert", self.revert))
                    if ports]
        return f"{self.action.value}: {', '.join(verdicts)}" if verdicts else self.action.value

    @classmethod
    def wait(cls, reason: str, blacklist: frozenset[str]) -> AutopipelineControlDecision:
        return cls(ControlAction.WAIT, reason, blacklist)

    @classmethod
    def halt(
        cls,
        reason: str,
        blacklist: frozenset[str],
        keep: tuple[str, ...] = (),
        revert: tuple[str, ...] = (),
    ) -> AutopipelineControlDecision:
        return cls(ControlAction.HALT, reason, blacklist, keep=keep, revert=revert)


def decide_after_optimization(
    plan: AutopipelinePlan, blacklist: frozenset[str]
) -> AutopipelineControlDecision:
    """Insert the plan's threads, or halt when the optimizer found no insertion."""
    if not plan.insertions:
        return AutopipelineControlDecision.halt(
            f"the optimizer found nothing: {plan.reason}", blacklist
        )
    operators = tuple(insertion.operator for insertion in plan.insertions)
    return AutopipelineControlDecision(
        ControlAction.INSERT,
        f"insert threads at {', '.join(operators)}: {plan.reason}",
        blacklist,
        insert=operators,
    )


def decide_screen(tasks: tuple[TaskTiming, ...], blacklist: frozenset[str], *, batches: int, noise: NoiseEstimate,
                  config: AutopipelineControlConfig = AutopipelineControlConfig(),
                  delivered_share: float = 1.0) -> AutopipelineControlDecision:
    """The cheap first look, on a window whose graph PEs ran fused: PROFILE (node by node, the
    optimizer's input) when some task's cores bound (fissure.control.cut_forecast.task_gain) beats
    the band a trial of `batches` after `batches` must pass; HALT when none does.
    `delivered_share`: what this run's trials delivered of their bounds (`delivered`)."""
    confidence = config.keep_confidence if config.keep_confidence is not None else 0.5
    band = max(noise_band(noise.spread(config.assumed_noise), max(1, batches), max(1, batches), confidence),
               config.min_gain)
    if not tasks:
        return AutopipelineControlDecision(ControlAction.PROFILE, "no task timed: profiling node by node", blacklist)
    best = max((delivered(task_gain(task), delivered_share) for task in tasks), key=lambda gain: gain.gain)
    noise_text = (f"the {band:+.1%} band a trial of {batches} batch(es) must pass at {confidence:.0%} confidence"
                  f" ({noise.describe(config.assumed_noise)})")
    if best.gain > band:
        return AutopipelineControlDecision(
            ControlAction.PROFILE, f"a cut may pay, profiling node by node: {best.reason}; beyond {noise_text}",
            blacklist)
    return AutopipelineControlDecision.halt(f"no cut can pay beyond the noise: {best.reason}; within {noise_text}",
                                            blacklist)


def decide_trials(profile: AutopipelineProfile, tasks: tuple[TaskTiming, ...], blacklist: frozenset[str], *,
                  batches_before: Mapping[str, int], max_trial_batches: int, noise: NoiseEstimate,
                  config: AutopipelineControlConfig = AutopipelineControlConfig(),
                  delivered_share: float = 1.0) -> AutopipelineControlDecision:
    """Insert only the proposed cuts whose predicted gain beats the noise (fissure.control.cut_forecast).

    The optimizer's plan for `profile`; each insertion's bound from `tasks` (the largest over the
    threads it relieves) against the band of a trial of `max_trial_batches` after
    `batches_before[port]` batches, scaled by `delivered_share`. Cuts that cannot pay are set aside for this round (not
    blacklisted: a later profile may change them) and the optimizer asked again without them;
    HALT when nothing is left that could pay, or when the optimizer found nothing."""
    confidence = config.keep_confidence if config.keep_confidence is not None else 0.5
    set_aside: list[TrialForecast] = []
    plan = plan_autopipelining(profile)
    while plan.insertions:
        bounds = [best_cut_gain(tasks, insertion.operator, insertion.threads) for insertion in plan.insertions]
        forecasts = [replace(forecast_trial(insertion.operator, delivered(bound, delivered_share),
                                            batches_before=max(1, batches_before.get(insertion.operator, 1)),
                                            max_trial_batches=max_trial_batches, noise=noise, confidence=confidence,
                                            assumed_sd=config.assumed_noise, min_gain=config.min_gain),
                             unscaled=bound.gain if bound is not None else None)
                     for insertion, bound in zip(plan.insertions, bounds)]
        worth = [forecast for forecast in forecasts if forecast.trial_batches]
        set_aside += [forecast for forecast in forecasts if not forecast.trial_batches]
        if worth:
            ports = tuple(forecast.port for forecast in worth)
            return AutopipelineControlDecision(
                ControlAction.INSERT,
                f"insert threads at {', '.join(ports)}: {plan.reason}; "
                + "; ".join(forecast.reason for forecast in (*set_aside, *worth)),
                blacklist, insert=ports, trial_batches=max(forecast.trial_batches for forecast in worth),
                not_tried=tuple(forecast.port for forecast in set_aside),
                bounds=tuple(forecast.unscaled for forecast in worth))
        plan = plan_autopipelining(replace(profile, blacklisted_ports=profile.blacklisted_ports
                                           | {forecast.port for forecast in set_aside}))
    if not set_aside:
        return decide_after_optimization(plan, blacklist)
    return AutopipelineControlDecision(
        ControlAction.HALT, "no cut can pay beyond the noise: " + "; ".join(forecast.reason for forecast in set_aside),
        blacklist, not_tried=tuple(forecast.port for forecast in set_aside))


def _usable(value: float | None) -> bool:
    return isinstance(value, (int, float)) and not math.isnan(value) and value >= 0.0


def evaluate_round(
    inserted: InsertionRound,
    throughput_after_per_s: Mapping[str, float],
    now_s: float,
    blacklist: frozenset[str],
    input_port_count: int,
    config: AutopipelineControlConfig = AutopipelineControlConfig(),
    samples_after: Mapping[str, Sequence[float]] | None = None,
    noise: NoiseEstimate = NoiseEstimate(),
) -> AutopipelineControlDecision:
    """Section 5: keep the round, or revert and blacklist the ports that did not improve.

    A port's rates per batch before (`inserted.samples_before`) and after (`samples_after`), when
    given, are the windows the noise rule compares; otherwise the window throughputs, as one
    sample each. `noise`: the spread this run measured under unchanged cuts."""
    if input_port_count < 1:
        raise ValueError(
            "input_port_count must be >= 1 (the graph's non-source input ports), got"
            f" {input_port_count}"
        )
    elapsed_s = now_s - inserted.applied_at_s
    if elapsed_s < config.settle_s:
        return AutopipelineControlDecision.wait(
            f"settling: {elapsed_s:.1f} s of {config.settle_s:.1f} s since the insertion", blacklist
        )
    unmeasured = [
        port
        for port in inserted.operators
        if not (
            _usable(inserted.throughput_before_per_s.get(port))
            and _usable(throughput_after_per_s.get(port))
        )
    ]
    if unmeasured:
        log.warning(
            "autopipelining: no change, throughput before or after missing for port(s) %s",
            ", ".join(unmeasured),
        )
        return AutopipelineControlDecision.wait(
            f"no change: throughput before or after missing for {', '.join(unmeasured)}", blacklist
        )

    def improved(port: str) -> bool:
        before = inserted.throughput_before_per_s[port]
        after = throughput_after_per_s[port]
        if config.keep_confidence is None:
            return after > before * (1.0 + config.min_gain)
        window_before = inserted.samples_before.get(port) or (before,)
        window_after = (samples_after or {}).get(port) or (after,)
        if before <= 0 or after <= 0:
            return after > before * (1.0 + config.min_gain)
        return judge_gain(window_before, window_after, noise, confidence=config.keep_confidence,
                          assumed_sd=config.assumed_noise, min_gain=config.min_gain).keep

    def change(port: str) -> str:
        before = inserted.throughput_before_per_s[port]
        return f"{port} {before:g} -> {throughput_after_per_s[port]:g}/s"

    keep = tuple(port for port in inserted.operators if improved(port))
    revert = tuple(port for port in inserted.operators if not improved(port))
    if not revert:
        return AutopipelineControlDecision(
            ControlAction.CONTINUE,
            "throughput rose at every new thread: " + ", ".join(map(change, keep)),
            blacklist,
            keep=keep,
        )
    new_blacklist = blacklist | frozenset(revert)
    blacklisted_share = len(new_blacklist) / input_port_count
    reason = (
        f"no gain at {', '.join(map(change, revert))}: reverted and blacklisted;"
        f" {len(new_blacklist)} of {input_port_count} input ports blacklisted"
        f" ({blacklisted_share:.0%}, alpha {config.alpha:.0%})"
    )
    if blacklisted_share > config.alpha:
        return AutopipelineControlDecision.halt(reason + ": halt", new_blacklist, keep, revert)
    return AutopipelineControlDecision(
        ControlAction.CONTINUE, reason, new_blacklist, keep=keep, revert=revert
    )


# -- the stage as a loop policy -------------------------------------------------------------------


@dataclass(frozen=True)
class AutopipelineWindow:
    """What the loop sees once per window of micro-batches.

    `throughput_per_s`: records into each port per second of batch wall time over the window;
    `samples`: the same per batch of the window; `measurements` and `stage_first_nodes`: what the
    optimizer's profile is built from (the profiler's piece measurements, the first node of every
    PE stage), handed to the policy's `profile_of`.
    """

    batch_id: int  # the window's last batch
    now_s: float
    throughput_per_s: Mapping[str, float]
    samples: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    measurements: tuple = ()
    stage_first_nodes: tuple[str, ...] = ()
    batches: int = 0  # micro-batches in the window (0: the longest of `samples`)
    wall_s: float = 0.0  # the window's micro-batches' summed wall time (0: unknown)

    @property
    def batch_count(self) -> int:
        return self.batches or max((len(rates) for rates in self.samples.values()), default=1)

    def summary(self) -> str:
        """One line for a loop's timeline: `batch 5: big 200/s, small 100/s`."""
        rates = ", ".join(f"{port} {rate:g}/s" for port, rate in sorted(self.throughput_per_s.items()))
        return f"batch {self.batch_id}: {rates or 'no port measured'}"


ProfileOf = Callable[[AutopipelineWindow, frozenset[str]], AutopipelineProfile]
TimingsOf = Callable[[AutopipelineWindow], tuple[TaskTiming, ...]]


class AutopipelinePolicy:
    """Profile -> optimize -> insert -> evaluate, one window at a time (the module docstring).

    `profile_of(window, blacklist)` builds the optimizer's profile of a window (on Spark:
    fissure.profile.graph_profile.autopipeline_profile); `input_port_count`: the graph's
    non-source input ports, what the blacklisted share is taken of. `timings_of(window)`: the
    window's task timings (on Spark: fissure.profile.graph_profile.task_timings); given, and with
    `config.forecast_trials`, a proposed cut is tried only when it can pay (`decide_trials`), for
    as few batches as its bound allows, and every round starts with a window whose graph PEs run
    fused (`decide_screen`): node-by-node counting, which unfuses them, only once some cut may pay.
    Phases: "screening", "profiling", "evaluating", "halted". Every window
    ran under unchanged cuts, so its per-batch rates feed the noise estimate (before the
    decision: a forecast weighs the noise of the window it was made on).
    """

    def __init__(self, input_port_count: int, profile_of: ProfileOf,
                 config: AutopipelineControlConfig = AutopipelineControlConfig(),
                 timings_of: TimingsOf | None = None) -> None:
        self.input_port_count, self.profile_of, self.config = input_port_count, profile_of, config
        self.timings_of = timings_of
        self.screens = timings_of is not None and config.forecast_trials
        self.phase = "screening" if self.screens else "profiling"
        self.blacklist: frozenset[str] = frozenset()
        self.noise = NoiseEstimate()  # the spread of a port's rate per batch under unchanged cuts
        self.last_profile: AutopipelineProfile | None = None
        self._round: InsertionRound | None = None
        self._bounds: dict[str, float] = {}  # the tried cuts' bounds, 1 + gain
        self._longest_trial = 0  # the batches a trial may last: the window its cut was chosen on
        self._first_part: AutopipelineWindow | None = None  # a short trial's window, when it goes on
        # the lowest share of its bound a trial delivered (measured 1 + gain over the bound's), at most 1
        self.delivered_share = 1.0

    def decide(self, window: AutopipelineWindow) -> AutopipelineControlDecision:
        if self.phase == "halted":
            return AutopipelineControlDecision.wait("halted: autopipelining has stopped", self.blacklist)
        if self.phase == "screening":
            self._add_noise(window)
            decision = decide_screen(self.timings_of(window), self.blacklist, batches=window.batch_count,
                                     noise=self.noise, config=self.config, delivered_share=self.delivered_share)
            self.phase = "profiling" if decision.action is ControlAction.PROFILE else "halted"
            return decision
        if self.phase == "profiling":
            self._add_noise(window)
            return self._optimize(window)
        decision = self._evaluate(window)  # judged against the noise measured before this window
        self._add_noise(window)
        return decision

    def _add_noise(self, window: AutopipelineWindow) -> None:
        for rates in window.samples.values():
            self.noise = self.noise.with_window(rates)

    def _optimize(self, window: AutopipelineWindow) -> AutopipelineControlDecision:
        profile = self.profile_of(window, self.blacklist)
        self.last_profile = profile
        if self.timings_of is not None and self.config.forecast_trials:
            decision = decide_trials(profile, self.timings_of(window), self.blacklist,
                                     batches_before={port: len(rates) for port, rates in window.samples.items()},
                                     max_trial_batches=window.batch_count, noise=self.noise, config=self.config,
                                     delivered_share=self.delivered_share)
            self._bounds = {port: 1.0 + bound for port, bound in zip(decision.insert, decision.bounds)
                            if bound is not None}
        else:
            decision = decide_after_optimization(plan_autopipelining(profile), self.blacklist)
        if decision.action is ControlAction.INSERT:
            self._longest_trial, self._first_part = window.batch_count, None
            self._round = InsertionRound(
                decision.insert, window.now_s,
                {port: window.throughput_per_s.get(port, float("nan")) for port in decision.insert},
                {port: window.samples.get(port, ()) for port in decision.insert})
            self.phase = "evaluating"
        else:
            self.phase = "halted"
        return decision

    def _evaluate(self, window: AutopipelineWindow) -> AutopipelineControlDecision:
        window = joined_windows(self._first_part, window) if self._first_part is not None else window
        decision = evaluate_round(self._round, window.throughput_per_s, window.now_s, self.blacklist,
                                  self.input_port_count, self.config, samples_after=window.samples,
                                  noise=self.noise)
        extended = self._extended_trial(decision, window)
        if extended is not None:
            return extended
        self._first_part = None
        if decision.action is not ControlAction.WAIT:
            for port, bound in self._bounds.items():
                before, after = self._round.throughput_before_per_s.get(port), window.throughput_per_s.get(port)
                if _usable(before) and _usable(after) and before > 0:
                    self.delivered_share = min(self.delivered_share, (after / before) / bound)
            self._bounds = {}
            self.blacklist = decision.blacklist
            self.phase = ("halted" if decision.action is ControlAction.HALT
                          else "screening" if self.screens else "profiling")
        return decision

    def _extended_trial(self, decision: AutopipelineControlDecision,
                        window: AutopipelineWindow) -> AutopipelineControlDecision | None:
        """A short trial whose every reverted cut measured a gain, but one within the band of so few
        batches, goes on to the longest trial instead of being reverted on too little evidence.

        On the waiting graph of benchmarks/autopipeline_graph.py (a lookup that waits about as long
        as the parsing above it computes) a one-batch trial of the cut at the lookup measured a
        gain inside that batch's band, and the cut was reverted and blacklisted for the rest of the
        run, where runs with the cut placed by hand gained."""
        if not decision.revert or self._first_part is not None or window.batch_count >= self._longest_trial:
            return None
        before = self._round.throughput_before_per_s
        if not all(_usable(before.get(port)) and _usable(window.throughput_per_s.get(port))
                   and window.throughput_per_s[port] > before[port] for port in decision.revert):
            return None
        self._first_part = window
        more = self._longest_trial - window.batch_count
        gains = ", ".join(f"{port} {window.throughput_per_s[port] / before[port] - 1:+.0%}" for port in decision.revert)
        return AutopipelineControlDecision(
            ControlAction.WAIT,
            f"inconclusive after {window.batch_count} batch(es): {gains}, within the noise of so few batches;"
            f" the trial goes on for {more} more batch(es)",
            self.blacklist, trial_batches=more)


def joined_windows(first: AutopipelineWindow, second: AutopipelineWindow) -> AutopipelineWindow:
    """Two consecutive windows under the same cuts as one: rates over their summed wall time (or
    weighted by batches when a wall time is unknown), per-batch samples one after the other."""
    batches = first.batch_count + second.batch_count
    rates = {}
    for port in set(first.throughput_per_s) | set(second.throughput_per_s):
        a, b = first.throughput_per_s.get(port), second.throughput_per_s.get(port)
        if a is None or b is None:
            rates[port] = b if a is None else a
        elif first.wall_s > 0 and second.wall_s > 0:
            rates[port] = (a * first.wall_s + b * second.wall_s) / (first.wall_s + second.wall_s)
        else:
            rates[port] = (a * first.batch_count + b * second.batch_count) / batches
    samples = {port: tuple(first.samples.get(port, ())) + tuple(second.samples.get(port, ()))
               for port in set(first.samples) | set(second.samples)}
    return AutopipelineWindow(second.batch_id, second.now_s, rates, samples, first.measurements + second.measurements,
                              second.stage_first_nodes, batches, first.wall_s + second.wall_s)
