"""What a newcomer reads when something goes wrong: the dead letter of an operator that raised
names the user's line, not the library's; run_local's results show their dead letters."""

from __future__ import annotations

import json
import warnings

import pytest

from fissure import Pipeline
from fissure.local.executor import DeadLettersWarning, run_local
from fissure.runtime.records.fate import describe_error, is_user_frame


def parse_payload(record):
    return json.loads(record["payload"])  # the user's line a dead letter must name


PARSE_LINE = parse_payload.__code__.co_firstlineno + 1


@pytest.mark.filterwarnings("ignore::fissure.local.executor.DeadLettersWarning")
def test_an_operator_error_raised_in_the_standard_library_names_the_users_line():
    pipeline = Pipeline("p").map("parse", parse_payload, schema={"n": int})
    results = run_local(pipeline, [{"payload": '{"n": 1}'}, {"payload": "{not json"}])
    assert results["sink"] == [{"n": 1}]
    (letter,) = results.dead_letters
    assert letter.error.startswith("JSONDecodeError: Expecting property name enclosed in double quotes: line 1 "
                                   "column 2 (char 1)")
    assert f"(at {__file__}:{PARSE_LINE} in parse_payload; raised in decoder.py:" in letter.error


def test_without_a_user_frame_the_innermost_frame_is_named():
    try:
        json.loads("[")
    except json.JSONDecodeError as error:
        error.__traceback__ = error.__traceback__.tb_next  # drop this test's own frame
        assert error.__traceback__ is not None
        text = describe_error(error)
    assert text.startswith("JSONDecodeError: Expecting value") and "decoder.py:" in text and "raised in" not in text


def test_user_frames_are_neither_the_standard_library_nor_packages_nor_fissure():
    import fissure.runtime.operators.fused
    import pyarrow

    assert is_user_frame(__file__)
    assert not is_user_frame(json.decoder.__file__)
    assert not is_user_frame(pyarrow.__file__)
    assert not is_user_frame(fissure.runtime.operators.fused.__file__)
    assert not is_user_frame("<frozen importlib._bootstrap>")


# --- run_local shows its dead letters ---------------------------------------------------------


