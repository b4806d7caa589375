"""`fissure run`: end to end in its own process on a small file source, and its usage errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pyarrow.parquet as pq
import pytest

from fissure.cli import main
from repository import REPOSITORY

PIPELINE_FILE = textwrap.dedent("""
    from fissure import Pipeline

    def count(state, record):
        state["n"] = state.get("n", 0) + 1
        return {"user": record["user"], "i": record["i"], "n": state["n"]}

    def build():
        return Pipeline("cli").partitioned("count", count, key="user", schema={"user": str, "i": int, "n": int})
""")


JSON_SOURCE = ["--format", "json", "--schema", "user:str,i:int"]  # the files write_inputs writes


def write_inputs(directory, count=6):
    directory.mkdir()
    (directory / "part-0.json").write_text("".join(json.dumps({"user": f"u{i % 2}", "i": i}) + "\n"
                                                   for i in range(count)))


@pytest.mark.spark
@pytest.mark.slow
def test_fissure_run_end_to_end_quietly_with_spark_output_in_the_log(tmp_path):
    (tmp_path / "pipeline.py").write_text(PIPELINE_FILE)
    write_inputs(tmp_path / "in")
    run_dir, out = tmp_path / "run", tmp_path / "out"
    with open(tmp_path / "stderr.txt", "w", encoding="utf-8") as stderr:  # a file, as in a CI log
        finished = subprocess.run(
            [sys.executable, "-m", "fissure", "run", f"{tmp_path / 'pipeline.py'}:build",
             "--source", str(tmp_path / "in"), "--format", "json", "--schema", "user:str,i:int", "--sink", str(out),
             "--run-dir", str(run_dir), "--master", "local[1]"],
            stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    error = (tmp_path / "stderr.txt").read_text()
    assert finished.returncode == 0, error
    assert "6 records in 1 batch" in finished.stdout
    assert f"Spark's output: {run_dir / 'spark.log'}" in finished.stdout
    # Spark's JVM lines and its Python workers' chatter went to the log, not to the terminal.
    for noise in ("WARN", "log4j", "TransformWithStateInPandas"):
        assert noise not in error
    spark_log = (run_dir / "spark.log").read_text()
    assert "TransformWithStateInPandas" in spark_log
    # Keys seen for the first time (u0, u1) leave no line each: PySpark's state server warns of
    # every MapState miss, and fissure quiets that logger.
    assert "doesn't contain key" not in spark_log
    # Progress in a file: plain lines, each starting with the ISO time; no redraws, no escape codes.
    assert "\r" not in error and "\x1b" not in error
    progress = [line for line in error.splitlines() if " fissure | " in line]
    assert progress and all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d fissure \| ", line)
                            for line in progress)
    assert "batch 0 | " in progress[-1] and "| 6 records |" in progress[-1]
    rows = pq.read_table(out).to_pylist()
    assert sorted((row["user"], row["n"]) for row in rows) == [("u0", 1), ("u0", 2), ("u0", 3),
                                                              ("u1", 1), ("u1", 2), ("u1", 3)]


GRAPH_FILE = textwrap.dedent("""
    from fissure import StreamGraph

    def count(state, record):
        state["n"] = state.get("n", 0) + 1
        return {"user": record["user"], "n": state["n"]}

    def build():
        g = StreamGraph("cli_graph")
        events = g.source("events")
        events.partitioned("count", count, key="user", schema={"user": str, "n": int}).sink("counts")
        events.filter("even", lambda record: record["i"] % 2 == 0).sink("evens")
        return g
