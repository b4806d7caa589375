"""The program record of a checkpoint and what counts as a change of it (pure); the checks of a
checkpoint's logs. Spark runs: tests/spark/checkpoint/test_checkpoint_guard.py."""

from __future__ import annotations

import pyarrow as pa
import pytest

from fissure import Pipeline, PipelineError, StreamGraph, TumblingWindow
from fissure.lifecycle.checkpoint_logs import missing_log_files
from fissure.program.fingerprint import (
    NEW_CHECKPOINT, READS_OLD_STATE, RENAME, ProgramFingerprint, StateMigration, compare_programs,
    program_fingerprint, refusal_text,
)
from fissure.program.graph import as_graph

COUNTED = {"host": str, "user": str, "n": int}


def count(state, record):
    state["n"] = state.get("n", 0) + 1
    return {**record, "n": state["n"]}


def tidy(record):
    return record


def shout(record):
    return {**record, "host": record["host"].upper()}


def program(*steps, name="logs"):
    """A chain from (method, name, options) steps."""
    pipeline = Pipeline(name)
    for method, step, options in steps:
        fn = tidy if method in ("map", "filter") else count
        getattr(pipeline, method)(step, fn, **options)
    return pipeline


BY_HOST = ("partitioned", "per_host", {"key": "host", "schema": COUNTED})
BY_USER = ("partitioned", "per_user", {"key": "user", "schema": COUNTED})
TOTAL = ("stateful", "total", {"schema": COUNTED})
PARSE = ("map", "parse", {})
INPUT = pa.schema([("host", pa.string()), ("user", pa.string())])


def fingerprint(pipeline, source_schema=INPUT):
    graph = as_graph(pipeline)
    schemas = dict(graph.check({graph.sources[0]: source_schema}).schemas)
    return program_fingerprint(graph, schemas)


def changes(before, after, migration=None):
    return compare_programs(fingerprint(before), fingerprint(after), migration).changes


def test_the_record_lists_each_stateful_operator_with_its_place_key_version_and_state_type():
    record = fingerprint(program(PARSE, BY_HOST, TOTAL))
    assert [(o.name, o.kind, o.place, o.key, o.key_types, o.state_version, o.state_type) for o in record.operators] == [
        ("per_host", "partitioned", 1, ("host",), ("string",), 1, "dict"),
        ("total", "stateful", 2, (), (), 1, "dict")]
    assert ProgramFingerprint.from_dict(record.to_dict()) == record
    with pytest.raises(ValueError):
        ProgramFingerprint.from_dict({"format": 99})


def test_stateless_operators_functions_and_the_program_name_are_not_changes():
    before = program(BY_HOST, TOTAL)
    after = Pipeline("renamed-program").map("parse", shout).filter("keep", tidy).partitioned(
        "per_host", lambda state, record: None, key="host", schema=COUNTED).map("late", tidy).stateful(
        "total", count, schema=COUNTED)
    assert compare_programs(fingerprint(before), fingerprint(after)).compatible


def test_swapped_keyed_operators_are_named_as_swapped():
    found = changes(program(BY_HOST, BY_USER), program(BY_USER, BY_HOST))
    assert len(found) == 1 and found[0].route == NEW_CHECKPOINT
    assert "operators per_host and per_user swapped places" in found[0].text


def test_a_changed_key_and_a_changed_key_type_are_changes():
    (key,) = changes(program(BY_HOST), program(("partitioned", "per_host", {"key": "user", "schema": COUNTED})))
    assert "operator per_host: key host -> user" in key.text and key.route == NEW_CHECKPOINT
    typed = pa.schema([("host", pa.int64()), ("user", pa.string())])
    found = compare_programs(fingerprint(program(BY_HOST)), fingerprint(program(BY_HOST), typed)).changes
    assert len(found) == 1 and "key types string -> int64" in found[0].text


