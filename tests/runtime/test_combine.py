"""Aggregates combined before the exchange (fissure.runtime.operators.combine): the partials of records split
over tasks, merged per key, give the outputs, dead letters and states of the per-record
functions; and which operators combine."""

from __future__ import annotations

import gc
import math
import random

import pyarrow as pa
import pytest

from fissure import Aggregate, Count, Max, Mean, Min, Pipeline, Sliding, Sum, Tumbling
from fissure.program.eventtime import WindowRole
from fissure.program.windows import Session
from fissure.program.combine_policy import combinable_aggregate, combine_decision
from fissure.runtime.operators import combine
from fissure.runtime.operators.count_fold import count_plain_keys
from fissure.runtime.operators.combine import PARTIAL_SCHEMA, CombinePlan, Combiner, combined_key_function, partial_inputs
from fissure.runtime.records.carried import live_batch
from fissure.runtime.operators.keyed import group_by_key
from fissure.runtime.state.codec import StateCodec
from fissure.runtime.operators.timed import key_function
from fissure.runtime.operators.watermark import Watermark

SCHEMA = pa.schema([("user", pa.string()), ("ts", pa.float64()), ("v", pa.int64())])


def batches_of(seed: int, batches: int = 4, per_batch: int = 60) -> list[list[tuple[dict, int]]]:
    rng = random.Random(seed)
    out, seq, clock = [], 0, 0.0
    for _ in range(batches):
        rows = []
        for _ in range(per_batch):
            record = {"user": rng.choice(["a", "b", "c", "d", None] if rng.random() < 0.05 else "abcd"),
                      "ts": None if rng.random() < 0.03 else float(round(clock + rng.uniform(-40, 10))),
                      "v": None if rng.random() < 0.04 else rng.randrange(-5, 20)}
            rows.append((record, seq))
            seq += 1
        clock += 15.0
        out.append(rows)
    return out


def operator_of(kind: str, aggregate) -> object:
    program = Pipeline("p").event_time("ts", lateness=3.0)
    if kind == "aggregate":
        program = program.aggregate("agg", key="user", aggregate=aggregate)
    else:
        window = Tumbling(10.0) if kind == "tumbling" else Sliding(20.0, 5.0)
        program = program.window("agg", key="user", window=window, aggregate=aggregate)
    return program.operators[-1]


def carried(rows: list[tuple[dict, int]]) -> pa.RecordBatch:
    data = pa.RecordBatch.from_pylist([record for record, _ in rows], schema=SCHEMA)
    return live_batch(data, [seq for _, seq in rows])


def times(batches) -> list:
    watermark, result = Watermark(3.0), []
    for rows in batches:
        time = watermark.begin_batch()
        result.append(time)
        watermark.observe(max((record["ts"] for record, _ in rows if record["ts"] is not None), default=None))
        watermark.end_batch(time)
    return result


def reference(operator, batches) -> tuple[list, list, dict]:
    """The per-record function over each batch's records, key by key."""
    fn = key_function(operator, "ts" if isinstance(operator.time, WindowRole) else None)
    states: dict = {}
    out, dead = [], []
    for rows, time in zip(batches, times(batches)):
        records = [record for record, _ in rows]
        grouped = group_by_key(records, ("user",))
        for position in grouped.pop(None, []):
            dead.append(("NullKey", rows[position][1]))
        for key in list(grouped) + [key for key in states if key not in grouped]:
            places = grouped.get(key, [])
            emitted = fn(dict(states.get(key, {})), [records[p] for p in places], [rows[p][1] for p in places], time)
            out += list(zip(map(sorted_items, emitted.records), emitted.seqs))
            dead += [(letter.error.split(":")[0], letter.seq) for letter in emitted.dead]
            if emitted.state is None:
                states.pop(key, None)
            else:
                states[key] = emitted.state
    return sorted(out), sorted(dead), states


