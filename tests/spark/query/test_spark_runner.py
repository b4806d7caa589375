"""The Spark runner: each region kind compiled and run, dead letters, ordering, schema checks."""

from __future__ import annotations

import dataclasses
import gc
import weakref

import pytest

import fissure
from fissure import Pipeline, PipelineError
from fissure.model.types import Plan, RegionPlan
from fissure.spark.io.sinks import FileSink, MemorySink
from fissure.testing import TestingSource, record_files

pytestmark = pytest.mark.spark

EVENTS = {"user": str, "i": int}


def events(count, users=3):
    return [{"user": f"u{i % users}", "i": i} for i in range(count)]


def scale(record):
    if record["i"] == 13:
        raise ValueError("thirteen is unlucky")
    return {"user": record["user"], "i": record["i"] * 10}


def keep_even_tens(record):
    return record["i"] % 20 == 0


def remember_order(state, record):
    """Emits the record with how many of its key came before it and whether they came in order."""
    previous = state.get("last", -1)
    state["seen"] = state.get("seen", 0) + 1
    state["last"] = record["i"]
    return {"user": record["user"], "i": record["i"], "seen": state["seen"], "in_order": record["i"] > previous}


ORDERED = {"user": str, "i": int, "seen": int, "in_order": bool}


def total(state, record):
    state["n"] = state.get("n", 0) + 1
    return {"user": record["user"], "i": record["i"], "seen": state["n"], "in_order": record["in_order"]}


def chain():
    return (Pipeline("chain").map("scale", scale).filter("even", keep_even_tens)
            .partitioned("order", remember_order, key="user", schema=ORDERED)
            .stateful("total", total, schema=ORDERED))


def expected_results(count):
    kept = [r for r in events(count) if r["i"] != 13 and (r["i"] * 10) % 20 == 0]
    return sorted(r["i"] * 10 for r in kept)


def run_chain(spark, tmp_path, plan, count=40, files=4):
    source = record_files(tmp_path / "in", events(count), EVENTS, records_per_file=count // files,
                          max_files_per_trigger=1)
    sink = MemorySink()
    runner = fissure.Runner(chain(), source, sink, plan=plan, checkpoint=str(tmp_path / "ckpt"),
                            config=fissure.RunnerConfig(spark=spark, progress="off",
                                                        dead_letters=FileSink(str(tmp_path / "dead"), format="json")))
    runner.start(available_now=True)
    runner.await_termination(120)
    report = runner.stop()
    return runner, report, sink.records()


def test_sequential_plan_runs_everything_on_one_partition(spark, tmp_path):
    runner, report, records = run_chain(spark, tmp_path, "sequential")
    assert [(stage.kind, stage.exchange) for stage in runner.compiled.steps] == [
        ("pe", "none"), ("state", "hash"), ("state", "single")]
    assert runner.compiled.state_partitions == 1
    assert sorted(record["i"] for record in records) == expected_results(40)
    assert report.input_records == 40 and report.batches == 4
    assert all(record["in_order"] for record in records)
    assert max(record["seen"] for record in records) == len(records)  # one state for the stream


@pytest.mark.slow
def test_fission_pipelining_and_keyed_regions_give_the_sequential_results(spark, tmp_path):
    plan = Plan((RegionPlan((("scale",), ("even",)), replicas=2),
                 RegionPlan((("order",),), replicas=2),
                 RegionPlan((("total",),), replicas=1)))
    runner, report, records = run_chain(spark, tmp_path, plan)
    stages = runner.compiled.steps
    # a file source: the scan's tasks spread the first region, which numbers the records itself
    assert [(s.kind, s.exchange, s.partitions, s.pipelines) for s in stages] == [
        ("pe", "none", None, (("scale",), ("even",))),
        ("state", "hash", 2, (("order",),)),
        ("state", "single", 2, (("total",),)),
    ]
    assert runner.compiled.spread_by_scan
    assert sorted(record["i"] for record in records) == expected_results(40)
    # Fission reorders records between the regions; sequence numbers restore the source order
    # for every key.
    assert all(record["in_order"] for record in records)
    per_user = {}
    for record in sorted(records, key=lambda r: r["i"]):
        per_user.setdefault(record["user"], []).append(record["i"])
    assert report.dead_letters == 1
    dead = spark.read.json(str(tmp_path / "dead")).collect()
    assert [(row.operator, row.record) for row in dead] == [("scale", '{"i": 13, "user": "u1"}')]
    assert "thirteen is unlucky" in dead[0].error


