"""Packed exchange (fissure.runtime.operators.packing): a keyed stage's input grouped before the exchange."""

from __future__ import annotations

import json
import zlib

import pyarrow as pa
import pytest

from fissure.runtime.records.columns import DEAD_OPERATOR, SEQ
from fissure.runtime.operators.packing import MAX_PACKED_ROWS, PackSpec, grouping_keys, key_bucket, pack, unpack
from fissure.runtime.state.grouping_keys import BALANCED_KEYS, balanced_spread_values

ROUTE = "_fissure_route"
SCHEMA = pa.schema([pa.field(ROUTE, pa.int32()), pa.field(SEQ, pa.int64()), pa.field(DEAD_OPERATOR, pa.string()),
                    pa.field("word", pa.string()), pa.field("n", pa.int64())])


def envelopes(rows):
    return pa.RecordBatch.from_pylist(rows, schema=SCHEMA)


def row(seq, word, route=1, dead=None, n=0):
    return {ROUTE: route, SEQ: seq, DEAD_OPERATOR: dead, "word": word, "n": n}


def unpacked(packed):
    return {key: unpack([payload], SCHEMA) for key, payload in
            zip(packed.column(0).to_pylist(), packed.column(1).to_pylist())}


def test_a_keys_bucket_is_crc32_of_its_json_text_so_every_process_agrees():
    for key in [("apple",), (1,), (1.5,), (None,), ("a", 2)]:
        assert key_bucket(key, 64) == zlib.crc32(json.dumps(list(key)).encode()) % 64


def test_records_of_one_key_share_a_bucket_and_other_rows_get_spread_keys():
    batch = envelopes([row(0, "a"), row(1, "b"), row(2, "a"), row(3, "x", route=2), row(4, None, dead="op"),
                       row(5, None), row(6, "b")])
    keys = grouping_keys(batch, PackSpec(1, ("word",), 2)).tolist()
    assert keys[0] == keys[2] == key_bucket(("a",), 64)
    assert keys[1] == keys[6] == key_bucket(("b",), 64)
    assert keys[5] == key_bucket((None,), 64)  # a live record with a null key is the operator's to judge
    assert keys[3] == -1 - 3 % 2 and keys[4] == -1 - 4 % 2  # another stream, a dead letter: passed through


def test_under_the_balanced_scheme_rows_carry_their_buckets_values_and_balanced_spread_keys():
    batch = envelopes([row(0, "a"), row(1, "b"), row(2, "a"), row(3, "x", route=2), row(4, None, dead="op")])
    keys = grouping_keys(batch, PackSpec(1, ("word",), 2, keys=BALANCED_KEYS)).tolist()
    assert keys[0] == keys[2] == BALANCED_KEYS.bucket_value(key_bucket(("a",), 64))
    assert keys[1] == BALANCED_KEYS.bucket_value(key_bucket(("b",), 64))
    assert keys[3] == balanced_spread_values(2)[3 % 2] and keys[4] == balanced_spread_values(2)[4 % 2]
    groups = unpacked(pack(batch, PackSpec(1, ("word",), 2, every_group=True, keys=BALANCED_KEYS)))
    assert set(BALANCED_KEYS.bucket_values) <= set(groups)
    assert sum(group.num_rows for group in groups.values()) == 5
    assert groups[keys[0]].column("word").to_pylist() == ["a", "a"]


def test_many_keys_spread_over_the_buckets():
    batch = envelopes([row(seq, f"u{seq % 500}") for seq in range(1000)])
    keys = grouping_keys(batch, PackSpec(1, ("word",), 2)).tolist()
    assert all(0 <= key < 64 for key in keys)
    assert len(set(keys)) > 32


def test_an_unkeyed_operators_records_form_one_group():
    batch = envelopes([row(0, "a"), row(1, "b"), row(2, "c", route=3)])
    assert grouping_keys(batch, PackSpec(1, None, 4)).tolist() == [0, 0, -1 - 2 % 4]


