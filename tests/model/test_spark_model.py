"""The Spark-faithful throughput model: its stages match the compiler, its shape, the planners on it."""

from __future__ import annotations

import json
import math
import random
import statistics
from collections import Counter
from dataclasses import replace

import pytest

from fissure import Pipeline
from fissure.program.graph import as_graph
from fissure.model.calibration import BatchObservation, fit_spark_constants
from fissure.model.spark_model import SparkConstants, SparkWorkload, batch_time_terms, evaluate_spark, batch_part_terms
from fissure.model.spark_stages import hash_balance, spark_stages
from fissure.model.spec import load_spec
from fissure.model.state_buckets import new_checkpoint_buckets
from fissure.model.types import Kind, Machine, OperatorStats, Plan, RegionPlan
from fissure.plan.planners import plan_chain
from fissure.plan.spark_chain import SparkChainModel, SparkModelSettings

from repository import EXAMPLES

LOGWATCH = EXAMPLES / "logwatch.json"


def stateless(name, cost_us, selectivity=1.0):
    return OperatorStats(name, Kind.STATELESS, cost_us, selectivity)


def plan_of(*regions):
    """plan_of(([["a", "b"], ["c"]], 2), ...): regions of pipelines with replicas."""
    return Plan(tuple(RegionPlan(tuple(tuple(pipeline) for pipeline in pipelines), replicas)
                      for pipelines, replicas in regions))


CHAIN = [stateless("a", 5.0), stateless("b", 3.0, 0.5),
         OperatorStats("c", Kind.PARTITIONED, 8.0, 1.0, key=("user",)), stateless("d", 4.0),
         OperatorStats("e", Kind.STATEFUL, 2.0, 1.0)]
PLANS = [
    plan_of(([["a", "b", "c", "d", "e"]], 1)),
    plan_of(([["a", "b"]], 2), ([["c", "d"]], 2), ([["e"]], 1)),
    plan_of(([["a"], ["b"]], 1), ([["c"]], 2), ([["d"]], 2), ([["e"]], 1)),
    plan_of(([["a"]], 1), ([["b"]], 2), ([["c"], ["d"]], 1), ([["e"]], 1)),
    plan_of(([["a", "b"], ["c", "d", "e"]], 1)),
]


def modelled_steps(operators, plan, scan_spreads=False):
    """The model's Python nodes in order, as (kind, pipelines, exchange before, partitions)."""
    names = [operator.name for operator in operators]
    steps = []
    for number, stage in enumerate(spark_stages(operators, plan, scan_spreads=scan_spreads)):
        for position, node in enumerate(stage.nodes):
            first = position == 0 and number > 0
            steps.append((node.kind, tuple(tuple(names[i] for i in pipeline) for pipeline in node.pipelines),
                          stage.exchange if first else "none", stage.partitions if first else None))
    return steps


@pytest.mark.spark
def test_the_models_spark_stages_are_the_compilers(spark, tmp_path):
    from fissure.spark.query.compile_graph import compile_graph
    from fissure.testing import record_files

    source = record_files(tmp_path / "in", [{"user": "u", "i": 1}], {"user": str, "i": int}).open(spark)
    pipeline = (Pipeline("model").map("a", lambda r: r).filter("b", lambda r: True)
                .partitioned("c", lambda state, r: r, key="user").map("d", lambda r: r)
                .stateful("e", lambda state, r: r))
    for plan in PLANS:
        for scan_spreads in (False, True):
            compiled = compile_graph(as_graph(pipeline), {"source": source}, plan=plan, scan_spreads=scan_spreads)
            assert modelled_steps(CHAIN, plan, scan_spreads) == [
                (step.kind, step.pipelines, step.exchange, step.partitions) for step in compiled.steps], plan


