"""Calibration: the paper's c_p formula, non-negative least squares, and where constants are stored."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fissure.model.calibration import Calibration, nnls, replication_cost_us
from fissure.model.spark_model import SparkConstants
from fissure.plan.stored_calibration import calibration_path, load_calibration, save_calibration, stored_spark_model


def eq18_rate_per_s(replicas: int, delta_us: float, cost_us: float, c_p_us: float) -> float:
    return 1e6 / ((2 * delta_us + cost_us) / replicas + math.log2(replicas) * c_p_us)


@pytest.mark.parametrize("n1,n2", [(1, 2), (2, 4), (1, 8), (4, 2)])
def test_eq19_recovers_the_replication_cost_without_knowing_the_operator(n1, n2):
    rates = {n: eq18_rate_per_s(n, delta_us=1.5, cost_us=40.0, c_p_us=0.8) for n in (n1, n2)}
    assert replication_cost_us(n1, rates[n1], n2, rates[n2]) == pytest.approx(0.8)


def test_eq19_refuses_what_it_cannot_use():
    with pytest.raises(ValueError, match="two different replica counts"):
        replication_cost_us(2, 100.0, 2, 200.0)
    with pytest.raises(ValueError, match="rates > 0"):
        replication_cost_us(1, 0.0, 2, 200.0)


def test_nnls_matches_least_squares_inside_the_orthant_and_clips_outside():
    rng = np.random.default_rng(7)
    matrix = rng.uniform(0.1, 1.0, size=(30, 4))
    inside = np.array([0.5, 2.0, 0.0, 1.0])
    assert nnls(matrix, matrix @ inside) == pytest.approx(inside, abs=1e-9)
    target = matrix @ np.array([1.0, -3.0, 2.0, 0.5])
    solution = nnls(matrix, target)
    assert (solution >= 0).all() and solution[1] == 0.0
    unconstrained_residual = np.linalg.norm(matrix @ np.clip(np.linalg.lstsq(matrix, target, rcond=None)[0], 0, None) - target)
    assert np.linalg.norm(matrix @ solution - target) <= unconstrained_residual + 1e-9


def calibration(**spark) -> Calibration:
    return Calibration(spark=SparkConstants(**spark), thread_switch_overhead_us=0.2,
                       thread_switch_overhead_large_us=1.4, replication_cost_us=0.9, batch_records=15_000,
                       cores=2, master="local[2]", measured_at="2026-11-22T01:00:00+00:00",
                       fit={"r_squared": 0.98})


def test_store_round_trips_where_the_environment_points(tmp_path, monkeypatch):
    monkeypatch.setenv("FISSURE_CALIBRATION", str(tmp_path / "deployment.json"))
    assert calibration_path() == tmp_path / "deployment.json"
    assert load_calibration() is None
    settings, where = stored_spark_model()
    assert settings.constants == SparkConstants() and "defaults" in where
    stored = save_calibration(calibration(batch_fixed_s=0.7))
    assert load_calibration() == calibration(batch_fixed_s=0.7)
    settings, where = stored_spark_model()
    assert settings.constants.batch_fixed_s == 0.7 and settings.workload.batch_records == 15_000
    assert stored == tmp_path / "deployment.json" and "2026-11-22" in where and str(tmp_path) not in where


def test_default_store_follows_xdg_config_home(tmp_path, monkeypatch):
    monkeypatch.delenv("FISSURE_CALIBRATION", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert calibration_path() == tmp_path / "fissure" / "calibration.json"


def test_an_unusable_store_means_the_defaults_not_a_crash(tmp_path, caplog):
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"spark": {"batch_fixed_s": -1}}))
    assert load_calibration(broken) is None
    broken.write_text("{not json")
    assert load_calibration(broken) is None
    assert "using the default constants" in caplog.text
    with pytest.raises(ValueError, match="fissure calibrate"):
        Calibration.from_dict({"spark": {}})


def test_calibrate_command_refuses_a_directory_as_output(tmp_path, capsys):
    from fissure.cli import main

    assert main(["calibrate", "--output", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_every_calibration_experiment_has_a_valid_plan_and_the_shape_it_is_there_to_measure():
    from fissure.cli.calibrate_cmd import _experiments
    from fissure.model.spark_stages import spark_stages
    from fissure.model.throughput import validate_plan

    shapes = {}
    for experiment in _experiments():
        pipeline, plan = experiment.build()
        operators = pipeline.operator_stats(None)
        validate_plan(operators, plan)
        shapes[experiment.label] = spark_stages(operators, plan)
    assert len(shapes) == len(_experiments())  # labels are unique: the report groups by them
    (one,) = shapes["python-records"]
    assert [node.kind for node in one.nodes] == ["pe"]
    # one Spark stage, two Python nodes: what one more node costs, against python-records
    (two,) = shapes["two-nodes"]
    assert [node.kind for node in two.nodes] == ["pe", "pe"]
    assert [stage.exchange for stage in shapes["exchange"]] == ["source", "round-robin"]
