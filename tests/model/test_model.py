"""The throughput model, eqs. 1-14, against values computed by hand."""

import math

import pytest

from fissure.model.throughput import InvalidPlan, canonical_regions, evaluate
from fissure.model.types import Kind, Machine, OperatorStats, Plan, RegionPlan

A = OperatorStats("A", Kind.STATELESS, cost_us=10.0, selectivity=0.5)
B = OperatorStats("B", Kind.STATELESS, cost_us=20.0, selectivity=1.0)
MACHINE = Machine(cores=4, thread_switch_overhead_us=1.0, replication_cost_us=2.0)


def plan(*regions):
    return Plan(tuple(RegionPlan(tuple(tuple(p) for p in pipelines), replicas) for pipelines, replicas in regions))


def test_sequential_throughput_is_inverse_of_selectivity_weighted_cost():
    result = evaluate([A, B], plan(([["A", "B"]], 1)), MACHINE)
    # c = 10 + 0.5 * 20 = 20 us per tuple (eq. 2)
    assert result.throughput_per_s == pytest.approx(1e6 / 20)
    assert result.utilization == pytest.approx(1.0)
    assert result.threads == 1


def test_two_pipelines_pay_thread_switching_on_both_sides():
    result = evaluate([A, B], plan(([["A"], ["B"]], 1)), MACHINE)
    first, second = result.regions[0].pipelines
    assert first.switch_overhead_us == pytest.approx(0.5)  # eq. 5: output side, times s = 0.5
    assert second.switch_overhead_us == pytest.approx(1.0)  # eq. 5: input side
    # eq. 3: min(1 / 10.5, (1 / 21) / 0.5) = 1 / 10.5
    assert result.throughput_per_s == pytest.approx(1e6 / 10.5)
    # eq. 14: R * (10.5 + 0.5 * 21) = 21 / 10.5
    assert result.utilization == pytest.approx(2.0)


def test_replicated_region_pays_log2_replication_cost():
    result = evaluate([A, B], plan(([["A", "B"]], 4)), MACHINE)
    # eq. 8: R* = (2 log2 4 + 1 / ((1 / 20) * 4))^-1 = 1 / 9
    assert result.throughput_per_s == pytest.approx(1e6 / 9)
    assert result.utilization == pytest.approx(24 / 9)  # (4 + 20) / 9


def test_bounded_throughput_scales_by_cores_over_utilization_only_when_over():
    two_cores = Machine(cores=2, thread_switch_overhead_us=1.0, replication_cost_us=2.0)
    result = evaluate([A, B], plan(([["A", "B"]], 4)), two_cores)
    assert result.unbounded_throughput_per_s == pytest.approx(1e6 / 9)
    assert result.throughput_per_s == pytest.approx(1e6 / 9 * 2 / (24 / 9))  # eq. 13
    plenty = evaluate([A, B], plan(([["A", "B"]], 4)), Machine(8, 1.0, 2.0))
    assert plenty.throughput_per_s == pytest.approx(plenty.unbounded_throughput_per_s)


def test_bounded_linear_scalability_caps_replicas():
    capped = OperatorStats("A", Kind.STATELESS, 10.0, 0.5, max_scale=2)
    result = evaluate([capped, B], plan(([["A", "B"]], 4)), MACHINE)
    assert result.regions[0].scalability == 2  # eq. 7: min over operators
    assert result.throughput_per_s == pytest.approx(1e6 / 14)  # (4 + 1 / (2 / 20))^-1


def test_region_switching_between_regions():
    result = evaluate([A, B], plan(([["A"]], 1), ([["B"]], 2)), MACHINE)
    first, second = result.regions
    assert first.switch_overhead_us == pytest.approx(0.5)  # eq. 10: output side, times s(P_1)
    assert second.switch_overhead_us == pytest.approx(1.0)  # eq. 10: input side
    assert second.capacity_in_chain_per_us == pytest.approx(1 / 13)  # eq. 9: (1 + 12)^-1
    assert result.throughput_per_s == pytest.approx(1e6 / 10.5)  # eq. 11: min(1/10.5, 2/13)
    assert result.utilization == pytest.approx(22 / 10.5)


def test_adjacent_unreplicated_regions_are_one_region():
    split = evaluate([A, B], plan(([["A"]], 1), ([["B"]], 1)), MACHINE)
    merged = evaluate([A, B], plan(([["A"], ["B"]], 1)), MACHINE)
    assert len(split.regions) == 1
    assert split.throughput_per_s == pytest.approx(merged.throughput_per_s)
    assert split.utilization == pytest.approx(merged.utilization)
    assert canonical_regions(plan(([["A"]], 1), ([["B"]], 1))) == merged.plan.regions


def test_zero_selectivity_downstream_never_limits():
    drop = OperatorStats("drop", Kind.STATELESS, 5.0, 0.0)
    costly = OperatorStats("costly", Kind.STATELESS, 1000.0, 1.0)
    result = evaluate([drop, costly], plan(([["drop"], ["costly"]], 1)), MACHINE)
    assert result.throughput_per_s == pytest.approx(1e6 / 5.0)  # eq. 5: 0 * delta on the way out
    assert math.isfinite(result.utilization)


@pytest.mark.parametrize(
    "operators, bad_plan, message",
    [
        ([A, B], plan(([["B", "A"]], 1)), "chain order"),
        ([A, B], plan(([["A"]], 1)), "each once"),
        (
            [OperatorStats("S", Kind.STATEFUL, 1, 1), B],
            plan(([["S", "B"]], 2)),
            "stateful operator 'S'",
        ),
        (
            [
                OperatorStats("P", Kind.PARTITIONED, 1, 1, key=("host",)),
                OperatorStats("Q", Kind.PARTITIONED, 1, 1, key=("user",)),
            ],
            plan(([["P", "Q"]], 2)),
            "share no key field",
        ),
    ],
)
def test_invalid_plans_are_refused_with_the_reason(operators, bad_plan, message):
    with pytest.raises(InvalidPlan, match=message):
        evaluate(operators, bad_plan, MACHINE)


def test_operators_with_overlapping_keys_may_share_a_replicated_region():
    p = OperatorStats("P", Kind.PARTITIONED, 1, 1, key=("host", "user"))
    q = OperatorStats("Q", Kind.PARTITIONED, 1, 1, key=("host", "port"))
    result = evaluate([p, q], plan(([["P", "Q"]], 2)), MACHINE)
    assert result.regions[0].kind is Kind.PARTITIONED
    assert result.regions[0].key == ("host",)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(kind=Kind.PARTITIONED, cost_us=1, selectivity=1), "no key"),
        (dict(kind=Kind.STATELESS, cost_us=-1, selectivity=1), "cost"),
        (dict(kind=Kind.STATELESS, cost_us=1, selectivity=float("nan")), "selectivity"),
        (dict(kind=Kind.STATEFUL, cost_us=1, selectivity=1, key=("k",)), "has a key"),
    ],
)
def test_operator_statistics_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        OperatorStats("op", **kwargs)
