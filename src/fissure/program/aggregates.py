"""Aggregates: what a window (or a keyed running aggregate) computes over its records.

An aggregate is any object with

    create() -> acc                 a fresh accumulator
    add(acc, record) -> acc         the accumulator with one more record (a dict)
    merge(acc, acc) -> acc          two accumulators as one (session windows merge theirs)
    result(acc) -> dict             the output fields
    result_schema                   the output fields' types: a pyarrow Schema or a mapping of
                                    field name to type, or a method result_schema(input_schema)
                                    returning one (for types that follow the input's)

(Beam's CombineFn and Flink's AggregateFunction have the same shape.) Accumulators are stored in
the key's state between micro-batches, so keep them plain data: numbers, strings, lists, dicts.
`reads` (optional) names the input fields `add` reads, checked against the input's schema.

Built in: `Count()`, `Sum(field)`, `Min(field)`, `Max(field)`, `Mean(field)`. For what no fold
expresses, `Aggregate.of(fn, schema=...)` calls `fn(records)` once per window with the window's
records (its accumulator is the list of records, so it keeps them all until the window fires).
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable, Mapping

import pyarrow as pa

from fissure.program.operators import PipelineError, RecordRejected, SchemaSpec, to_arrow_schema


class Aggregate:
    """The aggregate protocol (see the module docstring); subclass it or write any object with the
    same methods."""

    reads: tuple[str, ...] = ()
    result_schema: typing.Any = None

    def create(self) -> typing.Any:
        raise NotImplementedError

    def add(self, acc: typing.Any, record: dict) -> typing.Any:
        raise NotImplementedError

    def merge(self, first: typing.Any, second: typing.Any) -> typing.Any:
        raise NotImplementedError

    def result(self, acc: typing.Any) -> dict:
        raise NotImplementedError

    @staticmethod
    def of(fn: Callable[[list], Mapping], *, schema: SchemaSpec, name: str | None = None) -> FunctionAggregate:
        """An aggregate that calls `fn(records)` once per window, when it fires, with the window's
        records (in the order they arrived: micro-batches in order, each batch's in event-time
        order); `fn` returns the result record's fields (a dict of `schema`)."""
        return FunctionAggregate(fn, schema, name)


def _value(aggregate: str, field: str, record: dict) -> typing.Any:
    value = record.get(field)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        state = "missing" if field not in record else "None" if value is None else "NaN"
        raise RecordRejected(f"NullValue: {aggregate}: field {field!r} is {state}; give it a value upstream or "
                             f"filter the record out")
    return value


def _field_type(owner: str, field: str, input_schema: pa.Schema | None, numeric_only: bool) -> pa.DataType:
    if input_schema is None or field not in input_schema.names:
        return pa.float64()
    kind = input_schema.field(field).type
    if pa.types.is_integer(kind):
        return pa.int64()
    if pa.types.is_floating(kind):
        return pa.float64()
    if not numeric_only and (pa.types.is_timestamp(kind) or pa.types.is_string(kind) or pa.types.is_date(kind)):
        return kind
    wanted = "a number" if numeric_only else "a number, a string, a date or a datetime"
    raise PipelineError(f"{owner}: field {field!r} is {kind}; it needs {wanted}: convert it in a map before")


def _field_name(owner: str, field: object) -> str:
    if not isinstance(field, str) or not field:
        raise PipelineError(f"{owner} needs the name of the field it reads, got {field!r}; e.g. {owner}('price')")
    return field


class Count(Aggregate):
    """The number of records: {"count": n}."""

    result_schema = pa.schema([("count", pa.int64())])

    def create(self) -> int:
        return 0

    def add(self, acc: int, record: dict) -> int:
        return acc + 1

    def merge(self, first: int, second: int) -> int:
        return first + second

    def result(self, acc: int) -> dict:
        return {"count": acc}

    def __repr__(self) -> str:
        return "Count()"

    def __eq__(self, other: object) -> bool:
        return type(other) is Count

    def __hash__(self) -> int:
        return hash("Count")


class _FieldAggregate(Aggregate):
    output = ""
    numeric_only = True

    def __init__(self, field: str) -> None:
        self.field = _field_name(type(self).__name__, field)
        self.reads = (self.field,)

    def result_schema(self, input_schema: pa.Schema | None) -> pa.Schema:
        return pa.schema([(self.output, _field_type(repr(self), self.field, input_schema, self.numeric_only))])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.field!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.field == self.field

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.field))


