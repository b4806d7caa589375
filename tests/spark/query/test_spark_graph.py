"""Stream graphs on Spark: the same per-sink results as run_local, with and without pipeline
boundaries, no recomputation of shared upstream work, boundaries changed live, the
autopipelining loop, and exactly-once across a driver killed mid-stream."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import fissure
from fissure import Pipeline, PipelineError, StreamGraph, TumblingWindow, run_local
from fissure.cli.autopipeline_cmd import load_profile
from fissure.control.autopipeline_control import AutopipelineControlConfig, ControlAction
from fissure.model.types import Plan, RegionPlan
from fissure.profile.graph_profile import autopipeline_profile, piece_measurements, profile_json
from fissure.config import GraphAutopipelineConfig
from fissure.spark.run import run_graph
from fissure.spark.query.runner import Runner
from fissure.spark.io.sinks import FileSink, MemorySink
from fissure.testing import record_files

pytestmark = pytest.mark.spark

EVENT = {"host": str, "ts": int, "v": int}
HOSTS = {"host": str, "ts": int, "owner": str}
JOINED = {"host": str, "ts": int, "v": int, "owner": str}
EVENTS = [{"host": f"h{i % 3}", "ts": i, "v": i % 5} for i in range(60)]
HOST_RECORDS = [{"host": f"h{i % 3}", "ts": 2 * i, "owner": f"o{i}"} for i in range(30)]


def count(state, record):
    state["n"] = state.get("n", 0) + 1
    return {"host": record["host"], "n": state["n"]}


def enrich(left, right):
    return {"host": left["host"], "ts": left["ts"], "v": left["v"], "owner": right["owner"]}


def build_graph(calls_path: str | None = None) -> StreamGraph:
    """Two sources, fan-out of `parsed` to three consumers in three stages, a union, a keyed
    operator, a join, a failing operator (dead letters) and three sinks."""
    def parse(record):
        if calls_path is not None:
            with open(calls_path, "a", encoding="utf-8") as handle:
                handle.write(f"{record['ts']}\n")
        return {**record, "v": record["v"] * 10}

    def check(record):
        if record["ts"] % 17 == 0:
            raise ValueError("ts divisible by 17")
        return record

    g = StreamGraph("spark_graph")
    events = g.source("events", schema=EVENT)
    hosts = g.source("hosts", schema=HOSTS)
    parsed = events.map("parsed", parse)
    big = parsed.filter("big", lambda r: r["v"] >= 20)
    small = parsed.filter("small", lambda r: r["v"] < 20).map("checked", check)
    g.union("both", big, small).sink("all")
    parsed.partitioned("per_host", count, key="host", schema={"host": str, "n": int}).sink("counts")
    g.join("enrich", big, hosts, key="host", window=TumblingWindow("ts", 10, lateness=5), fn=enrich,
           schema=JOINED).sink("enriched")
    return g


def sources(tmp_path, files=3):
    """Both sources in `files` files each, one file of each a batch: batch k holds the events and
    the host records of ts [k * 60 / files, (k + 1) * 60 / files), so no record is late for the join."""
    return {"events": record_files(tmp_path / "events", EVENTS, EVENT, records_per_file=len(EVENTS) // files,
                                   max_files_per_trigger=1),
            "hosts": record_files(tmp_path / "hosts", HOST_RECORDS, HOSTS,
                                  records_per_file=len(HOST_RECORDS) // files, max_files_per_trigger=1)}


def canonical(records):
    return sorted(json.dumps(record, sort_keys=True) for record in records)


def expected():
    return run_local(build_graph(), {"events": EVENTS, "hosts": HOST_RECORDS})


def assert_same_as_local(sinks):
    local = expected()
    for name, sink in sinks.items():
        assert canonical(sink.records()) == canonical(local[name]), name
    return local


@pytest.mark.slow
@pytest.mark.parametrize("boundaries, partitions", [((), 1), (("big", "both"), 2)],
                         ids=["no-boundary", "boundaries-2-partitions"])
def test_graph_matches_run_local_and_runs_shared_work_once(spark, tmp_path, boundaries, partitions):
    """fissure.run of a graph by its named sources and sinks (no boundary, one state partition: the
    default plan) gives every sink as run_local does."""
    calls = tmp_path / "parse-calls.txt"
    sinks = {name: MemorySink() for name in ("all", "counts", "enriched")}
    report = fissure.run(build_graph(str(calls)), sources(tmp_path), sinks,
                         config=fissure.RunnerConfig(spark=spark, progress="off", boundaries=boundaries,
                                                     state_partitions=partitions))
    assert report.batches == len(report.batch_log) >= 2 and report.input_records == len(EVENTS) + len(HOST_RECORDS)
    local = assert_same_as_local(sinks)
    assert len(local["enriched"]) > 0 and len(local["all"]) < len(EVENTS)  # the join and the dead letters matter
    # `parsed` feeds big, small (pe stage) and per_host (keyed stage), big feeds enrich: each
    # event is parsed exactly once, so nothing upstream was recomputed for the other consumers
    assert sorted(int(line) for line in calls.read_text().split()) == list(range(len(EVENTS)))
    assert report.dead_letters == len(local.dead_letters) == 2  # small events with ts 0 and 51 fail in checked
    assert len(report.batch_log) >= 2 and all(batch.boundaries == tuple(sorted(boundaries)) for batch in report.batch_log)


def test_a_plan_replicates_stateless_and_keyed_stages_of_a_graph(spark, tmp_path):
    """Fission on a graph: the fan-out's stateless stage in two replicas cut into two processes,
    the keyed operator and the join in two state partitions; every sink as run_local has it."""
    graph = build_graph()
    assert graph.names == ("parsed", "big", "small", "checked", "both", "per_host", "enrich")
    plan = Plan(regions=(RegionPlan((("parsed", "big"), ("small", "checked", "both")), replicas=2),
                         RegionPlan((("per_host", "enrich"),), replicas=2)))
    sinks = {name: MemorySink() for name in ("all", "counts", "enriched")}
    runner = Runner(graph, sources(tmp_path), sinks, config=fissure.RunnerConfig(spark=spark), plan=plan)
    assert runner.boundaries == ("small",) and runner.state_partitions == 2
    runner.start(available_now=True)
    try:
        runner.await_termination(120)
    finally:
        report = runner.stop()
    assert_same_as_local(sinks)
    stages = runner.compiled.stages
    assert [(stage.kind, stage.nodes, stage.replicas, stage.boundaries) for stage in stages] == [
        ("pe", ("parsed", "big", "small", "checked", "both"), 2, ("small",)),
        ("keyed", ("per_host",), None, ()), ("keyed", ("enrich",), None, ())]
    assert report.plan == plan and report.dead_letters == 2


@pytest.mark.slow
def test_the_planner_plans_a_graph_as_the_chain_of_its_stages(spark, tmp_path):
    sinks = {name: MemorySink() for name in ("all", "counts", "enriched")}
    report = run_graph(build_graph(), sources(tmp_path), sinks, plan="planner",
                       config=fissure.RunnerConfig(spark=spark))
    assert report.plan.method != "sequential" and report.plan.operators == build_graph().names
    assert_same_as_local(sinks)


@pytest.mark.slow
def test_fissure_run_runs_every_program(spark, tmp_path):
    """One entry point: a chain-shaped graph; a Pipeline under the autopipelining loop (a graph by
    its named sources and sinks: test_graph_matches_run_local_and_runs_shared_work_once)."""
    import fissure

    chain = StreamGraph("chain_shaped")
    (chain.source("events", schema=EVENT).map("tenfold", lambda r: {**r, "v": r["v"] * 10})
     .partitioned("per_host", count, key="host", schema={"host": str, "n": int}).sink("counts"))
    chain_sink = MemorySink()
    report = fissure.run(chain, {"events": sources(tmp_path / "chain")["events"]}, {"counts": chain_sink},
                         plan="planner", config=fissure.RunnerConfig(spark=spark, progress="off"))
    assert report.input_records == len(EVENTS) and len(report.batch_log) == report.batches >= 1
    assert canonical(chain_sink.records()) == canonical(run_local(chain, {"events": EVENTS})["counts"])

    pipeline = Pipeline.from_graph(chain)
    piped = MemorySink()
    report = fissure.run(pipeline, sources(tmp_path / "piped", files=6)["events"], piped,
                         config=fissure.RunnerConfig(spark=spark, replanning="autopipeline"))
    assert len(report.batch_log) >= 2 and report.decisions
    assert canonical(piped.records()) == canonical(run_local(pipeline, EVENTS)["sink"])


def test_sinks_named_like_the_operators_that_feed_them(spark, tmp_path):
    """`parsed.sink("parsed")`: the runner binds sinks by name in their own namespace; the sinks'
    streams live to the end of the query however the stages and boundaries cut it."""
    import fissure

    g = StreamGraph("namesakes")
    parsed = g.source("events", schema=EVENT).map("parsed", lambda r: {**r, "v": r["v"] * 10})
    parsed.sink("parsed")
    big = parsed.filter("big", lambda r: r["v"] >= 20)
    big.sink("big")
    big.partitioned("per_host", count, key="host", schema={"host": str, "n": int}).sink("per_host")
    sinks = {name: MemorySink() for name in g.sinks}
    report = fissure.run(g, {"events": sources(tmp_path)["events"]}, sinks,
                         config=fissure.RunnerConfig(spark=spark, progress="off", boundaries=["big"],
                                                     state_partitions=2))
    local = run_local(g, {"events": EVENTS})
    for name, sink in sinks.items():
        assert canonical(sink.records()) == canonical(local[name]), name
    assert len(local["parsed"]) == len(EVENTS) and 0 < len(local["big"]) == len(local["per_host"]) < len(EVENTS)
    assert report.output_records == len(EVENTS) + 2 * len(local["big"])


def test_binding_and_boundary_errors_name_the_fix(spark, tmp_path):
    graph = build_graph()
    with pytest.raises(PipelineError, match="missing enriched"):
        Runner(graph, sources(tmp_path), {"all": MemorySink(), "counts": MemorySink()},
               config=fissure.RunnerConfig(spark=spark))
    runner = Runner(graph, sources(tmp_path), {name: MemorySink() for name in graph.sinks},
                    config=fissure.RunnerConfig(spark=spark))
    with pytest.raises(PipelineError, match="per_host name no stateless operator"):
        runner.set_boundaries(["big", "per_host"])
    with pytest.raises(PipelineError, match="'nowhere' name no stateless operator"):
        run_graph(graph, sources(tmp_path), {name: MemorySink() for name in graph.sinks},
                  config=fissure.RunnerConfig(spark=spark, boundaries=["nowhere"]))


@pytest.mark.slow
def test_boundaries_change_live_and_pieces_are_profiled(spark, tmp_path):
    sinks = {name: MemorySink() for name in ("all", "counts", "enriched")}
    # An autopipelining run's runner counts node by node (no loop attached here: the test moves the boundaries).
    runner = Runner(build_graph(), sources(tmp_path), sinks,
                    config=fissure.RunnerConfig(spark=spark, replanning="autopipeline"))
    runner.listeners.on_batch.append(lambda batch: runner.set_boundaries(["big"]) if batch.batch_id == 0 else None)
    runner.start(available_now=True)
    try:
        runner.await_termination(300)
    finally:
        report = runner.stop()
    assert_same_as_local(sinks)
    assert report.batch_log[0].boundaries == () and report.batch_log[-1].boundaries == ("big",)
    pieces = runner.profile_tally().pieces
    cuts = {piece_id.split("/")[2] for piece_id in pieces}
    assert cuts == {"parsed,big,small,checked,both", "parsed,small,checked|big,both"}
    measurements = piece_measurements(pieces)
    records_into = {}
    for piece in measurements:
        for node, records in piece.node_records_in.items():
            records_into[node] = records_into.get(node, 0) + records
    assert records_into["parsed"] == len(EVENTS)  # every event counted once, across both cuts
    profile = autopipeline_profile(runner.graph, measurements, stage_first_nodes=["parsed"])
    by_name = {thread.name: thread for thread in profile.threads}
    two_pieces = by_name["pe0/parsed,small,checked|big,both/p1"]
    assert set(two_pieces.port_utilization) == {"big", "both"}
    assert two_pieces.port_utilization["big"] >= two_pieces.port_utilization["both"]  # both is downstream of big
    one_piece = by_name["pe0/parsed,big,small,checked,both/p0"]
    assert "parsed" not in one_piece.port_utilization  # a boundary at the stage's first node cuts nothing
    profile_file = tmp_path / "profile.json"
    profile_file.write_text(json.dumps(profile_json(profile)))
    assert load_profile(profile_file).threads == profile.threads  # the CLI reads what the runner measured


@pytest.mark.slow
def test_autopipelining_loop_inserts_boundaries_while_running(spark, tmp_path):
    sinks = {name: MemorySink() for name in ("all", "counts", "enriched")}
    # every process is a bottleneck, and every proposed cut is tried (the paper's rule: this graph's
    # operators compute, so the forecast would try none)
    config = GraphAutopipelineConfig(profile_batches=1, beta=0.0,
                                     control=AutopipelineControlConfig(settle_s=0.0, forecast_trials=False))
    report = run_graph(build_graph(), sources(tmp_path, files=6), sinks,
                       config=fissure.RunnerConfig(spark=spark, replanning="autopipeline", autopipelining=config))
    assert_same_as_local(sinks)
    first = report.decisions[0]
    assert first.decision.action is ControlAction.INSERT and first.decision.insert
    inserted = set(first.decision.insert)
    later = [batch for batch in report.batch_log if batch.batch_id > first.batch_id]
    assert later and inserted <= set(later[0].boundaries)  # applied from the next batch, no restart
    for item in report.decisions[1:]:
        assert item.decision.reason
        assert set(item.decision.revert) <= set(item.decision.blacklist)


RESTART_DRIVER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[5])
    import fissure
    from fissure.spark.io.sinks import FileSink
    from fissure.spark.run import run_graph
    from test_spark_graph import build_graph, sources_for_restart

    inputs, out, checkpoint, available_now = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    graph = build_graph()
    sinks = {name: FileSink(f"{out}/{name}") for name in graph.sinks}
    run_graph(graph, sources_for_restart(inputs), sinks, checkpoint=checkpoint,
              config=fissure.RunnerConfig(master="local[2]", boundaries=["big"], available_now=available_now))
""")


