"""StreamGraph: definition, every validation error, stages and pieces, and run_local's semantics."""

from __future__ import annotations

import pyarrow as pa
import pytest

import fissure
from fissure import Pipeline, PipelineError, StreamGraph, TumblingWindow, run_local
from fissure.model.types import Plan, RegionPlan
from fissure.plan.plans import check_plan
from fissure.local.executor import LocalGraphRun
from fissure.runtime.records.columns import DEAD_OPERATOR
from fissure.runtime.records.carried import dead_letter_batch, live_batch
from fissure.runtime.records.fate import DeadLetter
from fissure.runtime.records.envelopes import EnvelopeLayout
from fissure.runtime.pe.graph_piece import GraphPiece
from fissure.compile.pieces import build_pieces
from fissure.compile.stages import fusion_runs, pieces_for, plan_graph_stages, state_partitions_of, stream_lifetimes

EVENT = {"host": str, "ts": int, "v": int}
HOSTS = {"host": str, "ts": int, "owner": str}
JOINED = {"host": str, "ts": int, "v": int, "owner": str}


def count(state, record):
    state["n"] = state.get("n", 0) + 1
    return {"host": record["host"], "n": state["n"]}


def joined(left, right):
    return {"host": left["host"], "ts": left["ts"], "v": left["v"], "owner": right["owner"]}


def example_graph() -> StreamGraph:
    """Two sources, fan-out, union, a partitioned operator, a join, three sinks."""
    g = StreamGraph("example")
    events = g.source("events", schema=EVENT)
    hosts = g.source("hosts", schema=HOSTS)
    parsed = events.map("parsed", lambda r: {**r, "v": r["v"] * 10})
    big = parsed.filter("big", lambda r: r["v"] >= 20)
    small = parsed.filter("small", lambda r: r["v"] < 20)
    g.union("both", big, small).sink("all")
    parsed.partitioned("per_host", count, key="host", schema={"host": str, "n": int}).sink("counts")
    g.join("enrich", big, hosts, key="host", window=TumblingWindow("ts", 10), fn=joined, schema=JOINED).sink("enriched")
    return g


def test_builder_returns_streams_and_fan_out_is_reuse():
    g = example_graph()
    assert g.sources == ("events", "hosts")
    assert g.sinks == ("all", "counts", "enriched")
    assert g.consumers("parsed") == ("big", "small", "per_host")
    layout = g.check()
    assert layout.order.index("parsed") < layout.order.index("big") < layout.order.index("enrich")
    assert layout.schemas["per_host"].names == ["host", "n"]
    assert layout.schemas["both"].names == ["host", "ts", "v"]
    assert isinstance(fissure.StreamGraph("x").source("s"), fissure.program.graph.Stream)


# --- validation ---------------------------------------------------------------------------------


def test_duplicate_names_across_kinds():
    g = StreamGraph("g")
    s = g.source("lines")
    with pytest.raises(PipelineError, match=r"'lines' is used twice .*\(a source and an operator\)"):
        s.map("lines", lambda r: r)
    s.map("parse", lambda r: r)
    with pytest.raises(PipelineError, match=r"sink 'parse' of graph 'g' is fed by 'lines', but 'parse' is the name of "
                                            r"operator parse .*: name it 'lines' or give it a name of its own"):
        s.sink("parse")
    g.sink("out", "later")
    with pytest.raises(PipelineError, match="sink 'out' of graph 'g' is fed by 'later', but 'out' is the name of "
                                            "operator out"):
        s.map("out", lambda r: r)
    s.sink("lines")  # the name of the stream that feeds it
    with pytest.raises(PipelineError, match="sink name 'lines' is used twice"):
        s.sink("lines")


def test_chain_checks_are_reused():
    g = StreamGraph("g")
    s = g.source("lines")
    with pytest.raises(PipelineError, match="has no key"):
        s.partitioned("p", count)
    with pytest.raises(PipelineError, match="cannot be called with 1 argument"):
        s.map("m", lambda a, b: a)
    with pytest.raises(PipelineError, match="not valid"):
        s.map("bad name", lambda r: r)


def test_cycle_through_low_level_add_is_detected():
    g = StreamGraph("g")
    g.source("s")
    g.add("map", "a", lambda r: r, inputs=["u"])
    g.add("map", "b", lambda r: r, inputs=["a"])
    g.union("u", "s", "b")
    g.sink("out", "b")
    with pytest.raises(PipelineError, match=r"has a cycle: (a -> b -> u -> a|b -> u -> a -> b|u -> a -> b -> u)"):
        g.check()


def test_unknown_input_and_reading_a_sink():
    g = StreamGraph("g")
    g.source("s").sink("out")
    g.add("map", "a", lambda r: r, inputs=["nowhere"])
    with pytest.raises(PipelineError, match="reads 'nowhere', which graph 'g' does not have"):
        g.check()
    g2 = StreamGraph("g2")
    g2.source("s").sink("out")
    g2.add("map", "a", lambda r: r, inputs=["out"])
    with pytest.raises(PipelineError, match="reads sink 'out'; a sink has no output"):
        g2.check()


def test_operator_reads_exactly_one_stream():
    g = StreamGraph("g")
    a, b = g.source("a"), g.source("b")
    with pytest.raises(PipelineError, match="reads 2 streams .* graph.union"):
        g.add("map", "m", lambda r: r, inputs=[a, b])


