"""Bad input and bad operator results become dead letters that say what was wrong, and the good
records go on: undecodable text and unreadable JSON or CSV lines (with the raw input), values that
do not fit their declared field type exactly, a flat_map that returns no iterable of records,
records without a key value; in process (the test kit) and on Spark, for chains and graphs."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest

import fissure
from fissure import Pipeline, StreamGraph
from fissure.spark.io.sinks import MemorySink
from fissure.spark.io.sources import FileSource
from fissure.testing import TestingSink, TestingSource, run_main
from fissure.runtime.records.columns import DEAD_ERROR, DEAD_OPERATOR, DEAD_RECORD, SEQ
from fissure.runtime.operators.fused import FusedStage, Step
from fissure.runtime.records.carried import live_batch
from fissure.local.executor import run_local

NUMBERS = pa.schema([("n", pa.int64())])


def carried(rows, schema=NUMBERS):
    return live_batch(pa.RecordBatch.from_pylist(rows, schema=schema), list(range(len(rows))))


def dead_rows(batch):
    return [row for row in batch.to_pylist() if row[DEAD_OPERATOR] is not None]


# --- a flat_map must return an iterable of records --------------------------------------------


@pytest.mark.parametrize("returned", ["abc", b"ab", {"n": 1}, 5])
def test_a_flat_map_returning_no_iterable_of_records_is_one_dead_letter_of_the_input(returned):
    stage = FusedStage([Step("split", "flat_map", lambda r: [r, r] if r["n"] == 1 else returned, NUMBERS)], NUMBERS)
    out = stage(carried([{"n": 1}, {"n": 2}]))
    assert [row["n"] for row in out.to_pylist() if row[DEAD_OPERATOR] is None] == [1, 1]
    (dead,) = dead_rows(out)
    assert dead[DEAD_RECORD] == '{"n": 2}' and dead[SEQ] == 1
    assert "a flat_map must return an iterable of records (dicts) or None" in dead[DEAD_ERROR]
    assert f"got {type(returned).__name__}" in dead[DEAD_ERROR]


def test_a_stateful_operator_returning_a_string_is_one_dead_letter_of_the_input():
    pipeline = Pipeline("p").partitioned("count", lambda state, r: "oops" if r["n"] == 2 else r, key="n")
    results = run_local(pipeline, [{"n": 1}, {"n": 2}])
    assert results["sink"] == [{"n": 1}]
    (dead,) = results.dead_letters
    assert dead.node == "count" and dead.record == '{"n": 2}' and "got str 'oops'" in dead.error


# --- values must fit their declared field type exactly ----------------------------------------


@pytest.mark.parametrize("value, fits", [
    (3.7, False), (3.0, True), (True, False), ("3", False), (3, True), (float("nan"), False), (None, True)])
def test_a_value_fits_an_int_field_only_as_a_whole_number(value, fits):
    pipeline = Pipeline("p").map("scale", lambda r: {"n": value}, schema={"n": int})
    results = run_local(pipeline, [{"i": 0}])
    if fits:
        assert results["sink"] == [{"n": None if value is None else int(value)}] and not results.dead_letters
        return
    assert results["sink"] == []
    (dead,) = results.dead_letters
    assert dead.node == "scale"
    assert "field 'n' is declared int64" in dead.error and f"got {type(value).__name__} {value!r}" in dead.error


def test_type_exact_fields_of_every_kind():
    import datetime

    schema = {"f": float, "s": str, "b": bytes, "t": datetime.datetime, "d": datetime.date, "l": list[int]}
    good = {"f": 2, "s": "x", "b": b"x", "t": datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc),
            "d": datetime.date(2024, 1, 1), "l": [1, 2.0]}
    bad = [("f", True, "bool True"), ("s", b"x", "bytes b'x'"), ("b", "x", "str 'x'"), ("t", 5, "int 5"),
           ("d", datetime.datetime(2024, 1, 1, 5), "datetime"), ("l", [1, 2.5], "an item float 2.5"),
           ("l", 7, "int 7")]
    records = [dict(good)] + [dict(good, **{field: value}) for field, value, _ in bad]
    pipeline = Pipeline("p").map("emit", lambda r: records[r["i"]], schema=schema)
    results = run_local(pipeline, [{"i": i} for i in range(len(records))])
    assert len(results["sink"]) == 1 and results["sink"][0]["l"] == [1, 2]
    assert len(results.dead_letters) == len(bad)
    for letter, (field, _, shown) in zip(sorted(results.dead_letters, key=lambda d: d.seq), bad):
        assert f"field {field!r} is declared" in letter.error and shown in letter.error, letter.error


# --- a key field that is null or missing -------------------------------------------------------


def count(state, record):
    state["n"] = state.get("n", 0) + 1
    return {"host": record["host"], "n": state["n"]}


COUNTS = {"host": str, "n": int}
HOSTS = [{"host": "a", "v": 1}, {"host": None, "v": 2}, {"host": "a", "v": 3}, {"v": 4}]


def null_key_chain() -> Pipeline:
    return Pipeline("hosts").partitioned("per_host", count, key="host", schema=COUNTS)


def null_key_graph() -> StreamGraph:
    g = StreamGraph("hosts")
    g.source("lines").map("copy", lambda r: dict(r)).partitioned("per_host", count, key="host",
                                                                schema=COUNTS).sink("counts")
    return g


def check_null_keys(out, dead):
    assert out == [{"host": "a", "n": 1}, {"host": "a", "n": 2}]
    assert len(dead) == 2
    for letter in dead:
        assert letter.error.startswith("NullKey: key field 'host' is null or missing")
    assert sorted(json.loads(letter.record)["v"] for letter in dead) == [2, 4]


@pytest.mark.parametrize("build", [null_key_chain, null_key_graph])
def test_a_record_without_a_key_value_is_a_dead_letter_in_process(build):
    out: list = []
    dead: list = []
    run_main(build(), TestingSource(HOSTS, batch_size=2), TestingSink(out), dead_letters=dead)
    check_null_keys(out, dead)
    assert {letter.node for letter in dead} == {"per_host"}


def test_a_join_record_without_a_key_value_is_a_dead_letter():
    g = StreamGraph("j")
    left, right = g.source("left"), g.source("right")
    g.join("pair", left, right, key="host", window=fissure.TumblingWindow("ts", 10),
           fn=lambda a, b: {"host": a["host"], "ts": a["ts"]}, schema={"host": str, "ts": float}).sink("pairs")
    results = run_local(g, {"left": [{"host": "a", "ts": 1.0}, {"host": None, "ts": 2.0}],
                            "right": [{"host": "a", "ts": 3.0}, {"host": None, "ts": 4.0}]})
    assert results["pairs"] == [{"host": "a", "ts": 1.0}]
    assert [letter.error.split(":")[0] for letter in results.dead_letters] == ["NullKey", "NullKey"]


# --- a source's undecodable rows (the worker side) --------------------------------------------


def test_text_that_is_not_utf8_is_a_dead_letter_of_the_source_and_the_batch_goes_on():
    from fissure.runtime.records.source_rows import carried_source_batch

    raw = pa.array([b"good 1", b"bad \xff\xfe\x80 line", None, b"good 2"], pa.binary()).view(pa.string())
    out = carried_source_batch(pa.RecordBatch.from_arrays([raw], names=["value"]), pa.schema([("value", pa.string())]),
                               10, "lines")
    live = [row for row in out.to_pylist() if row[DEAD_OPERATOR] is None]
    assert [(row["value"], row[SEQ]) for row in live] == [("good 1", 10), (None, 12), ("good 2", 13)]
    (dead,) = dead_rows(out)
    assert dead[DEAD_OPERATOR] == "lines" and dead[SEQ] == 11
    assert dead[DEAD_ERROR].startswith("InvalidUTF8: field 'value' of source 'lines' holds bytes that are not valid "
                                       "UTF-8, the first at byte offset 4 ")
    assert json.loads(dead[DEAD_RECORD]) == {"value": "bad \\xff\\xfe\\x80 line"}


RECORD_SCHEMA = pa.schema([("user", pa.string()), ("amount", pa.float64()), ("n", pa.int32()),
                           ("tags", pa.list_(pa.int64())), ("ok", pa.bool_())])


def unreadable_reasons(lines: list[bytes], line_format) -> list[str]:
    """The dead letters' reasons of rows whose raw lines the reader kept, read again by the worker."""
    from fissure.runtime.records.columns import CORRUPT_RECORD
    from fissure.runtime.records.source_rows import carried_source_batch

    nulls = [pa.nulls(len(lines), field.type) for field in RECORD_SCHEMA]
    corrupt = pa.array(lines, pa.binary()).view(pa.string())
    batch = pa.RecordBatch.from_arrays([*nulls, corrupt], names=[*RECORD_SCHEMA.names, CORRUPT_RECORD])
    out = carried_source_batch(batch, RECORD_SCHEMA, 0, "orders", line_format)
    prefix = ("MalformedRecord: source 'orders' could not read the line as a record of its schema {user: string, "
              "amount: double, n: int32, tags: list<item: int64>, ok: bool}: ")
    reasons = []
    for row in dead_rows(out):
        assert row[DEAD_ERROR].startswith(prefix) and row[DEAD_ERROR].endswith("; the record is the line as read")
        reasons.append(row[DEAD_ERROR][len(prefix):-len("; the record is the line as read")])
    return reasons


