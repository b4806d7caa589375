"""fissure.testing: in-memory sources and sinks, and the in-process run of any program (no JVM)."""

from __future__ import annotations

import pytest

from fissure import Count, Pipeline, PipelineError, StreamGraph, Tumbling
from fissure.testing import TestingSink, TestingSource, describe_batches, run_batches, run_main


def running_total(state, record):
    state["n"] = state.get("n", 0) + record["v"]
    return {"k": record["k"], "n": state["n"]}


def chain() -> Pipeline:
    return (Pipeline("totals").map("double", lambda r: {"k": r["k"], "v": 2 * r["v"]})
            .filter("positive", lambda r: r["v"] > 0)
            .partitioned("total", running_total, key="k", schema={"k": str, "n": int}))


RECORDS = [{"k": "a", "v": 1}, {"k": "b", "v": 0}, {"k": "a", "v": 2}, {"k": "b", "v": 5}, {"k": "a", "v": 3}]


def test_a_chain_runs_batch_by_batch_with_its_state_kept_between_batches():
    out: list = []
    batches = run_main(chain(), TestingSource(RECORDS, batch_size=2), TestingSink(out))
    assert batches == 3
    assert out == [{"k": "a", "n": 2}, {"k": "a", "n": 6}, {"k": "b", "n": 10}, {"k": "a", "n": 12}]


def test_a_graph_takes_sources_and_sinks_by_name_and_a_source_may_run_dry():
    g = StreamGraph("two")
    first = g.source("first")
    second = g.source("second")
    g.union("both", first.map("one", lambda r: r), second).partitioned("total", running_total, key="k",
                                                                         schema={"k": str, "n": int}).sink("totals")
    out: list = []
    run_main(g, {"first": TestingSource(RECORDS[:4], batch_size=2), "second": TestingSource([{"k": "c", "v": 7}])},
             {"totals": TestingSink(out)})
    assert sorted((r["k"], r["n"]) for r in out) == [("a", 1), ("a", 3), ("b", 0), ("b", 5), ("c", 7)]


def test_dead_letters_are_collected_or_refused_never_dropped():
    failing = Pipeline("failing").map("invert", lambda r: {"k": r["k"], "v": 1 // r["v"]})
    with pytest.raises(PipelineError, match="operator 'invert': ZeroDivisionError"):
        run_main(failing, TestingSource(RECORDS), TestingSink([]))
    dead: list = []
    out: list = []
    run_main(failing, TestingSource(RECORDS), TestingSink(out), dead_letters=dead)
    assert len(out) == 4 and [letter.node for letter in dead] == ["invert"] and '"v": 0' in dead[0].record


def test_an_empty_source_needs_a_schema_and_bad_names_are_refused():
    g = StreamGraph("two")
    g.union("both", g.source("first"), g.source("second")).sink("all")
    with pytest.raises(PipelineError, match="source 'second' has no declared schema and no records"):
        run_main(g, {"first": TestingSource(RECORDS), "second": TestingSource([])}, {"all": TestingSink([])})
    both: list = []
    run_main(g, {"first": TestingSource(RECORDS), "second": TestingSource([], schema={"k": str, "v": int})},
             {"all": TestingSink(both)})
    assert both == RECORDS
    out: list = []
    assert run_main(chain(), TestingSource([], schema={"k": str, "v": int}), TestingSink(out)) == 0 and out == []
    with pytest.raises(PipelineError, match="has no sink 'nowhere'"):
        run_main(chain(), TestingSource(RECORDS), {"nowhere": TestingSink([])})


def windowed() -> Pipeline:
    return (Pipeline("clicks").event_time("ts", lateness=1.0)
            .window("per_user", key="k", window=Tumbling(10.0), aggregate=Count()))


CLICKS = [[{"k": "a", "ts": 1.0}, {"k": "b", "ts": 4.0}], [], [{"k": "a", "ts": 12.0}], [{"k": "a", "ts": 2.0}],
          [{"k": "b", "ts": 30.0}]]


def test_explicit_micro_batches_show_the_watermark_after_each_and_the_end_of_input_flushes():
    out: list = []
    watermarks: list = []
    dead: list = []
    assert run_main(windowed(), TestingSource(batches=CLICKS), TestingSink(out), dead, watermarks=watermarks) == 5
    # the watermark after each batch: the largest event time so far minus the lateness
    assert watermarks == [3.0, 3.0, 11.0, 11.0, 29.0, 40.0]
    # ts 2 arrives in batch 3, judged against batch 2's watermark 3: [0, 10) is still open
    assert sorted((r["k"], r["window_start"], r["count"]) for r in out) == [
        ("a", 0.0, 2), ("a", 10.0, 1), ("b", 0.0, 1), ("b", 30.0, 1)]
    assert dead == []
    stopped: list = []
    run_main(windowed(), TestingSource(batches=CLICKS), TestingSink(stopped), end_of_input=False)
    assert sorted((r["k"], r["window_start"]) for r in stopped) == [("a", 0.0), ("b", 0.0)]  # [10, 20) still open


def test_run_batches_reports_each_batch_and_describes_them():
    steps = run_batches(windowed(), CLICKS[:4] + [[{"k": "a", "ts": 5.0}]])
    assert [(s.batch, s.end_of_input, s.records_in, s.watermark, s.next_watermark) for s in steps] == [
        (0, False, 2, float("-inf"), 3.0), (1, False, 0, 3.0, 3.0), (2, False, 1, 3.0, 11.0),
        (3, False, 1, 11.0, 11.0), (4, False, 1, 11.0, 11.0), (5, True, 0, 22.0, 22.0)]
    assert steps[4].late_records == 1 and steps[4].dead_letters[0].error.startswith("Late: event time 5")
    table = describe_batches(steps).splitlines()
    assert table[0].split() == ["batch", "in", "watermark", "next", "out", "dead", "late"]
    assert table[3].split() == ["2", "1", "3", "11", "sink", "0", "0", "0"]
    assert table[-1].split() == ["end", "0", "22", "22", "sink", "1", "0", "0"]
    with pytest.raises(PipelineError, match="give records \\(and batch_size\\) or batches=, not both"):
        TestingSource(RECORDS, batches=[RECORDS])


@pytest.mark.spark
def test_the_same_source_and_sink_run_on_spark_with_the_same_results(spark):
    import fissure

    local: list = []
    run_main(chain(), TestingSource(RECORDS, batch_size=2), TestingSink(local))
    on_spark: list = []
    report = fissure.run(chain(), TestingSource(RECORDS, batch_size=2), TestingSink(on_spark), plan="planner",
                         config=fissure.RunnerConfig(spark=spark, progress="off"))
    assert report.batches == 3 and report.input_records == len(RECORDS)
    assert sorted(map(str, on_spark)) == sorted(map(str, local))