def test_no_sink_and_sink_fed_by_nothing():
    g = StreamGraph("g")
    g.source("s").map("m", lambda r: r)
    with pytest.raises(PipelineError, match="has no sink"):
        g.check()
    g.sink("out", None)
    with pytest.raises(PipelineError, match="sink 'out' is fed by nothing"):
        g.check()
    with pytest.raises(PipelineError, match="is empty"):
        StreamGraph("e").check()


def test_unconnected_operator_and_unread_source():
    g = StreamGraph("g")
    s = g.source("s")
    s.map("kept", lambda r: r).sink("out")
    s.filter("lost", lambda r: True)
    with pytest.raises(PipelineError, match="operator lost .* is unconnected: its output reaches no sink"):
        g.check()
    g2 = StreamGraph("g2")
    g2.source("s").sink("out")
    g2.source("unused")
    with pytest.raises(PipelineError, match="source 'unused' is read by nothing"):
        g2.check()


def test_key_missing_on_partitioned_input_and_on_join_sides():
    g = StreamGraph("g")
    s = g.source("s", schema={"user": str, "ts": int})
    s.partitioned("p", count, key="host", schema={"host": str, "n": int}).sink("out")
    with pytest.raises(PipelineError, match="operator 'p' .* is keyed on field 'host', but its input 's' has only user, ts"):
        g.check()

    def join_graph(left_schema, right_schema):
        g = StreamGraph("j")
        left, right = g.source("l", schema=left_schema), g.source("r", schema=right_schema)
        g.join("jn", left, right, key="host", window=TumblingWindow("ts", 5), fn=joined, schema=JOINED).sink("out")
        return g

    with pytest.raises(PipelineError, match="join 'jn': its left input 'l' lacks the key field 'host'"):
        join_graph({"ts": int}, HOSTS).check()
    with pytest.raises(PipelineError, match="join 'jn': its right input 'r' lacks the key field 'host'"):
        join_graph(EVENT, {"ts": int, "owner": str}).check()
    with pytest.raises(PipelineError, match="its right input 'r' lacks the time field 'ts'"):
        join_graph(EVENT, {"host": str, "owner": str}).check()
    with pytest.raises(PipelineError, match="key field 'host' is string on the left .* but int64 on the right"):
        join_graph(EVENT, {"host": int, "ts": int}).check()
    with pytest.raises(PipelineError, match="time field 'ts' of 'l' is string"):
        join_graph({"host": str, "ts": str}, HOSTS).check()


def test_key_checked_against_bound_schema_when_source_is_undeclared():
    g = StreamGraph("g")
    g.source("s").partitioned("p", count, key="host", schema={"host": str, "n": int}).sink("out")
    g.check()  # nothing known yet
    with pytest.raises(PipelineError, match="keyed on field 'host'"):
        g.check({"s": pa.schema([("user", pa.string())])})
    with pytest.raises(PipelineError, match="keyed on field 'host'"):
        run_local(g, {"s": [{"user": "a"}]})


def test_union_schema_mismatch():
    g = StreamGraph("g")
    a = g.source("a", schema={"x": int})
    b = g.source("b", schema={"x": str})
    g.union("u", a, b).sink("out")
    with pytest.raises(PipelineError, match="union 'u': stream 'b' has fields \\(x: string\\) but 'a' has \\(x: int64\\)"):
        g.check()
    with pytest.raises(PipelineError, match="give it two or more"):
        g.union("u2", a)
    with pytest.raises(PipelineError, match="names a stream twice"):
        g.union("u3", a, a)


def test_join_definition_errors():
    g = StreamGraph("g")
    a, b = g.source("a"), g.source("b")
    with pytest.raises(PipelineError, match="self-joins are not supported"):
        g.join("j", a, a, key="host", window=TumblingWindow("ts", 1), fn=joined, schema=JOINED)
    with pytest.raises(PipelineError, match="declare the schema="):
        g.join("j", a, b, key="host", window=TumblingWindow("ts", 1), fn=joined, schema=None)
    with pytest.raises(PipelineError, match="must take \\(left_record, right_record\\)"):
        g.join("j", a, b, key="host", window=TumblingWindow("ts", 1), fn=lambda x: x, schema=JOINED)
    with pytest.raises(PipelineError, match="size must be a number > 0"):
        TumblingWindow("ts", 0)
    with pytest.raises(PipelineError, match="has no key"):
        g.join("j", a, b, key=[], window=TumblingWindow("ts", 1), fn=joined, schema=JOINED)
    with pytest.raises(PipelineError, match="'j': key must be a field name .* got int 5"):
        g.join("j", a, b, key=5, window=TumblingWindow("ts", 1), fn=joined, schema=JOINED)
    with pytest.raises(PipelineError, match="'p': key must be a field name .* got float 1.5"):
        a.partitioned("p", lambda state, record: record, key=1.5)


def test_streams_of_another_graph_are_refused():
    other = StreamGraph("other").source("s")
    with pytest.raises(PipelineError, match="belongs to graph 'other'"):
        StreamGraph("g").union("u", other, "x")


# --- stages and pieces ----------------------------------------------------------------------------


def test_stages_cut_at_keyed_nodes_in_topological_order():
    g = example_graph()
    stages = plan_graph_stages(g)
    assert [(stage.kind, stage.nodes) for stage in stages] == [
        ("pe", ("parsed", "big", "small", "both")), ("keyed", ("per_host",)), ("keyed", ("enrich",))]


