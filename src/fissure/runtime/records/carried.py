"""Carried batches: the rows a stage passes on, the user's fields beside fissure's own columns.

Records become a batch of their declared schema only when every value fits its field exactly
(`records_to_batch`); a record that does not becomes a dead letter, and dead letters travel as
rows of the same carried schema (`dead_letter_batch`, `split_dead`, `reshape_dead`), so that a
stage never loses one. No pyspark here.
"""

from __future__ import annotations

import datetime
import functools
import numbers
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fissure.runtime.records.columns import DEAD_ERROR, DEAD_OPERATOR, DEAD_RECORD, SEQ, carried_schema
from fissure.runtime.records.fate import DeadLetter, record_text, shown_value

# --- type-exact fields --------------------------------------------------------------------------
# Arrow converts loosely: 3.7 into an int64 field becomes 3, True into a float field 1.0, bytes into
# a string field are decoded, an int into a timestamp field counts microseconds. Before a batch is
# built, every field of such a type is checked: its values' Python types, collected in one C-level
# pass per field, must be the field's own (the good path); only when they are not is each value
# checked, and a value that does not fit exactly makes its record a dead letter. An integral float
# (3.0) fits an integer field: it converts without loss.


def _whole_number(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) or (
        isinstance(value, float) and value.is_integer())


def _real_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _date_only(value: object) -> bool:
    return isinstance(value, datetime.date) and not isinstance(value, datetime.datetime)


def _scalar_check(arrow_type: pa.DataType) -> tuple[frozenset, Callable[[object], bool], str] | None:
    """(Python types that fit at once, a check for any other value, what the field takes), or None
    when Arrow's own conversion is exact for the type."""
    if pa.types.is_integer(arrow_type):
        return frozenset({int}), _whole_number, "a whole number: an int, or a float without fraction"
    if pa.types.is_floating(arrow_type):
        return frozenset({float, int}), _real_number, "a number: a float or an int, not a bool"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return frozenset({str}), lambda value: isinstance(value, str), "str"
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return (frozenset({bytes}), lambda value: isinstance(value, (bytes, bytearray, memoryview)),
                "bytes")
    if pa.types.is_timestamp(arrow_type):
        return (frozenset({datetime.datetime}), lambda value: isinstance(value, datetime.datetime),
                "datetime.datetime")
    if pa.types.is_date(arrow_type):
        return frozenset({datetime.date}), _date_only, "a datetime.date, not a datetime"
    return None


@dataclass(frozen=True)
class _FieldCheck:
    name: str
    declared: pa.DataType
    fast: frozenset  # the value types that pass without a look at each value (None always does)
    fits: Callable[[object], bool]
    takes: str
    of_list: bool  # the checks apply to the items of a list field


@functools.lru_cache(maxsize=256)
def type_checks(schema: pa.Schema) -> tuple[_FieldCheck, ...]:
    """The checks of the fields of `schema` that Arrow would convert loosely (top level, and the
    items of a list field)."""
    checks = []
    for field in schema:
        of_list = pa.types.is_list(field.type) or pa.types.is_large_list(field.type)
        check = _scalar_check(field.type.value_type if of_list else field.type)
        if check is not None:
            fast, fits, takes = check
            checks.append(_FieldCheck(field.name, field.type, fast | {type(None)}, fits, takes, of_list))
    return tuple(checks)


def _misfit(check: _FieldCheck, value: object) -> object:
    """The value (or list item) that does not fit `check`; `_FITS` when all fit."""
    if value is None:
        return _FITS
    if check.of_list:
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
            return value
        for item in value:
            if item is not None and not check.fits(item):
                return item
        return _FITS
    return _FITS if check.fits(value) else value


_FITS = object()


