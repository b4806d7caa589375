"""Why a source's reader could not read a line (no pyspark here).

Spark's JSON and CSV readers, in PERMISSIVE mode, keep a line they could not turn into a record
of the schema as it was read, and say nothing of why (fissure.spark.io.sources.FileSource). The
worker reads such a line again, in Python, against the same schema, and names the first thing
wrong with it: bytes that are not UTF-8 (the offset of the first), a JSON line that does not
parse (the parser's message and position), a CSV line with another number of columns than the
schema has fields, or the first field whose value has another type than declared (the field, the
declared type, the raw value). Only dead rows are read again, so good input pays nothing.

The rules follow Spark's readers where they differ from Python's: a JSON field declared string
takes any value (Spark keeps its JSON text); floats take integers and "NaN"/"Infinity"; a CSV
field that is empty is null; booleans are true/false in any case.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass

import pyarrow as pa

from fissure.runtime.records.fate import shown_value

INT_RANGES = {bit_width: (-(1 << (bit_width - 1)), (1 << (bit_width - 1)) - 1) for bit_width in (8, 16, 32, 64)}
NON_FINITE = {"nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"}


@dataclass(frozen=True)
class LineFormat:
    """How a source's lines are written: "json" or "csv" (with its delimiter, quote and escape)."""

    kind: str
    delimiter: str = ","
    quote: str = '"'
    escape: str = "\\"


def first_invalid_byte(raw: bytes) -> int | None:
    """The offset of the first byte that is not valid UTF-8 (None: all valid)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return error.start
    return None


def why_unreadable(raw: bytes, schema: pa.Schema, line_format: LineFormat) -> str:
    """What is wrong with `raw`, a line the reader refused, as a record of `schema`."""
    offset = first_invalid_byte(raw)
    if offset is not None:
        return f"the line holds bytes that are not valid UTF-8 (the first at byte offset {offset})"
    line = raw.decode("utf-8")
    if line_format.kind == "json":
        return _why_json(line, schema)
    if line_format.kind == "csv":
        return _why_csv(line, schema, line_format)
    raise ValueError(f"no reading of {line_format.kind!r} lines")


NOTHING_FOUND = ("every field's value fits its declared type as fissure reads it; Spark's reader refused the line "
                 "all the same (a date or time in another format, a number too precise for a decimal?)")


def _why_json(line: str, schema: pa.Schema) -> str:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as error:
        return f"the line is not valid JSON: {error.msg} at column {error.colno} (char {error.pos})"
    if not isinstance(value, dict):
        return f"the line is a JSON {_json_kind(value)}, not an object of the schema's fields"
    by_lower = {name.lower(): name for name in value}  # Spark matches field names without case by default
    for field in schema:
        name = field.name if field.name in value else by_lower.get(field.name.lower())
        if name is None:
            continue
        problem = _json_misfit(value[name], field.type)
        if problem is not None:
            return f"field {field.name!r} is declared {field.type}, but the line has {problem}"
    return NOTHING_FOUND


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def _shown_json(value: object) -> str:
    return f"{_json_kind(value)} {shown_value(json.dumps(value)) if isinstance(value, (dict, list)) else shown_value(value)}"


def _json_misfit(value: object, arrow_type: pa.DataType) -> str | None:
    """How a parsed JSON value does not fit `arrow_type` (None: it fits)."""
    if value is None or pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return None
    if pa.types.is_integer(arrow_type):
        if isinstance(value, bool) or not isinstance(value, int):
            return _shown_json(value)
        return _out_of_range(value, arrow_type)
    if pa.types.is_floating(arrow_type):
        if isinstance(value, bool) or not (isinstance(value, (int, float))
                                           or isinstance(value, str) and value.lower() in NON_FINITE):
            return _shown_json(value)
        return None
    if pa.types.is_boolean(arrow_type):
        return None if isinstance(value, bool) else _shown_json(value)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        if not isinstance(value, list):
            return _shown_json(value)
        for index, item in enumerate(value):
            problem = _json_misfit(item, arrow_type.value_type)
            if problem is not None:
                return f"an item {index} that is {problem}"
        return None
    if pa.types.is_struct(arrow_type):
        if not isinstance(value, dict):
            return _shown_json(value)
        for index in range(arrow_type.num_fields):
            inner = arrow_type.field(index)
            problem = _json_misfit(value.get(inner.name), inner.type)
            if problem is not None:
                return f"in {inner.name!r} ({inner.type}) {problem}"
        return None
    if pa.types.is_timestamp(arrow_type) or pa.types.is_date(arrow_type):
        return None if isinstance(value, (str, int)) and not isinstance(value, bool) else _shown_json(value)
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return None if isinstance(value, str) else _shown_json(value)
    return None  # a type fissure does not read again: no verdict


def _out_of_range(value: int, arrow_type: pa.DataType) -> str | None:
    low, high = INT_RANGES.get(arrow_type.bit_width, (None, None))
    if low is not None and not low <= value <= high:
        return f"number {value}, outside {arrow_type}'s range"
    return None


def _why_csv(line: str, schema: pa.Schema, line_format: LineFormat) -> str:
    try:
        (values,) = list(csv.reader([line], delimiter=line_format.delimiter, quotechar=line_format.quote or None,
                                    escapechar=line_format.escape or None, strict=True))
    except (csv.Error, ValueError) as error:
        return f"the line is not valid CSV: {error}"
    fields = ", ".join(schema.names)
    if len(values) != len(schema):
        return (f"the line has {len(values)} column{'' if len(values) == 1 else 's'}, the schema "
                f"{len(schema)} ({fields})")
    for column, (field, text) in enumerate(zip(schema, values), start=1):
        if _csv_fits(text, field.type):
            continue
        return f"field {field.name!r} (column {column}) is declared {field.type}, but the line has {shown_value(text)}"
    return NOTHING_FOUND


def _csv_fits(text: str, arrow_type: pa.DataType) -> bool:
    if text == "" or pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return True  # an empty value is null (Spark's nullValue)
    text = text.strip()
    if "_" in text:  # Python's int() and float() take digit separators; Spark's readers do not
        return False
    if pa.types.is_integer(arrow_type):
        try:
            value = int(text)
        except ValueError:
            return False
        return _out_of_range(value, arrow_type) is None
    if pa.types.is_floating(arrow_type):
        try:
            value = float(text)
        except ValueError:
            return False
        return not math.isnan(value) or text.lower() in NON_FINITE
    if pa.types.is_boolean(arrow_type):
        return text.lower() in ("true", "false")
    return True  # dates, times and the rest: no verdict