def test_an_unreadable_json_line_says_whether_it_does_not_parse_or_which_field_has_which_type():
    from fissure.runtime.records.unreadable_lines import LineFormat

    lines = [b'{"user": "ann", "amount": 1.5,', b'{"user": "bob", "amount": true}', b'{"USER": 7, "n": 2147483648}',
             b'{"tags": [1, "two"]}', b'{"ok": "yes"}', b'{"user": "b\xc3\x28d"}', b'"just a string"',
             b'{"amount": "NaN", "n": 3, "user": {"a": 1}, "date": "x"}']
    assert unreadable_reasons(lines, LineFormat("json")) == [
        "the line is not valid JSON: Expecting property name enclosed in double quotes at column 31 (char 30)",
        "field 'amount' is declared double, but the line has boolean True",
        "field 'n' is declared int32, but the line has number 2147483648, outside int32's range",
        "field 'tags' is declared list<item: int64>, but the line has an item 1 that is string 'two'",
        "field 'ok' is declared bool, but the line has string 'yes'",
        "the line holds bytes that are not valid UTF-8 (the first at byte offset 11)",
        "the line is a JSON string, not an object of the schema's fields",
        # Spark refused it for a reason fissure does not check: said so, not guessed
        "every field's value fits its declared type as fissure reads it; Spark's reader refused the line all the "
        "same (a date or time in another format, a number too precise for a decimal?)"]


