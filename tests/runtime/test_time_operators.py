"""Aggregates, running aggregates, deduplication and expiring state in process, against
plain-Python references; time in graphs; the definition errors; what the planner sees."""

from __future__ import annotations

import datetime
import math
import random
import statistics

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fissure
from fissure import (Aggregate, Count, Max, Mean, Min, Pipeline, PipelineError, StreamGraph, Sum, Tumbling,
                     TumblingWindow)
from fissure.program.chain import output_schemas
from fissure.testing import run_batches
from repository import DOCS

SCHEMA = {"user": str, "ts": float, "v": int}


def events(seed: int, count: int = 80, span: int = 100) -> list[dict]:
    rng = random.Random(seed)
    return [{"user": rng.choice("abcd"), "ts": float(rng.randrange(span)), "v": rng.randrange(-5, 20)}
            for _ in range(count)]


def by_window(records: list[dict], size: float) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        start = math.floor(record["ts"] / size) * size
        groups.setdefault((record["user"], start, start + size), []).append(record)
    return groups


def window_program(aggregate) -> Pipeline:
    return Pipeline("agg").event_time("ts").window("w", key="user", window=Tumbling(10.0), aggregate=aggregate)


def median_of(records: list[dict]) -> dict:
    return {"median": float(statistics.median(record["v"] for record in records))}


@pytest.mark.parametrize("aggregate,reference", [
    (Count(), lambda rs: {"count": len(rs)}),
    (Sum("v"), lambda rs: {"sum": sum(r["v"] for r in rs)}),
    (Min("v"), lambda rs: {"min": min(r["v"] for r in rs)}),
    (Max("v"), lambda rs: {"max": max(r["v"] for r in rs)}),
    (Mean("v"), lambda rs: {"mean": sum(r["v"] for r in rs) / len(rs)}),
    (Aggregate.of(median_of, schema={"median": float}), median_of),
])
def test_each_aggregate_matches_a_reference_per_window(aggregate, reference):
    data = events(5)
    batches = [data[:30], data[30:31], [], data[31:]]
    steps = run_batches(window_program(aggregate), batches, schema=SCHEMA)
    got = {(r["user"], r["window_start"], r["window_end"]): {k: v for k, v in r.items() if k not in
                                                             ("user", "window_start", "window_end")}
           for step in steps for r in step.results["sink"]}
    late = [letter.record for step in steps for letter in step.dead_letters]
    kept = [e for e in data if fissure.runtime.records.fate.record_text(e) not in late]
    expected = {window: reference(records) for window, records in by_window(kept, 10.0).items()}
    assert got.keys() == expected.keys()
    for window, result in expected.items():
        assert got[window] == pytest.approx(result), window


def test_aggregate_result_types_follow_the_input_and_a_null_value_is_a_dead_letter():
    schema = pa.schema([("user", pa.string()), ("ts", pa.float64()), ("v", pa.int64()), ("x", pa.float64())])
    for aggregate, kind in ((Sum("v"), pa.int64()), (Sum("x"), pa.float64()), (Max("v"), pa.int64()),
                            (Mean("v"), pa.float64()), (Count(), pa.int64())):
        out = output_schemas(window_program(aggregate), schema)["w"]
        assert out.names[:3] == ["user", "window_start", "window_end"] and out.field(3).type == kind
    results = fissure.run_local(window_program(Sum("v")), [{"user": "a", "ts": 1.0, "v": 2},
                                                         {"user": "a", "ts": 2.0, "v": None}])
    assert results["sink"][0]["sum"] == 2
    (letter,) = results.dead_letters
    assert letter.error.startswith("NullValue: Sum('v'): field 'v' is None")


