"""Arrow columns as Python values: the same values and types as pyarrow's to_pylist, faster."""

from __future__ import annotations

import datetime
import decimal

import pyarrow as pa
import pytest

from fissure.runtime.records.arrow_rows import batch_records, column_values

COLUMNS = [
    pa.array(["a", None, "\u00fc", ""]), pa.array(["x", None], pa.large_string()),
    pa.array([1, -2, 2 ** 63 - 1], pa.int64()), pa.array([1, None], pa.int64()), pa.array([2 ** 64 - 1], pa.uint64()),
    pa.array([1, 2, 3, 4], pa.int8()).slice(2), pa.array([1.5, float("inf")]), pa.array([1.5, None]),
    pa.array([0.1], pa.float32()), pa.array([True, False]), pa.array([True, None]),
    pa.array([datetime.datetime(2020, 1, 1, 12)]), pa.array([datetime.date(2020, 1, 1)]), pa.array([b"x", None]),
    pa.array([[1, 2], None]), pa.array([decimal.Decimal("1.5")]), pa.array(["a", "b", "a"]).dictionary_encode(),
    pa.array(["a", "b", "c", "d"]).slice(1, 2), pa.chunked_array([[1, 2], [3]]), pa.array([], pa.string()),
]


@pytest.mark.parametrize("column", COLUMNS, ids=lambda column: str(column.type))
def test_a_column_gives_the_values_and_types_to_pylist_gives(column):
    values, expected = column_values(column), column.to_pylist()
    assert values == expected
    assert [type(value) for value in values] == [type(value) for value in expected]


def test_a_nan_stays_a_float_nan():
    (value,) = column_values(pa.array([float("nan")]))
    assert isinstance(value, float) and value != value


def test_a_batch_gives_the_records_to_pylist_gives():
    batch = pa.RecordBatch.from_pydict({"n": [1, None, 3], "word": ["a", "b", None], "x": [0.5, 1.0, 2.0]})
    assert batch_records(batch) == batch.to_pylist()
    assert batch_records(batch.select(["word"])) == batch.select(["word"]).to_pylist()
    assert batch_records(pa.RecordBatch.from_pydict({"n": pa.array([], pa.int64())})) == []