def combined(operator, batches, tasks: int, seed: int, columnar: bool = True) -> tuple[list, list, dict, int]:
    """The tasks' partials, merged per key."""
    rng = random.Random(seed)
    role = operator.time
    time_field = "ts" if isinstance(role, WindowRole) else None
    plan = CombinePlan.of(operator, SCHEMA, time_field)
    fn = combined_key_function(operator, time_field)
    states: dict = {}
    out, dead, shipped = [], [], 0
    for rows, time in zip(batches, times(batches)):
        split = [[] for _ in range(tasks)]
        for row in rows:
            split[rng.randrange(tasks)].append(row)
        partials = []
        for task_rows in split:
            combiner = Combiner(plan, time if plan.needs_clock else None, columnar)
            for chunk in (task_rows[:len(task_rows) // 2], task_rows[len(task_rows) // 2:]):
                if chunk:
                    dead += [(letter.error.split(":")[0], letter.seq) for letter in combiner.add(carried(chunk))]
            partials.append(combiner.partials())
        batch = pa.Table.from_batches(partials, schema=PARTIAL_SCHEMA).combine_chunks().to_batches()
        batch = batch[0] if batch else PARTIAL_SCHEMA.empty_table().to_batches()
        shipped += batch.num_rows if isinstance(batch, pa.RecordBatch) else 0
        decoded = partial_inputs(batch, StateCodec("agg")) if isinstance(batch, pa.RecordBatch) else None
        grouped = decoded.grouped if decoded else {}
        for key in list(grouped) + [key for key in states if key not in grouped]:
            places = grouped.get(key, [])
            emitted = fn(dict(states.get(key, {})), [decoded.inputs[p] for p in places],
                         [decoded.seqs[p] for p in places], time)
            out += list(zip(map(sorted_items, emitted.records), emitted.seqs))
            dead += [(letter.error.split(":")[0], letter.seq) for letter in emitted.dead]
            if emitted.state is None:
                states.pop(key, None)
            else:
                states[key] = emitted.state
    return sorted(out), sorted(dead), states, shipped


def sorted_items(record: dict) -> tuple:
    return tuple(sorted((name, round(value, 9) if isinstance(value, float) else value)
                        for name, value in record.items()))


@pytest.mark.parametrize("kind", ["aggregate", "tumbling", "sliding"])
@pytest.mark.parametrize("aggregate", [Count(), Sum("v"), Min("v"), Max("v"), Mean("v")], ids=repr)
@pytest.mark.parametrize("tasks", [1, 3])
@pytest.mark.parametrize("columnar", [True, False], ids=["columns-where-allowed", "records"])
def test_partials_merged_give_the_per_record_outputs(kind, aggregate, tasks, columnar):
    for seed in range(3):
        batches = batches_of(seed)
        operator = operator_of(kind, aggregate)
        expected_out, expected_dead, expected_states = reference(operator, batches)
        out, dead, states, shipped = combined(operator, batches, tasks, seed, columnar)
        assert out == expected_out
        assert dead == expected_dead
        assert states == expected_states
        assert expected_out  # the comparison saw outputs
        if kind != "sliding":  # fewer rows shipped than records: 4 keys, a few windows each
            assert shipped < sum(len(rows) for rows in batches)


def test_late_records_and_missing_event_times_become_dead_letters_in_the_task():
    operator = operator_of("tumbling", Count())
    batches = batches_of(7)
    _, dead, _, _ = combined(operator, batches, 2, 7)
    reasons = {reason for reason, _ in dead}
    assert {"Late", "NoEventTime"} <= reasons
    assert dead == reference(operator, batches)[1]


def test_a_task_whose_records_all_failed_still_reports_its_largest_event_time():
    operator = operator_of("tumbling", Sum("v"))
    combiner = Combiner(CombinePlan.of(operator, SCHEMA, "ts"), Watermark(3.0).begin_batch())
    dead = combiner.add(carried([({"user": "a", "ts": 50.0, "v": None}, 1)]))
    assert [letter.error.split(":")[0] for letter in dead] == ["NullValue"]
    partials = combiner.partials()  # no accumulator: a row with the key's counts and the event time
    assert partials.num_rows == 1 and partials.column("_fissure_partial").null_count == 1
    decoded = partial_inputs(partials, StateCodec("agg"))
    assert decoded.largest == 50.0
    assert [(item["has_acc"], item["records"], item["dead"]) for item in decoded.inputs] == [(False, 1, 1)]
    emitted = combined_key_function(operator, "ts")({}, decoded.inputs, decoded.seqs, Watermark(3.0).begin_batch())
    assert (emitted.records, emitted.state) == ([], None)


def test_one_partial_per_key_per_task():
    operator = operator_of("aggregate", Count())
    combiner = Combiner(CombinePlan.of(operator, SCHEMA, None))
    rows = [({"user": "ab"[i % 2], "ts": 1.0, "v": 1}, i) for i in range(1000)]
    combiner.add(carried(rows[:500]))
    combiner.add(carried(rows[500:]))
    partials = combiner.partials()
    assert partials.num_rows == 2 and combiner.records_in == 1000
    decoded = partial_inputs(partials, StateCodec("agg"))
    assert sorted((item["key"], item["acc"]) for item in decoded.inputs) == [(["a"], 500), (["b"], 500)]
    assert sorted(item["last_seq"] for item in decoded.inputs) == [998, 999]
    assert sorted(item["records"] for item in decoded.inputs) == [500, 500]
    assert all(item["fold_cpu_s"] >= 0 for item in decoded.inputs)


class Last(Aggregate):
    result_schema = {"last": int}

    def create(self):
        return None

    def add(self, acc, record):
        return record["v"]

    def result(self, acc):
        return {"last": acc}


def test_which_operators_combine():
    assert combine_decision(operator_of("aggregate", Count()), True).combine
    assert combine_decision(operator_of("sliding", Mean("v")), True).combine
    assert not combine_decision(operator_of("aggregate", Count()), False).combine
    function = Aggregate.of(lambda records: {"n": len(records)}, schema={"n": int})
    decision = combine_decision(operator_of("tumbling", function), True)
    assert not decision.combine and "records" in decision.reason
    assert not combinable_aggregate(Last()).combine  # merge is Aggregate's, not its own
    expiring = Pipeline("p").aggregate("agg", key="user", aggregate=Count(), expire_after=5.0).operators[-1]
    assert "expire_after" in combine_decision(expiring, True).reason
    sessions = Pipeline("p").event_time("ts").window("agg", key="user", window=Session(5.0),
                                                     aggregate=Count()).operators[-1]
    assert not combine_decision(sessions, True).combine
    marked = Count()
    marked.combinable = False
    assert not combinable_aggregate(marked).combine


def test_partials_go_to_their_keys_buckets_and_every_bucket_gets_a_group_when_asked():
    from fissure.runtime.operators.combine import PARTIAL_KEY, is_partial_schema
    from fissure.runtime.operators.packing import PackSpec, key_bucket, pack_partials, unpack_apart
    from fissure.runtime.state.grouping_keys import balanced_keys

    operator = operator_of("aggregate", Count())
    combiner = Combiner(CombinePlan.of(operator, SCHEMA, None))
    combiner.add(carried([({"user": name, "ts": 1.0, "v": 1}, i) for i, name in enumerate("abcab")]))
    partials = combiner.partials()
    eight = balanced_keys(8)
    packed = pack_partials(partials, PARTIAL_KEY, PackSpec(0, ("user",), 1, keys=eight))
    groups = {eight.bucket_of(value): payload
              for value, payload in zip(packed.column(0).to_pylist(), packed.column(1).to_pylist())}
    assert set(groups) == {key_bucket((name,), 8) for name in "abc"}
    for group, payload in groups.items():
        envelopes, found = unpack_apart([payload], pa.schema([("x", pa.int64())]), is_partial_schema)
        assert envelopes.num_rows == 0 and [key_bucket((text[2:-2],), 8) for batch in found
                                            for text in batch.column(PARTIAL_KEY).to_pylist()] == [group] * sum(
            batch.num_rows for batch in found)
    every = pack_partials(partials, PARTIAL_KEY, PackSpec(0, ("user",), 1, every_group=True, keys=eight))
    assert sorted(eight.bucket_of(value) for value in every.column(0).to_pylist()) == list(range(8))


def _count_plan(key: tuple[str, ...], schema: pa.Schema) -> CombinePlan:
    operator = Pipeline("p").aggregate("agg", key=list(key), aggregate=Count()).operators[-1]
    return CombinePlan.of(operator, schema, None)


COUNTED = pa.schema([("word", pa.string()), ("n", pa.int64()), ("x", pa.float64())])


def _counted_chunks(seed: int) -> list[pa.RecordBatch]:
    """Chunks of records as a flat_map emits them (several records share a sequence number), out
    of sequence order across and within chunks, with null keys."""
    rng = random.Random(seed)
    rows = []
    for seq in range(300):
        for _ in range(rng.randrange(0, 4)):
            rows.append(({"word": None if rng.random() < 0.05 else rng.choice(["a", "b", "é", "c\"d", "a b"]),
                          "n": None if rng.random() < 0.05 else rng.randrange(-3, 3), "x": rng.random()}, seq))
    rng.shuffle(rows)
    chunks = []
    for start in range(0, len(rows), 97):
        part = rows[start:start + 97]
        data = pa.RecordBatch.from_pylist([record for record, _ in part], schema=COUNTED)
        chunks.append(live_batch(data, [seq for _, seq in part]))
    return chunks


@pytest.mark.parametrize("key", [("word",), ("n",), ("word", "n")])
def test_a_count_folded_from_columns_makes_the_partials_and_dead_letters_of_the_records(key):
    for seed in range(3):
        plan = _count_plan(key, COUNTED)
        assert plan.counts_by_columns
        by_columns, by_records = Combiner(plan), Combiner(plan, columnar=False)
        for chunk in _counted_chunks(seed):
            assert ([(d.operator, d.error, d.record, d.seq) for d in by_columns.add(chunk)]
                    == [(d.operator, d.error, d.record, d.seq) for d in by_records.add(chunk)])
        assert by_columns.records_in == by_records.records_in
        fold_time = PARTIAL_SCHEMA.get_field_index("_fissure_fold_cpu_s")
        columns, records = by_columns.partials(), by_records.partials()
        assert columns.remove_column(fold_time).equals(records.remove_column(fold_time))
        assert columns.num_rows > 3
        # only the records without a key value became dicts (for their dead letters)
        nulls = sum(sum(any(row[name] is None for name in key) for row in chunk.to_pylist())
                    for chunk in _counted_chunks(seed))
        assert nulls
        assert by_columns.records_as_dicts == nulls
        assert by_records.records_as_dicts == by_records.records_in


def test_only_a_count_running_or_tumbling_over_text_or_integer_keys_is_folded_from_columns():
    assert _count_plan(("word",), COUNTED).counts_by_columns
    assert not _count_plan(("x",), COUNTED).counts_by_columns  # a float key: its texts through the records
    summed = Pipeline("p").aggregate("agg", key="word", aggregate=Sum("n")).operators[-1]
    assert not CombinePlan.of(summed, COUNTED, None).counts_by_columns
    assert CombinePlan.of(operator_of("tumbling", Count()), SCHEMA, "ts").counts_by_columns
    assert not CombinePlan.of(operator_of("sliding", Count()), SCHEMA, "ts").counts_by_columns
    as_time = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us")), ("v", pa.int64())])
    assert not CombinePlan.of(operator_of("tumbling", Count()), as_time, "ts").counts_by_columns


def test_a_tumbling_count_folded_from_columns_makes_the_partials_and_dead_letters_of_the_records():
    """Windows over an event time with nulls, NaN and late records, several chunks per task: the
    same partials (every column but the fold time), largest event time and dead letters in the same
    order as the per-record fold; only the dead letters' records became dicts."""
    operator = operator_of("tumbling", Count())
    for seed in range(4):
        batches = batches_of(seed, batches=3, per_batch=150)
        for rows, time in zip(batches, times(batches)):
            rng = random.Random(seed)
            rows = [({**record, "ts": math.nan} if rng.random() < 0.03 else record, seq) for record, seq in rows]
            rng.shuffle(rows)
            plan = CombinePlan.of(operator, SCHEMA, "ts")
            by_columns, by_records = Combiner(plan, time), Combiner(plan, time, columnar=False)
            for start in range(0, len(rows), 40):
                chunk = carried(rows[start:start + 40])
                assert ([(d.operator, d.error, d.record, d.seq) for d in by_columns.add(chunk)]
                        == [(d.operator, d.error, d.record, d.seq) for d in by_records.add(chunk)])
            fold_time = PARTIAL_SCHEMA.get_field_index("_fissure_fold_cpu_s")
            columns, records = by_columns.partials(), by_records.partials()
            assert columns.remove_column(fold_time).equals(records.remove_column(fold_time))
            assert by_columns.largest == by_records.largest and by_columns.records_in == by_records.records_in
            assert by_columns.records_as_dicts < by_records.records_as_dicts == len(rows)


def _plain_chunks(seed: int, key: str) -> list[tuple[list[dict], list[int]]]:
    """Records as a flat_map emits them (a run of records per sequence number), each chunk in
    sequence order but one, whose keys are all text or all integers; one chunk has a null key."""
    rng = random.Random(seed)
    chunks = []
    for number in range(5):
        records, seqs = [], []
        for seq in range(number * 100, number * 100 + 100):
            for _ in range(rng.randrange(0, 5)):
                records.append({"word": rng.choice(["a", "b", "é", "c\"d", "a b", "1"]),
                                "n": rng.choice([-3, 0, 1, 7, 1 << 40]), "x": rng.random()})
                seqs.append(seq)
        chunks.append((records, seqs))
    records, seqs = chunks[2]
    order = list(range(len(seqs)))
    rng.shuffle(order)  # out of sequence order: sorted first
    chunks[2] = ([records[place] for place in order], [seqs[place] for place in order])
    chunks[3][0][5][key] = None  # a null key: that chunk goes the per-record way, with its dead letter
    return chunks


def _folded(plan: CombinePlan, chunks) -> tuple[Combiner, list]:
    combiner, dead = Combiner(plan), []
    for records, seqs in chunks:
        dead.append([(d.operator, d.error[:7], d.seq) for d in combiner.add_records(records, seqs)])
    return combiner, dead


@pytest.mark.parametrize("key", ["word", "n"])
def test_a_count_of_plain_keys_from_dicts_makes_the_entries_of_the_per_record_fold(key, monkeypatch):
    plan = _count_plan((key,), COUNTED)
    for seed in range(3):
        with monkeypatch.context() as patch:
            patch.setattr(combine, "count_plain_keys", lambda *args: False)
            reference, reference_dead = _folded(plan, _plain_chunks(seed, key))
        fast, dead = _folded(plan, _plain_chunks(seed, key))
        assert dead == reference_dead
        assert [len(letters) for letters in dead] == [0, 0, 0, 1, 0] and dead[3][0][1] == "NullKey"
        assert fast.records_in == reference.records_in
        fold_time = PARTIAL_SCHEMA.get_field_index("_fissure_fold_cpu_s")
        ours, theirs = fast.partials(), reference.partials()
        assert ours.remove_column(fold_time).equals(theirs.remove_column(fold_time))
        assert ours.num_rows >= 5


def test_a_count_of_keys_of_mixed_types_goes_the_per_record_way():
    plan = _count_plan(("n",), pa.schema([("n", pa.int64())]))
    combiner = Combiner(plan)
    # True == 1 in Python but not as a key; 1 << 70 does not fit int64
    for records in ([{"n": 1}, {"n": True}], [{"n": 1 << 70}, {"n": 1}]):
        assert not count_plain_keys(combiner, records, [0, 1], None)
    assert count_plain_keys(combiner, [{"n": 1}, {"n": 2}, {"n": 1}], [0, 1, 2], None)
    assert {text: entry[3] for text, entry in combiner.entries.items()} == {"[1]": 2, "[2]": 1}


def test_the_cyclic_collector_waits_while_a_task_makes_its_partials(monkeypatch):
    combiner = Combiner(_count_plan(("word",), COUNTED))
    combiner.add_records([{"word": "a", "n": 1, "x": 0.5}, {"word": "b", "n": 2, "x": 0.5}], [0, 1])
    seen, dumps = [], StateCodec.dumps
    monkeypatch.setattr(StateCodec, "dumps", lambda *args: seen.append(gc.isenabled()) or dumps(*args))
    assert combiner.partials().num_rows == 2
    assert seen == [False, False] and gc.isenabled()


def test_the_profile_counts_a_combined_operators_partials_and_the_keys_and_windows_they_hold():
    """Two tasks, each seeing user a in two 10-second windows and user b in one: six partials of
    three groups, standing for the six records."""
    from fissure.runtime.profiling.profiler import (COMBINE_GROUPS, PARTIALS, RECORDS_IN, ProfiledKeyFunction,
                                                    ProfileTally)

    class Accumulator:
        def __init__(self):
            self.value = ProfileTally(adopt=True)

        def add(self, other):
            pass

    operator = operator_of("tumbling", Count())
    rows = [({"user": user, "ts": ts, "v": 1}, seq)
            for seq, (user, ts) in enumerate([("a", 1.0), ("a", 2.0), ("a", 11.0), ("a", 12.0), ("b", 3.0), ("b", 4.0)])]
    time = Watermark(3.0).begin_batch()
    plan = CombinePlan.of(operator, SCHEMA, "ts")
    partials = []
    for task_rows in (rows[0::2], rows[1::2]):
        combiner = Combiner(plan, time)
        combiner.add(carried(task_rows))
        partials.append(combiner.partials())
    batch = pa.Table.from_batches(partials, schema=PARTIAL_SCHEMA).combine_chunks().to_batches()[0]
    decoded = partial_inputs(batch, StateCodec("agg"))
    fn = ProfiledKeyFunction(combined_key_function(operator, "ts"), "agg", Accumulator())
    for places in decoded.grouped.values():
        fn({}, [decoded.inputs[p] for p in places], [decoded.seqs[p] for p in places], time)
    values = fn.live_counts()
    assert (values[PARTIALS], values[COMBINE_GROUPS], values[RECORDS_IN]) == (6, 3, 6)
    assert batch.num_rows == 6


def test_an_aggregates_partials_are_one_group_per_key_and_failed_ones_none():
    partial = {"has_acc": True, "start": None}
    assert combine.CombinedKeys.groups_of([partial, dict(partial)]) == 1
    assert combine.CombinedKeys.groups_of([{"has_acc": False, "start": None}]) == 0
    assert combine.CombinedKeys.groups_of([{"has_acc": True, "start": 0.0}, {"has_acc": True, "start": 10.0},
                                           {"has_acc": True, "start": 0.0}]) == 2