def test_packing_keeps_every_envelope_once_in_its_groups_row_in_input_order():
    rows = [row(seq, f"w{seq % 7}", route=1 if seq % 5 else 2, n=seq) for seq in range(200)]
    packed = pack(envelopes(rows), PackSpec(1, ("word",), 3))
    groups = unpacked(packed)
    assert len(groups) == packed.num_rows  # one row per grouping key present
    seen = sorted(seq for batch in groups.values() for seq in batch.column(SEQ).to_pylist())
    assert seen == list(range(200))
    for key, batch in groups.items():
        seqs = batch.column(SEQ).to_pylist()
        assert seqs == sorted(seqs)
        if key >= 0:
            assert {key_bucket((word,), 64) for word in batch.column("word").to_pylist()} == {key}
        else:
            assert set(batch.column(ROUTE).to_pylist()) == {2}


def test_while_migrating_state_every_bucket_gets_a_row_with_records_or_not():
    batch = envelopes([row(0, "a"), row(1, "b"), row(2, "c", route=3)])
    groups = unpacked(pack(batch, PackSpec(1, ("word",), 2, every_group=True)))
    assert set(range(64)) <= set(groups)
    assert sum(group.num_rows for group in groups.values()) == 3
    assert groups[key_bucket(("a",), 64)].num_rows >= 1
    assert set(unpacked(pack(batch, PackSpec(1, None, 2, every_group=True)))) >= {0}
    assert not set(range(64)) <= set(unpacked(pack(batch, PackSpec(1, ("word",), 2))))


def test_a_large_group_is_cut_into_rows_of_bounded_size():
    rows = [row(seq, "same") for seq in range(MAX_PACKED_ROWS + 10)]
    packed = pack(envelopes(rows), PackSpec(1, ("word",), 1))
    assert packed.num_rows == 2
    assert len(set(packed.column(0).to_pylist())) == 1
    sizes = [unpack([payload], SCHEMA).num_rows for payload in packed.column(1).to_pylist()]
    assert sizes == [MAX_PACKED_ROWS, 10]


def test_multi_field_keys_bucket_on_all_fields():
    schema = pa.schema([pa.field(ROUTE, pa.int32()), pa.field(SEQ, pa.int64()), pa.field(DEAD_OPERATOR, pa.string()),
                        pa.field("a", pa.string()), pa.field("b", pa.int64())])
    batch = pa.RecordBatch.from_pylist([{ROUTE: 1, SEQ: i, DEAD_OPERATOR: None, "a": "x", "b": i % 2}
                                        for i in range(4)], schema=schema)
    keys = grouping_keys(batch, PackSpec(1, ("a", "b"), 1)).tolist()
    assert keys == [key_bucket(("x", i % 2), 64) for i in range(4)]


def test_multi_field_keys_bucket_per_distinct_key_as_row_by_row(monkeypatch):
    """Several key fields with nulls, a float and text: each row's bucket is its key's, the
    key's text made once per distinct key (from the columns' dictionaries), not per row."""
    import random

    from fissure.runtime.operators import packing

    schema = pa.schema([pa.field(ROUTE, pa.int32()), pa.field(SEQ, pa.int64()), pa.field(DEAD_OPERATOR, pa.string()),
                        pa.field("a", pa.string()), pa.field("b", pa.int64()), pa.field("c", pa.float64())])
    rng = random.Random(3)
    rows = [{ROUTE: 1, SEQ: i, DEAD_OPERATOR: None, "a": rng.choice(["x", "y", None, "é"]),
             "b": rng.choice([1, 2, None, -5]), "c": rng.choice([0.5, 2.0, None])} for i in range(400)]
    batch = pa.RecordBatch.from_pylist(rows, schema=schema)
    hashed = []
    monkeypatch.setattr(packing, "key_bucket", lambda key, buckets: hashed.append(key) or key_bucket(key, buckets))
    keys = grouping_keys(batch, PackSpec(1, ("a", "b", "c"), 1)).tolist()
    assert keys == [key_bucket((row["a"], row["b"], row["c"]), 64) for row in rows]
    assert len(hashed) == len({(row["a"], row["b"], row["c"]) for row in rows}) < 64