def test_a_stateless_node_runs_after_the_keyed_stage_of_its_latest_input():
    g = StreamGraph("g")
    s = g.source("s", schema=EVENT)
    direct = s.map("direct", lambda r: r)
    counted = s.partitioned("per_host", count, key="host", schema={"host": str, "n": int})
    widened = counted.map("widened", lambda r: {"host": r["host"], "ts": r["n"], "v": 0}, schema=EVENT)
    g.union("merged", direct, widened).map("after", lambda r: r).sink("out")
    stages = plan_graph_stages(g)
    assert [(stage.kind, stage.nodes) for stage in stages] == [
        ("pe", ("direct",)), ("keyed", ("per_host",)), ("pe", ("widened", "merged", "after"))]
    results = run_local(g, {"s": [{"host": "a", "ts": 5, "v": 1}, {"host": "a", "ts": 6, "v": 2}]})
    assert sorted((r["ts"], r["v"]) for r in results["out"]) == [(1, 0), (2, 0), (5, 1), (6, 2)]


def test_pieces_follow_the_boundaries():
    g = example_graph()
    nodes = ("parsed", "big", "small", "both")
    assert pieces_for(g, nodes, ()) == (nodes,)
    assert pieces_for(g, nodes, ["big"]) == (("parsed", "small"), ("big", "both"))
    assert pieces_for(g, nodes, ["big", "both"]) == (("parsed", "small"), ("big",), ("both",))
    assert pieces_for(g, nodes, ["parsed"]) == (nodes,)  # a boundary at the first node cuts nothing off


def test_piece_forwards_only_what_later_nodes_need():
    g = example_graph()
    layout = g.check()
    schemas = {name: schema for name, schema in layout.schemas.items() if name not in g.sinks}
    envelope = EnvelopeLayout(schemas)
    stages = plan_graph_stages(g)
    first, second = build_pieces(g, schemas, envelope, stages, stages[0], ["big"])
    # parsed is read by big (next piece) and per_host (keyed stage); small by both (next piece)
    assert first.forward == {"parsed", "small"}
    # small is done once both ran; big is read by enrich, both by sink 'all', parsed by per_host
    assert second.forward == {"parsed", "big", "both"}
    assert isinstance(first, GraphPiece)


def test_a_piece_profile_id_names_the_operators_the_piece_runs():
    # build_pieces writes the id, graph_profile reads it back: the format has these two homes
    from fissure.profile.graph_profile import PieceMeasurement

    g = example_graph()
    layout = g.check()
    schemas = {name: schema for name, schema in layout.schemas.items() if name not in g.sinks}
    stages = plan_graph_stages(g)
    pieces = build_pieces(g, schemas, EnvelopeLayout(schemas), stages, stages[0], ["big", "both"],
                          profile_prefix="query")
    ran = [tuple(name for unit in piece.nodes for name in (unit.names or (unit.name,))) for piece in pieces]
    assert ran == [("parsed", "small"), ("big",), ("both",)]
    assert [PieceMeasurement(piece.profile_id, 0.0, 0.0, {}, {}).operators for piece in pieces] == ran


def test_pieces_give_the_same_rows_as_one_piece():
    g = example_graph()
    layout = g.check()
    schemas = {name: schema for name, schema in layout.schemas.items() if name not in g.sinks}
    envelope = EnvelopeLayout(schemas)
    stages = plan_graph_stages(g)
    from fissure.runtime.records.columns import carried_schema
    from fissure.runtime.records.carried import live_batch

    data = pa.RecordBatch.from_pylist([{"host": f"h{i % 2}", "ts": i, "v": i % 4} for i in range(12)],
                                      schema=schemas["events"])
    batch = envelope.wrap(live_batch(data, list(range(12))), "events")

    def run(boundaries):
        out = batch
        for piece in build_pieces(g, schemas, envelope, stages, stages[0], boundaries):
            out = piece(out)
        return sorted(map(str, out.to_pylist()))

    assert carried_schema(schemas["events"]).names[:3] == ["host", "ts", "v"]
    assert run([]) == run(["big"]) == run(["big", "small", "both"])


# --- run_local ------------------------------------------------------------------------------------


def test_run_local_fan_out_union_keyed_and_join():
    events = [{"host": "a", "ts": 1, "v": 1}, {"host": "b", "ts": 2, "v": 3}, {"host": "a", "ts": 12, "v": 2}]
    hosts = [{"host": "a", "ts": 5, "owner": "ann"}, {"host": "a", "ts": 15, "owner": "al"},
             {"host": "b", "ts": 25, "owner": "bo"}]
    results = run_local(example_graph(), {"events": events, "hosts": hosts})
    assert sorted(results["all"], key=lambda r: r["ts"]) == [
        {"host": "a", "ts": 1, "v": 10}, {"host": "b", "ts": 2, "v": 30}, {"host": "a", "ts": 12, "v": 20}]
    assert results["counts"] == [{"host": "a", "n": 1}, {"host": "a", "n": 2}, {"host": "b", "n": 1}]
    # big = v >= 20: (b, 2, 30) in window 0 has no b host in window 0; (a, 12, 20) meets (a, 15) in window 1
    assert results["enriched"] == [{"host": "a", "ts": 12, "v": 20, "owner": "al"}]
    assert results.dead_letters == []


def test_join_emits_every_pair_of_a_window_once_whatever_the_side_order():
    g = StreamGraph("j")
    left, right = g.source("l", schema=EVENT), g.source("r", schema=HOSTS)
    g.join("jn", left, right, key="host", window=TumblingWindow("ts", 10), fn=joined, schema=JOINED).sink("out")
    lefts = [{"host": "a", "ts": 1, "v": 1}, {"host": "a", "ts": 3, "v": 2}]
    rights = [{"host": "a", "ts": 2, "owner": "x"}, {"host": "a", "ts": 9, "owner": "y"}, {"host": "b", "ts": 2, "owner": "z"}]
    pairs = sorted((r["v"], r["owner"]) for r in run_local(g, {"l": lefts, "r": rights})["out"])
    assert pairs == [(1, "x"), (1, "y"), (2, "x"), (2, "y")]