def test_batch_time_is_fixed_costs_plus_stage_times_and_throughput_is_records_over_it():
    evaluation = evaluate_spark(CHAIN, PLANS[1], 2, SparkConstants(), SparkWorkload(batch_records=5000))
    defaults = SparkConstants()  # CHAIN has two stateful operators
    assert evaluation.batch_time_s == pytest.approx(sum(stage.time_s for stage in evaluation.stages)
                                                    + defaults.batch_fixed_s + 2 * defaults.state_operator_batch_s)
    assert evaluation.throughput_per_s == pytest.approx(5000 / evaluation.batch_time_s)
    assert 0 < evaluation.utilization <= 2
    assert evaluation.fixed_s < evaluation.batch_time_s


def test_larger_batches_amortize_the_fixed_costs():
    rates = [evaluate_spark(CHAIN, PLANS[0], 2, workload=SparkWorkload(batch_records=n)).throughput_per_s
             for n in (100, 1000, 10_000, 100_000)]
    assert rates == sorted(rates) and rates[-1] > 3 * rates[0]


def test_fission_of_a_costly_stateless_operator_approaches_the_core_count_and_no_further():
    chain = [stateless("heavy", 200.0)]
    workload = SparkWorkload(batch_records=200_000)
    no_fixed = SparkConstants(batch_fixed_s=0, stage_fixed_s=0, task_fixed_s=0)
    one, two, four = (evaluate_spark(chain, plan_of(([["heavy"]], r)), 2, no_fixed, workload).throughput_per_s
                      for r in (1, 2, 4))
    assert 1.7 < two / one < 2.0  # the exchange costs a little
    assert four <= two * 1.0001  # replicas beyond the task slots run in waves
    # a PE of two processes in each of two replicas oversubscribes two cores: no gain over x2
    pipelined = evaluate_spark([stateless("x", 100.0), stateless("y", 100.0)], plan_of(([["x"], ["y"]], 2)), 2,
                               no_fixed, workload).throughput_per_s
    fused = evaluate_spark([stateless("x", 100.0), stateless("y", 100.0)], plan_of(([["x", "y"]], 2)), 2,
                           no_fixed, workload).throughput_per_s
    assert pipelined <= fused


def test_stages_add_up_where_the_papers_pipelines_overlap():
    """A stateful operator after a stateless one: Spark runs the two stages one after the other."""
    chain = [stateless("parse", 50.0), OperatorStats("total", Kind.STATEFUL, 50.0, 1.0)]
    plan = plan_of(([["parse"]], 2), ([["total"]], 1))
    zero = SparkConstants(**{name: 0.0 for name in SparkConstants.names()})
    evaluation = evaluate_spark(chain, plan, 2, zero, SparkWorkload(batch_records=10_000))
    # parse on two slots (0.25 s), then total on one (0.5 s): 0.75 s, not max(0.25, 0.5)
    assert evaluation.batch_time_s == pytest.approx(0.75)


