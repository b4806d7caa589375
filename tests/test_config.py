"""RunnerConfig, the one config home: its settings as spark.fissure.* keys (from_conf, `fissure run
--conf`), its checks, and the small run surface of fissure.run. No Spark starts here."""

from __future__ import annotations

import ast
import inspect
import pathlib

import pytest

import fissure
from fissure.cli import build_parser
from fissure.cli.run_cmd import run_config, with_run_dir
from fissure.config import REPLANNING, GraphAutopipelineConfig, RunnerConfig
from fissure.control.thread_level.config import ElasticityConfig
from fissure.profile.settings import ProfileSettings

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def test_keys_parse_to_the_types_of_their_settings():
    config = RunnerConfig.from_conf({
        "spark.fissure.replanning": "autopipeline", "spark.fissure.timeout_s": "60", "spark.fissure.max_batches": "3",
        "spark.fissure.spark_ui": "TRUE", "spark.fissure.batch_latency_bound_s": "none",
        "spark.fissure.boundaries": "parse, count", "spark.fissure.profiling.window_batches": "7",
        "spark.fissure.thread_elasticity.max_threads": "8", "spark.fissure.adaptation.correction.max_plans": "3",
        "spark.fissure.autopipelining.control.min_gain": "0.05", "spark.sql.shuffle.partitions": "4"})
    assert (config.replanning, config.timeout_s, config.max_batches, config.spark_ui) == ("autopipeline", 60.0, 3, True)
    assert config.batch_latency_bound_s is None and config.boundaries == ("parse", "count")
    assert config.profiling == ProfileSettings(window_batches=7)
    assert config.thread_elasticity == ElasticityConfig(max_threads=8)  # an optional tree, made when a key sets it
    assert config.adaptation.correction.max_plans == 3 and config.autopipelining.control.min_gain == 0.05
    assert config.autopipelining.control.settle_s == GraphAutopipelineConfig().control.settle_s  # the rest kept
    assert config.spark_conf == {"spark.sql.shuffle.partitions": "4"}  # Spark's own keys: for the session


def test_keys_apply_over_a_base_and_take_values_of_their_type_as_they_are():
    base = RunnerConfig(master="local[2]", spark_conf={"spark.a": "1"}, replanning="adaptive")
    config = RunnerConfig.from_conf([("spark.fissure.timeout_s", 30), ("spark.fissure.combine_aggregates", False),
                                     ("spark.b", 2)], base=base)
    assert (config.master, config.replanning, config.timeout_s, config.combine_aggregates) == \
        ("local[2]", "adaptive", 30.0, False)
    assert config.spark_conf == {"spark.a": "1", "spark.b": "2"} and base.spark_conf == {"spark.a": "1"}


@pytest.mark.parametrize("key, value, message", [
    ("spark.fissure.timeoutS", "1", "spark.fissure.timeoutS is no fissure setting; did you mean spark.fissure.timeout_s?"),
    ("spark.fissure.adaptive", "true", "did you mean spark.fissure.replanning=adaptive?"),
    ("spark.fissure.profilng.window_batches", "3", "did you mean spark.fissure.profiling.window_batches?"),
    ("spark.fissure.spark_ui", "yes", "spark.fissure.spark_ui='yes': expected true or false"),
    ("spark.fissure.max_batches", "1.5", "spark.fissure.max_batches='1.5': expected a whole number or none"),
    ("spark.fissure.batch_fixed_share", "lots", "spark.fissure.batch_fixed_share='lots': expected a number"),
    ("spark.fissure.replanning", "both", "replanning must be one of 'off', 'adaptive', 'autopipeline'"),
    ("spark.fissure.profiling.window_batches", "0", "spark.fissure.profiling.window_batches: window_batches must be >= 1"),
    ("spark.fissure.timeout_s", "-5", "spark.fissure.timeout_s: timeout_s must be a number of seconds > 0"),
])
def test_a_bad_key_or_value_is_refused_naming_the_key(key, value, message):
    with pytest.raises(ValueError) as raised:
        RunnerConfig.from_conf({key: value})
    assert message in str(raised.value)


def test_every_key_is_listed_with_its_default_and_every_setting_is_documented():
    keys = RunnerConfig.keys()
    assert keys["spark.fissure.replanning"] == "off" and keys["spark.fissure.timeout_s"] == "none"
    assert keys["spark.fissure.thread_elasticity.max_threads"] == str(ElasticityConfig().max_threads)
    assert "spark.fissure.spark" not in keys and "spark.fissure.estimates" not in keys  # objects are fields only
    # every default, as text, reads back as itself (an optional tree's keys make the tree of its defaults)
    assert RunnerConfig.from_conf(keys) == RunnerConfig(thread_elasticity=ElasticityConfig())
    section = (DOCS / "spark-runner.md").read_text().split("## Settings as keys")[1].split("\n## ")[0]
    for name in {key.removeprefix("spark.fissure.").split(".")[0] for key in keys}:
        assert f"`{name}" in section, name