def test_min_and_max_of_datetimes_and_datetime_event_times():
    base = datetime.datetime(2024, 5, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
    records = [{"user": "a", "ts": base + datetime.timedelta(seconds=s)} for s in (3, 1, 14, 12)]
    program = (Pipeline("dt").event_time("ts")
               .window("first", key="user", window=Tumbling(10.0), aggregate=Min("ts")))
    got = [(r["window_start"] - base.timestamp(), r["min"]) for r in fissure.run_local(program, records)["sink"]]
    assert got == [(0.0, base + datetime.timedelta(seconds=1)), (10.0, base + datetime.timedelta(seconds=12))]


def test_a_running_aggregate_emits_each_changed_key_once_per_batch():
    data = events(9, 60)
    batches = [data[:20], data[20:25], data[25:]]
    steps = run_batches(Pipeline("totals").aggregate("total", key="user", aggregate=Sum("v")), batches,
                        schema=SCHEMA)
    totals: dict[str, int] = {}
    for batch, step in zip(batches, steps):
        for event in batch:
            totals[event["user"]] = totals.get(event["user"], 0) + event["v"]
        assert sorted((r["user"], r["sum"]) for r in step.results["sink"]) == \
            sorted((user, totals[user]) for user in {event["user"] for event in batch})
    assert steps[-1].end_of_input and steps[-1].results["sink"] == []


def test_a_running_aggregate_with_expire_after_forgets_a_key_and_starts_over():
    batches = [[{"user": "a", "ts": 1.0, "v": 1}, {"user": "b", "ts": 2.0, "v": 1}],
               [{"user": "b", "ts": 20.0, "v": 1}],
               [{"user": "a", "ts": 21.0, "v": 5}],  # runs with W 20: a expired (1 + 10 <= 20) at its end
               [{"user": "a", "ts": 22.0, "v": 5}],
               [{"user": "c", "ts": 5.0, "v": 1}, {"user": "a", "ts": 5.0, "v": 1}]]  # W_prev 21
    program = Pipeline("t").event_time("ts").aggregate("total", key="user", aggregate=Sum("v"), expire_after=10.0)
    steps = run_batches(program, batches, schema=SCHEMA)
    assert [[(r["user"], r["sum"]) for r in step.results["sink"]] for step in steps] == \
        [[("a", 1), ("b", 1)], [("b", 2)], [("a", 6)], [("a", 11)], [("a", 12)], []]
    # c has no state and its record's expiry (5 + 10) is behind the watermark: late; a's state takes it
    (letter,) = steps[4].dead_letters
    assert '"user": "c"' in letter.record and letter.error.startswith("Late: event time 5 is in the expiry window")


def count_clicks(state, record):
    state["clicks"] = state.get("clicks", 0) + 1
    state.setdefault("first", record["ts"])


def summary(state, key):
    return {"user": key, "clicks": state["clicks"], "first": state["first"]}


def expiring(expire_after: float = 10.0, lateness: float = 0.0) -> Pipeline:
    return (Pipeline("visits").event_time("ts", lateness=lateness)
            .partitioned("visits", count_clicks, key="user", expire_after=expire_after, on_expire=summary,
                         schema={"user": str, "clicks": int, "first": float}))


def reference_expiry(batches: list[list[dict]], expire_after: float, lateness: float):
    """Per batch: each key's clicks counted, then every key whose last event + expire_after is at or
    below the batch's watermark emitted and forgotten; what is left, at the end."""
    states: dict[str, list] = {}  # user -> [clicks, first, last]
    out, largest = [], -math.inf
    for batch in batches:
        watermark = largest - lateness
        for event in sorted(batch, key=lambda e: e["ts"]):
            state = states.setdefault(event["user"], [0, event["ts"], event["ts"]])
            state[0] += 1
            state[2] = max(state[2], event["ts"])
        for user in sorted(states):
            if states[user][2] + expire_after <= watermark:
                out.append((user, states[user][0], states[user][1]))
                del states[user]
        largest = max([largest] + [e["ts"] for e in batch])
    out += [(user, clicks, first) for user, (clicks, first, _) in states.items()]
    return out


def test_expire_after_drops_a_keys_state_after_on_expire_and_state_stays_bounded():
    rng = random.Random(4)
    batches = [[{"user": f"u{rng.randrange(4) + 3 * n}", "ts": float(10 * n + rng.randrange(10)), "v": 0}
                for _ in range(6)] for n in range(12)]
    run = fissure.local.executor.LocalGraphRun(fissure.program.graph.as_graph(expiring()))
    out, keys_held = [], []
    for batch in batches:
        out += run.run_batch({"source": batch})["sink"]
        keys_held.append(len(run.states["visits"]))
    out += run.finish()["sink"]
    assert sorted((r["user"], r["clicks"], r["first"]) for r in out) == sorted(reference_expiry(batches, 10.0, 0.0))
    assert max(keys_held) <= 8 and run.states["visits"] == {}  # new users every batch, old ones expire


def test_a_record_older_than_a_forgotten_keys_expiry_is_late():
    steps = run_batches(expiring(), [[{"user": "a", "ts": 1.0, "v": 0}], [{"user": "b", "ts": 30.0, "v": 0}],
                                     [{"user": "c", "ts": 31.0, "v": 0}], [{"user": "a", "ts": 5.0, "v": 0}]],
                        schema=SCHEMA)
    assert [(r["user"], r["clicks"]) for r in steps[2].results["sink"]] == [("a", 1)]
    (letter,) = steps[3].dead_letters
    assert letter.error == "Late: event time 5 is in the expiry window [5, 15) that closed at watermark 30"


def test_on_expire_errors_are_dead_letters_and_a_cleared_state_is_deleted_at_once():
    def clear_on_logout(state, record):
        if record["v"] < 0:
            state.clear()
            return None
        state["n"] = state.get("n", 0) + 1

    program = Pipeline("p").event_time("ts").partitioned(
        "s", clear_on_logout, key="user", expire_after=5.0, on_expire=lambda state, key: 1 / 0,
        schema={"user": str})
    run = fissure.local.executor.LocalGraphRun(fissure.program.graph.as_graph(program))
    run.run_batch({"source": [{"user": "a", "ts": 1.0, "v": 1}, {"user": "b", "ts": 1.0, "v": 1},
                              {"user": "b", "ts": 2.0, "v": -1}]})
    assert list(run.states["s"]) == ['["a"]']  # b logged out: its state is gone, on_expire not called
    flushed = run.finish()
    (letter,) = flushed.dead_letters
    assert letter.node == "s" and letter.error.startswith("ZeroDivisionError") and '"key": "a"' in letter.record
    assert run.states["s"] == {}


def test_expiry_without_event_time_runs_on_processing_time():
    program = Pipeline("p").partitioned("visits", count_clicks, key="user", expire_after=60.0, on_expire=summary,
                                        schema={"user": str, "clicks": int, "first": float})
    batches = [[{"user": "a", "ts": 1.0, "v": 0}], [{"user": "b", "ts": 2.0, "v": 0}], [], [{"user": "a", "ts": 3.0,
                                                                                             "v": 0}]]
    steps = run_batches(program, batches, schema=SCHEMA, batch_times=[1000.0, 1030.0, 1060.0, 1070.0, 1080.0])
    out = [[(r["user"], r["clicks"]) for r in step.results["sink"]] for step in steps]
    # a's state (last seen at 1000) expires in the batch at 1060; a comes back at 1070: a new state
    assert out == [[], [], [("a", 1)], [], [("b", 1), ("a", 1)]]


def reference_dedupe(stream: list[dict], within: float) -> list[dict]:
    """Events in time order: one passes when no event of its user passed less than `within` before it."""
    passed, kept = [], {}
    for event in stream:
        if event["user"] not in kept or event["ts"] - kept[event["user"]] >= within:
            kept[event["user"]] = event["ts"]
            passed.append(event)
    return passed


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 1000), sizes=st.lists(st.integers(0, 20), max_size=6))
def test_deduplicate_passes_the_first_of_each_key_within_its_range_however_the_input_is_cut(seed, sizes):
    stream = sorted(events(seed, 60), key=lambda e: e["ts"])
    batches, start = [], 0
    for size in sizes:
        batches.append(stream[start:start + size])
        start += size
    batches.append(stream[start:])
    program = Pipeline("d").event_time("ts").deduplicate("once", key="user", within=7.0)
    steps = run_batches(program, batches, schema=SCHEMA)
    passed = [r for step in steps for r in step.results["sink"]]
    assert not [letter for step in steps for letter in step.dead_letters]
    key = lambda e: (e["user"], e["ts"], e["v"])  # noqa: E731
    assert sorted(map(key, passed)) == sorted(map(key, reference_dedupe(stream, 7.0)))


