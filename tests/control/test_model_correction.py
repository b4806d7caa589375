"""Learning from measurements (fissure.control.model_correction) and its use by the adaptive loop."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fissure.control.adaptive.config import AdaptiveConfig
from fissure.control.adaptive.decisions import Action
from fissure.control.adaptive.search import ChainPlanSearch
from fissure.control.model_correction import (
    OPERATORS_TERM,
    CorrectablePlanSearch,
    CorrectionConfig,
    ModelCorrection,
    PlanMeasurement,
    fit_correction,
)
from fissure.control.plan_change import parse_fingerprint
from fissure.control.scenarios import CHAIN, MACHINE, SEQUENTIAL, run_scenario, scenario
from fissure.model.throughput import evaluate
from fissure.model.types import Kind, Machine, OperatorStats

# Plans of the scenarios' chain that differ in their terms: none, boundaries, replicas, both.
PLANS = tuple(parse_fingerprint(text) for text in (
    "[parse,enrich,filter,count,report]",
    "[parse|enrich|filter,count,report]",
    "[parse|enrich,filter,count,report]",
    "[parse,enrich,filter]x2 -> [count,report]",
    "[parse,enrich,filter]x4 -> [count,report]",
    "[parse,enrich]x3 -> [filter,count,report]",
    "[parse] -> [enrich]x2 -> [filter,count,report]",
))


def measured(plans, truth: Machine, operators=CHAIN, believed: Machine = MACHINE, cost_factor: float = 1.0):
    """What each plan measures on the true machine (operators' true costs times `cost_factor`)."""
    true_operators = tuple(replace(op, cost_us=op.cost_us * cost_factor) for op in operators)
    return [PlanMeasurement(plan, operators, believed, evaluate(true_operators, plan, truth).throughput_per_s)
            for plan in plans]


def fitted(measurements, config: CorrectionConfig = CorrectionConfig()):
    store = ModelCorrection(config)
    for measurement in measurements:
        store.record(measurement)
    return store.fit(ChainPlanSearch())


def test_the_paper_search_is_correctable_and_its_factors_scale_the_right_constants():
    search = ChainPlanSearch()
    assert isinstance(search, CorrectablePlanSearch)
    replicated = PLANS[4]
    truth = replace(MACHINE, replication_cost_us=MACHINE.replication_cost_us * 20)
    scaled = search.with_factors({"replication_cost_us": 20.0})
    assert scaled.predict_per_s(CHAIN, replicated, MACHINE) == pytest.approx(evaluate(CHAIN, replicated, truth).throughput_per_s)
    # the sequential plan has no replicas: c_p does not touch it
    assert scaled.predict_per_s(CHAIN, SEQUENTIAL, MACHINE) == pytest.approx(search.predict_per_s(CHAIN, SEQUENTIAL, MACHINE))


def test_the_correction_recovers_known_factors_from_synthetic_measurements():
    truth = replace(MACHINE, replication_cost_us=MACHINE.replication_cost_us * 20,
                    thread_switch_overhead_us=MACHINE.thread_switch_overhead_us * 3)
    measurements = measured(PLANS, truth, cost_factor=1.3)
    # with a weak prior, every factor the plans tell apart
    correction = fitted(measurements, CorrectionConfig(prior_weight=1e-6))
    assert correction.factor("replication_cost_us") == pytest.approx(20.0, rel=0.02)
    assert correction.factor("thread_switch_overhead_us") == pytest.approx(3.0, rel=0.05)
    assert correction.factor(OPERATORS_TERM) == pytest.approx(1.3, rel=0.02)
    assert correction.plans == len(PLANS)
    assert correction.error_before > 0.5 and correction.error_after < 0.005
    # with the default prior too, less closely for delta (a few percent of any plan's time)
    default = fitted(measurements)
    assert default.factor("replication_cost_us") == pytest.approx(20.0, rel=0.05)
    assert default.factor(OPERATORS_TERM) == pytest.approx(1.3, rel=0.03)
    assert default.factor("thread_switch_overhead_us") == pytest.approx(3.0, rel=0.2)
    assert default.error_after < 0.03


def test_a_solver_on_synthetic_linear_terms_recovers_every_factor():
    # seconds per record = sum of features x factor x unit: the fit sees only the measurements
    features = {f"p{i}": row for i, row in enumerate(
        [(1, 0, 0), (1, 1, 0), (1, 0, 1), (2, 1, 1), (1, 3, 0), (0.5, 0, 2)])}
    truth = (2.0, 0.5, 7.0)
    terms = ("a", "b", "c")
    plans = [replace(SEQUENTIAL, notes=(name,)) for name in features]

    def seconds(measurement, factors):
        row = features[measurement.plan.notes[0]]
        return sum(value * factors[term] for value, term in zip(row, terms)) * 1e-5

    measurements = [PlanMeasurement(plan, CHAIN, MACHINE,
                                     1 / (sum(v * f for v, f in zip(features[plan.notes[0]], truth)) * 1e-5))
                    for plan in plans]
    correction = fit_correction(measurements, terms, seconds, CorrectionConfig(prior_weight=1e-6))
    for term, value in zip(terms, truth):
        assert correction.factor(term) == pytest.approx(value, rel=0.03)


def test_no_measurement_means_no_correction():
    correction = fitted([])
    assert correction.is_identity() and correction.plans == 0 and correction.scale == 1.0
    assert correction.as_dict == {OPERATORS_TERM: 1.0, "thread_switch_overhead_us": 1.0, "replication_cost_us": 1.0}


def test_measurements_that_match_the_model_leave_every_factor_at_one():
    correction = fitted(measured(PLANS, MACHINE))
    assert all(value == pytest.approx(1.0, abs=1e-6) for _, value in correction.factors)
    assert correction.error_before == pytest.approx(0.0, abs=1e-9)


def test_a_term_no_measured_plan_has_gets_no_factor_of_its_own():
    # only plans without replicas ran, 40 % slower than predicted: c_p has no evidence at all,
    # so it follows the overall scale the measured plans show, nothing more
    truth = replace(MACHINE, replication_cost_us=99.0)
    no_replicas = [PLANS[0], PLANS[1], PLANS[2]]
    correction = fitted(measured(no_replicas, truth, cost_factor=1.4))
    assert correction.relative("replication_cost_us") == 1.0
    assert correction.factor(OPERATORS_TERM) == pytest.approx(1.4, rel=0.03)


def test_one_measured_plan_only_sets_the_overall_scale_and_changes_no_ranking():
    # one plan 2.5x slower than predicted: which term is off, one plan cannot tell
    truth = replace(MACHINE, replication_cost_us=MACHINE.replication_cost_us * 20)
    correction = fitted(measured([PLANS[4]], truth))
    assert correction.scale == pytest.approx(1 / (evaluate(CHAIN, PLANS[4], truth).throughput_per_s
                                                   / evaluate(CHAIN, PLANS[4], MACHINE).throughput_per_s), rel=0.02)
    assert not correction.reranks(tolerance=0.02)
    search, corrected = ChainPlanSearch(), ChainPlanSearch().with_factors(correction.as_dict)
    ratios = [corrected.predict_per_s(CHAIN, plan, MACHINE) / search.predict_per_s(CHAIN, plan, MACHINE) for plan in PLANS]
    assert max(ratios) == pytest.approx(min(ratios), rel=0.03)


def test_small_noise_moves_the_factors_only_a_little():
    measurements = measured(PLANS, MACHINE)
    noisy = [replace(m, measured_per_s=m.measured_per_s * (1.02 if i % 2 else 0.98)) for i, m in enumerate(measurements)]
    correction = fitted(noisy)
    assert all(0.8 < value < 1.25 for _, value in correction.factors)


def test_factors_stay_within_their_bound():
    truth = replace(MACHINE, replication_cost_us=MACHINE.replication_cost_us * 1000)
    correction = fitted(measured(PLANS, truth), CorrectionConfig(max_factor=10.0))
    assert correction.factor("replication_cost_us") == pytest.approx(10.0)


def test_one_measurement_per_plan_and_only_the_latest_plans_are_kept():
    store = ModelCorrection(CorrectionConfig(max_plans=3))
    for measurement in measured(PLANS, MACHINE):
        store.record(measurement)
    store.record(replace(measured([PLANS[6]], MACHINE)[0], measured_per_s=123.0))
    assert [m.measured_per_s for m in store.measurements][-1] == 123.0
    assert len(store.measurements) == 3
    store.record(replace(measured([PLANS[0]], MACHINE)[0], measured_per_s=float("nan")))  # unusable: ignored
    assert len(store.measurements) == 3


def test_the_spark_search_is_correctable_and_scales_its_constants():
    from fissure.model.spark_model import SparkConstants, SparkWorkload, evaluate_spark
    from fissure.plan.spark_chain import SparkModelSettings
    from fissure.control.adaptive.spark_model_search import SparkModelSearch

    chain = (OperatorStats("a", Kind.STATELESS, 50.0, 1.0), OperatorStats("b", Kind.STATELESS, 50.0, 1.0))
    settings = SparkModelSettings(SparkConstants(), SparkWorkload(batch_records=2000))
    search = SparkModelSearch(settings)
    assert isinstance(search, CorrectablePlanSearch)
    assert set(search.correction_terms()) == {OPERATORS_TERM, *SparkConstants.names()}
    machine = Machine(cores=2)
    fused, replicated = parse_fingerprint("[a,b]"), parse_fingerprint("[a,b]x2")
    dear_exchange = search.with_factors({"exchange_record_us": 10.0})
    assert dear_exchange.predict_per_s(chain, fused, machine) == pytest.approx(search.predict_per_s(chain, fused, machine))
    expected = evaluate_spark(chain, replicated, 2, SparkConstants(exchange_record_us=5.0), settings.workload)
    assert dear_exchange.predict_per_s(chain, replicated, machine) == pytest.approx(expected.throughput_per_s)
    # and the correction learns that factor from two measured plans
    truth = SparkConstants(exchange_record_us=5.0)
    store = ModelCorrection()
    for plan in (fused, replicated, parse_fingerprint("[a|b]")):
        true_rate = evaluate_spark(chain, plan, 2, truth, settings.workload).throughput_per_s
        store.record(PlanMeasurement(plan, chain, machine, true_rate))
    correction = store.fit(search)
    assert correction.error_after < 0.01
    corrected = search.with_factors(correction.as_dict)
    for plan in (fused, replicated):  # an RMS error under 1 % over three plans: each within sqrt(3) %
        assert corrected.predict_per_s(chain, plan, machine) == pytest.approx(
            evaluate_spark(chain, plan, 2, truth, settings.workload).throughput_per_s, rel=0.0175)


# -- the loop -------------------------------------------------------------------------------------


def best_and_final(run) -> tuple[float, float]:
    end_s = run.system.clock() - 1.0
    best = run.system.best_static(end_s, method="optimal").evaluation.throughput_per_s
    return run.system.capacity_per_s(run.system.plan, end_s), best


@pytest.mark.parametrize("seed", [0, 3])
def test_with_a_wrong_model_the_loop_learns_and_reaches_the_best_plan(seed):
    run = run_scenario(scenario("model-mismatch", seed, quick=True))
    ours, best = best_and_final(run)
    assert ours >= 0.9 * best
    assert run.controller.correction.factor("replication_cost_us") == pytest.approx(20.0, rel=0.15)
    changed = [d for d in run.decisions if "the correction changed the ranking" in d.reason]
    assert changed and changed[0].action is Action.APPLY
    assert changed[0].correction is not None and changed[0].correction.factor("replication_cost_us") > 10
    blacklisted = []
    for decision in run.decisions:  # a blacklisted change stays blacklisted, corrected model or not
        if decision.action in (Action.APPLY, Action.RELEASE):
            assert not any(decision.switch.change.repeats(bad) for bad in blacklisted)
        if decision.blacklisted is not None:
            blacklisted.append(decision.blacklisted)


def test_without_learning_the_same_run_stays_far_from_the_best_plan():
    chosen = scenario("model-mismatch", 0, quick=True)
    run = run_scenario(replace(chosen, config=replace(chosen.config, correct_model=False)))
    ours, best = best_and_final(run)
    assert ours < 0.8 * best
    assert run.controller.correction is None
    assert not any("model corrected" in d.reason for d in run.decisions)


def test_the_correction_is_off_for_a_search_that_cannot_be_corrected():
    from fissure.control.adaptive.controller import AdaptiveController
    from fissure.control.simulate import TablePlanSearch

    ctl = AdaptiveController(CHAIN, MACHINE, SEQUENTIAL, AdaptiveConfig(), search=TablePlanSearch())
    assert ctl.correction is None and ctl.measured_plans == ()