""")


@pytest.mark.spark
@pytest.mark.slow
def test_fissure_run_runs_a_graph_with_a_sink_directory_per_sink(tmp_path):
    (tmp_path / "graph.py").write_text(GRAPH_FILE)
    write_inputs(tmp_path / "in")
    out = tmp_path / "out"
    finished = subprocess.run(
        [sys.executable, "-m", "fissure", "run", f"{tmp_path / 'graph.py'}:build", "--source", str(tmp_path / "in"),
         "--format", "json", "--schema", "user:str,i:int", "--sink", str(out), "--run-dir", str(tmp_path / "run"),
         "--master", "local[1]", "--plan", "planner", "--no-adapt", "--json"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert finished.returncode == 0, finished.stderr
    assert "6 records in 1 batch" in finished.stderr  # --json: the human lines go to stderr
    summary = json.loads(finished.stdout.strip().splitlines()[-1])
    assert {key: summary[key] for key in ("batches", "input_records", "output_records", "dead_letters",
                                          "steady_records_per_s")} == {
        "batches": 1, "input_records": 6, "output_records": 6 + 3, "dead_letters": 0, "steady_records_per_s": None}
    assert 0 < summary["first_batch_s"] <= summary["elapsed_s"] and summary["plan"].startswith("[")
    assert (summary["state_keys"], summary["state_keys_peak"], summary["late_records"]) == (2, 2, 0)  # u0, u1
    counts = pq.read_table(out / "counts").to_pylist()
    assert sorted((row["user"], row["n"]) for row in counts) == [("u0", 1), ("u0", 2), ("u0", 3),
                                                                ("u1", 1), ("u1", 2), ("u1", 3)]
    assert sorted(row["i"] for row in pq.read_table(out / "evens").to_pylist()) == [0, 2, 4]


JSON_FILE = textwrap.dedent("""
    from fissure import Pipeline

    def checked(record):
        if record["i"] == 3:
            raise ValueError("three is refused")
        return record

    def count(state, record):
        state["n"] = state.get("n", 0) + 1
        return {"user": record["user"], "n": state["n"]}

    def build():
        return (Pipeline("cli_json").map("checked", checked)
                .partitioned("count", count, key="user", schema={"user": str, "n": int}))