def sources_for_restart(inputs):
    from fissure.spark.io.sources import FileSource

    return {"events": FileSource(f"{inputs}/events", format="json", schema=EVENT, max_files_per_trigger=1),
            "hosts": FileSource(f"{inputs}/hosts", format="json", schema=HOSTS, max_files_per_trigger=1)}


def committed(path):
    if not os.path.isdir(path):
        return 0
    return sum(os.path.exists(os.path.join(path, entry, "_SUCCESS")) for entry in os.listdir(path))


@pytest.mark.slow
def test_sigkill_then_restart_keeps_every_sink_exactly_once(spark, tmp_path):
    """A driver process killed with SIGKILL after its second batch; the restart on its checkpoint
    runs here, on the test's session (the same program, without a JVM to start)."""
    sources(tmp_path, files=6)  # writes the input files
    script = tmp_path / "driver.py"
    script.write_text(RESTART_DRIVER)
    out, checkpoint = tmp_path / "out", tmp_path / "ckpt"
    tests_dir = os.path.dirname(os.path.abspath(__file__))

    first = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(out), str(checkpoint), "0", tests_dir],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while committed(out / "enriched") < 2 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.2)
    assert first.poll() is None, "the first driver ended before it could be killed"
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    assert 2 <= committed(out / "enriched") < 6
    graph = build_graph()
    run_graph(graph, sources_for_restart(str(tmp_path)), {name: FileSink(f"{out}/{name}") for name in graph.sinks},
              checkpoint=str(checkpoint),
              config=fissure.RunnerConfig(spark=spark, boundaries=["big"], available_now=True, progress="off"))
    local = expected()
    for name in ("all", "counts", "enriched"):
        rows = [row.asDict() for row in spark.read.parquet(str(out / name)).drop("batch_id").collect()]
        assert canonical(rows) == canonical(local[name]), name