def test_deduplicate_judges_records_below_the_watermark_late():
    program = Pipeline("d").event_time("ts").deduplicate("once", key="user", within=5.0)
    steps = run_batches(program, [[{"user": "a", "ts": 10.0, "v": 1}], [{"user": "a", "ts": 40.0, "v": 1}],
                                  [{"user": "a", "ts": 12.0, "v": 2}], [{"user": "a", "ts": 10.0, "v": 3}]],
                        schema=SCHEMA)
    assert [[r["v"] for r in step.results["sink"]] for step in steps] == [[1], [1], [], [], []]
    (letter,) = [letter for step in steps for letter in step.dead_letters]
    assert letter.error.startswith("Late: event time 10 is below watermark 40")


def test_records_without_event_time_are_dead_letters_at_the_declaration():
    records = [{"user": "a", "ts": 1.0}, {"user": "a", "ts": None}, {"user": "a", "ts": "noon"},
               {"user": "a", "ts": float("nan")}, {"user": "a"}]
    program = Pipeline("p").event_time("ts").window("w", key="user", window=Tumbling(5.0), aggregate=Count())
    graph = StreamGraph("g")
    graph.source("s", schema={"user": str, "ts": float}).event_time("ts").window(
        "w", key="user", window=Tumbling(5.0), aggregate=Count()).sink("out")
    results = fissure.run_local(program, [{"user": "a", "ts": 1.0}, {"user": "a", "ts": None},
                                          {"user": "a", "ts": float("nan")}])
    assert results["sink"] == [{"user": "a", "window_start": 0.0, "window_end": 5.0, "count": 1}]
    assert [letter.error.split(";")[0] for letter in results.dead_letters] == [
        "NoEventTime: field 'ts' is None", "NoEventTime: field 'ts' is NaN"]
    check = fissure.program.eventtime.EventTimeCheck("ts")
    reasons = []
    for record in records[1:]:
        with pytest.raises(fissure.runtime.records.fate.RecordRejected) as raised:
            check(record)
        reasons.append(str(raised.value).split(";")[0])
    assert reasons == ["NoEventTime: field 'ts' is None", "NoEventTime: field 'ts' is str 'noon'",
                       "NoEventTime: field 'ts' is NaN", "NoEventTime: field 'ts' is missing"]


