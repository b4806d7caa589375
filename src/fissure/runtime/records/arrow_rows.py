"""Arrow columns as the Python values operators receive (no pyspark here).

`pyarrow.Array.to_pylist` builds a scalar object per value before it asks it for its Python
value; NumPy's conversion of the same column followed by `tolist` is about an order of magnitude
faster for short strings and for int64 (PyArrow 22; to see it on a machine at hand:
`./dev python -m timeit -s "import pyarrow as pa; a = pa.array([str(i) for i in range(10000)])"
"a.to_pylist()"`, then the same with `"a.to_numpy(zero_copy_only=False).tolist()"`). On LogWatch
that conversion was a large share of its parsing operator's own time. So a column of a
type whose NumPy values become exactly the Python values `to_pylist` gives (strings with or
without nulls; integers, floats and booleans without nulls) goes through NumPy; any other column
(timestamps, dates, decimals, binary, lists, structs, dictionaries, numbers with nulls) through
`to_pylist`.
"""

from __future__ import annotations

import pyarrow as pa


def _through_numpy(array: pa.Array) -> bool:
    kind = array.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return True  # nulls become None in NumPy's object array too
    return array.null_count == 0 and (pa.types.is_integer(kind) or pa.types.is_float32(kind)
                                      or pa.types.is_float64(kind) or pa.types.is_boolean(kind))


def column_values(array: pa.Array | pa.ChunkedArray) -> list:
    """The column's values as Python objects, equal to `array.to_pylist()`."""
    if isinstance(array, pa.ChunkedArray):
        return [value for chunk in array.chunks for value in column_values(chunk)]
    if _through_numpy(array):
        return array.to_numpy(zero_copy_only=False).tolist()
    return array.to_pylist()


def batch_records(batch: pa.RecordBatch) -> list[dict]:
    """The batch's rows as dicts of field name to value, equal to `batch.to_pylist()`."""
    names = batch.schema.names
    if not names:
        return [{} for _ in range(batch.num_rows)]
    columns = [column_values(column) for column in batch.columns]
    if len(names) == 1:
        (name,), (values,) = names, columns
        return [{name: value} for value in values]
    return [dict(zip(names, row)) for row in zip(*columns)]