class Sum(_FieldAggregate):
    """The sum of a numeric field: {"sum": x} (an int field sums to an int)."""

    output = "sum"

    def create(self) -> int:
        return 0

    def add(self, acc, record: dict):
        return acc + _value(repr(self), self.field, record)

    def merge(self, first, second):
        return first + second

    def result(self, acc) -> dict:
        return {"sum": acc}


class Min(_FieldAggregate):
    """The smallest value of a field: {"min": x} (numbers, strings, dates, datetimes)."""

    output = "min"
    numeric_only = False

    def create(self) -> None:
        return None

    def add(self, acc, record: dict):
        value = _value(repr(self), self.field, record)
        return value if acc is None or value < acc else acc

    def merge(self, first, second):
        return second if first is None or (second is not None and second < first) else first

    def result(self, acc) -> dict:
        return {"min": acc}


class Max(_FieldAggregate):
    """The largest value of a field: {"max": x} (numbers, strings, dates, datetimes)."""

    output = "max"
    numeric_only = False

    def create(self) -> None:
        return None

    def add(self, acc, record: dict):
        value = _value(repr(self), self.field, record)
        return value if acc is None or value > acc else acc

    def merge(self, first, second):
        return second if first is None or (second is not None and second > first) else first

    def result(self, acc) -> dict:
        return {"max": acc}


class Mean(_FieldAggregate):
    """The mean of a numeric field: {"mean": x} (a float); its accumulator is [sum, count]."""

    output = "mean"

    def result_schema(self, input_schema: pa.Schema | None) -> pa.Schema:
        _field_type(repr(self), self.field, input_schema, True)
        return pa.schema([("mean", pa.float64())])

    def create(self) -> list:
        return [0, 0]

    def add(self, acc: list, record: dict) -> list:
        return [acc[0] + _value(repr(self), self.field, record), acc[1] + 1]

    def merge(self, first: list, second: list) -> list:
        return [first[0] + second[0], first[1] + second[1]]

    def result(self, acc: list) -> dict:
        return {"mean": acc[0] / acc[1] if acc[1] else None}


class FunctionAggregate(Aggregate):
    """`Aggregate.of(fn, schema=...)`: `fn(records)` over a window's records when it fires."""

    def __init__(self, fn: Callable[[list], Mapping], schema: SchemaSpec, name: str | None = None) -> None:
        if not callable(fn):
            raise PipelineError(f"Aggregate.of: {fn!r} is not callable; pass a function of the window's records")
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", None) or repr(fn)
        self.result_schema = to_arrow_schema(schema, f"Aggregate.of({self.name})")
        if self.result_schema is None:
            raise PipelineError(f"Aggregate.of({self.name}): declare schema= of the dict the function returns, e.g. "
                                f"schema={{'top': str, 'n': int}}")

    def create(self) -> list:
        return []

    def add(self, acc: list, record: dict) -> list:
        acc.append(dict(record))
        return acc

    def merge(self, first: list, second: list) -> list:
        return first + second

    def result(self, acc: list) -> dict:
        result = self.fn(list(acc))
        if not isinstance(result, Mapping):
            raise TypeError(f"Aggregate.of({self.name}): the function must return a dict of its schema's fields, got "
                            f"{type(result).__name__}")
        return dict(result)

    def __repr__(self) -> str:
        return f"Aggregate.of({self.name})"


def check_aggregate(owner: str, aggregate: object) -> None:
    """Refuse what is not an aggregate, naming the missing method and the way to build one."""
    missing = [method for method in ("create", "add", "merge", "result") if not callable(getattr(aggregate, method, None))]
    if missing or getattr(aggregate, "result_schema", None) is None:
        what = f"it lacks {', '.join(missing)}" if missing else "it declares no result_schema"
        raise PipelineError(
            f"{owner}: aggregate={aggregate!r} is not an aggregate ({what}); use Count(), Sum(field), Min(field), "
            f"Max(field), Mean(field), Aggregate.of(fn, schema={{...}}), or an object with create, add, merge, "
            f"result and result_schema")


def result_schema(owner: str, aggregate: typing.Any, input_schema: pa.Schema | None) -> pa.Schema:
    """The aggregate's declared result schema, for this input schema where its types follow it."""
    declared = aggregate.result_schema
    if callable(declared) and not isinstance(declared, (pa.Schema, Mapping)):
        declared = declared(input_schema)
    schema = to_arrow_schema(declared, f"{owner}: aggregate {aggregate!r}")
    if schema is None:
        raise PipelineError(f"{owner}: aggregate {aggregate!r} declares no result fields")
    return schema