def test_join_evicts_closed_windows_and_dead_letters_late_records():
    g = StreamGraph("j")
    left, right = g.source("l", schema=EVENT), g.source("r", schema=HOSTS)
    g.join("jn", left, right, key="host", window=TumblingWindow("ts", 10, lateness=2), fn=joined,
           schema=JOINED).sink("out")
    run = LocalGraphRun(g)
    first = run.run_batch({"l": [{"host": "a", "ts": 5, "v": 1}], "r": [{"host": "a", "ts": 11, "owner": "x"}]})
    assert first["out"] == [] and first.dead_letters == []
    # watermark 11 < 10 + 2: window 0 still open; a right record at ts 8 joins the stored left
    second = run.run_batch({"l": [], "r": [{"host": "a", "ts": 8, "owner": "y"}]})
    assert second["out"] == [{"host": "a", "ts": 5, "v": 1, "owner": "y"}]
    # watermark 12 closes window 0 (its state is evicted); a record for it is late
    third = run.run_batch({"l": [{"host": "a", "ts": 12, "v": 2}], "r": []})
    assert third["out"] == [{"host": "a", "ts": 12, "v": 2, "owner": "x"}]
    # within a batch records go by event time: ts 3 before ts 12 would still join; in a later batch it is late
    fourth = run.run_batch({"l": [], "r": [{"host": "a", "ts": 3, "owner": "z"}]})
    assert fourth["out"] == []
    (late,) = fourth.dead_letters
    assert late.node == "jn" and late.error.startswith("Late: event time 3 is in window [0, 10) that closed at watermark 12 of this key")
    assert list(join_windows(run.states["jn"])) == [1]


def join_windows(states):
    import json

    from fissure.runtime.state.codec import DATA_HEADER, decode_data

    stored = states[json.dumps(["a"])]
    assert stored.startswith(DATA_HEADER)  # a join's state is data, never a pickle
    return decode_data(stored[len(DATA_HEADER):])["windows"].keys()


