"""The adaptive loop's state machine, `AdaptiveController`: one `BatchObservation` in, one
`Decision` out. It collects the windows (profiling, evaluation, monitoring), asks the search and
the `PlanChooser` for a plan when a profiling window is full, starts a `Trial` and has it judged
when its evaluation window is full, keeps the blacklist, halts, re-opens on a workload change
(fissure.control.adaptive.workload), and learns the model's correction from what every plan
measured. The clock and the measurements come in as arguments; nothing here reads a clock, sleeps
or touches Spark. Every decision is logged at INFO (see the package's docstring for the loop as a
whole).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from statistics import fmean

from fissure.control.adaptive.choice import Choice, PlanChooser
from fissure.control.adaptive.config import AdaptiveConfig, SwitchCosts
from fissure.control.adaptive.decisions import Action, Decision, Objective, Phase, PlanSwitch, format_rate
from fissure.control.adaptive.evaluation import BlacklistShare, Trial, judge
from fissure.control.noise import NoiseEstimate, noise_band
from fissure.control.adaptive.observations import BatchObservation, Sample, estimate_operators, load_of, usable
from fissure.control.adaptive.search import ChainPlanSearch, PlanSearch, ScoredPlan
from fissure.control.adaptive.workload import PlanningBasis, drift_since, workload_change
from fissure.control.change import ChangeDetector
from fissure.control.thread_level.decisions import relative_gain
from fissure.control.model_correction import CorrectablePlanSearch, Correction, ModelCorrection, PlanMeasurement
from fissure.control.plan_change import PlanChange, SwitchKind, classify_change, plan_fingerprint
from fissure.model.throughput import InvalidPlan, validate_plan
from fissure.model.types import Machine, OperatorStats, Plan

log = logging.getLogger(__name__)

# Samples kept in a window at most (a window that cannot plan for want of profiles stays bounded).
MAX_WINDOW_BATCHES = 256


class AdaptiveController:
    """Profile, plan, apply, evaluate, keep or revert and blacklist, halt, re-open."""

    def __init__(
        self,
        operators: Sequence[OperatorStats],
        machine: Machine,
        initial_plan: Plan,
        config: AdaptiveConfig | None = None,
        switch_costs: SwitchCosts | None = None,
        search: PlanSearch | None = None,
    ) -> None:
        self._chain = tuple(operators)
        validate_plan(self._chain, initial_plan)
        self._machine = machine
        self.config = config or AdaptiveConfig()
        self._costs = switch_costs or SwitchCosts()
        self._search = search or ChainPlanSearch(self.config.planning_method, self.config.max_threads)
        self._plan = initial_plan
        self._phase = Phase.PROFILING
        self._window: list[Sample] = []
        self._discard = self.config.discard_after_switch  # the first batch of a run is a start too
        self._trial: Trial | None = None
        self._origin: Plan | None = None  # the plan before the last switch handed out
        self._blacklist: list[PlanChange] = []
        self._detectors: dict[str, ChangeDetector] = {}
        self._basis: PlanningBasis | None = None
        self._last_candidates: tuple[ScoredPlan, ...] = ()  # of the last planning
        self._reference_per_s: float | None = None  # last baseline measured for the plan in force
        self._noise = NoiseEstimate()  # the spread of batches under unchanged plans, this run
        self._switches_since_change = 0  # plan switches tried since the workload last changed
        # Learning from measurements: what every plan run so far measured, and the last fit.
        correctable = self.config.correct_model and isinstance(self._search, CorrectablePlanSearch)
        self._measured = ModelCorrection(self.config.correction) if correctable else None
        self._correction: Correction | None = None

    # -- read-only views ----------------------------------------------------------------------
    @property
    def plan(self) -> Plan:
        return self._plan

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def blacklist(self) -> tuple[PlanChange, ...]:
        return tuple(self._blacklist)

    @property
    def switch_costs(self) -> SwitchCosts:
        return self._costs

    @property
    def correction(self) -> Correction | None:
        """The model correction of the last planning (None: none learned, or not supported)."""
        return self._correction

    @property
    def measured_plans(self) -> tuple[PlanMeasurement, ...]:
        return self._measured.measurements if self._measured is not None else ()

    def blacklisted_share(self) -> BlacklistShare:
        """The last planning's candidate changes (from the plan in force) that are blacklisted."""
        changes = [classify_change(self._plan, scored.plan, self._chain) for scored in self._last_candidates]
        changes = [change for change in changes if not change.is_empty]
        blocked = sum(any(change.repeats(bad) for bad in self._blacklist) for change in changes)
        return BlacklistShare(blocked, len(changes))

    # -- inputs ---------------------------------------------------------------------------------
    def observe(self, observation: BatchObservation) -> Decision:
        """Take one batch's measurements and decide."""
        return self._logged(self._observe(observation))

    def inject(self, plan: Plan, batch_id: int, now_s: float, reason: str = "injected") -> Decision:
        """Try `plan` now (an operator's request, an experiment): evaluated, kept or reverted and
        blacklisted like any candidate, but never if it repeats a blacklisted change."""
        return self._logged(self._inject(plan, batch_id, now_s, reason))

    def switch_applied(self, kind: SwitchKind, cost_s: float | None) -> None:
        """The realizer made the last switch; fold in what it measured the switch to cost."""
        self._origin = None
        measured = usable(cost_s)
        if measured is None:
            log.info("adaptive: no usable switch cost for %s (%r): estimate unchanged", kind.value, cost_s)
            return
        config = self.config
        self._costs = self._costs.with_measurement(kind, measured, config.switch_cost_weight, config.switch_cost_max_step)

    def switch_failed(self, batch_id: int, now_s: float, error: str) -> Decision:
        """The realizer could not make the last switch and left the previous plan in force."""
        return self._logged(self._switch_failed(batch_id, now_s, error))

    # -- the state machine ----------------------------------------------------------------------
    def _observe(self, observation: BatchObservation) -> Decision:
        batch_id, now_s = observation.batch_id, observation.now_s
        in_force = plan_fingerprint(self._plan)
        if observation.plan_in_force is not None and observation.plan_in_force != in_force:
            return Decision.observe(
                batch_id, now_s, in_force,
                f"no change: plan {in_force} not in force yet (the runner reports {observation.plan_in_force})",
            )
        if self._discard > 0:
            self._discard -= 1
            return Decision.observe(batch_id, now_s, in_force, f"first batch under {in_force} discarded (restart effects)")
        if observation.query_start:
            # A restart the loop did not ask for (the machine's failure, a failed switch's way
            # back): its first batch is as slow as a switch's, neither the plan's rate nor noise.
            return Decision.observe(batch_id, now_s, in_force,
                                    f"first batch of a restarted query under {in_force} discarded (start-up cost)")
        throughput = usable(observation.throughput_per_s)
        if throughput is None:
            log.info("adaptive: batch %d: no usable throughput (%r): no change", batch_id, observation.throughput_per_s)
            return Decision.observe(
                batch_id, now_s, in_force, f"no change: no usable throughput measured ({observation.throughput_per_s!r})"
            )
        duration = usable(observation.duration_s) or 0.0
        self._window.append(
            Sample(batch_id, now_s, duration, throughput, max(0, observation.records_in), observation.operators,
                   usable(observation.offered_rate_per_s), observation.backlog_records)
        )
        del self._window[:-MAX_WINDOW_BATCHES]
        if self._phase is Phase.EVALUATING:
            return self._evaluate(batch_id, now_s)
        detector = self._detectors.setdefault(
            in_force,
            ChangeDetector(self.config.sensitivity, self.config.change_confirmations, self.config.change_noise_z,
                           min_reference=self.config.profile_batches),
        )
        change = detector.update(throughput)
        if change is not None:
            return self._reopen(
                batch_id, now_s,
                f"throughput under {in_force} {change.relative_change:+.0%} from its reference"
                f" {format_rate(change.reference)} for {len(change.confirming)} batches",
            )
        if self._phase is Phase.PROFILING:
            if not self._window_ready(self.config.profile_batches, self.config.profile_s):
                return Decision.observe(batch_id, now_s, in_force, f"profiling {in_force}: {self._progress()}")
            return self._plan_next(batch_id, now_s, observation.cores)
        if not self._window_ready(self.config.profile_batches, self.config.profile_s):
            return Decision.observe(batch_id, now_s, in_force, f"{self._phase.value}: {in_force} in force")
        workload = self._workload_change(observation.cores)
        if workload is not None:
            return self._reopen(batch_id, now_s, workload)
        self._reference_per_s = fmean([sample.throughput_per_s for sample in self._window])
        self._remember(self._plan, self._reference_per_s, self._basis.cores if self._basis else observation.cores)
        self._noise = self._noise.with_window(self._window_rates())
        self._window = []
        return Decision.observe(
            batch_id, now_s, in_force,
            f"{self._phase.value}: {in_force} in force at {format_rate(self._reference_per_s)}, workload unchanged",
        )

    def _window_rates(self) -> list[float]:
        return [sample.throughput_per_s for sample in self._window]

    @property
    def noise(self) -> NoiseEstimate:
        """The spread of batches under unchanged plans this run has measured (fissure.control.noise)."""
        return self._noise

    def _window_ready(self, batches: int, seconds: float) -> bool:
        if len(self._window) < batches:
            return False
        first = self._window[0]
        return self._window[-1].now_s - (first.now_s - first.duration_s) >= seconds

    def _progress(self) -> str:
        first = self._window[0]
        span_s = self._window[-1].now_s - (first.now_s - first.duration_s)
        return (f"{len(self._window)} of {self.config.profile_batches} batches,"
                f" {span_s:.1f} of {self.config.profile_s:.1f} s")

    def _planning_machine(self, cores: int | None) -> Machine:
        if cores is None or cores < 1 or cores == self._machine.cores:
            return self._machine
        return replace(self._machine, cores=cores)

    def _plan_next(self, batch_id: int, now_s: float, cores: int | None) -> Decision:
        in_force = plan_fingerprint(self._plan)
        estimate = estimate_operators(self._chain, self._window, self.config.min_operator_samples)
        if estimate.operators is None:
            log.info("adaptive: no profile yet for %s: no change", ", ".join(estimate.missing))
            return Decision.observe(
                batch_id, now_s, in_force,
                f"no change: no profile of {self.config.min_operator_samples} tuples yet for"
                f" {', '.join(estimate.missing)}",
            )
        machine = self._planning_machine(cores)
        baseline_samples = self._window_rates()
        baseline = fmean(baseline_samples)
        self._noise = self._noise.with_window(baseline_samples)
        self._remember(self._plan, baseline, machine.cores, estimate.operators)
        correction = self._fit_correction()
        search = self._corrected_search()
        load = load_of(self._window)
        try:
            current = search.predict_per_s(estimate.operators, self._plan, machine)
            options = tuple(search.candidates(estimate.operators, machine))
            plain = None
            if search is not self._search:  # also the uncorrected planner's candidates, re-ranked
                plain_current = self._search.predict_per_s(estimate.operators, self._plan, machine)
                plain_options = tuple(self._search.candidates(estimate.operators, machine))
                known = {plan_fingerprint(scored.plan) for scored in options}
                options += tuple(ScoredPlan(scored.plan, search.predict_per_s(estimate.operators, scored.plan, machine))
                                 for scored in plain_options if plan_fingerprint(scored.plan) not in known)
                plain = self._chooser().choose(plain_options, plain_current, baseline, load)
        except ValueError as error:  # InvalidPlan, a chain that costs nothing, a search too large
            log.warning("adaptive: cannot plan: %s", error)
            return Decision.observe(batch_id, now_s, in_force, f"no change: cannot plan: {error}")
        self._reference_per_s = baseline
        self._last_candidates = tuple(options)
        choice = self._chooser().choose(options, current, baseline, load)
        self._basis = PlanningBasis(estimate.operators, choice.objective, load.offered_rate_per_s, machine.cores)
        reason = choice.reason + self._correction_note(choice, plain)
        used = correction if search is not self._search else None
        if choice.option is None:
            self._phase = Phase.SETTLED
            self._window = []
            return replace(Decision.observe(batch_id, now_s, in_force, f"settled: {reason}"), correction=used)
        option = choice.option
        budget = self.config.max_switches_per_workload
        if budget is not None and self._switches_since_change >= budget:
            self._phase = Phase.SETTLED
            self._window = []
            return replace(Decision.observe(
                batch_id, now_s, in_force,
                f"settled: {option.change.after} would be next ({choice.reason}), but the {budget} switches"
                f" allowed since the workload last changed are spent"), correction=used)
        self._switches_since_change += 1
        switch = PlanSwitch(option.scored.plan, option.change, option.predicted,
                            relative_gain(current, option.predicted), option.cost_s)
        trial = Trial(switch, self._plan, choice.objective, baseline, choice.required_per_s, baseline_samples)
        release = choice.objective is Objective.RATE and option.threads < self._plan.threads
        decision = self._start(trial, batch_id, now_s, reason, Action.RELEASE if release else Action.APPLY)
        return replace(decision, correction=used)

    # -- learning from measurements ---------------------------------------------------------------
    def _remember(self, plan: Plan, measured_per_s: float, cores: int | None,
                  operators: Sequence[OperatorStats] | None = None) -> None:
        """Keep what `plan` measured, with the operator statistics it ran on, for the correction."""
        if self._measured is None:
            return
        if operators is None:
            estimate = estimate_operators(self._chain, self._window, self.config.min_operator_samples)
            operators = estimate.operators or (self._basis.operators if self._basis is not None else None)
        if operators is None:
            return
        self._measured.record(PlanMeasurement(plan, tuple(operators), self._planning_machine(cores), measured_per_s))

    def _fit_correction(self) -> Correction | None:
        if self._measured is None:
            return None
        try:
            self._correction = self._measured.fit(self._search)  # type: ignore[arg-type]
        except ValueError as error:  # a measured plan the model cannot evaluate any more
            log.info("adaptive: no model correction: %s", error)
            self._correction = None
        return self._correction

    def _corrected_search(self) -> PlanSearch:
        """The search with the learned factors; the plain one while nothing was learned."""
        correction = self._correction
        if self._measured is None or correction is None or correction.is_identity():
            return self._search
        return self._search.with_factors(correction.as_dict)  # type: ignore[attr-defined]

    def _correction_note(self, choice: Choice, plain: Choice | None) -> str:
        """What the correction is, and whether it changed the choice, for the reason."""
        if plain is None or self._correction is None:
            return ""
        note = f"; model corrected by the measurements: {self._correction.describe()}"
        chosen = choice.option.change.after if choice.option is not None else None
        uncorrected = plain.option.change.after if plain.option is not None else None
        if chosen == uncorrected:
            return note
        if uncorrected is None:
            return note + "; the correction changed the ranking: uncorrected, no plan would be worth a switch"
        return note + f"; the correction changed the ranking: uncorrected, the model would pick {uncorrected}"

    def _chooser(self) -> PlanChooser:
        config = self.config
        band = noise_band(self._noise.spread(config.assumed_noise), max(1, config.profile_batches),
                          max(1, config.evaluation_batches), config.keep_confidence)
        return PlanChooser(config, self._plan, self._chain, tuple(self._blacklist), self._costs, band)

    def _start(self, trial: Trial, batch_id: int, now_s: float, reason: str, action: Action) -> Decision:
        self._trial = trial
        self._origin = self._plan
        self._plan = trial.switch.plan
        self._phase = Phase.EVALUATING
        self._window = []
        self._discard = self.config.discard_after_switch
        if action is Action.RELEASE:
            return Decision.release(batch_id, now_s, trial.switch, f"release: {reason}")
        return Decision.apply(batch_id, now_s, trial.switch, f"apply: {reason}")

    def _evaluate(self, batch_id: int, now_s: float) -> Decision:
        trial, config = self._trial, self.config
        assert trial is not None
        measured = fmean([sample.throughput_per_s for sample in self._window])
        candidate = trial.switch.change.after
        if not self._window_ready(config.evaluation_batches, config.evaluation_s):
            return Decision.observe(
                batch_id, now_s, candidate,
                f"evaluating {candidate}: {len(self._window)} of {config.evaluation_batches} batches,"
                f" {format_rate(measured)} so far vs {format_rate(trial.baseline_per_s)} before",
            )
        self._remember(self._plan, measured, self._basis.cores if self._basis is not None else None)
        drift = self._drift_since_planning()
        if drift is not None:
            # The baseline was measured on another workload: comparing with it would blacklist
            # (or keep) the candidate for the workload's doing. No verdict; plan afresh from here.
            self._trial = None
            return self._reopen(batch_id, now_s, f"{drift} while {candidate} was evaluated: no verdict on it")
        rates = self._window_rates()
        verdict = judge(trial, rates, config, self._noise)
        self._noise = self._noise.with_window(rates)  # the candidate ran unchanged through its window
        if verdict.keep:
            self._trial = None
            self._phase = Phase.PROFILING
            self._reference_per_s = measured
            return Decision.keep(batch_id, now_s, candidate, f"keep {candidate}: {verdict.reason}")
        return self._revert(batch_id, now_s, measured, verdict.reason)

    def _revert(self, batch_id: int, now_s: float, measured: float, why: str) -> Decision:
        trial = self._trial
        assert trial is not None
        change = trial.switch.change
        self._blacklist.append(change)
        back = classify_change(self._plan, trial.previous, self._chain)
        switch = PlanSwitch(trial.previous, back, trial.baseline_per_s,
                            relative_gain(measured, trial.baseline_per_s), self._costs.cost_s(back.kind))
        self._trial = None
        self._origin = self._plan
        self._plan = trial.previous
        self._window = []
        self._discard = self.config.discard_after_switch
        share = self.blacklisted_share()
        reason = (f"revert {change.after} to {back.after} and blacklist {change.describe()}: {why};"
                  f" {share.blocked} of {share.candidates} candidate changes blacklisted"
                  f" ({share.share:.0%}, alpha {self.config.alpha:.0%})")
        if share.share > self.config.alpha:
            self._phase = Phase.HALTED
            return Decision.halt(batch_id, now_s, back.after, reason + ": halt", switch, change)
        self._phase = Phase.PROFILING
        return Decision.revert(batch_id, now_s, back.after, change, reason, switch)

    def _drift_since_planning(self) -> str | None:
        return drift_since(self._basis, self._chain, self._window, self.config)

    def _workload_change(self, cores: int | None) -> str | None:
        return workload_change(self._basis, self._chain, self._window, self.config, self._plan,
                               self._planning_machine(cores).cores)

    def _reopen(self, batch_id: int, now_s: float, why: str) -> Decision:
        self._phase = Phase.PROFILING
        self._window = []
        self._detectors.clear()
        self._basis = None
        self._last_candidates = ()
        reason = f"workload changed: {why}"
        self._switches_since_change = 0
        if self.config.forget_blacklist_on_change and self._blacklist:
            reason += f"; {len(self._blacklist)} blacklisted change(s) forgotten"
            self._blacklist.clear()
        return Decision.reopen(batch_id, now_s, plan_fingerprint(self._plan), reason)

    def _inject(self, plan: Plan, batch_id: int, now_s: float, reason: str) -> Decision:
        in_force = plan_fingerprint(self._plan)
        try:
            change = classify_change(self._plan, plan, self._chain)
            validate_plan(self._chain, plan)
        except (InvalidPlan, ValueError) as error:
            return Decision.observe(batch_id, now_s, in_force, f"{reason}: plan refused: {error}")
        if self._phase is Phase.EVALUATING:
            return Decision.observe(batch_id, now_s, in_force, f"{reason}: refused while {in_force} is evaluated")
        if change.is_empty:
            return Decision.observe(batch_id, now_s, in_force, f"{reason}: {in_force} is in force already")
        blocked = next((bad for bad in self._blacklist if change.repeats(bad)), None)
        if blocked is not None:
            return Decision.observe(
                batch_id, now_s, in_force, f"{reason}: {change.after} refused, it repeats the blacklisted {blocked.describe()}"
            )
        measured = [sample.throughput_per_s for sample in self._window]
        baseline = fmean(measured) if measured else self._reference_per_s
        if baseline is None:
            return Decision.observe(batch_id, now_s, in_force, f"{reason}: refused, no baseline measured for {in_force} yet")
        predicted = gain = None
        estimate = estimate_operators(self._chain, self._window, self.config.min_operator_samples)
        if estimate.operators is not None:
            machine = self._machine
            try:
                search = self._corrected_search()
                current = search.predict_per_s(estimate.operators, self._plan, machine)
                predicted = search.predict_per_s(estimate.operators, plan, machine)
                gain = relative_gain(current, predicted)
            except ValueError as error:
                log.info("adaptive: no prediction for the injected plan: %s", error)
                predicted = gain = None
        switch = PlanSwitch(plan, change, predicted, gain, self._costs.cost_s(change.kind))
        trial = Trial(switch, self._plan, Objective.THROUGHPUT, baseline, None, tuple(measured))
        expected = "" if gain is None else f" (predicted {gain:+.0%})"
        return self._start(trial, batch_id, now_s, f"{reason}: {change.after}{expected}", Action.APPLY)

    def _switch_failed(self, batch_id: int, now_s: float, error: str) -> Decision:
        origin = self._origin
        if origin is None:
            log.warning("adaptive: realizer error with no switch pending: %s", error)
            return Decision.observe(batch_id, now_s, plan_fingerprint(self._plan), f"no switch pending; realizer said: {error}")
        failed, back = plan_fingerprint(self._plan), plan_fingerprint(origin)
        self._plan, self._origin = origin, None
        self._window = []
        self._discard = 0
        trial, self._trial = self._trial, None
        if trial is not None:
            self._blacklist.append(trial.switch.change)
            self._phase = Phase.PROFILING
            return Decision.revert(
                batch_id, now_s, back, trial.switch.change,
                f"the realizer could not apply {failed} ({error}): {back} stays, {trial.switch.change.describe()} blacklisted",
            )
        self._phase = Phase.HALTED
        return Decision.halt(batch_id, now_s, back, f"the realizer could not switch to {failed} ({error}): halted with {back}")

    def _logged(self, decision: Decision) -> Decision:
        log.info("adaptive: batch %d %s: %s", decision.batch_id, decision.action.value, decision.reason)
        return decision