def halve(record):
    if record["n"] % 2:
        raise ValueError(f"{record['n']} is odd")
    return {"n": record["n"] // 2}


def test_run_local_results_show_their_dead_letters_and_warn_about_them():
    pipeline = Pipeline("p").map("halve", halve, schema={"n": int})
    with pytest.warns(DeadLettersWarning) as caught:
        results = run_local(pipeline, [{"n": n} for n in range(10)])
    assert results["sink"] == [{"n": n} for n in range(5)]
    shown = repr(results)
    assert shown.startswith("{'sink': [{'n': 0}, ") and "with 5 dead letters: 'halve': ValueError: 1 is odd" in shown
    assert "(record {\"n\": 1})" in shown and "'halve': ValueError: 5 is odd" in shown
    assert "7 is odd" not in shown and shown.endswith("; and 2 more") and str(results) == shown
    (warning,) = caught
    assert str(warning.message).startswith("run_local('p'): 5 dead letters: 'halve': ValueError: 1 is odd")
    assert "read results.dead_letters" in str(warning.message)
    assert warning.filename == __file__  # points at the caller's line


def test_run_local_without_dead_letters_says_so_and_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        results = run_local(Pipeline("p").map("halve", halve, schema={"n": int}), [{"n": 2}])
    assert repr(results) == "{'sink': [{'n': 1}]} with no dead letters"


# --- a run's report: summary() on its own, a short repr ---------------------------------------


def counted_pipeline() -> Pipeline:
    return (Pipeline("p").map("parse", lambda r: {"user": r["value"]}, schema={"user": str})
            .partitioned("count", lambda state, r: r, key="user"))


def reports():
    from fissure.model.types import Plan, RegionPlan
    from fissure.spark.adaptive.loop import AdaptiveRunReport
    from fissure.plan.plans import describe_plan
    from fissure.spark.query.runner import BatchTime, GraphBatch, RunReport

    plan = Plan((RegionPlan((("parse", "count"),), replicas=2),))
    figures = dict(plan=plan, batches=40, input_records=120_000, dead_letters=3, elapsed_s=12.0,
                   checkpoint="ckpt", plan_text=describe_plan(plan, counted_pipeline()),
                   batch_log=tuple(GraphBatch(batch, 0.1, (), 0, 2_950) for batch in range(40)),
                   batch_times=tuple(BatchTime(batch, 3_000, 0.25) for batch in range(40)))
    return RunReport(**figures), AdaptiveRunReport(**figures, queries=2, timeline_json="run/timeline.json")


def test_a_reports_summary_needs_no_plan_text_and_keeps_the_json_contract():
    from fissure.plan.plans import describe_plan

    for report in reports():
        assert report.summary() == report.summary(describe_plan(report.plan, counted_pipeline()))
        assert report.summary() == {"plan": "[parse,count]x2(user)", "batches": 40, "input_records": 120_000,
                                    "output_records": 118_000, "dead_letters": 3, "elapsed_s": 12.0,
                                    "first_batch_s": 0.25, "steady_records_per_s": 12000.0, "end_of_input_s": None,
                                    "state_keys": None, "state_keys_peak": None, "late_records": 0,
                                    "missing_files": []}


def test_the_steady_rate_leaves_out_the_end_of_input_query_and_the_summary_gives_its_time():
    from fissure.model.types import Plan, RegionPlan
    from fissure.spark.query.runner import BatchTime, RunReport

    plan = Plan((RegionPlan((("parse", "count"),), replicas=2),))
    # Batch 0 starts the query, 1-3 run steadily, 4 is the end-of-input query's only batch (no input).
    times = (BatchTime(0, 1_000, 5.0), BatchTime(1, 1_000, 1.0), BatchTime(2, 1_000, 1.0), BatchTime(3, 1_000, 2.0),
             BatchTime(4, 0, 3.0))
    flushed = RunReport(plan=plan, batches=5, input_records=4_000, dead_letters=0, elapsed_s=12.0, checkpoint="c",
                        batch_times=times, end_of_input_from=4).summary()
    assert (flushed["steady_records_per_s"], flushed["end_of_input_s"], flushed["first_batch_s"]) == (750.0, 3.0, 5.0)
    unmarked = RunReport(plan=plan, batches=5, input_records=4_000, dead_letters=0, elapsed_s=12.0, checkpoint="c",
                         batch_times=times).summary()
    assert (unmarked["steady_records_per_s"], unmarked["end_of_input_s"]) == (428.6, None)  # 3,000 in 7 s


def test_a_report_prints_as_one_short_line_of_its_key_figures():
    plain, adaptive = reports()
    assert repr(plain) == ("RunReport(plan [parse,count]x2(user), 40 batches, 120,000 records in, 118,000 out, "
                           "3 dead letters, 12.0 s, 10,000 records/s)")
    assert repr(adaptive) == ("AdaptiveRunReport(plan [parse,count]x2(user), 40 batches, 120,000 records in, "
                              "118,000 out, 3 dead letters, 12.0 s, 10,000 records/s, 0 switches, 2 queries, "
                              "timeline run/timeline.json)")


# --- fail before Spark starts: a missing source path, a program that does not fit its source -------


@pytest.fixture
def no_spark(monkeypatch):
    """Every entry point's session factory refuses: a check that passes this ran before Spark."""
    import fissure.spark.adaptive.loop
    import fissure.spark.run
    import fissure.spark.query.runner

    def refuse(*args, **kwargs):
        raise AssertionError("Spark was started")

    monkeypatch.setattr(fissure.spark.query.runner, "create_session", refuse)
    monkeypatch.setattr(fissure.spark.adaptive.loop, "create_session", refuse)
    monkeypatch.setattr(fissure.spark.run, "create_session", refuse)


def keyed_on_user() -> Pipeline:
    return Pipeline("p").partitioned("per_user", lambda state, r: r, key="user")


@pytest.mark.parametrize("adaptive", [False, True])
def test_a_missing_local_source_directory_is_named_with_the_fix_before_spark_starts(no_spark, tmp_path, adaptive):
    import fissure
    from fissure.spark.io.sinks import MemorySink
    from fissure.spark.io.sources import FileSource, SourcePathNotFound

    missing = tmp_path / "no" / "such-dir"
    for path in (str(missing), f"file://{missing}"):
        with pytest.raises(SourcePathNotFound) as raised:
            fissure.run(Pipeline("p").map("up", lambda r: r), FileSource(path), MemorySink(),
                        config=fissure.RunnerConfig(replanning="adaptive" if adaptive else "off"))
        message = str(raised.value)
        assert message.startswith(f"file source {path!r}: the directory {missing} does not exist; create it "
                                  f"(`mkdir -p {missing}`) before the run")
    with pytest.raises(SourcePathNotFound, match=r"the pattern matches no file or directory"):
        fissure.Runner(Pipeline("p").map("up", lambda r: r), FileSource(str(tmp_path / "*.json"), format="json",
                                                                          schema={"a": int}), MemorySink())


def test_a_path_without_a_scheme_is_checked_early_only_where_it_is_known_to_be_local(tmp_path):
    from fissure.spark.io.sources import FileSource, SourcePathNotFound, check_before_spark, default_file_system

    from fissure.program.graph import as_graph

    graph = as_graph(Pipeline("p").map("up", lambda r: r))
    missing = {"source": FileSource(str(tmp_path / "missing"))}
    assert default_file_system(None, "local[2]", {}) == "file:///"
    with pytest.raises(SourcePathNotFound):
        check_before_spark(graph, missing, default_file_system(None, "local[2]", {}))
    # On a cluster, or with HDFS as the default file system, the path is not on this machine:
    # Spark checks it when the source opens.
    for master, conf in (("spark://host:7077", {}), ("local[2]", {"spark.hadoop.fs.defaultFS": "hdfs://nn:8020"})):
        check_before_spark(graph, missing, default_file_system(None, master, conf))


@pytest.mark.parametrize("make_source", ["text", "json", "testing"])
def test_a_program_that_does_not_fit_its_source_fails_before_spark_starts(no_spark, tmp_path, make_source):
    import fissure
    from fissure.program.operators import PipelineError
    from fissure.spark.io.sinks import MemorySink
    from fissure.spark.io.sources import FileSource
    from fissure.testing import TestingSource

    (tmp_path / "in").mkdir()
    source = {"text": FileSource(str(tmp_path / "in")),
              "json": FileSource(str(tmp_path / "in"), format="json", schema={"name": str, "n": int}),
              "testing": TestingSource([{"name": "a", "n": 1}])}[make_source]
    fields = "value" if make_source == "text" else "name, n"
    expected = f"operator 'per_user' .* is keyed on field 'user', but its input .* has only {fields}"
    for run in (lambda: fissure.run(keyed_on_user(), source, MemorySink(), config=fissure.RunnerConfig(progress="off")),
                lambda: fissure.run(keyed_on_user(), source, MemorySink(),
                                    config=fissure.RunnerConfig(progress="off", replanning="adaptive")),
                lambda: fissure.Runner(keyed_on_user(), source, MemorySink())):
        with pytest.raises(PipelineError, match=expected):
            run()


def test_fissure_run_checks_the_program_before_it_starts_spark(no_spark, tmp_path, capsys):
    from fissure.cli import main

    (tmp_path / "in").mkdir()
    (tmp_path / "app.py").write_text(
        "from fissure import Pipeline\n\n"
        "def build():\n"
        "    return Pipeline('app').partitioned('per_user', lambda state, r: r, key='user')\n")
    assert main(["run", f"{tmp_path / 'app.py'}:build", "--source", str(tmp_path / "in"),
                 "--run-dir", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert "operator 'per_user'" in error and "is keyed on field 'user'" in error and "has only value" in error
    assert "starting Spark" not in error and not (tmp_path / "run").exists()