def test_a_renamed_operator_is_a_change_a_migration_can_vouch_for():
    renamed = program(("partitioned", "by_host", {"key": "host", "schema": COUNTED}))
    (change,) = changes(program(BY_HOST), renamed)
    assert change.route == RENAME and "renamed per_host -> by_host" in change.text
    assert not changes(program(BY_HOST), renamed, StateMigration.of({"per_host": "by_host"}))
    text = refusal_text("ckpt/", fingerprint(program(BY_HOST)), compare_programs(fingerprint(program(BY_HOST)),
                                                                               fingerprint(renamed)))
    assert "fissure.migrate_state('ckpt/', program, renamed={'per_host': 'by_host'})" in text


def test_a_new_state_version_or_state_type_needs_the_function_to_read_the_old_state():
    bumped = program(("partitioned", "per_host", {"key": "host", "schema": COUNTED, "state_version": 2}))
    (change,) = changes(program(BY_HOST), bumped)
    assert change.route == READS_OLD_STATE and "state_version 1 -> 2" in change.text
    assert not changes(program(BY_HOST), bumped, StateMigration.of(reads_old_state=["per_host"]))
    listed = program(("partitioned", "per_host", {"key": "host", "schema": COUNTED, "state_factory": list}))
    (typed,) = changes(program(BY_HOST), listed)
    assert typed.route == READS_OLD_STATE and "a new state is a list, the stored states are dicts" in typed.text
    with pytest.raises(PipelineError, match="state_version must be a whole number >= 1"):
        program(("partitioned", "per_host", {"key": "host", "state_version": 0}))


def test_added_removed_and_moved_stateful_operators_are_changes_a_migration_cannot_carry():
    added = changes(program(BY_HOST), program(BY_HOST, TOTAL))
    assert [change.route for change in added] == [NEW_CHECKPOINT] and "total (stateful) added at place 2" in added[0].text
    removed = changes(program(BY_HOST, TOTAL), program(BY_HOST))
    assert len(removed) == 1 and "total (stateful, place 2) removed" in removed[0].text
    moved = changes(program(TOTAL, BY_HOST), program(BY_HOST, TOTAL, BY_USER))
    assert any("swapped places" in change.text for change in moved) and any("per_user" in c.text for c in moved)
    text = refusal_text("ckpt/", fingerprint(program(BY_HOST)), compare_programs(fingerprint(program(BY_HOST)),
                                                                               fingerprint(program(BY_HOST, TOTAL))))
    assert "new checkpoint" in text and "migrate_state(" not in text


def join_graph(size=60, lateness=0, right_fields=(("host", pa.string()), ("ts", pa.float64()))):
    graph = StreamGraph("joined")
    left = graph.source("left", schema={"host": str, "ts": float})
    right = graph.source("right", schema=pa.schema(list(right_fields)))
    graph.join("pair", left.map("l", tidy), right, key="host", window=TumblingWindow("ts", size, lateness),
               fn=lambda a, b: {"host": a["host"]}, schema={"host": str}).sink("out")
    return graph


def test_a_joins_window_and_input_fields_are_part_of_its_state():
    def compared(after):
        before = join_graph()
        return compare_programs(program_fingerprint(before, before.check().schemas),
                                program_fingerprint(after, after.check().schemas)).changes

    assert not compared(join_graph())
    (window,) = compared(join_graph(size=30))
    assert "join pair: window (ts size 60 lateness 0) -> (ts size 30 lateness 0)" in window.text
    (fields,) = compared(join_graph(right_fields=(("host", pa.string()), ("ts", pa.float64()), ("x", pa.int64()))))
    assert "right input" in fields.text and fields.route == NEW_CHECKPOINT


def test_missing_offsets_files_are_found_and_a_purged_log_is_not():
    assert missing_log_files([], []) is None
    assert missing_log_files(list(range(200, 301)), list(range(199, 301))) is None  # Spark purged the oldest
    assert missing_log_files([0, 1, 2, 3], [0, 1, 2]) is None  # batch 3 ran, not committed
    newest = missing_log_files([0, 1], [0, 1, 2])
    assert newest.missing == ("offsets/2",) and "records batch 2 as committed" in newest.reason
    middle = missing_log_files([0, 2, 3], [0, 1, 2, 3])
    assert middle.missing == ("offsets/1",) and "no entry for batch 1 between batches 0 and 3" in middle.reason