def hot_items_graph() -> StreamGraph:
    """Bids from two sources, counts per auction per window, then the top auction per window."""
    graph = StreamGraph("hot_items")
    bids = graph.union("bids", graph.source("east", schema={"auction": int, "ts": float}),
                       graph.source("west", schema={"auction": int, "ts": float}))
    counts = bids.event_time("ts", lateness=2.0).window("per_auction", key="auction", window=Tumbling(10.0),
                                                        aggregate=Count())
    counts.sink("counts")
    top = counts.map("window_of", lambda r: {**r, "w": r["window_start"]},
                     schema={"auction": int, "window_start": float, "window_end": float, "count": int, "w": float})
    top.window("top", key="w", window=Tumbling(10.0), aggregate=Aggregate.of(
        lambda rs: max(({"auction": r["auction"], "bids": r["count"]} for r in rs),
                       key=lambda item: (item["bids"], -item["auction"])),
        schema={"auction": int, "bids": int})).sink("top")
    return graph


def test_a_graph_chains_windows_in_one_batch_and_matches_a_reference():
    rng = random.Random(2)
    east = [{"auction": rng.randrange(5), "ts": float(rng.randrange(60))} for _ in range(80)]
    west = [{"auction": rng.randrange(5), "ts": float(rng.randrange(60))} for _ in range(80)]
    results = fissure.run_local(hot_items_graph(), {"east": east, "west": west})
    counts: dict[tuple, int] = {}
    for bid in east + west:
        start = math.floor(bid["ts"] / 10) * 10
        counts[(bid["auction"], start)] = counts.get((bid["auction"], start), 0) + 1
    assert sorted((r["auction"], r["window_start"], r["count"]) for r in results["counts"]) == \
        sorted((auction, start, n) for (auction, start), n in counts.items())
    best = {}
    for (auction, start), n in counts.items():
        if start not in best or (n, -auction) > (best[start][1], -best[start][0]):
            best[start] = (auction, n)
    # the top window reads window_end as its event time: [w_end // 10 * 10, +10) is the next window
    assert sorted((r["window_start"] - 10, r["auction"], r["bids"]) for r in results["top"]) == \
        sorted((start, auction, n) for start, (auction, n) in best.items())
    # over micro-batches of 15 s of bids each (so none is late) the same, each window once
    steps = run_batches(hot_items_graph(), [{name: [bid for bid in bids if start <= bid["ts"] < start + 15]
                                             for name, bids in (("east", east), ("west", west))}
                                            for start in range(0, 60, 15)])
    assert not [letter for step in steps for letter in step.dead_letters]
    for sink in ("counts", "top"):
        assert sorted(map(str, (r for step in steps for r in step.results[sink]))) == \
            sorted(map(str, results[sink]))