def test_a_list_valued_key_buckets_on_its_text():
    schema = pa.schema([pa.field(ROUTE, pa.int32()), pa.field(SEQ, pa.int64()), pa.field(DEAD_OPERATOR, pa.string()),
                        pa.field("tags", pa.list_(pa.string()))])
    batch = pa.RecordBatch.from_pylist([{ROUTE: 1, SEQ: i, DEAD_OPERATOR: None, "tags": ["a", str(i % 2)]}
                                        for i in range(4)], schema=schema)
    keys = grouping_keys(batch, PackSpec(1, ("tags",), 1)).tolist()
    assert keys == [key_bucket((["a", str(i % 2)],), 64) for i in range(4)]


def test_unpacking_nothing_gives_an_empty_batch_of_the_schema():
    assert unpack([], SCHEMA).schema == SCHEMA
    assert pack(envelopes([]), PackSpec(1, ("word",), 1)).num_rows == 0


@pytest.mark.slow
def test_the_exchange_before_a_keyed_stage_moves_packed_rows_not_records(spark, tmp_path):
    """Spark shuffles a few rows per bucket, not one per record, and the counts stay exact."""
    import fissure
    from fissure import Pipeline
    from fissure.spark.session.stage_log import StageLog
    from fissure.testing import text_files

    def count(state, record):
        state["n"] = state.get("n", 0) + 1
        return {"word": record["word"], "count": state["n"]}

    lines = [" ".join(f"w{(line * 7 + position) % 50}" for position in range(10)) for line in range(300)]
    source = text_files(str(tmp_path / "in"), lines, lines_per_file=300, max_files_per_trigger=1)
    pipeline = (Pipeline("packed")
                .flat_map("words", lambda record: [{"word": word} for word in record["value"].split()],
                          schema={"word": str}, reads=["value"])
                .partitioned("count", count, key="word", schema={"word": str, "count": int}))
    sink = fissure.MemorySink()
    before = {stage["stageId"] for stage in StageLog(spark).get("/stages")}
    fissure.run(pipeline, source, sink, checkpoint=str(tmp_path / "checkpoint"),
                config=fissure.RunnerConfig(spark=spark, progress="off"))
    totals: dict[str, list[int]] = {}
    for record in sink.records():
        totals.setdefault(record["word"], []).append(record["count"])
    assert sum(len(counts) for counts in totals.values()) == 3000
    assert all(sorted(counts) == list(range(1, len(counts) + 1)) for counts in totals.values())
    shuffled = [stage.get("shuffleWriteRecords", 0) for stage in StageLog(spark).get("/stages")
                if stage["stageId"] not in before]
    assert max(shuffled) > 0
    assert sum(shuffled) <= 64 * 4  # at most a row per bucket and task, far below the 3,000 words


def test_a_keyed_stages_output_for_the_pe_stage_after_it_is_packed_and_read_back_in_order():
    from fissure.runtime.operators import packing

    rows = [row(seq, f"w{seq % 7}", route=1 + seq % 2, dead="op" if seq == 5 else None) for seq in range(2_500)]
    batch = envelopes(rows)
    packed = packing.pack_rows(batch)
    assert packed.schema == packing.PACKED_SCHEMA and packed.num_rows == 1
    assert [envelope for part in packing.unpacked([packed], SCHEMA) for envelope in part.to_pylist()] == rows
    # rows beyond MAX_PACKED_ROWS go into further rows, still in order; an empty output packs to nothing
    many = envelopes([row(seq, "w") for seq in range(MAX_PACKED_ROWS + 3)])
    packed = packing.pack_rows(many)
    assert packed.num_rows == 2
    assert [r[SEQ] for part in packing.unpacked([packed], SCHEMA) for r in part.to_pylist()] == list(
        range(MAX_PACKED_ROWS + 3))
    assert packing.pack_rows(envelopes([])).num_rows == 0
    assert list(packing.unpacked([packing.EMPTY_PACKED], SCHEMA)) == []
