"""`fissure plan`: its command contract (docs/commands.md) and its errors."""

import json
import subprocess
import sys

import pytest

from fissure.cli import main
from repository import EXAMPLES

EXAMPLE = EXAMPLES / "logwatch.json"


def run_plan(capsys, *args):
    code = main(["plan", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("method", ["heuristic", "optimal", "fission-only", "pipelining-only", "sequential"])
def test_json_output_follows_the_contract(capsys, method):
    code, out, _ = run_plan(capsys, EXAMPLE, "--method", method, "--cores", 4, "--json")
    assert code == 0
    result = json.loads(out)
    assert result["method"] == method and result["cores"] == 4
    spec = json.loads(EXAMPLE.read_text())
    listed = [name for region in result["regions"] for pipeline in region["pipelines"] for name in pipeline]
    assert listed == [operator["name"] for operator in spec["operators"]]
    for region in result["regions"]:
        assert set(region) == {"replicas", "kind", "key", "pipelines"}
        if region["kind"] == "stateful":
            assert region["replicas"] == 1 and region["key"] is None
    assert result["threads"] == sum(r["replicas"] * len(r["pipelines"]) for r in result["regions"])
    assert result["threads"] <= 8
    assert result["throughput_per_s"] > 0 and result["utilization"] > 0 and result["solve_ms"] >= 0


def test_more_cores_never_predict_less_throughput(capsys):
    throughputs = []
    for cores in (1, 4, 12):
        _, out, _ = run_plan(capsys, EXAMPLE, "--cores", cores, "--json")
        throughputs.append(json.loads(out)["throughput_per_s"])
    assert throughputs[0] < throughputs[1] < throughputs[2]


def test_table_names_every_column(capsys):
    code, out, _ = run_plan(capsys, EXAMPLE, "--cores", 12)
    assert code == 0
    header = out.splitlines()[1]
    for column in ("region", "kind", "key", "replicas", "pipelines"):
        assert column in header
    assert "predicted throughput" in out and "utilization" in out and "threads" in out


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"cores": 2, "operators": []}, "non-empty list"),
        ({"cores": 2, "operators": [{"name": "a", "kind": "stateless", "cost": 1}]}, "no selectivity"),
        ({"cores": 2, "operators": [{"name": "a", "kind": "partitioned", "cost": 1, "selectivity": 1}]}, "key"),
        ({"cores": 2, "operators": [{"name": "a", "kind": "magic", "cost": 1, "selectivity": 1}]}, "kind must be"),
        (
            {"cores": 2, "operators": [{"name": "a", "kind": "stateless", "cost": 1, "selectivity": 1}] * 2},
            "appears twice",
        ),
        ({"cores": 0, "operators": [{"name": "a", "kind": "stateless", "cost": 1, "selectivity": 1}]}, "cores"),
        ({"cores": 2, "operators": [{"name": "a", "kind": "stateless", "cost": -1, "selectivity": 1}]}, "cost"),
        ({"cores": 2, "speed": 3, "operators": [{"name": "a", "kind": "stateless", "cost": 1, "selectivity": 1}]}, "unknown"),
    ],
)
def test_bad_specs_get_a_clear_error_and_exit_code_2(tmp_path, capsys, spec, message):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    code, out, err = run_plan(capsys, path)
    assert code == 2 and out == ""
    assert message in err and err.startswith("fissure plan:")


def test_unreadable_and_malformed_files(tmp_path, capsys):
    code, _, err = run_plan(capsys, tmp_path / "missing.json")
    assert code == 2 and "cannot read" in err
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    code, _, err = run_plan(capsys, broken)
    assert code == 2 and "not valid JSON" in err


def test_exhaustive_refusal_is_a_usage_error(tmp_path, capsys):
    spec = {"cores": 32, "operators": [{"name": f"o{i}", "kind": "stateless", "cost": 5, "selectivity": 1} for i in range(40)]}
    path = tmp_path / "big.json"
    path.write_text(json.dumps(spec))
    code, _, err = run_plan(capsys, path, "--method", "optimal")
    assert code == 2 and "use the heuristic" in err.lower()


def test_module_entry_point_runs():
    completed = subprocess.run(
        [sys.executable, "-m", "fissure", "plan", str(EXAMPLE), "--json"], capture_output=True, text=True, check=True
    )
    assert json.loads(completed.stdout)["cores"] == 4