def test_an_unreadable_csv_line_names_the_field_its_type_and_the_raw_value_or_the_column_count():
    from fissure.runtime.records.unreadable_lines import LineFormat

    lines = [b"ann;1.5;x;;true", b"bob;lots;1;;false", b"cid;1.0;2", b"dan;2.0;3;;maybe", b'eve;"2.0;3;;true']
    assert unreadable_reasons(lines, LineFormat("csv", delimiter=";")) == [
        "field 'n' (column 3) is declared int32, but the line has 'x'",
        "field 'amount' (column 2) is declared double, but the line has 'lots'",
        "the line has 3 columns, the schema 5 (user, amount, n, tags, ok)",
        "field 'ok' (column 5) is declared bool, but the line has 'maybe'",
        "the line is not valid CSV: unexpected end of data"]


# --- on Spark -----------------------------------------------------------------------------------


def dead_letters_of(sink: MemorySink) -> list[dict]:
    return sorted(sink.records(), key=lambda row: row["seq"])


@pytest.mark.spark
def test_on_spark_undecodable_lines_are_dead_letters_and_every_good_line_is_processed(spark, tmp_path):
    os.makedirs(tmp_path / "in")
    with open(tmp_path / "in" / "part-0.txt", "wb") as handle:
        handle.write(b"alpha 1\nbad \xff\xfe\x80 line\nbeta 2\n")
    pipeline = (Pipeline("text").filter("always", lambda r: True)
                .map("words", lambda r: {"word": r["value"].split()[0]}, schema={"word": str}))
    out, dead = MemorySink(), MemorySink()
    report = fissure.run(pipeline, FileSource(str(tmp_path / "in")), out,
                         config=fissure.RunnerConfig(dead_letters=dead, spark=spark, progress="off", profiling=None))
    assert sorted(row["word"] for row in out.records()) == ["alpha", "beta"]
    assert report.dead_letters == 1
    (letter,) = dead_letters_of(dead)
    assert letter["operator"] == "source" and "InvalidUTF8" in letter["error"] and "not valid UTF-8" in letter["error"]
    assert json.loads(letter["record"]) == {"value": "bad \\xff\\xfe\\x80 line"}


@pytest.mark.spark
def test_on_spark_a_graph_of_two_text_sources_keeps_the_good_lines_of_the_bad_file(spark, tmp_path):
    for name, content in (("a", b"one\n\xc3\x28 broken\ntwo\n"), ("b", b"three\n")):
        os.makedirs(tmp_path / name)
        with open(tmp_path / name / "part-0.txt", "wb") as handle:
            handle.write(content)
    g = StreamGraph("two")
    g.union("both", g.source("a"), g.source("b")).filter("always", lambda r: True).sink("lines")
    out, dead = MemorySink(), MemorySink()
    fissure.run(g, {"a": FileSource(str(tmp_path / "a")), "b": FileSource(str(tmp_path / "b"))}, {"lines": out},
                config=fissure.RunnerConfig(dead_letters=dead, spark=spark, progress="off", profiling=None))
    assert sorted(row["value"] for row in out.records()) == ["one", "three", "two"]
    (letter,) = dead_letters_of(dead)
    assert letter["operator"] == "a" and "InvalidUTF8" in letter["error"]
    assert json.loads(letter["record"]) == {"value": "\\xc3( broken"}


