"""`fissure elastic-sim`: its command contract (docs/commands.md), and the project goal on realistic curves."""

from __future__ import annotations

import json

import pytest

from fissure.cli import main
from fissure.cli.elastic_sim_curves import random_workload_spec, rise_peak_fall_curve
from fissure.control.thread_level.config import POLICY_NAMES
from repository import EXAMPLES

EXAMPLE = EXAMPLES / "enrichment_sim.json"


def write_spec(tmp_path, spec: dict) -> str:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return str(path)


def run_json(capsys, *argv: str) -> dict:
    assert main(["elastic-sim", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def small_spec() -> dict:
    return {
        "max_threads": 8,
        "noise": 0.02,
        "seed": 7,
        "phases": [
            {"periods": 40, "throughput": [100, 190, 270, 330, 350, 340, 320, 300]},
            {"periods": 40, "throughput": [50, 100, 150, 200, 250, 300, 350, 400]},
        ],
    }


class TestContract:
    @pytest.mark.parametrize("policy", POLICY_NAMES)
    def test_json_output_has_the_contracted_fields(self, tmp_path, capsys, policy):
        result = run_json(capsys, write_spec(tmp_path, small_spec()), "--policy", policy)
        assert set(result) == {"policy", "levels", "phases"}
        assert result["policy"] == policy
        assert len(result["levels"]) == 80 and result["levels"][0] == 1
        assert all(1 <= level <= 8 for level in result["levels"])
        assert [set(phase) for phase in result["phases"]] == [
            {"settled_level", "best_level", "settled_share_of_best"}
        ] * 2
        assert [phase["best_level"] for phase in result["phases"]] == [5, 8]

    def test_settled_level_and_share_follow_their_definition(self, tmp_path, capsys):
        spec = small_spec()
        result = run_json(capsys, write_spec(tmp_path, spec))
        for index, phase in enumerate(result["phases"]):
            levels = result["levels"][index * 40 : (index + 1) * 40][-10:]
            counts = {level: levels.count(level) for level in levels}
            assert counts[phase["settled_level"]] == max(counts.values())
            rates = spec["phases"][index]["throughput"]
            assert phase["settled_share_of_best"] == pytest.approx(rates[phase["settled_level"] - 1] / max(rates))

    def test_same_seed_same_run_other_seed_other_noise(self, tmp_path, capsys):
        path = write_spec(tmp_path, small_spec())
        first, again = run_json(capsys, path), run_json(capsys, path)
        assert first == again
        other = small_spec() | {"seed": 8}
        assert run_json(capsys, write_spec(tmp_path, other))["levels"] != first["levels"]

    def test_default_policy_is_trust_trend_and_the_table_is_readable(self, tmp_path, capsys):
        assert main(["elastic-sim", write_spec(tmp_path, small_spec())]) == 0
        table = capsys.readouterr().out
        assert table.startswith("policy trust-trend, levels 1..8, noise 0.02, seed 7")
        assert "settled level" in table and "share of best" in table
        assert "levels in phase 2:" in table

    @pytest.mark.parametrize("policy", POLICY_NAMES)
    def test_the_example_spec_settles_on_the_best_level_in_both_phases(self, capsys, policy):
        result = run_json(capsys, str(EXAMPLE), "--policy", policy)
        assert [phase["settled_share_of_best"] for phase in result["phases"]] == [1.0, 1.0]


class TestBadInput:
    @pytest.mark.parametrize(
        "change, message",
        [
            ({"max_threads": 0}, "max_threads must be an integer >= 1"),
            ({"noise": -0.1}, "noise must be a number in [0, 1)"),
            ({"phases": []}, "phases must be a non-empty list"),
            ({"phases": [{"periods": 10, "throughput": [1, 2]}]}, "must list the rate at each level 1..8 (8 numbers), got 2"),
            ({"phases": [{"periods": 0, "throughput": [1] * 8}]}, "phases[0].periods must be an integer >= 1"),
            ({"phases": [{"periods": 5, "throughput": [1, 2, -3, 4, 5, 6, 7, 8]}]}, "at level 3 must be a finite number >= 0"),
            ({"phases": [{"periods": 5, "throughput": [0] * 8}]}, "zero at every level"),
        ],
    )
    def test_bad_spec_exits_2_naming_the_field(self, tmp_path, capsys, change, message):
        assert main(["elastic-sim", write_spec(tmp_path, small_spec() | change)]) == 2
        assert message in capsys.readouterr().err

    def test_missing_file_and_broken_json(self, tmp_path, capsys):
        assert main(["elastic-sim", str(tmp_path / "nope.json")]) == 2
        assert "not found" in capsys.readouterr().err
        broken = tmp_path / "broken.json"
        broken.write_text("{")
        assert main(["elastic-sim", str(broken)]) == 2
        assert "not valid JSON" in capsys.readouterr().err


class TestProjectGoal:
    """In-worker elasticity settles within 5 % of the best static thread count: seeded realistic
    specs (rise-peak-fall with the peak anywhere in 1..32, plateaus, a load change at every phase
    boundary, noise 0.02, 100-140 periods per phase) through the command's code path."""

    @pytest.mark.parametrize("policy", POLICY_NAMES)
    @pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6, 7, 8])
    def test_settles_within_five_percent_of_the_best_in_every_phase(self, tmp_path, capsys, policy, seed):
        result = run_json(capsys, write_spec(tmp_path, random_workload_spec(seed, phases=3)), "--policy", policy)
        shares = [phase["settled_share_of_best"] for phase in result["phases"]]
        assert min(shares) >= 0.95, shares

    @pytest.mark.parametrize("policy", POLICY_NAMES)
    @pytest.mark.parametrize("peak", [1, 2, 5, 9, 16, 23, 31])
    def test_peak_anywhere_then_the_service_slows_down(self, tmp_path, capsys, policy, peak):
        phases = [
            {"periods": 120, "throughput": list(rise_peak_fall_curve(32, peak, 1.5, 4000.0))},
            {"periods": 120, "throughput": list(rise_peak_fall_curve(32, min(32, 2 * peak), 1.5, 2500.0))},
        ]
        spec = {"max_threads": 32, "noise": 0.02, "seed": peak, "phases": phases}
        result = run_json(capsys, write_spec(tmp_path, spec), "--policy", policy)
        assert min(phase["settled_share_of_best"] for phase in result["phases"]) >= 0.95