def test_run_local_dead_letters_carry_node_and_reason():
    g = StreamGraph("d")
    g.source("s", schema={"x": int}).map("inv", lambda r: {"x": 10 // r["x"]}).sink("out")
    results = run_local(g, {"s": [{"x": 2}, {"x": 0}, {"x": 5}]})
    assert results["out"] == [{"x": 5}, {"x": 2}]
    (dead,) = results.dead_letters
    assert dead.node == "inv" and dead.error.startswith("ZeroDivisionError")


def test_run_local_binding_errors():
    g = example_graph()
    with pytest.raises(PipelineError, match="no records given for source\\(s\\) 'hosts'"):
        run_local(g, {"events": []})
    with pytest.raises(PipelineError, match="has no source 'nope'"):
        run_local(g, {"events": [], "hosts": [], "nope": []})
    undeclared = StreamGraph("u")
    undeclared.source("s").sink("out")
    with pytest.raises(PipelineError, match="no declared schema and no records"):
        run_local(undeclared, {"s": []})


# --- graph profiles and the autopipelining loop, with a recording fake runner (no Spark) ---------

from fissure.control.autopipeline_control import ControlAction  # noqa: E402
from fissure.profile.graph_profile import autopipeline_profile, piece_measurements  # noqa: E402
from fissure.config import GraphAutopipelineConfig  # noqa: E402
from fissure.spark.adaptive.autopipelining import GraphAutopipeliner  # noqa: E402
from fissure.runtime.profiling.profiler import ProfileTally  # noqa: E402

ONE_PIECE = "example/pe0/parsed,big,small,both/p0"


def piece_counts(cpu_s, wall_s, node_cpu_s, node_records):
    return [cpu_s, wall_s, {name: [node_records.get(name, 0), 0, value] for name, value in node_cpu_s.items()}]


def test_profile_is_mu_of_threads_and_ports_downstream_within_the_piece():
    g = example_graph()
    pieces = {ONE_PIECE: piece_counts(0.9, 1.0, {"parsed": 0.1, "big": 0.4, "small": 0.1, "both": 0.2}, {})}
    profile = autopipeline_profile(g, piece_measurements(pieces), stage_first_nodes=["parsed"], beta=0.8)
    (thread,) = profile.threads
    assert thread.name == "pe0/parsed,big,small,both/p0"
    assert thread.utilization == pytest.approx(0.9)
    # big feeds both: mu(big) = big + both; parsed, the stage's first node, offers no port
    assert thread.port_utilization == pytest.approx({"big": 0.6, "small": 0.3, "both": 0.2})
    before, later = ProfileTally(), ProfileTally()
    before.add_piece(ONE_PIECE, *pieces[ONE_PIECE])
    later.add_piece(ONE_PIECE, *piece_counts(1.9, 3.0, {"parsed": 0.3, "big": 0.4, "small": 0.1, "both": 0.2}, {"big": 5}))
    gained = later.minus(before).pieces[ONE_PIECE]
    assert gained[:2] == pytest.approx([1.0, 2.0]) and gained[2]["big"] == pytest.approx([5, 0, 0.0])
    assert later.minus(later).pieces == {}  # nothing new: no piece


def test_a_waiting_node_occupies_its_thread_for_its_wall_time_and_the_forecast_sees_the_task():
    from fissure.profile.graph_profile import task_timings

    g = example_graph()
    # small sleeps: 0.4 s of wall time for 0.01 s of CPU; the others compute (wall = CPU)
    nodes = {name: [0, 0, cpu_s, wall_s] for name, cpu_s, wall_s in
             (("parsed", 0.1, 0.1), ("big", 0.2, 0.2), ("small", 0.01, 0.4), ("both", 0.1, 0.1))}
    pieces = {ONE_PIECE: [0.45, 1.0, nodes, 4]}
    measurements = piece_measurements(pieces)
    (thread,) = autopipeline_profile(g, measurements, stage_first_nodes=["parsed"]).threads
    assert thread.utilization == pytest.approx(0.45 + 0.39)  # its CPU and the waiting of small
    assert thread.port_utilization == pytest.approx({"big": 0.3, "small": 0.5, "both": 0.1})
    (task,) = task_timings(g, measurements, batches=2, cores=2, stage_first_nodes=["parsed"])
    assert (task.wall_s, task.tasks_per_batch, task.core_share, task.idle_cores) == (1.0, 2.0, 1.0, None)
    idle = task_timings(g, piece_measurements({ONE_PIECE: [0.45, 1.0, nodes, 4, 0.5, 12]}), batches=2, cores=2)
    assert idle[0].idle_cores == 0.5  # the machine's idle CPU seconds over the calls' wall seconds
    assert idle[0].chunks_per_call == 3.0  # 12 Arrow batches in 4 calls, no chunking given
    from fissure.runtime.pe.element import pipelining_chunk_count
    chunked = task_timings(g, piece_measurements({ONE_PIECE: [0.45, 1.0, {**nodes, "parsed": [30000, 0, 0.1, 0.1]},
                                                              4, 0.5, 12]}), batches=2, cores=2,
                           chunk_count=pipelining_chunk_count)
    assert chunked[0].chunks_per_call == 3.0 * 8  # 2,500-row batches cut into 8 for two processes
    (piece,) = task.pieces
    assert piece.first and piece.below == {"big": {"big", "both"}, "small": {"small", "both"}, "both": {"both"}}
    assert piece.cuttable  # big, small and both read parsed
    # counted per fused run under a cut: the id names every operator of a piece, its counts only a run's last
    cut = {f"example~runs/pe0/parsed,big,small|both/p{number}": [0.3, 1.0, {name: [0, 0, 0.1, 0.1]}, 4]
           for number, name in ((0, "small"), (1, "both"))}
    first, union = task_timings(g, piece_measurements(cut), batches=2, cores=2, stage_first_nodes=["parsed"])[0].pieces
    assert piece_measurements(cut)[0].operators == ("parsed", "big", "small")
    assert (first.cuttable, union.cuttable) == (True, False)  # both alone: no operator of its piece reads another
    assert piece.nodes["small"].waiting and not piece.nodes["big"].waiting
    # on a machine short of cores every operator shows 2.5 x its CPU time: only small waits beyond that
    stretched = {name: [0, 0, cpu_s, wall_s * (2.5 if name != "small" else 1.0)]
                 for name, (_, _, cpu_s, wall_s) in nodes.items()}
    (piece,) = task_timings(g, piece_measurements({ONE_PIECE: [0.45, 2.0, stretched, 4]}), batches=2, cores=2)[0].pieces
    assert [name for name, timing in piece.nodes.items() if timing.waiting] == ["small"]


class RecordingRunner:
    """What GraphAutopipeliner needs of a Runner; records every boundary change."""

    def __init__(self, graph):
        from types import SimpleNamespace

        self.graph = graph
        self.profile_pieces = True
        self.cores = 2  # one task a batch on two cores: a cut has a core of its own
        self.counting: list[str] = []  # every counting mode the loop set
        self.compiled = SimpleNamespace(stages=plan_graph_stages(graph))
        self.boundaries = ()
        self.listeners = SimpleNamespace(on_batch=[])
        self.applied: list[tuple[str, ...]] = []
        self.tally = ProfileTally()

    def set_boundaries(self, boundaries):
        self.boundaries = tuple(sorted(boundaries))
        self.applied.append(self.boundaries)

    def profile_tally(self):
        return self.tally.copy()

    def count_pieces(self, counting):
        self.counting.append(counting)

    def run_batch(self, batch_id, wall_s, pieces):
        from fissure.spark.query.runner import GraphBatch

        for piece, (cpu_s, piece_wall_s, nodes) in pieces.items():
            self.tally.add_piece(piece, cpu_s, piece_wall_s, nodes)
        for listener in self.listeners.on_batch:
            listener(GraphBatch(batch_id, wall_s, self.boundaries, 0))


BUSY = {"parsed": 0.1, "big": 0.45, "small": 0.1, "both": 0.1}  # big: U 0.55, small 0.7, both 0.8
CUT = "example/pe0/parsed,small|big,both"


def screened(runner, loop, batch_id=0):
    """The loop's first window only screens (fused, counted per run): this one says a cut may pay."""
    runner.run_batch(batch_id, 1.0, {ONE_PIECE: piece_counts(0.9, 1.0, BUSY, {"big": 100})})
    decision = loop.decisions[-1].decision
    assert decision.action is ControlAction.PROFILE and decision.reason.startswith(
        "a cut may pay, profiling node by node: pe0/parsed,big,small,both: any cut gains at most +100%")
    assert runner.counting == ["runs", "nodes"] and runner.applied == []


def test_loop_inserts_keeps_a_port_that_gains_then_halts():
    runner = RecordingRunner(example_graph())
    loop = GraphAutopipeliner(runner, GraphAutopipelineConfig(profile_batches=1, beta=0.8), clock=lambda: 0.0).attach()
    screened(runner, loop)
    runner.run_batch(1, 1.0, {ONE_PIECE: piece_counts(0.9, 1.0, BUSY, {"big": 100})})
    first = loop.decisions[1].decision
    assert (first.action, first.insert, first.trial_batches) == (ControlAction.INSERT, ("big",), 1)
    assert runner.applied == [("big",)]
    # the next window ran under the new cut, twice as fast: big's throughput 100/s -> 200/s
    after_cut = {f"{CUT}/p0": piece_counts(0.3, 0.5, {"parsed": 0.1, "small": 0.1}, {}),
                 f"{CUT}/p1": piece_counts(0.3, 0.5, {"big": 0.2, "both": 0.1}, {"big": 100})}
    runner.run_batch(2, 0.5, after_cut)
    second = loop.decisions[2].decision
    assert (second.action, second.keep, second.revert) == (ControlAction.CONTINUE, ("big",), ())
    assert runner.applied[-1] == ("big",) and runner.counting[-1] == "runs"  # the next round screens first
    runner.run_batch(3, 0.5, after_cut)
    third = loop.decisions[3].decision  # the task computes for 1.6 of its time, on two cores: a cut may gain +25 %
    assert third.action is ControlAction.PROFILE
    runner.run_batch(4, 0.5, after_cut)
    fourth = loop.decisions[4].decision
    assert fourth.action is ControlAction.HALT and "no thread is at or above beta 0.8" in fourth.reason
    assert loop.phase == "halted" and runner.counting[-1] == "off"  # halted: the pieces fuse again, uncounted
    runner.run_batch(5, 0.5, {})
    assert len(loop.decisions) == 5


def test_loop_reverts_and_blacklists_a_port_that_does_not_gain():
    runner = RecordingRunner(example_graph())
    loop = GraphAutopipeliner(runner, GraphAutopipelineConfig(profile_batches=1, beta=0.8), clock=lambda: 0.0).attach()
    screened(runner, loop)
    runner.run_batch(1, 1.0, {ONE_PIECE: piece_counts(0.9, 1.0, BUSY, {"big": 100})})
    runner.run_batch(2, 1.25, {f"{CUT}/p0": piece_counts(0.3, 1.25, {"parsed": 0.1, "small": 0.1}, {}),
                               f"{CUT}/p1": piece_counts(0.3, 1.25, {"big": 0.2, "both": 0.1}, {"big": 100})})
    second = loop.decisions[2].decision
    assert second.revert == ("big",) and second.blacklist == frozenset({"big"})
    assert second.action is ControlAction.CONTINUE  # 1 of 4 ports blacklisted: below alpha 0.5
    assert runner.applied == [("big",), ()]
    # the trial delivered 0.8 against a bound of 1 / 0.55: every later bound of the run is scaled by that
    assert loop.policy.delivered_share == pytest.approx(0.8 * 0.55)
    runner.run_batch(3, 1.0, {ONE_PIECE: piece_counts(0.9, 1.0, BUSY, {"small": 100})})
    third = loop.decisions[3].decision  # the screen's +100 % is +0 % at that share: no second trial
    assert third.action is ControlAction.HALT and "0.44 of that as this run's trials delivered: +0%" in third.reason
    assert runner.applied == [("big",), (), ()] and runner.counting[-1] == "off"


def test_loop_tries_no_cut_on_a_task_with_no_free_core_and_a_short_trial_where_one_pays():
    computing = {name: [100, 100, cpu_s, cpu_s] for name, cpu_s in BUSY.items()}  # wall = CPU: every node computes
    runner = RecordingRunner(example_graph())
    runner.cores = 1
    loop = GraphAutopipeliner(runner, GraphAutopipelineConfig(profile_batches=3, beta=0.8), clock=lambda: 0.0).attach()
    for batch_id in range(3):
        runner.run_batch(batch_id, 1.0, {ONE_PIECE: [0.9, 1.0, computing]})
    (only,) = [item.decision for item in loop.decisions]
    assert only.action is ControlAction.HALT and only.reason.startswith(
        "no cut can pay beyond the noise: pe0/parsed,big,small,both: any cut gains at most +0%")
    assert runner.applied == [()] and runner.counting == ["runs", "off"]  # screened fused, never unfused, no trial

    waiting = {**computing, "small": [100, 100, 0.01, 0.6]}  # small sleeps: 0.6 s of wall time, 0.01 s of CPU
    runner = RecordingRunner(example_graph())
    runner.cores = 1
    loop = GraphAutopipeliner(runner, GraphAutopipelineConfig(profile_batches=3, beta=0.8), clock=lambda: 0.0).attach()
    for batch_id in range(6):  # a window screened, a window profiled node by node
        runner.run_batch(batch_id, 1.5, {ONE_PIECE: [0.91, 1.5, waiting]})
    screen, first = (item.decision for item in loop.decisions)
    assert screen.action is ControlAction.PROFILE
    assert (first.action, first.insert, first.trial_batches) == (ControlAction.INSERT, ("small",), 1)
    cut = "example/pe0/parsed,big|small,both"
    runner.run_batch(6, 1.0, {f"{cut}/p0": [0.35, 1.0, {name: computing[name] for name in ("parsed", "big")}],
                              f"{cut}/p1": [0.2, 1.0, {name: waiting[name] for name in ("small", "both")}]})
    second = loop.decisions[2].decision  # judged after the one batch of the trial
    assert (second.action, second.keep) == (ControlAction.CONTINUE, ("small",))


# --- one program model: a chain is a graph -------------------------------------------------------


def _chain():
    return (Pipeline("chain").map("double", lambda r: {"k": r["k"], "v": 2 * r["v"]})
            .filter("big", lambda r: r["v"] > 2, selectivity=0.5)
            .partitioned("total", lambda state, r: state.update(n=state.get("n", 0) + r["v"]) or
                         {"k": r["k"], "n": state["n"]}, key="k", schema={"k": str, "n": int}))


def test_a_pipeline_is_the_graph_of_one_source_and_one_sink():
    chain = _chain()
    graph = StreamGraph.from_pipeline(chain)
    assert graph.sources == ("source",) and graph.sinks == ("sink",) and graph.names == chain.names
    assert [node.operator for node in graph.nodes if node.operator] == list(chain.operators)
    assert graph.operator_stats() == chain.operator_stats()  # the same planner input
    back = Pipeline.from_graph(graph)
    assert back.names == chain.names and back.operators == chain.operators
    records = [{"k": "a", "v": 1}, {"k": "a", "v": 2}, {"k": "b", "v": 3}]
    assert run_local(chain, records)["sink"] == [{"k": "a", "n": 4}, {"k": "b", "n": 6}]


def test_an_operator_named_like_an_end_moves_the_end_and_fan_out_is_no_chain():
    chain = Pipeline("p").map("source", lambda r: r).map("sink", lambda r: r)
    graph = StreamGraph.from_pipeline(chain)
    assert graph.sources == ("source_",) and graph.sinks == ("sink_",)
    g = StreamGraph("fan")
    stream = g.source("in").map("a", lambda r: r)
    stream.map("b", lambda r: r).sink("out1")
    stream.map("c", lambda r: r).sink("out2")
    assert g.chain_operators() is None
    with pytest.raises(PipelineError, match="not a chain"):
        Pipeline.from_graph(g)


def test_a_graph_is_planned_as_the_chain_of_its_operators_loaded_with_their_records():
    g = StreamGraph("rates")
    first = g.source("one", schema={"k": str})
    second = g.source("two", schema={"k": str})
    kept = first.filter("kept", lambda r: True, selectivity=0.25)
    merged = g.union("merged", kept, second)
    merged.partitioned("counted", lambda state, r: None, key="k").sink("out")
    merged.map("copied", lambda r: r, cost_us=4.0).sink("copies")
    assert g.names == ("kept", "merged", "copied", "counted")
    rates = g.input_rates()
    assert rates == {"kept": 0.5, "merged": 0.5 * 0.25 + 0.5, "copied": 0.625, "counted": 0.625}
    stats = g.operator_stats()
    entering, loads = 1.0, {}
    for operator in stats:  # the chain's records entering each operator reproduce the graph's rates
        loads[operator.name] = entering
        entering *= operator.selectivity
    assert loads == pytest.approx({name: rate / rates["kept"] for name, rate in rates.items()})
    assert [(s.kind.value, s.key, s.cost_us) for s in stats] == [
        ("stateless", None, 10.0), ("stateless", None, 0.5), ("stateless", None, 4.0), ("partitioned", ("k",), 10.0)]


def test_a_plan_cuts_a_graph_into_replicated_stages_and_processes():
    g = StreamGraph("staged")
    stream = g.source("in", schema={"k": str, "v": int})
    a = stream.map("a", lambda r: r)
    a.map("b", lambda r: r).partitioned("c", lambda state, r: None, key="k").map("d", lambda r: r).sink("out")
    a.filter("e", lambda r: True).sink("side")
    assert g.names == ("a", "b", "e", "c", "d")
    plan = Plan(regions=(RegionPlan((("a",), ("b", "e")), replicas=3), RegionPlan((("c", "d"),), replicas=2)))
    stages = plan_graph_stages(g, plan)
    assert [(st.kind, st.nodes, st.replicas, st.boundaries) for st in stages] == [
        ("pe", ("a", "b", "e"), 3, ("b",)), ("keyed", ("c",), None, ()), ("pe", ("d",), None, ())]
    assert state_partitions_of(g, plan) == 2
    assert [(st.kind, st.nodes) for st in plan_graph_stages(g)] == [
        ("pe", ("a", "b", "e")), ("keyed", ("c",)), ("pe", ("d",))]
    with pytest.raises(PipelineError, match="instead of the order a -> b -> e -> c -> d"):
        check_plan(Plan(regions=(RegionPlan((("a", "b", "c", "e", "d"),)),)), g)
    with pytest.raises(PipelineError, match="replicates operators keyed on different fields"):
        g2 = StreamGraph("keys")
        s2 = g2.source("in", schema={"k": str, "j": str})
        s2.partitioned("x", lambda state, r: None, key="k").partitioned("y", lambda state, r: None, key="j").sink("o")
        check_plan(Plan(regions=(RegionPlan((("x", "y"),), replicas=2),)), g2)


# --- envelopes between stages: only the live streams' columns ------------------------------------


def _lifetime_graph():
    g = StreamGraph("lifetimes")
    raw = g.source("raw", schema={"k": str, "v": int})
    parsed = raw.map("parsed", lambda r: {"k": r["k"], "w": r["v"]}, schema={"k": str, "w": int})
    parsed.partitioned("count", lambda state, r: None, key="k", schema={"k": str, "n": int}).sink("counts")
    parsed.filter("kept", lambda r: True).map("doubled", lambda r: {"k": r["k"], "w": 2 * r["w"]}).sink("all")
    return g


def test_streams_live_from_the_stage_after_their_maker_to_their_last_reader():
    g = _lifetime_graph()
    stages = plan_graph_stages(g)
    assert [(stage.kind, stage.nodes) for stage in stages] == [("pe", ("parsed", "kept", "doubled")),
                                                                ("keyed", ("count",))]
    assert stream_lifetimes(g, stages) == (frozenset({"raw"}), frozenset({"parsed", "doubled"}),
                                           frozenset({"doubled", "count"}))


def test_a_restricted_layout_keeps_column_names_and_conforms_envelopes_both_ways():
    g = _lifetime_graph()
    schemas = {name: schema for name, schema in g.check().schemas.items() if name not in g.sinks}
    every = EnvelopeLayout(schemas)
    narrow = every.restricted({"doubled"})
    assert narrow.columns_of("doubled") == every.columns_of("doubled")
    assert not narrow.carries("raw") and narrow.carries("parsed")  # parsed and doubled share a schema
    data = pa.RecordBatch.from_pylist([{"k": "a", "w": 1}, {"k": "b", "w": 2}], schema=schemas["doubled"])
    carried = live_batch(data, [7, 8])
    wide = every.wrap(carried, "doubled")
    assert every.streams_in(wide) == {"doubled"} and every.extract(wide, "doubled").equals(carried)
    assert narrow.conform(wide).schema.equals(narrow.schema)
    back = every.conform(narrow.conform(wide))
    assert every.extract(back, "doubled").equals(carried)  # through the narrow layout and back
    with pytest.raises(ValueError, match="without the columns of stream 'raw'"):
        narrow.wrap(live_batch(pa.RecordBatch.from_pylist([{"k": "a", "v": 1}], schema=schemas["raw"]), [1]), "raw")
    letters = dead_letter_batch([DeadLetter("raw_op", "ValueError: x", "{}", 3)], schemas["raw"])
    dead = narrow.wrap(letters, "raw")  # a dead letter needs no user field: any layout takes it
    assert dead.num_rows == 1 and dead.column(dead.schema.get_field_index(DEAD_OPERATOR)).to_pylist() == ["raw_op"]


def test_runs_of_operators_fuse_until_a_fan_out_or_a_union():
    g = StreamGraph("runs")
    a = g.source("in", schema={"v": int}).map("a", lambda r: r).map("b", lambda r: r)
    c = a.map("c", lambda r: r)
    a.filter("d", lambda r: True).sink("side")
    g.union("u", c, g.source("other", schema={"v": int})).map("e", lambda r: r).map("f", lambda r: r).sink("out")
    assert fusion_runs(g, ["a", "b", "c", "d", "u", "e", "f"]) == [["a", "b"], ["c"], ["d"], ["u"], ["e", "f"]]
    records = [{"v": 1}, {"v": 2}]
    assert run_local(g, {"in": records, "other": [{"v": 3}]})["out"] == records + [{"v": 3}]


def namesake_graph() -> StreamGraph:
    """Sinks named like the operators that feed them: `parsed` feeds its sink and an operator,
    `big` its sink and a keyed operator, `per_host` only its sink."""
    g = StreamGraph("namesakes")
    parsed = g.source("events", schema=EVENT).map("parsed", lambda r: {**r, "v": r["v"] * 10})
    parsed.sink("parsed")
    big = parsed.filter("big", lambda r: r["v"] >= 20)
    big.sink("big")
    big.partitioned("per_host", count, key="host", schema={"host": str, "n": int}).sink("per_host")
    return g


NAMESAKE_EVENTS = [{"host": f"h{i % 2}", "ts": i, "v": i % 4} for i in range(8)]


def test_a_sink_named_like_the_operator_that_feeds_it_runs_in_process():
    from fissure.testing import TestingSink, TestingSource, run_main

    g = namesake_graph()
    assert g.sinks == ("parsed", "big", "per_host") and g.names == ("parsed", "big", "per_host")
    assert g.sink_node("big").inputs == ("big",) and g.node("big").kind.value == "operator"
    assert g.consumers("parsed") == ("big",) and g.sinks_of("parsed") == ("parsed",)
    assert g.check().order == ("events", "parsed", "big", "per_host")
    results = run_local(g, {"events": NAMESAKE_EVENTS})
    assert [r["v"] for r in results["parsed"]] == [0, 10, 20, 30, 0, 10, 20, 30]
    assert [r["v"] for r in results["big"]] == [20, 30, 20, 30]
    assert results["per_host"] == [{"host": "h0", "n": 1}, {"host": "h0", "n": 2}, {"host": "h1", "n": 1},
                                   {"host": "h1", "n": 2}]
    out = {name: [] for name in g.sinks}
    run_main(g, TestingSource(NAMESAKE_EVENTS, batch_size=3), {name: TestingSink(out[name]) for name in g.sinks})
    assert {name: len(records) for name, records in out.items()} == {"parsed": 8, "big": 4, "per_host": 4}
    # Streams a sink reads live to the end, and a run does not fuse past an operator a sink reads.
    stages = plan_graph_stages(g)
    assert [(stage.kind, stage.nodes) for stage in stages] == [("pe", ("parsed", "big")), ("keyed", ("per_host",))]
    assert stream_lifetimes(g, stages)[-1] == frozenset({"parsed", "big", "per_host"})
    assert fusion_runs(g, ["parsed", "big"]) == [["parsed"], ["big"]]
    chain = StreamGraph("c")
    chain.source("lines").map("upper", lambda r: {"value": r["value"].upper()}).sink("upper")
    assert Pipeline.from_graph(chain).names == ("upper",) and repr(chain) == "StreamGraph('c': 3 nodes, sinks upper)"