def test_time_in_graphs_is_checked_and_joins_take_tumbling_with_the_declared_event_time():
    graph = StreamGraph("g")
    plain = graph.source("s", schema={"user": str, "ts": float})
    with pytest.raises(PipelineError, match=r"operator 'w' \(window\) needs event time"):
        plain.window("w", key="user", window=Tumbling(10.0), aggregate=Count())
    declared = plain.event_time("ts", lateness=1.0)
    other = graph.source("o", schema={"user": str, "ts": float}).event_time("ts", lateness=3.0, name="et2")
    graph.union("both", declared, other).deduplicate("d", key="user", within=1.0).sink("out")
    with pytest.raises(PipelineError, match="declares event time with lateness 3 s, but operator 'event_time'"):
        graph.check()
    # a join with Tumbling takes the field and lateness declared upstream of both sides
    join_graph = StreamGraph("j")
    left = join_graph.source("l", schema={"user": str, "ts": float}).event_time("ts", lateness=2.0)
    right = join_graph.source("r", schema={"user": str, "ts": float, "name": str}).event_time(
        "ts", lateness=2.0, name="et_r")
    join_graph.join("jn", left, right, key="user", window=Tumbling(10.0), schema={"user": str, "name": str},
                    fn=lambda a, b: {"user": a["user"], "name": b["name"]}).sink("out")
    assert join_graph.node("jn").join.window == TumblingWindow("ts", 10.0, 2.0)
    bare = StreamGraph("bare")
    with pytest.raises(PipelineError, match="takes its time field from the event time declared upstream"):
        bare.join("jn", bare.source("l"), bare.source("r"), key="user", window=Tumbling(10.0), schema={"user": str},
                  fn=lambda a, b: a)
    # the low-level form checks the same, once the graph is whole
    late_graph = StreamGraph("late")
    late_graph.add("window", "w", inputs=["s"], key="user", window=Tumbling(10.0), aggregate=Count())
    late_graph.source("s", schema={"user": str, "ts": float})
    late_graph.sink("out", "w")
    with pytest.raises(PipelineError, match="needs event time, and none is declared upstream"):
        late_graph.check()


def test_definition_errors_name_the_operator_and_the_fix():
    source = pa.schema([("user", pa.string()), ("ts", pa.string())])
    with pytest.raises(PipelineError, match="event-time field 'ts' .* is string; event time is seconds"):
        output_schemas(Pipeline("p").event_time("ts"), source)
    dropped = Pipeline("p").event_time("ts").map("drop", lambda r: {"user": r["user"]}, schema={"user": str}) \
        .window("w", key="user", window=Tumbling(1.0), aggregate=Count())
    with pytest.raises(PipelineError, match="reads the event-time field 'ts' declared by 'event_time', but its input"):
        output_schemas(dropped, pa.schema([("user", pa.string()), ("ts", pa.float64())]))
    with pytest.raises(PipelineError, match="is keyed on field 'host'"):
        output_schemas(Pipeline("p").event_time("ts").window("w", key="host", window=Tumbling(1.0),
                                                               aggregate=Count()),
                       pa.schema([("user", pa.string()), ("ts", pa.float64())]))
    with pytest.raises(PipelineError, match="aggregate Count\\(\\) emits a field 'count', which the output already"):
        output_schemas(Pipeline("p").event_time("ts").window("w", key="count", window=Tumbling(1.0),
                                                               aggregate=Count()),
                       pa.schema([("count", pa.string()), ("ts", pa.float64())]))
    with pytest.raises(PipelineError, match="window must be Tumbling"):
        Pipeline("p").event_time("ts").window("w", key="u", window=10, aggregate=Count())
    with pytest.raises(PipelineError, match="is not an aggregate"):
        Pipeline("p").event_time("ts").window("w", key="u", window=Tumbling(1.0), aggregate=sum)
    with pytest.raises(PipelineError, match="size must be a number of seconds > 0"):
        Tumbling(0)
    with pytest.raises(PipelineError, match="every must be at most size"):
        fissure.Sliding(5.0, 10.0)
    with pytest.raises(PipelineError, match="on_expire= runs when a key's state expires; give expire_after"):
        Pipeline("p").partitioned("s", count_clicks, key="user", on_expire=summary)
    with pytest.raises(PipelineError, match="one watermark, hence one lateness"):
        Pipeline("p").event_time("ts", lateness=1.0).event_time("ts", lateness=2.0)
    with pytest.raises(PipelineError, match="disagrees with the event time declared by 'event_time'"):
        Pipeline("p").event_time("ts").window("w", key="u", window=TumblingWindow("t2", 5.0), aggregate=Count())
    with pytest.raises(PipelineError, match="declare schema= of the dict"):
        Aggregate.of(median_of, schema=None)