""")


@pytest.mark.spark
@pytest.mark.slow
def test_fissure_run_json_summary_counts_what_the_adaptive_run_read_wrote_and_refused(tmp_path):
    (tmp_path / "pipeline.py").write_text(JSON_FILE)
    (tmp_path / "in").mkdir()
    for part in range(3):  # three files, one per batch: a first batch and two steady ones
        (tmp_path / "in" / f"part-{part}.json").write_text(
            "".join(json.dumps({"user": f"u{i % 2}", "i": i}) + "\n" for i in range(part * 4, part * 4 + 4)))
    finished = subprocess.run(
        [sys.executable, "-m", "fissure", "run", f"{tmp_path / 'pipeline.py'}:build", "--source", str(tmp_path / "in"),
         "--format", "json", "--schema", "user:str,i:int", "--files-per-batch", "1",
         "--dead-letters", str(tmp_path / "dead"), "--sink", str(tmp_path / "out"), "--run-dir", str(tmp_path / "run"),
         "--master", "local[1]", "--json"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert finished.returncode == 0, finished.stderr
    summary = json.loads(finished.stdout.strip().splitlines()[-1])
    assert {key: summary[key] for key in ("batches", "input_records", "output_records", "dead_letters")} == {
        "batches": 3, "input_records": 12, "output_records": 11, "dead_letters": 1}
    assert summary["steady_records_per_s"] > 0 and 0 < summary["first_batch_s"] <= summary["elapsed_s"]
    assert len(pq.read_table(tmp_path / "out").to_pylist()) == 11
    dead = [json.loads(line) for path in (tmp_path / "dead").rglob("*.json") for line in path.read_text().splitlines()]
    assert [(row["operator"], json.loads(row["record"])["i"]) for row in dead] == [("checked", 3)]


@pytest.mark.parametrize("reference, message", [
    ("examples/logwatch.py", "must be FILE.py:FUNCTION or MODULE:FUNCTION"),
    ("no_such_file.py:build", "pipeline file 'no_such_file.py' does not exist"),
    ("examples/logwatch.py:no_such_function", "has no 'no_such_function'; it defines"),
    ("fissure_no_such_module:build", "cannot import pipeline module 'fissure_no_such_module'"),
])
def test_bad_pipeline_reference_is_a_usage_error(tmp_path, capsys, monkeypatch, reference, message):
    monkeypatch.chdir(REPOSITORY)
    assert main(["run", reference, "--source", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_missing_source_directory_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "pipeline.py").write_text(PIPELINE_FILE)
    missing = tmp_path / "no-such-dir"
    assert main(["run", f"{tmp_path / 'pipeline.py'}:build", "--source", str(missing)]) == 2
    error = capsys.readouterr().err
    assert f"--source {str(missing)!r} is not a directory" in error and "fissure run:" in error


def test_bad_schema_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "pipeline.py").write_text(PIPELINE_FILE)
    assert main(["run", f"{tmp_path / 'pipeline.py'}:build", "--source", str(tmp_path), "--format", "json",
                 "--schema", "user:text"]) == 2
    assert "--schema item 'user:text' is not name:type" in capsys.readouterr().err


def config_for(tmp_path, monkeypatch, flags: list[str]):
    """The RunnerConfig `fissure run` with `flags` hands to fissure.run (stopped before any session)."""
    import fissure

    (tmp_path / "pipeline.py").write_text(PIPELINE_FILE)
    write_inputs(tmp_path / "in")
    seen = {}

    def fake_run(*args, config, **kwargs):
        seen["config"] = config
        raise KeyboardInterrupt  # stop before any session: what the run would get is known

    monkeypatch.setattr(fissure, "run", fake_run)
    assert main(["run", f"{tmp_path / 'pipeline.py'}:build", "--source", str(tmp_path / "in"), *JSON_SOURCE,
                 "--run-dir", str(tmp_path / "run"), *flags]) == 130
    return seen["config"]


@pytest.mark.parametrize("flags, ui, address", [([], False, "127.0.0.1"), (["--spark-ui"], True, "127.0.0.1"),
                                                 (["--spark-ui=0.0.0.0"], True, "0.0.0.0")])
def test_spark_ui_flag_turns_the_ui_on_only_when_asked(tmp_path, monkeypatch, flags, ui, address):
    config = config_for(tmp_path, monkeypatch, flags)
    assert config.spark_ui is ui
    assert config.spark_ui_address == address  # loopback unless named
    assert config.batch_sample_costs is True


def test_no_cost_sample_flag_keeps_the_declared_costs(tmp_path, monkeypatch):
    assert config_for(tmp_path, monkeypatch, ["--no-cost-sample"]).batch_sample_costs is False


def test_conf_flags_become_the_sessions_spark_settings(tmp_path, monkeypatch):
    config = config_for(tmp_path, monkeypatch, ["--conf", "spark.sql.streaming.metricsEnabled=true",
                                                "--conf", "spark.metrics.conf.*.sink.prometheusServlet.path=/metrics/prometheus"])
    assert config.spark_conf == {"spark.sql.streaming.metricsEnabled": "true",
                                 "spark.metrics.conf.*.sink.prometheusServlet.path": "/metrics/prometheus"}


def test_a_conf_flag_without_a_value_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "pipeline.py").write_text(PIPELINE_FILE)
    write_inputs(tmp_path / "in")
    assert main(["run", f"{tmp_path / 'pipeline.py'}:build", "--source", str(tmp_path / "in"), *JSON_SOURCE,
                 "--run-dir", str(tmp_path / "run"), "--conf", "spark.ui.enabled"]) == 2
    assert "--conf 'spark.ui.enabled' is not KEY=VALUE" in capsys.readouterr().err


def test_the_ui_notice_gives_the_address_or_says_why_there_is_none():
    from types import SimpleNamespace

    from fissure.spark.session.create import SESSION_DEFAULTS, ui_notice

    assert SESSION_DEFAULTS["spark.ui.enabled"] == "false"  # off unless asked for
    running = SimpleNamespace(sparkContext=SimpleNamespace(uiWebUrl="http://host:4041"))
    assert "Spark UI at http://host:4041" in ui_notice(running)
    assert "no Spark UI" in ui_notice(SimpleNamespace(sparkContext=SimpleNamespace(uiWebUrl=None)))