JSON_LINES = ['{"user": "ann", "amount": 1.5, "n": 1}',
              '{"user": "bob", "amount": ',
              '{"user": "cid", "amount": "lots", "n": 2}',
              '{"user": "dan", "amount": 2.0, "n": 3.7}',
              'not json at all',
              '{"user": "eve", "amount": 4.0, "n": 5}']


@pytest.mark.spark
@pytest.mark.parametrize("file_format", ["json", "csv"])
def test_on_spark_unreadable_lines_are_dead_letters_with_the_raw_line(spark, tmp_path, file_format):
    os.makedirs(tmp_path / "in")
    if file_format == "json":
        lines, bad = JSON_LINES, JSON_LINES[1:5]
        reasons = {JSON_LINES[1]: "the line is not valid JSON: Expecting value at column 27 (char 26)",
                   JSON_LINES[2]: "field 'amount' is declared double, but the line has string 'lots'",
                   JSON_LINES[3]: "field 'n' is declared int64, but the line has number 3.7",
                   JSON_LINES[4]: "the line is not valid JSON: Expecting value at column 1 (char 0)"}
    else:
        lines = ["user,amount,n", "ann,1.5,1", "bob,lots,2", "cid,2.0,3.7", "dan,1.0", "eve,4.0,5"]
        bad = lines[2:5]
        reasons = {lines[2]: "field 'amount' (column 2) is declared double, but the line has 'lots'",
                   lines[3]: "field 'n' (column 3) is declared int64, but the line has '3.7'",
                   lines[4]: "the line has 2 columns, the schema 3 (user, amount, n)"}
    with open(tmp_path / "in" / f"part-0.{file_format}", "w", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in lines))
    pipeline = Pipeline("records").map("check", lambda r: {"user": r["user"], "amount": r["amount"] * 2, "n": r["n"]})
    out, dead = MemorySink(), MemorySink()
    fissure.run(pipeline, FileSource(str(tmp_path / "in"), format=file_format,
                                     schema={"user": str, "amount": float, "n": int}), out,
                config=fissure.RunnerConfig(dead_letters=dead, spark=spark, progress="off", profiling=None))
    assert sorted((row["user"], row["amount"], row["n"]) for row in out.records()) == [("ann", 3.0, 1),
                                                                                       ("eve", 8.0, 5)]
    letters = dead_letters_of(dead)
    assert sorted(letter["record"] for letter in letters) == sorted(bad)
    for letter in letters:
        assert letter["operator"] == "source" and letter["error"].startswith(
            "MalformedRecord: source 'source' could not read the line as a record of its schema {user: string, "
            f"amount: double, n: int64}}: {reasons[letter['record']]}; the record is the line as read")


@pytest.mark.spark
@pytest.mark.parametrize("build", [null_key_chain, null_key_graph])
def test_on_spark_null_keys_are_dead_letters_and_a_float_does_not_fit_an_int(spark, build):
    out: list = []
    dead = MemorySink()
    program = build()
    fissure.run(program, TestingSource(HOSTS, batch_size=2), TestingSink(out),
                config=fissure.RunnerConfig(dead_letters=dead, spark=spark, progress="off", profiling=None))
    letters = dead_letters_of(dead)
    check_null_keys(out, [type("Letter", (), {"error": row["error"], "record": row["record"]}) for row in letters])
    assert {letter["operator"] for letter in letters} == {"per_host"}
    truncating = Pipeline("ints").map("half", lambda r: {"n": r["v"] / 2}, schema={"n": int})
    out = []
    dead = MemorySink()
    fissure.run(truncating, TestingSource([{"v": 6}, {"v": 7}]), TestingSink(out),
                config=fissure.RunnerConfig(dead_letters=dead, spark=spark, progress="off", profiling=None))
    assert out == [{"n": 3}]  # 6 / 2 = 3.0 fits; 7 / 2 = 3.5 does not become 3
    (letter,) = dead_letters_of(dead)
    assert letter["operator"] == "half" and "field 'n' is declared int64" in letter["error"] and \
        "got float 3.5" in letter["error"]


def test_a_line_fissure_cannot_read_again_keeps_the_general_reason_and_the_batch_goes_on():
    from fissure.runtime.records.unreadable_lines import LineFormat

    (reason,) = unreadable_reasons([b"ann||1.5"], LineFormat("csv", delimiter="||"))  # Spark's sep may be longer
    assert reason == ("it does not parse, or a value has another type (fissure could not read the line again: "
                      "TypeError: \"delimiter\" must be a 1-character string)")