def test_the_config_checks_the_run_settings():
    assert RunnerConfig(boundaries=["a", "b"]).boundaries == ("a", "b")
    with pytest.raises(ValueError, match="boundaries and state_partitions would be dropped: an adaptive run"):
        RunnerConfig(replanning="adaptive", boundaries=["a"], state_partitions=2)
    with pytest.raises(ValueError, match="max_batches must be a whole number >= 1"):
        RunnerConfig(max_batches=0)
    with pytest.raises(ValueError, match="boundaries must be a list of operator names"):
        RunnerConfig(boundaries="a")
    assert REPLANNING == ("off", "adaptive", "autopipeline")


def test_fissure_run_is_a_small_surface_that_says_where_a_moved_argument_went():
    parameters = inspect.signature(fissure.run).parameters
    assert len(parameters) <= 8 and list(parameters)[:6] == ["program", "source", "sink", "plan", "checkpoint", "config"]
    program = fissure.Pipeline("p").map("m", lambda record: record)
    with pytest.raises(TypeError) as raised:
        fissure.run(program, None, None, adaptive=True, spark=None)
    assert 'adaptive= is RunnerConfig(replanning="adaptive")' in str(raised.value)
    assert "spark= is RunnerConfig(spark=)" in str(raised.value)
    with pytest.raises(TypeError, match="unexpected keyword argument 'chekpoint'; did you mean checkpoint="):
        fissure.run(program, None, None, chekpoint="ckpt")


# The run's what and where, as fissure.run takes them beside its config: no RunnerConfig field.
RUN_ARGUMENTS = ("program", "pipeline", "source", "sink", "plan", "checkpoint", "config")


@pytest.mark.parametrize("entry", ["fissure.spark.query.runner:Runner",
                                   "fissure.spark.adaptive.loop:run_adaptive_on_spark"])
def test_the_lower_entry_points_take_every_setting_from_the_config_alone(entry):
    """Before: Runner and run_adaptive_on_spark took `progress`, `profile`, `boundaries`, `timeout_s`, ...
    beside `config`, and fissure.run passed both; a setting had two homes that could disagree."""
    import dataclasses
    import importlib

    module, name = entry.split(":")
    function = getattr(importlib.import_module(module), name)
    parameters = inspect.signature(function).parameters
    settings = {item.name for item in dataclasses.fields(RunnerConfig)}
    assert not settings & set(parameters), f"{name} takes RunnerConfig fields as arguments: {settings & set(parameters)}"
    assert not {"profile", "adaptive_config", "profile_pieces", "progress"} & set(parameters)  # renamed settings
    assert "config" in parameters
    doc = inspect.getdoc(function)
    for other in set(parameters) - set(RUN_ARGUMENTS):  # each says why it is not a setting
        assert f"`{other}`: not a setting" in doc, (name, other)


def _cli_args(*extra: str):
    return build_parser().parse_args(["run", "app.py:build", "--source", "in", *extra])


def test_fissure_run_reads_conf_keys_and_its_flags_win(tmp_path):
    args = _cli_args("--run-dir", str(tmp_path), "--conf", "spark.fissure.timeout_s=60", "--conf",
                     "spark.fissure.progress=lines", "--conf", "spark.sql.shuffle.partitions=3", "--timeout", "30",
                     "--conf", "spark.fissure.max_batches=4")
    config = run_config(args, None)
    assert (config.timeout_s, config.progress, config.max_batches) == (30.0, "lines", 4)  # --timeout wins
    assert config.replanning == "adaptive" and config.master == "local[*,4]"  # the command's default: it adapts
    assert config.spark_conf == {"spark.sql.shuffle.partitions": "3"}
    placed = with_run_dir(config, args.run_dir)
    assert placed.run_dir == str(tmp_path) and placed.spark_log == str(tmp_path / "spark.log")
    off = run_config(_cli_args("--run-dir", str(tmp_path), "--no-adapt", "--conf", "spark.fissure.replanning=adaptive"),
                     None)
    assert off.replanning == "off"
    assert run_config(_cli_args("--run-dir", str(tmp_path), "--conf", "spark.fissure.replanning=off"),
                      None).replanning == "off"
    with pytest.raises(ValueError, match="did you mean spark.fissure.max_batches"):
        run_config(_cli_args("--run-dir", str(tmp_path), "--conf", "spark.fissure.max_batch=2"), None)


def test_the_config_module_stays_out_of_the_spark_layer():
    tree = ast.parse((pathlib.Path(fissure.__file__).parent / "config.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not {name for name in imported if name.startswith(("pyspark", "fissure.spark", "fissure.cli"))}