@pytest.mark.parametrize("buckets", [None, 64])
def test_keys_per_batch_cost_the_stateful_node_per_key(buckets):
    chain = [OperatorStats("count", Kind.PARTITIONED, 1.0, 1.0, key=("k",))]
    plan = plan_of(([["count"]], 1))
    constants = SparkConstants()

    def batch_time(keys: int) -> float:
        workload = SparkWorkload(1000, keys_per_batch={"count": keys}, state_buckets=buckets)
        return evaluate_spark(chain, plan, 2, constants, workload).batch_time_s

    groups = buckets or new_checkpoint_buckets(2)  # None: a new checkpoint's on 2 cores, 8
    # Up to `groups` keys, each key is its own Spark group too; beyond, keys share buckets.
    assert batch_time(groups) - batch_time(groups // 2) == pytest.approx(
        groups // 2 * (constants.state_key_us + constants.state_group_us) / 1e6)
    assert batch_time(groups + 500) - batch_time(groups) == pytest.approx(500 * constants.state_key_us / 1e6)


def test_fewer_buckets_are_fewer_calls_but_never_split_more_ways_than_they_are():
    from fissure.model.spark_stages import bucket_balance

    chain = [OperatorStats("count", Kind.PARTITIONED, 1.0, 1.0, key=("k",))]
    plan = plan_of(([["count"]], 2))

    def per_s(buckets: int) -> float:
        workload = SparkWorkload(10_000, keys_per_batch={"count": 5000}, state_buckets=buckets)
        return evaluate_spark(chain, plan, 2, SparkConstants(), workload).throughput_per_s

    assert per_s(8) > per_s(64)
    assert bucket_balance(5000, 3, 64) == pytest.approx(64 / 22)
    assert bucket_balance(5000, 3, 8) == pytest.approx(8 / 3)
    assert bucket_balance(5000, 8, 4) == pytest.approx(4.0)  # four buckets: four ways at most
    with pytest.raises(ValueError, match="one of 2, 4, 8, 16, 32, 64"):
        SparkWorkload(state_buckets=12)


ZERO = SparkConstants(**{name: 0.0 for name in SparkConstants.names()})


def test_hashing_few_keys_splits_a_keyed_stage_fewer_ways_than_its_partitions():
    for keys in (4, 8, 32, 200):  # two partitions: the exact E[max(X, K - X)], X ~ Binomial(K, 1/2)
        largest = sum(math.comb(keys, x) * max(x, keys - x) for x in range(keys + 1)) / 2 ** keys
        assert hash_balance(keys, 2) == pytest.approx(keys / largest, rel=0.03), keys
    draw = random.Random(5)
    for keys in (16, 64):  # four partitions: a simulation with a fixed seed
        largest = statistics.fmean(max(Counter(draw.randrange(4) for _ in range(keys)).values())
                                   for _ in range(4000))
        assert hash_balance(keys, 4) == pytest.approx(keys / largest, rel=0.05), keys
    assert hash_balance(1, 4) == 1.0 and hash_balance(3, 1) == 1.0 and hash_balance(10**6, 2) > 1.99


def test_a_replicated_keyed_stage_splits_as_its_keys_hash():
    chain = [OperatorStats("count", Kind.PARTITIONED, 100.0, 1.0, key=("k",))]
    plan = plan_of(([["count"]], 2))
    times = {keys: evaluate_spark(chain, plan, 2, ZERO, SparkWorkload(10_000, keys_per_batch={"count": keys}))
             .batch_time_s for keys in (4, 32, 5000)}
    # one second of work; the largest of the two partitions holds 1 / hash_balance of it
    assert times[4] == pytest.approx(1.0 / hash_balance(4, 2))
    assert times[4] > times[32] > times[5000] > 0.5


def test_every_state_partition_pays_its_store_an_empty_one_too():
    """An unkeyed stateful operator runs in one task however many state partitions there are; the
    other partitions still load and commit their stores, on CPU the busy task then shares."""
    chain = [OperatorStats("total", Kind.STATEFUL, 50.0, 1.0)]  # 0.5 s of work in 10,000 records
    plan = plan_of(([["total"]], 1))

    def batch_s(constants, partitions):
        return evaluate_spark(chain, plan, 2, constants,
                              SparkWorkload(10_000, default_state_partitions=partitions)).batch_time_s

    task_only = ZERO.with_values(state_partition_fixed_s=0.1)
    assert batch_s(task_only, 1) == pytest.approx(0.6)
    assert batch_s(task_only, 2) == pytest.approx(0.6)  # the idle partition's store work fits on the idle core
    with_jvm = task_only.with_values(state_partition_jvm_s=0.3)
    assert batch_s(with_jvm, 1) == pytest.approx(0.6)  # 0.9 s of CPU on two cores: the task's 0.6 s path rules
    assert batch_s(with_jvm, 2) == pytest.approx((0.5 + 2 * 0.4) / 2)  # 1.3 s of CPU on two cores


def test_batch_time_is_linear_in_the_constants_around_a_point():
    constants = SparkConstants(io_record_us=2.0, state_key_us=300.0)
    workload = SparkWorkload(4000, keys_per_batch={"c": 50})
    for plan in PLANS:
        slopes, operators_s = batch_time_terms(CHAIN, plan, 2, constants, workload)
        predicted = operators_s + sum(slopes[name] * getattr(constants, name) for name in slopes)
        assert predicted == pytest.approx(evaluate_spark(CHAIN, plan, 2, constants, workload).batch_time_s)


def synthetic_observations(truth: SparkConstants) -> list[BatchObservation]:
    """Batches the model generates with `truth`, their stages timed: CHAIN under every plan of
    PLANS and its stateless head (without stateful nodes, so that the fixed costs can be told
    apart) in one and two replicas, at two batch sizes and two key counts."""
    runs = [(CHAIN, plan) for plan in PLANS] + [(CHAIN[:2], plan_of(([["a", "b"]], r))) for r in (1, 2)]
    observations = []
    for chain, plan in runs:
        for records in (2000, 20_000):
            for keys in (4, 400):
                workload = SparkWorkload(records, keys_per_batch={"c": keys})
                evaluation = evaluate_spark(chain, plan, 2, truth, workload)
                observations.append(BatchObservation("synthetic", tuple(chain), plan, 2, workload, evaluation.batch_time_s,
                                                     tuple(stage.time_s for stage in evaluation.stages)))
    return observations


def test_the_fit_recovers_constants_from_batches_the_model_generated():
    truth = SparkConstants(batch_fixed_s=0.4, stage_fixed_s=0.03, state_partition_fixed_s=0.1, io_record_us=1.5,
                           python_record_us=0.7, exchange_record_us=0.9, state_key_us=800.0)
    fitted = ("batch_fixed_s", "stage_fixed_s", "state_partition_fixed_s", "io_record_us", "python_record_us",
              "exchange_record_us", "state_key_us")
    observations = [replace(item, stage_s=None) for item in synthetic_observations(truth)]
    fit = fit_spark_constants(observations, SparkConstants(), fitted)
    for name in fitted:
        assert getattr(fit.constants, name) == pytest.approx(getattr(truth, name), rel=1e-4), name
    assert fit.r_squared == pytest.approx(1.0) and fit.median_abs_relative_error < 1e-6


def test_stage_times_are_linear_in_the_constants_and_add_up_to_the_batch():
    constants = SparkConstants(io_record_us=2.0, state_key_us=300.0, state_partition_jvm_s=0.05)
    workload = SparkWorkload(4000, keys_per_batch={"c": 50})
    for plan in PLANS:
        evaluation = evaluate_spark(CHAIN, plan, 2, constants, workload)
        *stages, (rest, rest_operators_s) = batch_part_terms(CHAIN, plan, 2, constants, workload)
        assert len(stages) == len(evaluation.stages)
        for (slopes, operators_s), figures in zip(stages, evaluation.stages):
            assert slopes["batch_fixed_s"] == 0.0 and slopes["state_operator_batch_s"] == 0.0
            assert operators_s + sum(slopes[name] * getattr(constants, name) for name in slopes) == \
                pytest.approx(figures.time_s)
        # outside the stages: the batch's fixed cost and each of CHAIN's two stateful operators'
        assert rest_operators_s == pytest.approx(0.0, abs=1e-9)
        assert {name: value for name, value in rest.items() if abs(value) > 1e-9} == \
            {"batch_fixed_s": pytest.approx(1.0), "state_operator_batch_s": pytest.approx(2.0)}
        assert evaluation.batch_time_s == pytest.approx(constants.batch_fixed_s + 2 * constants.state_operator_batch_s
                                                        + sum(stage.time_s for stage in evaluation.stages))


def test_stage_times_tell_apart_constants_that_batch_times_cannot():
    """In batch totals a batch's fixed cost trades off with the stores on the tasks' path and with
    the Python nodes' hand-over (every stage here has Python nodes); with every stage measured the
    fit recovers every constant. A batch whose stages do not match the model's count falls back
    to its batch time, and the fit says so."""
    truth = SparkConstants(batch_fixed_s=0.3, stage_fixed_s=0.02, python_node_fixed_s=0.025,
                           state_operator_batch_s=0.04, state_partition_fixed_s=0.1, state_partition_jvm_s=0.06,
                           io_record_us=1.0, state_key_us=500.0)
    fitted = ("batch_fixed_s", "stage_fixed_s", "python_node_fixed_s", "state_operator_batch_s",
              "state_partition_fixed_s", "state_partition_jvm_s", "io_record_us", "state_key_us")
    observations = synthetic_observations(truth)
    totals_only = [replace(item, stage_s=None) for item in observations]
    confounded = fit_spark_constants(totals_only, SparkConstants(), fitted).constants
    assert any(getattr(confounded, name) != pytest.approx(getattr(truth, name), rel=0.1) for name in fitted)
    fit = fit_spark_constants(observations, SparkConstants(), fitted)
    for name in fitted:
        assert getattr(fit.constants, name) == pytest.approx(getattr(truth, name), rel=1e-4), name
    assert all(error == pytest.approx(0.0, abs=1e-9) for item in fit.residuals for error in item.stage_errors_s)
    assert not fit.notes
    mismatched = [replace(item, stage_s=item.stage_s[:-1]) for item in observations[:3]] + observations[3:]
    fit = fit_spark_constants(mismatched, SparkConstants(), fitted)
    assert any("3 batches had a different number of Spark stages" in note for note in fit.notes)
    assert fit.residuals[0].stage_errors_s is None
    assert fit.constants.state_partition_jvm_s == pytest.approx(truth.state_partition_jvm_s, rel=1e-4)


def test_invalid_constants_and_workloads_name_the_fault():
    with pytest.raises(ValueError, match="exchange_record_us"):
        SparkConstants(exchange_record_us=-1)
    with pytest.raises(ValueError, match="unknown Spark model constants"):
        SparkConstants.from_dict({"nonsense": 1})
    with pytest.raises(ValueError, match="batch_records"):
        SparkWorkload(batch_records=0)


# -- the planners on the Spark model --------------------------------------------------------------


@pytest.mark.parametrize("method", ["heuristic", "paper-heuristic", "optimal", "fission-only", "pipelining-only",
                                    "sequential"])
def test_every_planner_ranks_by_the_spark_model(method):
    spec = load_spec(LOGWATCH, cores=2)
    settings = SparkModelSettings(workload=SparkWorkload(batch_records=20_000))
    result = plan_chain(spec.operators, spec.machine, method, spark=settings)
    assert result.spark is not None and result.plan.threads <= 4
    assert result.throughput_per_s == result.spark.throughput_per_s
    model = SparkChainModel(spec.operators, 2, settings)
    assert result.throughput_per_s == pytest.approx(model.throughput(model.from_plan(result.plan)) * 1e6)


def test_the_exact_spark_search_bounds_the_heuristic_which_beats_sequential():
    chain = [stateless("parse", 30.0), stateless("score", 60.0, 0.5),
             OperatorStats("per_user", Kind.PARTITIONED, 20.0, 1.0, key=("user",)), stateless("format", 5.0)]
    machine = Machine(cores=2)
    settings = SparkModelSettings(workload=SparkWorkload(batch_records=50_000, keys_per_batch={"per_user": 20}))
    best = plan_chain(chain, machine, "optimal", spark=settings).throughput_per_s
    heuristic = plan_chain(chain, machine, "heuristic", spark=settings).throughput_per_s
    sequential = plan_chain(chain, machine, "sequential", spark=settings).throughput_per_s
    assert best >= heuristic * (1 - 1e-9) and heuristic > sequential


def test_plan_command_keeps_the_paper_model_unless_told(capsys, tmp_path, monkeypatch):
    from fissure.cli import main
    from fissure.model.calibration import Calibration
    from fissure.plan.stored_calibration import save_calibration

    monkeypatch.setenv("FISSURE_CALIBRATION", str(tmp_path / "none.json"))
    assert main(["plan", str(LOGWATCH), "--cores", "2", "--json"]) == 0
    paper = json.loads(capsys.readouterr().out)
    assert "model" not in paper
    assert main(["plan", str(LOGWATCH), "--cores", "2", "--json", "--model", "spark"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert default["model"] == "spark" and set(paper) <= set(default)
    assert default["throughput_per_s"] < paper["throughput_per_s"]  # micro-batch and state costs count
    slow = Calibration(spark=SparkConstants(batch_fixed_s=5.0), thread_switch_overhead_us=1.0,
                       thread_switch_overhead_large_us=None, replication_cost_us=None, batch_records=10_000,
                       cores=2, master="local[2]", measured_at="2026-11-22")
    save_calibration(slow, tmp_path / "slow.json")
    monkeypatch.setenv("FISSURE_CALIBRATION", str(tmp_path / "slow.json"))
    assert main(["plan", str(LOGWATCH), "--cores", "2", "--json", "--model", "spark"]) == 0
    calibrated = json.loads(capsys.readouterr().out)
    assert calibrated["batch_records"] == 10_000 and calibrated["batch_time_s"] > 5.0
    assert not math.isclose(calibrated["throughput_per_s"], default["throughput_per_s"])


def test_a_combined_aggregate_sends_partials_through_its_exchange():
    """Word count: a split then a count of few keys; combined, the exchange and the keyed stage see
    about the keys per task, not every word, and the plan gets faster."""
    from fissure.model.spark_model import combine_selectivity, combined_partials

    split = stateless("split", 2.0, 12.0)
    count = OperatorStats("count", Kind.PARTITIONED, 1.0, 0.01, key=("word",))
    plan = plan_of(([["split", "count"]], 2))
    workload = SparkWorkload(10_000, source_partitions=2, keys_per_batch={"count": 1000})
    whole = evaluate_spark([split, count], plan, 2, SparkConstants(), workload)
    combined = evaluate_spark([split, replace(count, combined=True)], plan, 2, SparkConstants(), workload)
    keyed = [index for index, stage in enumerate(whole.stages) if stage.shape.exchange == "hash"][0]
    assert whole.stages[keyed].records_in == pytest.approx(120_000)
    assert combined.stages[keyed].records_in == pytest.approx(combined_partials(120_000, 1000, 2))
    assert combined.stages[keyed].records_in <= 2 * 1000 + 1e-6  # each task sends its keys
    assert combined.throughput_per_s > whole.throughput_per_s
    # every record its own key: nothing to gain, the partials are the records
    assert combined_partials(100, 1e9, 2) == pytest.approx(100, rel=1e-3)
    assert combine_selectivity(count, workload, 120_000, 2) == 1.0  # not combined


def test_a_combine_is_priced_on_the_keys_its_counted_partials_imply_at_the_folds_that_made_them():
    """Hot items' bids per auction and window: the partials a run counted, solved for the keys a
    uniform draw would need at the plan's folds, give back those partials at that plan, and the
    occupancy's estimate at other folds."""
    from fissure.model.spark_model import combine_folds, combine_selectivity, combined_partials, uniform_combine_keys

    parse = stateless("parse", 2.0, 1.0)
    bids = OperatorStats("bids", Kind.PARTITIONED, 1.0, 0.07, key=("auction",), combined=True)
    replicated, single = plan_of(([["parse", "bids"]], 2)), plan_of(([["parse", "bids"]], 1))
    workload = SparkWorkload(250_000, source_partitions=2, keys_per_batch={"bids": 9_933})
    assert combine_folds([parse, bids], replicated, 2, workload) == {"bids": 2}
    assert combine_folds([parse, bids], single, 2, workload) == {"bids": 2}  # a task per source partition
    assert combine_folds([parse, bids], single, 2, replace(workload, source_partitions=1)) == {"bids": 1}
    assert combine_folds([parse, replace(bids, combined=False)], replicated, 2, workload) == {}
    keys = uniform_combine_keys(250_000, 24_008, 2)
    assert combined_partials(250_000, keys, 2) == pytest.approx(24_008, rel=1e-5)
    assert 9_933 < keys < 17_712  # more than the key groups, fewer than the distinct keys and windows
    measured = replace(workload, combine_keys_per_batch={"bids": keys})
    assert combine_selectivity(bids, measured, 250_000, 2) * 250_000 == pytest.approx(24_008, rel=1e-5)
    assert combine_selectivity(bids, workload, 250_000, 2) * 250_000 == pytest.approx(combined_partials(250_000, 9_933, 2))
    on_keys = evaluate_spark([parse, bids], replicated, 2, SparkConstants(), workload)
    on_partials = evaluate_spark([parse, bids], replicated, 2, SparkConstants(), measured)
    keyed = [index for index, stage in enumerate(on_keys.stages) if stage.shape.exchange == "hash"][0]
    assert on_partials.stages[keyed].records_in == pytest.approx(24_008, rel=1e-5)
    assert on_partials.batch_time_s > on_keys.batch_time_s  # more partials to merge than the keys said
    # one fold makes a partial of every key and window the run counted, whatever the uniform draw says
    counted = replace(measured, combine_groups_per_batch={"bids": 17_712})
    assert combine_selectivity(bids, counted, 250_000, 1) * 250_000 == pytest.approx(17_712)
    assert combine_selectivity(bids, counted, 250_000, 2) * 250_000 == pytest.approx(24_008, rel=1e-5)
    assert uniform_combine_keys(250_000, 250_000, 2) is None  # nothing combined
    assert uniform_combine_keys(100, 0, 2) == 0.0


def test_an_aggregate_after_a_keyed_operator_gets_partials_folded_per_call_of_the_keyed_stage():
    """A per-user operator then a per-region count: the per-user stage folds each call's records
    (a bucket of its keys), so the count's exchange carries about regions x buckets partials."""
    from fissure.model.spark_model import combined_partials

    per_user = OperatorStats("per_user", Kind.PARTITIONED, 2.0, 1.0, key=("user",))
    per_region = OperatorStats("per_region", Kind.PARTITIONED, 1.0, 0.001, key=("region",))
    plan = plan_of(([["per_user"]], 2), ([["per_region"]], 2))
    workload = SparkWorkload(10_000, source_partitions=2, keys_per_batch={"per_user": 5000, "per_region": 8})
    whole = evaluate_spark([per_user, per_region], plan, 2, SparkConstants(), workload)
    combined = evaluate_spark([per_user, replace(per_region, combined=True)], plan, 2, SparkConstants(), workload)
    keyed = [index for index, stage in enumerate(whole.stages) if stage.shape.key_operator == 1][0]
    assert whole.stages[keyed].records_in == pytest.approx(10_000)
    buckets = new_checkpoint_buckets(2)
    assert combined.stages[keyed].records_in == pytest.approx(combined_partials(10_000, 8, buckets))
    assert combined.stages[keyed].records_in <= 8 * buckets
    assert combined.throughput_per_s > whole.throughput_per_s
    # an unkeyed operator before: one call, one partial per region
    single = OperatorStats("single", Kind.STATEFUL, 2.0, 1.0)
    after_single = evaluate_spark([single, replace(per_region, combined=True)],
                                  plan_of(([["single", "per_region"]], 1)), 2, SparkConstants(), workload)
    assert after_single.stages[-1].records_in == pytest.approx(8)


def test_planner_statistics_say_which_aggregates_combine():
    from fissure import Aggregate, Count, StreamGraph

    pipeline = (Pipeline("p").flat_map("split", lambda r: [], schema={"word": str})
                .aggregate("count", key="word", aggregate=Count()))
    assert [stats.combined for stats in pipeline.operator_stats()] == [False, True]
    function = Aggregate.of(lambda records: {"n": len(records)}, schema={"n": int})
    assert not Pipeline("q").aggregate("f", key="word", aggregate=function).operator_stats()[0].combined
    graph = StreamGraph("g")
    words = graph.source("lines").flat_map("split", lambda r: [], schema={"word": str})
    words.aggregate("count", key="word", aggregate=Count()).sink("counts")
    words.sink("words")  # the words travel anyway: no combine
    assert [stats.combined for stats in graph.operator_stats()] == [False, False]