@pytest.mark.parametrize("source_kind", ["files", "testing"])
def test_partitioned_region_spreads_its_stateless_prefix_and_hashes_on_the_key(spark, tmp_path, source_kind):
    pipeline = (Pipeline("prefix").map("scale", scale)
                .partitioned("order", remember_order, key="user", schema=ORDERED))
    plan = Plan((RegionPlan((("scale", "order"),), replicas=2),))
    if source_kind == "files":
        source = record_files(tmp_path / "in", events(30), EVENTS, records_per_file=10)
    else:
        source = TestingSource(events(30), schema=EVENTS)
    sink = MemorySink()
    runner = fissure.Runner(pipeline, source, sink, plan=plan, config=fissure.RunnerConfig(spark=spark, progress="off"))
    runner.start(available_now=True)
    runner.await_termination(120)
    runner.stop()
    # A file source's scan splits each micro-batch over the cores and spreads the prefix; any
    # other source's rows are numbered first, then spread round-robin.
    assert [(s.kind, s.exchange, s.key) for s in runner.compiled.steps] == (
        [("pe", "none", None), ("state", "hash", ("user",))] if source_kind == "files" else
        [("sequence", "none", None), ("pe", "round-robin", None), ("state", "hash", ("user",))])
    counts = {}
    for record in sink.records():
        counts[record["user"]] = max(counts.get(record["user"], 0), record["seen"])
    assert counts == {"u0": 10, "u1": 9, "u2": 10}  # i = 13 (user u1) is a dead letter


def unlucky_after(record):
    if record["seen"] == 4:
        raise ValueError("the fourth of a user")
    return record


@pytest.mark.parametrize("plan", ["sequential", Plan((RegionPlan((("order", "after"),), replicas=2),))])
def test_a_keyed_operators_output_reaches_the_stateless_ones_after_it_whole_and_in_order(spark, tmp_path, plan):
    # `after` runs in the keyed stage's Spark stage: the keyed stage hands it its output packed
    pipeline = (Pipeline("keyed_then_stateless").partitioned("order", remember_order, key="user", schema=ORDERED)
                .map("after", unlucky_after))
    source = record_files(tmp_path / "in", events(30), EVENTS, records_per_file=10, max_files_per_trigger=1)
    sink = MemorySink()
    report = fissure.run(pipeline, source, sink, plan=plan, config=fissure.RunnerConfig(spark=spark, progress="off"))
    records = sink.records()
    assert sorted((r["user"], r["seen"]) for r in records) == sorted(
        (f"u{user}", seen) for user in range(3) for seen in range(1, 11) if seen != 4)
    assert all(record["in_order"] for record in records)
    assert report.dead_letters == 3


def test_order_by_field_orders_a_keys_records_within_a_batch(spark, tmp_path):
    # Several files in one micro-batch: Spark packs them into partitions by size, so the
    # source order is only defined per partition; order_by gives an event-time order instead.
    records = [{"user": "u", "i": i} for i in range(20)]
    source = record_files(tmp_path / "in", list(reversed(records)), EVENTS, records_per_file=2)
    pipeline = Pipeline("ordered").partitioned("order", remember_order, key="user", schema=ORDERED, order_by="i")
    sink = MemorySink()
    fissure.run(pipeline, source, sink, config=fissure.RunnerConfig(spark=spark, progress="off"))
    assert [(r["i"], r["seen"]) for r in sorted(sink.records(), key=lambda r: r["seen"])] == [
        (i, i + 1) for i in range(20)]


def test_pipeline_that_does_not_fit_its_source_fails_at_start(spark, tmp_path):
    """A source whose schema is known without Spark (a FileSource) is checked when the Runner is
    made; one known only from its frame (a callable), when the query starts."""
    source = record_files(tmp_path / "in", events(3), EVENTS)
    pipeline = (Pipeline("misfit").map("scale", scale)
                .partitioned("per_host", remember_order, key="host", schema=ORDERED))
    with pytest.raises(PipelineError) as raised:
        fissure.Runner(pipeline, source, MemorySink(), config=fissure.RunnerConfig(spark=spark, progress="off"))
    assert "'per_host'" in str(raised.value) and "'host'" in str(raised.value)
    runner = fissure.Runner(pipeline, source.open, MemorySink(),
                            config=fissure.RunnerConfig(spark=spark, progress="off"))
    with pytest.raises(PipelineError) as raised:
        runner.start(available_now=True)
    assert "'per_host'" in str(raised.value) and "'host'" in str(raised.value)
    assert runner.query is None


def test_plan_that_does_not_fit_the_pipeline_is_refused(spark):
    with pytest.raises(PipelineError, match="lacks total"):
        fissure.Runner(chain(), lambda s: None, MemorySink(), config=fissure.RunnerConfig(spark=spark),
                       plan={"regions": [{"replicas": 1, "pipelines": [["scale", "even", "order"]]}]})
    with pytest.raises(PipelineError, match="replicates stateful operator 'total'"):
        fissure.Runner(chain(), lambda s: None, MemorySink(), config=fissure.RunnerConfig(spark=spark),
                       plan=Plan((RegionPlan((("scale", "even", "order"),)), RegionPlan((("total",),), 2))))