def _exact_types(records: list, seqs: list[int], checks: Sequence[_FieldCheck], operator: str,
                 dead: list[DeadLetter]) -> tuple[list, list[int]]:
    """The records whose values fit their fields exactly; the others become dead letters."""
    suspects: set[int] = set()
    for check in checks:
        values = map(itemgetter(check.name), records)
        try:
            types = set(map(type, chain.from_iterable(filter(None, values)))) if check.of_list \
                else set(map(type, values))
        except TypeError:  # a list field holding something that is not a list
            types = {object}
        if not types <= check.fast:
            suspects.update(position for position, record in enumerate(records)
                            if _misfit(check, record[check.name]) is not _FITS)
    if not suspects:
        return records, seqs
    kept, kept_seqs = [], []
    for position, (record, seq) in enumerate(zip(records, seqs)):
        if position not in suspects:
            kept.append(record)
            kept_seqs.append(seq)
            continue
        problems = []
        for check in checks:
            value = record[check.name]
            bad = _misfit(check, value)
            if bad is not _FITS:
                if not check.of_list:
                    takes, got = check.takes, ""
                elif bad is value:
                    takes, got = "a list", ""
                else:
                    takes, got = f"items: {check.takes}", "an item "
                problems.append(f"field {check.name!r} is declared {check.declared} ({takes}), "
                                f"got {got}{type(bad).__name__} {shown_value(bad)}")
        dead.append(DeadLetter(operator, "SchemaMismatch: " + "; ".join(problems), record_text(record), seq))
    return kept, kept_seqs