def test_the_planner_sees_time_operators_as_partitioned_with_their_keys():
    from fissure.model.types import Kind, Machine
    from fissure.plan.planners import plan_chain

    program = (Pipeline("p").map("parse", lambda r: r).event_time("ts")
               .window("w", key="user", window=Tumbling(10.0), aggregate=Count(), cost_us=40.0)
               .deduplicate("d", key=["user", "window_start"], within=5.0, cost_us=30.0))
    stats = program.operator_stats()
    assert [(s.name, s.kind, s.key) for s in stats] == [
        ("parse", Kind.STATELESS, None), ("event_time", Kind.STATELESS, None), ("w", Kind.PARTITIONED, ("user",)),
        ("d", Kind.PARTITIONED, ("user", "window_start"))]
    plan = plan_chain(stats, Machine(cores=4), "heuristic")
    keyed = [region for region in plan.evaluation.regions if region.kind is Kind.PARTITIONED]
    assert {region.key for region in keyed} <= {("user",), ("user", "window_start")} and keyed
    graph_stats = hot_items_graph().operator_stats()
    assert [(s.name, s.key) for s in graph_stats if s.kind is Kind.PARTITIONED] == [
        ("per_auction", ("auction",)), ("top", ("w",))]
    assert program.operator("w").describe() == "w (partitioned window Count() key=user)"
    assert program.operator("d").describe() == "d (partitioned deduplicate within 5 s key=user,window_start)"
    # what a run ships to its workers: the user's functions inside aggregates and on_expire too
    expiring_program = expiring()
    assert expiring_program.operator("visits").functions == (count_clicks, dict, summary)
    assert window_program(Aggregate.of(median_of, schema={"median": float})).operator("w").functions[2] is median_of