def shout(record):
    return {"value": record["value"].upper()}


def test_a_file_source_without_a_size_is_admitted_in_batches_the_policy_sizes(spark, tmp_path):
    """A latency bound below any batch's time sizes batches at the policy's minimum (1,000
    records of 7 bytes: 7,000 bytes). Spark admits whole files up to that many bytes: 2,400 lines
    in six files of 400 (2,800 bytes each) arrive two files a batch, each line once."""
    from fissure.plan.batch_size import MIN_RECORDS
    from fissure.config import RunnerConfig
    from fissure.testing import text_files

    lines = [f"a{i:05d}" for i in range(2400)]

    def run(config, name):
        source = text_files(tmp_path / name, lines, lines_per_file=400)
        sink = MemorySink()
        report = fissure.run(Pipeline("admitted").map("shout", shout), source, sink,
                             checkpoint=str(tmp_path / f"{name}-ckpt"),
                             config=dataclasses.replace(config, spark=spark, progress="off", profiling=None))
        return report, sorted(record["value"] for record in sink.records())

    expected = sorted(line.upper() for line in lines)
    sized, records = run(RunnerConfig(batch_latency_bound_s=0.01), "sized")
    (admission,) = sized.admissions
    assert admission.decision.records == MIN_RECORDS and "latency bound 0.01 s" in admission.decision.reason
    # the first file's 400 lines: 200 warm the operator up, 200 are measured
    assert admission.costs.startswith("operator costs measured on a sample of 200 records")
    declared, records = run(RunnerConfig(batch_latency_bound_s=0.01, batch_sample_costs=False), "declared")
    assert records == expected and declared.admissions[0].costs == "the operators' declared costs"
    assert admission.max_bytes_per_trigger == 7 * MIN_RECORDS
    assert records == expected and sized.batches == 3
    whole, records = run(RunnerConfig(batch_size="all"), "whole")
    assert records == expected and whole.batches == 1 and whole.admissions == ()


def test_a_stopped_runner_is_not_kept_alive_by_its_foreach_batch_function(spark, tmp_path):
    # PySpark pools every foreachBatch function for the session's life; one that still held the
    # Runner would keep the stopped Java query and its plans in the driver's heap.
    runner, report, records = run_chain(spark, tmp_path, "sequential", count=8, files=2)
    assert report.input_records == 8
    with pytest.raises(RuntimeError, match="stopped query"):
        runner._batch_function(None, 99)
    stopped = weakref.ref(runner)
    del runner
    gc.collect()
    assert stopped() is None


def test_the_operators_run_on_a_cost_sample_once_per_checkpoint_and_say_so(spark, tmp_path, capsys):
    """The sample runs the user's operators (here: each call leaves a mark in a file); a second
    start on the checkpoint (a restart, a resumed run) reads the costs the first one kept."""
    from fissure.spark.checkpoint.files import open_store
    from fissure.config import RunnerConfig
    from fissure.testing import text_files

    marks = tmp_path / "marks"

    def marked(record):
        with open(marks, "a") as out:
            out.write("x")
        return record

    source = text_files(tmp_path / "in", [f"line {i}" for i in range(600)], lines_per_file=600)
    store = open_store(spark, str(tmp_path / "ckpt"))

    def start(config=RunnerConfig()):
        runner = fissure.Runner(Pipeline("sampled").map("marked", marked), source, MemorySink(),
                                checkpoint=str(tmp_path / "ckpt"),
                                config=dataclasses.replace(config, spark=spark, progress="off"))
        _, (admission,) = runner._sized_sources(store)
        return admission

    first = start()
    calls = len(marks.read_text())
    assert calls >= 400 and first.costs.startswith("operator costs measured on a sample of 400 records")
    assert "runs the program's operators in a separate process, once per checkpoint" in capsys.readouterr().err
    again = start()
    assert len(marks.read_text()) == calls  # not run again
    assert again.costs.startswith("operator costs measured on a sample of 400 records")
    assert "(at the checkpoint's first start)" in again.costs
    assert "separate process" not in capsys.readouterr().err
    store.delete("fissure", recursive=True)
    off = start(RunnerConfig(batch_sample_costs=False))
    assert len(marks.read_text()) == calls and off.costs == "the operators' declared costs"
    store.delete("fissure", recursive=True)
    # Read once (available now), 600 lines fit in one batch whatever a sample would measure: none runs.
    runner = fissure.Runner(Pipeline("sampled").map("marked", marked), source, MemorySink(),
                            checkpoint=str(tmp_path / "ckpt"), config=RunnerConfig(spark=spark, progress="off"))
    _, (once,) = runner._sized_sources(store, available_now=True)
    assert len(marks.read_text()) == calls and "separate process" not in capsys.readouterr().err
    assert once.costs.startswith("the operators' declared costs (no sample: the whole input, about 600 records")
