"""The adaptive loop's decisions: re-plan while running, keep what helps, roll back what does not.

A pure state machine. The runner hands it one `BatchObservation` per micro-batch and gets one
`Decision` back, a frozen value that carries its reason; the clock and the measurements come in
as arguments, nothing here reads a clock, sleeps or touches Spark. What the loop does:

1. Profile: collect a window of batches on the plan in force (at least `profile_batches` and
   `profile_s`), the first batch after every switch, and a restarted query's first batch with
   input, discarded (start-up and restart effects).
2. Plan: estimate every operator's cost and selectivity from the window, correct the model by
   what the plans run so far measured (a factor per model term, fissure.control.model_correction),
   ask the planner for candidate plans (the corrected planner's and the plain one's, all priced
   by the corrected model), leave out those that repeat a blacklisted change, and pick
   - for throughput: the candidate with the most records over the payback horizon, counting the
     time its switch loses (`SwitchCosts`); it must be predicted `min_gain` better than the plan
     in force and pay its switch back within `payback_horizon_s`;
   - for an input that no longer saturates the plan (offered rate known, no backlog): the plan
     with the fewest threads predicted to process the offered rate with `rate_headroom`, at most
     `max_release_fraction` of the threads fewer per step (scenario d: release cores).
   Nothing worth switching to: the loop settles, and only watches the workload.
3. Apply (the driver hands the switch to a `PlanRealizer`), then evaluate for
   `evaluation_batches` and `evaluation_s`: keep when the measured throughput beats the baseline
   (the previous plan's window) by more than this run's noise could give with `keep_confidence`
   (the spread of batches under unchanged plans, pooled over the run: fissure.control.noise; a
   switch the model predicts to lose must beat twice that band); a release: when it still
   processes the offered rate with headroom. Otherwise revert and blacklist the change (Tang and
   Gedik, "Autopipelining for Data Stream Processing", IEEE TPDS 2013, Section 5, keep any gain:
   on a machine whose batches spread by ±10 %, that keeps noise).
   An operator that drifted since the planning voids the comparison: re-open, no verdict.
4. Halt when more than a share `alpha` of the planner's candidate changes repeat a blacklisted
   change (Tang and Gedik halt on the share of blacklisted input ports, the places where their
   optimizer may insert a thread; here the candidates are whole plan changes).
5. Re-open, from settled or halted, when the workload changes: the throughput of the plan in
   force departs from its reference by more than `sensitivity` (SENS) for `change_confirmations`
   batches in a row (the Streams 4.2 change-in-load test, `ChangeDetector`), an operator's cost
   or selectivity drifts by more than `operator_sensitivity`, the cores change, or the load does
   (the input starts or stops saturating the plan, the offered rate moves by `rate_change`). A
   workload change forgets the blacklist: its measurements belong to the old workload, as the
   Streams paper untrusts all its data on a change in load.

Missing or NaN measurements never crash and never switch: the decision is "observe", with a log
line. Decisions are logged at INFO by the controller itself.

One role per module:
- `config`: `AdaptiveConfig`, every parameter; `SwitchCosts`, what each kind of switch loses;
- `observations`: what comes in (`BatchObservation`) and what a window of it tells;
- `decisions`: what goes out (`Decision`, `PlanSwitch`, `Action`, `Phase`, `Objective`);
- `search`: where candidates and predictions come from (`PlanSearch`, `ChainPlanSearch`);
- `choice`: which candidate is worth a switch (`PlanChooser`);
- `evaluation`: keep or revert a switch (`Trial`, `judge`), the blacklisted share that halts;
- `controller`: the state machine that ties them together (`AdaptiveController`).
"""