def test_the_sample_measures_a_windows_selectivity():
    from fissure.local.cost_sample import CHUNK_RECORDS, WARM_UP_RECORDS, measure_sample

    data = [{"user": "abcd"[i % 4], "ts": float(i // 8), "v": i} for i in range(4000)]
    costs = measure_sample(window_program(Count()), {"source": data}, budget_s=60.0)
    # by hand: each chunk runs with the watermark of the records before it, and emits every
    # (user, window) that ended at or before it and has not come out yet
    emitted, counted, done = set(), 0, 0
    for start in [0] + list(range(WARM_UP_RECORDS, len(data), CHUNK_RECORDS)):
        end = WARM_UP_RECORDS if start == 0 else start + CHUNK_RECORDS
        watermark = max((r["ts"] for r in data[:start]), default=-math.inf)
        due = {(r["user"], r["ts"] // 10) for r in data[:end] if (r["ts"] // 10 + 1) * 10 <= watermark} - emitted
        if start:
            counted += len(due)
            done += len(data[start:end])
        emitted |= due
    assert costs.records == done and costs.estimates["w"].selectivity == pytest.approx(counted / done)


def test_the_per_key_runtime_fires_due_keys_deletes_finished_state_and_profiles():
    from fissure.runtime.operators.keyed import BatchTime, run_keys
    from fissure.runtime.profiling.profiler import ProfiledKeyFunction, ProfileTally, RECORDS_IN, RECORDS_OUT, DEAD_LETTERS
    from fissure.runtime.operators.timed import per_key_step
    from fissure.runtime.records.carried import live_batch

    class Accumulator:
        def __init__(self):
            self.value = ProfileTally(adopt=True)

        def add(self, other):
            pass

    program = window_program(Count())
    schema = pa.schema([("user", pa.string()), ("ts", pa.float64()), ("v", pa.int64())])
    schemas = output_schemas(program, schema)
    accumulator = Accumulator()
    wrapped = {}

    def wrap(function):
        wrapped["fn"] = ProfiledKeyFunction(function, "w", accumulator)
        return wrapped["fn"]

    step = per_key_step(program.operator("w"), schemas["event_time"], schemas["w"], "ts", wrap)
    states, deadlines = {}, {}

    def store(key, state):
        if state is None:
            del states[key]
        else:
            states[key] = state

    def load(key):  # a stored state as the keyed runtime reads it: (its body, pickled or not)
        return (states[key], False) if key in states else None

    records = [{"user": "a", "ts": 1.0, "v": 1}, {"user": "b", "ts": 12.0, "v": 1}, {"user": "a", "ts": 3.0, "v": 1}]
    batch = live_batch(pa.RecordBatch.from_pylist(records, schema=schema), [0, 1, 2])
    run_keys(step, batch, load, store, time=BatchTime(-math.inf, 0.0), deadline=deadlines.__setitem__)
    assert sorted(states) == ['["a"]', '["b"]'] and deadlines == {'["a"]': 10.0, '["b"]': 20.0}
    empty = batch.slice(0, 0)
    out = run_keys(step, empty, load, store, time=BatchTime(0.0, 15.0), due=['["a"]'],
                   deadline=deadlines.__setitem__)
    assert out.select(["user", "count"]).to_pylist() == [{"user": "a", "count": 2}]
    assert list(states) == ['["b"]'] and deadlines['["a"]'] is None
    values = wrapped["fn"].live_counts()
    assert (values[RECORDS_IN], values[RECORDS_OUT], values[DEAD_LETTERS]) == (3, 1, 0)


def test_the_watermark_is_fixed_per_batch_and_end_of_input_passes_every_deadline():
    from fissure.runtime.operators.watermark import Deadlines, Watermark

    mark = Watermark(lateness=5.0)
    first = mark.begin_batch()
    mark.observe(20.0)
    mark.observe(12.0)
    assert (first.previous, first.current, mark.next) == (-math.inf, -math.inf, 15.0)
    mark.end_batch(first)
    second = mark.begin_batch()
    mark.observe(8.0)  # older events never lower it
    mark.end_batch(second)
    assert (second.previous, second.current, mark.next) == (-math.inf, 15.0, 15.0)
    final = mark.end_of_input(horizon=30.0)
    assert (final.previous, final.current, mark.next) == (15.0, 50.0, 50.0)
    deadlines = Deadlines()
    deadlines.set("a", 10.0)
    deadlines.set("b", 60.0)
    deadlines.set("c", 5.0)
    deadlines.set("a", None)
    assert deadlines.due(50.0) == ["c"] and deadlines.earliest() == 5.0 and len(deadlines) == 2


def test_the_time_section_of_the_docs_shows_what_the_code_prints():
    from fissure.testing import describe_batches

    docs = (DOCS / "pipeline-api.md").read_text()
    bids = (Pipeline("hot_items").event_time("ts", lateness=5.0)
            .window("bids", key="auction", window=Tumbling(10.0), aggregate=Count()))
    result = fissure.run_local(bids, [{"auction": 1, "ts": 3.0}, {"auction": 1, "ts": 12.5},
                                      {"auction": 2, "ts": 7.0}, {"auction": 1, "ts": 8.0}])["sink"]
    shown = "# " + repr(result).replace("}, {", "},\n#  {")
    assert shown in docs
    steps = run_batches(bids, [[{"auction": 1, "ts": 3.0}, {"auction": 2, "ts": 7.0}], [{"auction": 1, "ts": 21.0}],
                               [{"auction": 1, "ts": 8.0}], [{"auction": 1, "ts": 4.0}]])
    assert describe_batches(steps) in docs
    assert steps[3].dead_letters[0].error in docs


def test_a_chain_and_the_same_graph_give_the_same_time_results():
    def build(stream):
        timed = stream.event_time("ts", lateness=3.0)
        once = timed.deduplicate("once", key="user", within=2.0)
        return once.partitioned("visits", count_clicks, key="user", expire_after=15.0, on_expire=summary,
                                schema={"user": str, "clicks": int, "first": float})

    chain = build(Pipeline("visits"))
    graph = StreamGraph("visits")
    build(graph.source("clicks", schema=SCHEMA)).sink("out")
    data = sorted(events(21, 120, span=300), key=lambda e: e["ts"])
    batches = [data[start:start + 25] for start in range(0, len(data), 25)]
    from_chain = run_batches(chain, batches, schema=SCHEMA)
    from_graph = run_batches(graph, [{"clicks": batch} for batch in batches])
    assert [step.results["sink"] for step in from_chain] == [step.results["out"] for step in from_graph]
    assert [step.watermark for step in from_chain] == [step.watermark for step in from_graph]
    clicks = sum(r["clicks"] for step in from_chain for r in step.results["sink"])
    assert clicks == len(reference_dedupe(data, 2.0)) and from_chain[-1].results["sink"]
