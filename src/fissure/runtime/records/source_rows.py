"""A source's rows as carried rows, where records enter the graph (no pyspark here).

Input a source could not turn into records becomes dead letters of the source (the dead letter's
operator is the source's name), and the good rows of the batch go on:

- text that is not valid UTF-8: Spark's readers hand the bytes of a line on unchecked, and Arrow
  refuses them only when a value is converted to Python, which would fail the whole batch at the
  first per-record operator (and again at every restart). Every string column of a source batch is
  validated once (one pass over its bytes in Arrow); only a batch that fails is looked at row by
  row. The dead letter names the field and the byte offset of the first invalid byte; its record
  shows the row with undecodable bytes as `\\xNN` escapes.
- a line the reader could not parse, or whose value does not fit the source's schema: JSON and CSV
  file sources read in Spark's PERMISSIVE mode with the raw line in the column CORRUPT_RECORD
  (fissure.spark.io.sources.FileSource); a row with that column set is a dead letter whose record is
  the line as read, and whose reason says what is wrong with it: the line is read again against
  the schema (fissure.runtime.records.unreadable_lines; only such rows pay for it).
"""

from __future__ import annotations

import pyarrow as pa

from fissure.runtime.records.columns import CORRUPT_RECORD, carried_schema
from fissure.runtime.records.carried import assemble, dead_letter_batch, live_batch
from fissure.runtime.records.fate import MAX_DEAD_RECORD_CHARS, DeadLetter, record_text
from fissure.runtime.records.unreadable_lines import LineFormat, first_invalid_byte, why_unreadable

__all__ = ["LineFormat", "carried_source_batch", "without_corrupt_record"]


def _holds_text(arrow_type: pa.DataType) -> bool:
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return True
    if pa.types.is_nested(arrow_type):
        return any(_holds_text(arrow_type.field(index).type) for index in range(arrow_type.num_fields))
    return False


def _valid(array: pa.Array) -> bool:
    try:
        array.validate(full=True)  # checks every string's UTF-8 (SIMD: a cheap pass over the bytes)
    except pa.ArrowInvalid:
        return False
    return True


def _as_bytes(array: pa.Array) -> pa.Array:
    """A string array as binary, without looking at its bytes."""
    return array.view(pa.large_binary() if pa.types.is_large_string(array.type) else pa.binary())


def _decoded(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", errors="backslashreplace")


def _bad_rows(array: pa.Array) -> dict[int, tuple[object, int | None]]:
    """The rows of a column that fails validation: each value shown safely, and the byte offset of
    its first invalid byte (None: in a nested value)."""
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        bad = {}
        for row, raw in enumerate(_as_bytes(array).to_pylist()):
            offset = first_invalid_byte(raw) if raw is not None else None
            if offset is not None:
                bad[row] = (_decoded(raw), offset)
        return bad
    return {row: ("<a nested value that is not valid UTF-8>", None) for row in range(len(array))
            if not _valid(array.slice(row, 1))}


def _value(array: pa.Array, row: int) -> object:
    """A value of a row that is dead for another column's sake, shown safely."""
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        return _decoded(_as_bytes(array.slice(row, 1)).to_pylist()[0])
    try:
        return array.slice(row, 1).to_pylist()[0]
    except (UnicodeDecodeError, pa.ArrowException):
        return "<a nested value that is not valid UTF-8>"


UNSAID = "it does not parse, or a value has another type"


def _why(raw: bytes, schema: pa.Schema, line_format: LineFormat | None) -> str:
    """What is wrong with an unreadable line; reading it again never fails the batch."""
    if line_format is None:
        return UNSAID
    try:
        return why_unreadable(raw, schema, line_format)
    except Exception as error:  # noqa: BLE001 - options Python's csv module cannot follow: say so, go on
        return f"{UNSAID} (fissure could not read the line again: {type(error).__name__}: {error})"


def carried_source_batch(batch: pa.RecordBatch, source_schema: pa.Schema, first_seq: int,
                         source: str, line_format: LineFormat | None = None) -> pa.RecordBatch:
    """A source batch as carried rows of `source_schema` (sequence numbers from `first_seq`), its
    undecodable and unreadable rows as dead letters of `source`; `line_format`: how the source's
    lines are written, to say what is wrong with an unreadable one (None: not said)."""
    rows = batch.num_rows
    names = batch.schema.names
    columns = [batch.column(batch.schema.get_field_index(name)).cast(field.type)
               for name, field in zip(source_schema.names, source_schema)]
    corrupt = batch.column(names.index(CORRUPT_RECORD)) if CORRUPT_RECORD in names else None
    problems: dict[int, list[str]] = {}
    shown: dict[int, dict] = {}
    raw_lines: dict[int, str] = {}
    if corrupt is not None and corrupt.null_count < rows:
        fields = ", ".join(f"{field.name}: {field.type}" for field in source_schema)
        for row, raw in enumerate(_as_bytes(corrupt).to_pylist()):
            if raw is None:
                continue
            raw_lines[row] = _decoded(raw)
            why = _why(raw, source_schema, line_format)
            problems[row] = [f"MalformedRecord: source {source!r} could not read the line as a record of its "
                             f"schema {{{fields}}}: {why}; the record is the line as read"]
    for name, column in zip(source_schema.names, columns):
        if _holds_text(column.type) and not _valid(column):
            for row, (value, offset) in _bad_rows(column).items():
                shown.setdefault(row, {})[name] = value
                if row not in raw_lines:
                    where = f", the first at byte offset {offset}" if offset is not None else ""
                    problems.setdefault(row, []).append(
                        f"InvalidUTF8: field {name!r} of source {source!r} holds bytes that are not valid UTF-8"
                        f"{where} (shown as \\xNN escapes in the record); fix the input's encoding")
    seqs = range(first_seq, first_seq + rows)
    if not problems:
        data = pa.RecordBatch.from_arrays(columns, schema=source_schema)
        return live_batch(data, seqs)
    dead = []
    for row in sorted(problems):
        if row in raw_lines:
            record = raw_lines[row][:MAX_DEAD_RECORD_CHARS]
        else:
            values = {name: shown[row][name] if name in shown[row] else _value(column, row)
                      for name, column in zip(source_schema.names, columns)}
            record = record_text(values)
        dead.append(DeadLetter(source, "; ".join(problems[row]), record, seqs[row]))
    keep = pa.array([row not in problems for row in range(rows)], pa.bool_())
    data = pa.RecordBatch.from_arrays(columns, schema=source_schema).filter(keep)
    kept_seqs = [seq for row, seq in enumerate(seqs) if row not in problems]
    return assemble([live_batch(data, kept_seqs), dead_letter_batch(dead, source_schema)],
                    carried_schema(source_schema))


def without_corrupt_record(schema: pa.Schema) -> pa.Schema:
    """A source frame's schema as the program sees it: without the column CORRUPT_RECORD."""
    index = schema.get_field_index(CORRUPT_RECORD)
    return schema if index < 0 else schema.remove(index)