def records_to_batch(records: list, seqs: list[int], schema: pa.Schema, operator: str,
                     dead: list[DeadLetter]) -> tuple[pa.RecordBatch, list[int]]:
    """Records as a batch of `schema`; records that do not fit become dead letters of `operator`."""
    fitting, fitting_seqs = fitting_records(records, seqs, schema, operator, dead)
    try:
        return pa.RecordBatch.from_pylist(fitting, schema=schema), fitting_seqs
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        pass
    # Some value does not convert: find the records one by one.
    kept, kept_seqs = [], []
    for record, seq in zip(fitting, fitting_seqs):
        try:
            pa.RecordBatch.from_pylist([record], schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as error:
            dead.append(DeadLetter(operator, f"SchemaMismatch: {type(error).__name__}: {error}",
                                   record_text(record), seq))
        else:
            kept.append(record)
            kept_seqs.append(seq)
    return pa.RecordBatch.from_pylist(kept, schema=schema), kept_seqs


def fitting_records(records: list, seqs: list[int], schema: pa.Schema, operator: str,
                    dead: list[DeadLetter]) -> tuple[list, list[int]]:
    """`records_to_batch`'s judgment before Arrow: the records that are mappings of exactly
    `schema`'s fields with values of their fields' types; the others become dead letters of
    `operator`. A value Arrow still cannot convert (an integer out of its field's range, text that
    is not UTF-8) is only found by building the batch."""
    if _plain_dicts_of(records, schema.names):
        fitting, fitting_seqs = records, seqs
    else:
        fitting, fitting_seqs = _mappings_of(records, seqs, set(schema.names), operator, dead)
    checks = type_checks(schema)
    if checks and fitting:
        fitting, fitting_seqs = _exact_types(fitting, fitting_seqs, checks, operator, dead)
    return fitting, fitting_seqs


def plain_dicts_of_size(records: list, size: int) -> bool:
    """Whether every record is a plain dict of `size` fields (two C-level passes, no per-record
    Python step): the shape both the batch check and the fold from dicts start from."""
    return set(map(type, records)) == {dict} and set(map(len, records)) == {size}


def _plain_dicts_of(records: list, names: Sequence[str]) -> bool:
    """Whether every record is a plain dict of exactly the fields `names` (the good path): a few
    C-level passes over the records instead of an ABC isinstance and a keys comparison each
    (about 0.3 us a record; these passes take about 0.05 per field)."""
    if not plain_dicts_of_size(records, len(names)):
        return False
    try:
        for name in names:
            deque(map(itemgetter(name), records), maxlen=0)  # KeyError: a field missing somewhere
    except KeyError:
        return False
    return True


def _mappings_of(records: list, seqs: list[int], expected: set[str], operator: str,
                 dead: list[DeadLetter]) -> tuple[list, list[int]]:
    """The records that are mappings of exactly the `expected` fields; the others dead letters."""
    fitting, fitting_seqs = [], []
    for record, seq in zip(records, seqs):
        # a dict first: the ABC's isinstance costs about as much as the rest of the loop per record
        if type(record) is not dict and not isinstance(record, Mapping):
            dead.append(DeadLetter(operator, f"TypeError: emitted a {type(record).__name__}, not a dict",
                                   record_text(record), seq))
        elif record.keys() != expected:
            extra, missing = sorted(set(record) - expected), sorted(expected - set(record))
            problems = ([f"field(s) {', '.join(map(repr, extra))} not in its schema (declare them in schema=)"] if extra else []) \
                + ([f"missing field(s) {', '.join(map(repr, missing))} (emit them, None for null)"] if missing else [])
            dead.append(DeadLetter(operator, "SchemaMismatch: record has " + "; ".join(problems),
                                   record_text(record), seq))
        else:
            fitting.append(record)
            fitting_seqs.append(seq)
    return fitting, fitting_seqs


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """The columns of `schema`, in its order and types."""
    if batch.schema.equals(schema):
        return batch
    columns = [batch.column(batch.schema.get_field_index(field.name)).cast(field.type) for field in schema]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def dead_letter_batch(dead: Sequence[DeadLetter], data_schema: pa.Schema) -> pa.RecordBatch:
    """Dead letters as rows of the carried schema: null user fields, the dead-letter columns set."""
    count = len(dead)
    columns = [pa.nulls(count, field.type) for field in data_schema]
    columns += [
        pa.array([letter.seq for letter in dead], pa.int64()),
        pa.array([letter.operator for letter in dead], pa.string()),
        pa.array([letter.error for letter in dead], pa.string()),
        pa.array([letter.record for letter in dead], pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=carried_schema(data_schema))


def live_batch(data: pa.RecordBatch, seqs: Sequence[int] | pa.Array) -> pa.RecordBatch:
    """Live rows in the carried schema: the user's fields, sequence numbers (a list, a range or an
    Arrow column: the last two without a Python int per row), null dead letters."""
    count = data.num_rows
    columns = list(data.columns) + [sequence_column(seqs)] + [pa.nulls(count, pa.string())] * 3
    return pa.RecordBatch.from_arrays(columns, schema=carried_schema(data.schema))


def sequence_column(seqs: Sequence[int] | pa.Array) -> pa.Array:
    if isinstance(seqs, pa.Array):
        return seqs if seqs.type == pa.int64() else seqs.cast(pa.int64())
    if isinstance(seqs, range) and seqs.step == 1:
        return pa.array(np.arange(seqs.start, seqs.stop, dtype=np.int64))
    return pa.array(seqs, pa.int64())


def split_dead(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, pa.RecordBatch | None]:
    """(live rows, dead-letter rows or None) of a carried batch."""
    dead_mask = batch.column(batch.schema.get_field_index(DEAD_OPERATOR)).is_valid()
    if not pc.any(dead_mask).as_py():
        return batch, None
    return batch.filter(pc.invert(dead_mask)), batch.filter(dead_mask)


def reshape_dead(dead_rows: pa.RecordBatch, data_schema: pa.Schema) -> pa.RecordBatch:
    """Dead-letter rows that came from upstream, re-emitted in this stage's carried schema."""
    internal = [dead_rows.column(dead_rows.schema.get_field_index(name)) for name in (SEQ, DEAD_OPERATOR, DEAD_ERROR, DEAD_RECORD)]
    columns = [pa.nulls(dead_rows.num_rows, field.type) for field in data_schema] + internal
    return pa.RecordBatch.from_arrays(columns, schema=carried_schema(data_schema))


def assemble(parts: Iterable[pa.RecordBatch | None], schema: pa.Schema) -> pa.RecordBatch:
    present = [part for part in parts if part is not None and part.num_rows]
    if not present:
        return pa.RecordBatch.from_pylist([], schema=schema)
    return present[0] if len(present) == 1 else pa.concat_batches(present)
