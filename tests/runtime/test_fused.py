"""Fused stages and keyed groups in the worker: results, dead letters, order, schemas."""

from __future__ import annotations

import gc
import json
import pickle

import pyarrow as pa
import pytest

from fissure.runtime.records.columns import DEAD_ERROR, DEAD_OPERATOR, DEAD_RECORD, SEQ, carried_schema
from fissure.runtime.operators.fused import FusedStage, Step
from fissure.runtime.records.carried import live_batch
from fissure.runtime.operators.keyed import StatefulStep, key_text, run_group, run_keys
from fissure.runtime.state.codec import decode_data, encode_data

NUMBERS = pa.schema([("n", pa.int64())])
WORDS = pa.schema([("word", pa.string()), ("n", pa.int64())])


def carried(rows, schema=NUMBERS, first_seq=0):
    return live_batch(pa.RecordBatch.from_pylist(rows, schema=schema), list(range(first_seq, first_seq + len(rows))))


def inverse(record):
    return {"n": 100 // record["n"]}


def test_record_steps_fuse_map_filter_flat_map_and_keep_seq():
    stage = FusedStage([
        Step("inverse", "map", inverse, NUMBERS),
        Step("odd", "filter", lambda r: r["n"] % 2 == 1, NUMBERS),
        Step("words", "flat_map", lambda r: [{"word": "x" * i, "n": r["n"]} for i in (1, 2)], WORDS),
    ], NUMBERS)
    out = stage(carried([{"n": 4}, {"n": 1}, {"n": 20}]))
    assert out.schema == carried_schema(WORDS)
    assert out.select(["word", "n", SEQ]).to_pylist() == [
        {"word": "x", "n": 25, SEQ: 0}, {"word": "xx", "n": 25, SEQ: 0},
        {"word": "x", "n": 5, SEQ: 2}, {"word": "xx", "n": 5, SEQ: 2}]


def test_the_cyclic_collector_waits_while_a_batch_runs_and_comes_back_after_it():
    seen = []

    def noting(record):
        seen.append(gc.isenabled())
        if record["n"] == 0:
            raise ValueError("zero")
        return record

    stage = FusedStage([Step("noting", "map", noting, NUMBERS)], NUMBERS)
    assert gc.isenabled()
    out = stage(carried([{"n": 1}, {"n": 0}, {"n": 2}]))
    assert seen == [False, False, False] and gc.isenabled()
    assert out.column(DEAD_OPERATOR).to_pylist() == [None, None, "noting"]  # the raising record's dead letter
    gc.disable()  # a program that turned it off itself keeps it off
    try:
        stage(carried([{"n": 3}]))
        assert not gc.isenabled()
    finally:
        gc.enable()
    stage = FusedStage([Step("stop", "map", lambda record: (_ for _ in ()).throw(KeyboardInterrupt()), NUMBERS)],
                       NUMBERS)
    with pytest.raises(Exception):
        stage(carried([{"n": 1}]))
    assert gc.isenabled()


def test_raising_record_becomes_dead_letter_and_the_rest_goes_on():
    stage = FusedStage([Step("inverse", "map", inverse, NUMBERS)], NUMBERS)
    out = stage(carried([{"n": 5}, {"n": 0}, {"n": 10}]))
    live = out.filter(pa.compute.is_null(out.column(DEAD_OPERATOR)))
    dead = out.filter(pa.compute.is_valid(out.column(DEAD_OPERATOR))).to_pylist()
    assert live.column("n").to_pylist() == [20, 10]
    assert len(dead) == 1
    assert dead[0][DEAD_OPERATOR] == "inverse"
    assert dead[0][DEAD_ERROR].startswith("ZeroDivisionError")
    assert dead[0][DEAD_RECORD] == '{"n": 0}' and dead[0][SEQ] == 1 and dead[0]["n"] is None


@pytest.mark.parametrize("action, fn, live", [
    ("map", lambda r: {"n": 10 // r["n"]}, [(10, 1), (5, 4), (3, 5)]),
    ("filter", lambda r: 10 // r["n"] > 4, [(1, 1), (2, 4)]),
    ("flat_map", lambda r: [{"n": 10 // r["n"]}] * r["n"], [(10, 1), (5, 4), (5, 4), (3, 5), (3, 5), (3, 5)]),
])
def test_each_action_keeps_sequence_numbers_around_records_that_raise(action, fn, live):
    # 0 raises: at the first position, twice in a row and at the last
    out = FusedStage([Step("s", action, fn, NUMBERS)], NUMBERS)(carried([{"n": n} for n in (0, 1, 0, 0, 2, 3, 0)]))
    rows = out.select(["n", SEQ, DEAD_OPERATOR, DEAD_RECORD]).to_pylist()
    assert [(row["n"], row[SEQ]) for row in rows if row[DEAD_OPERATOR] is None] == live
    assert [(row[SEQ], row[DEAD_RECORD]) for row in rows if row[DEAD_OPERATOR] == "s"] == [
        (seq, '{"n": 0}') for seq in (0, 2, 3, 6)]


def test_a_batch_runs_its_per_record_steps_in_chunks_with_the_whole_batchs_result(monkeypatch):
    """Chunks of input rows (cache-sized on a real batch) give the records, sequence numbers, dead
    letters and profile counts one pass over the whole batch gives."""
    from uuid import uuid4

    from fissure.runtime.operators import fused
    from fissure.runtime.profiling.profiler import ProfileTally

    def steps():
        return [Step("inverse", "map", inverse, NUMBERS),
                Step("odd", "filter", lambda r: r["n"] % 2 == 1, NUMBERS),
                Step("words", "flat_map", lambda r: [{"word": "x" * i, "n": r["n"]} for i in range(r["n"] % 3)],
                     WORDS)]

    batch = carried([{"n": n} for n in (4, 0, 1, 20, 0, 3, 7, 9, 0, 33, 5)], first_seq=100)

    def run(chunk_rows: int):
        monkeypatch.setattr(fused, "RECORD_CHUNK_ROWS", chunk_rows)
        stage = FusedStage(steps(), NUMBERS, profile_id=f"chunks-{uuid4().hex[:8]}")
        out = stage(batch)
        tally = ProfileTally()
        stage.bind_profile().report(tally)
        counts = {counts.operator: (counts.records_in, counts.records_out, counts.dead_letters)
                  for counts in tally.operator_counts()}
        return out.to_pylist(), counts

    whole, whole_counts = run(1_000)
    for chunk_rows in (1, 3, 4):
        assert run(chunk_rows) == (whole, whole_counts)
    assert [row[SEQ] for row in whole if row[DEAD_OPERATOR] == "inverse"] == [101, 104, 108]
    assert whole_counts["inverse"] == (11, 8, 3) and whole_counts["odd"][:2] == (8, 5)


def test_a_run_with_an_operator_on_elastic_threads_takes_the_whole_batch(monkeypatch):
    """Its threads would drain at every chunk: the waiting operator gets the batch's records in one call."""
    from dataclasses import replace

    from fissure.runtime.operators import fused
    from fissure.runtime.operators.fused import run_record_steps

    class Waiting:
        def __init__(self):
            self.calls = []

        def engaged(self):
            return True

        def run(self, step, records, seqs, dead):
            self.calls.append(len(records))
            return run_record_steps((replace(step, waiting=None),), records, seqs, dead)

    monkeypatch.setattr(fused, "RECORD_CHUNK_ROWS", 2)
    rows_made_dicts = []
    batch_records = fused.batch_records
    monkeypatch.setattr(fused, "batch_records",
                        lambda data: rows_made_dicts.append(data.num_rows) or batch_records(data))
    waiting = Waiting()
    stage = FusedStage([Step("inverse", "map", inverse, NUMBERS),
                        Step("fetch", "map", lambda r: {"n": r["n"] + 1}, NUMBERS, waiting=waiting)], NUMBERS)
    out = stage(carried([{"n": n} for n in (1, 2, 0, 4, 5)]))
    assert rows_made_dicts == [5] and waiting.calls == [4]  # the 4 records `inverse` kept, in one call
    assert out.select(["n", SEQ]).to_pylist()[:4] == [{"n": 101, SEQ: 0}, {"n": 51, SEQ: 1},
                                                      {"n": 26, SEQ: 3}, {"n": 21, SEQ: 4}]
    rows_made_dicts.clear()
    FusedStage([Step("inverse", "map", inverse, NUMBERS)], NUMBERS)(carried([{"n": n} for n in (1, 2, 4, 5, 10)]))
    assert rows_made_dicts == [2, 2, 1]  # without one: chunks of RECORD_CHUNK_ROWS rows


def test_dead_letters_pass_through_later_stages():
    first = FusedStage([Step("inverse", "map", inverse, NUMBERS)], NUMBERS)
    second = FusedStage([Step("words", "map", lambda r: {"word": str(r["n"]), "n": r["n"]}, WORDS)], NUMBERS)
    out = second(first(carried([{"n": 0}, {"n": 50}])))
    assert out.select(["word", DEAD_OPERATOR, SEQ]).to_pylist() == [
        {"word": "2", DEAD_OPERATOR: None, SEQ: 1}, {"word": None, DEAD_OPERATOR: "inverse", SEQ: 0}]


def test_records_that_do_not_fit_the_schema_are_dead_letters():
    stage = FusedStage([Step("shape", "map", lambda r: {"n": r["n"], "extra": 1} if r["n"] == 1 else
                             {"n": "text"} if r["n"] == 2 else r, NUMBERS)], NUMBERS)
    out = stage(carried([{"n": 1}, {"n": 2}, {"n": 3}]))
    rows = out.to_pylist()
    assert [row["n"] for row in rows if row[DEAD_OPERATOR] is None] == [3]
    errors = {row[SEQ]: row[DEAD_ERROR] for row in rows if row[DEAD_OPERATOR] == "shape"}
    assert "'extra'" in errors[0] and "schema=" in errors[0]
    assert errors[1].startswith("SchemaMismatch")


def test_batch_steps_arrow_and_pandas_with_row_by_row_retry():
    def halve(batch):
        values = batch.column("n").to_pylist()
        if 7 in values:
            raise ValueError("seven")
        return pa.RecordBatch.from_pydict({"n": [v // 2 for v in values]})

    stage = FusedStage([
        Step("halve", "map_batches", halve, NUMBERS, "arrow"),
        Step("big", "filter_batches", lambda frame: frame["n"] > 1, NUMBERS, "pandas"),
    ], NUMBERS)
    out = stage(carried([{"n": 10}, {"n": 7}, {"n": 2}, {"n": 6}]))
    assert [(r["n"], r[SEQ]) for r in out.to_pylist() if r[DEAD_OPERATOR] is None] == [(5, 0), (3, 3)]
    assert [r[SEQ] for r in out.to_pylist() if r[DEAD_OPERATOR] == "halve"] == [1]


def _counting(monkeypatch, name):
    from fissure.runtime.operators import fused

    calls = []
    original = getattr(fused, name)
    monkeypatch.setattr(fused, name, lambda *args: calls.append(1) or original(*args))
    return calls


def test_per_batch_steps_keep_records_and_sequence_numbers_in_arrow(monkeypatch):
    """A run of per-batch steps builds no dict nor Python value per record (its sequence numbers
    stay an Arrow column, filtered with the rows); a per-record step after it gets them as before."""
    records, values = _counting(monkeypatch, "batch_records"), _counting(monkeypatch, "column_values")
    steps = [Step("double", "map_batches", lambda batch: pa.RecordBatch.from_pydict(
                 {"n": pa.compute.multiply(batch.column("n"), 2)}), NUMBERS, "arrow"),
             Step("big", "filter_batches", lambda batch: pa.compute.greater(batch.column("n"), 4), NUMBERS, "arrow")]
    rows = [{"n": n} for n in (3, 1, 5, 2, 4)]
    out = FusedStage(steps, NUMBERS)(carried(rows, first_seq=10))
    assert (records, values) == ([], [])
    assert out.select(["n", SEQ]).to_pylist() == [{"n": 6, SEQ: 10}, {"n": 10, SEQ: 12}, {"n": 8, SEQ: 14}]
    then_per_record = FusedStage(steps + [Step("minus", "map", lambda r: {"n": r["n"] - 1}, NUMBERS)], NUMBERS)
    out = then_per_record(carried(rows, first_seq=10))
    assert out.select(["n", SEQ]).to_pylist() == [{"n": 5, SEQ: 10}, {"n": 9, SEQ: 12}, {"n": 7, SEQ: 14}]
    assert len(records) == 1


def test_fused_stage_pickles():
    stage = FusedStage([Step("inverse", "map", inverse, NUMBERS)], NUMBERS)
    copy = pickle.loads(pickle.dumps(stage))
    assert copy(carried([{"n": 50}])).column("n").to_pylist() == [2]


def running_total(state, record):
    state["total"] = state.get("total", 0) + record["n"]
    if record["n"] < 0:
        raise ValueError("negative")
    return {"n": state["total"]}


def test_keyed_group_runs_in_sequence_order_and_returns_state():
    step = StatefulStep("total", running_total, dict, NUMBERS, NUMBERS, key=None)
    batch = live_batch(pa.RecordBatch.from_pylist([{"n": 3}, {"n": 1}, {"n": 2}], schema=NUMBERS), [30, 10, 20])
    result = run_group(step, batch, None)
    assert result.batch.select(["n", SEQ]).to_pylist() == [{"n": 1, SEQ: 10}, {"n": 3, SEQ: 20}, {"n": 6, SEQ: 30}]
    again = run_group(step, carried([{"n": 4}]), (result.state, False))
    assert again.batch.column("n").to_pylist() == [10]
    assert decode_data(again.state) == {"total": 10}  # stored as data, never pickled


def test_keyed_group_orders_by_field_and_keeps_dead_letters():
    schema = pa.schema([("t", pa.int64()), ("n", pa.int64())])
    step = StatefulStep("total", running_total, dict, schema, NUMBERS, key=None, order_by="t")
    batch = live_batch(pa.RecordBatch.from_pylist([{"t": 2, "n": 5}, {"t": 1, "n": -1}, {"t": 3, "n": 1}],
                                                  schema=schema), [0, 1, 2])
    rows = run_group(step, batch, None).batch.to_pylist()
    assert [(r["n"], r[SEQ]) for r in rows if r[DEAD_OPERATOR] is None] == [(4, 0), (5, 2)]
    assert [r[SEQ] for r in rows if r[DEAD_OPERATOR] == "total"] == [1]


def test_a_bucket_of_keys_runs_each_key_in_order_with_its_own_state():
    schema = pa.schema([("user", pa.string()), ("n", pa.int64())])
    step = StatefulStep("total", running_total, dict, schema, NUMBERS, key=("user",))
    rows = [{"user": "a", "n": 1}, {"user": "b", "n": 10}, {"user": None, "n": 7}, {"user": "a", "n": -2},
            {"user": "b", "n": 20}, {"user": "a", "n": 3}]
    batch = live_batch(pa.RecordBatch.from_pylist(rows, schema=schema), [5, 4, 3, 2, 1, 0])
    stored = {key_text({"user": "a"}, ("user",)): encode_data({"total": 100})}
    loaded = []

    def load(key):
        loaded.append(key)
        return (stored[key], False) if key in stored else None

    output = run_keys(step, batch, load, stored.__setitem__).to_pylist()
    # each key's records in sequence order (seq 0 first), each key loaded once, states stored;
    # the record without a user (seq 3) is a dead letter: no state for a null key
    assert sorted(loaded) == sorted({'["a"]', '["b"]'})
    live = sorted((r[SEQ], r["n"]) for r in output if r[DEAD_OPERATOR] is None)
    assert live == [(0, 103), (1, 20), (4, 30), (5, 102)]  # a: 100+3 (seq 0) then +1 (seq 5); -2 dead
    assert sorted((r[SEQ], r[DEAD_OPERATOR]) for r in output if r[DEAD_OPERATOR] is not None) == [
        (2, "total"), (3, "total")]
    null_key = [r for r in output if r[SEQ] == 3][0]
    assert null_key[DEAD_ERROR].startswith("NullKey: key field 'user' is null or missing")
    assert null_key[DEAD_RECORD] == '{"n": 7, "user": null}'
    assert {key: decode_data(value) for key, value in stored.items()} == {
        '["a"]': {"total": 102}, '["b"]': {"total": 30}}


def test_key_text_is_the_json_of_the_key_fields():
    # one text or whole-number field takes a shorter path to the same text: states stored under
    # one stay found under the other
    for value in ("a", "", "\u00fc", "\u65e5\u672c", "\ud800", '"q"\\', "\n\t\x00", 0, -5, 2 ** 70, True, None, 1.5,
                  float("nan"), [1, "x"]):
        assert key_text({"k": value}, ("k",)) == json.dumps([value], default=repr)
    assert key_text({"a": "x", "b": 2}, ("a", "b")) == '["x", 2]'


def test_keys_equal_in_python_but_not_as_text_keep_their_own_state():
    schema = pa.schema([("k", pa.float64()), ("n", pa.int64())])
    step = StatefulStep("total", running_total, dict, schema, NUMBERS, key=("k",))
    nan = float("nan")
    rows = [{"k": nan, "n": 1}, {"k": 2.0, "n": 10}, {"k": nan, "n": 5}]
    stored = {}
    run_keys(step, live_batch(pa.RecordBatch.from_pylist(rows, schema=schema), [0, 1, 2]), stored.get,
             stored.__setitem__)
    # NaN is not equal to itself, yet its records are one key: one state, both records counted
    assert {key: decode_data(value) for key, value in stored.items()} == {"[NaN]": {"total": 6}, "[2.0]": {"total": 10}}
    step = StatefulStep("total", running_total, dict, pa.schema([("k", pa.list_(pa.int64())), ("n", pa.int64())]),
                        NUMBERS, key=("k",))
    rows = [{"k": [1, 2], "n": 1}, {"k": [1, 2], "n": 2}, {"k": [3], "n": 4}]
    stored = {}
    run_keys(step, live_batch(pa.RecordBatch.from_pylist(rows, schema=step.input_schema), [0, 1, 2]), stored.get,
             stored.__setitem__)
    assert {key: decode_data(value) for key, value in stored.items()} == {"[[1, 2]]": {"total": 3}, "[[3]]": {"total": 4}}
