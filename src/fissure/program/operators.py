"""One operator of a program, as every face of the program model builds it (`fissure.Pipeline`,
a StreamGraph's streams): what its function does (`Action`), its declared schema, its hints to
the planner and its state; and the two errors of the model: a program that cannot run
(`PipelineError`) and fissure's own verdict on one record (`RecordRejected`). The bottom of
fissure.program: it imports none of the package's other modules.

Schemas: an operator that changes the shape of its records declares `schema=` (a mapping of
field name to a Python type such as `str`, `int`, `float`, `bool`, `bytes`, `datetime`,
`list[str]`, or a pyarrow type; or a pyarrow Schema). Without it the operator emits records of
the same fields as its input. `reads=` names the input fields an operator needs, so a program
that does not fit its source fails at start with the operator and the field named.
"""

from __future__ import annotations

import datetime
import inspect
import re
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

import pyarrow as pa

from fissure.model.types import Kind

# Planner inputs used until profiles exist: costs in microseconds per record.
DEFAULT_COST_US = 10.0
DEFAULT_SELECTIVITY = 1.0

NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")  # operator, source, sink and graph names
STATE_CODECS = ("data", "pickle")  # Operator.state_codec (fissure.runtime.state.codec)
# Field names that fissure uses for its own columns between Spark stages.
RESERVED_FIELD_PREFIX = "_fissure_"


class PipelineError(ValueError):
    """A program definition that cannot run; the message names the operator and the fix."""


class RecordRejected(ValueError):
    """fissure's own verdict on a record (no event time, a null value an aggregate needs): its
    message is the whole dead-letter reason, `Reason: what is wrong; the fix`, with no frame."""


def shown_value(value: object) -> str:
    """A value's repr for an error message, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Action(str, Enum):
    """What an operator's function does with its input."""

    MAP = "map"  # record -> record
    FILTER = "filter"  # record -> bool
    FLAT_MAP = "flat_map"  # record -> iterable of records
    MAP_BATCHES = "map_batches"  # batch -> batch of the same length
    FILTER_BATCHES = "filter_batches"  # batch -> boolean mask
    UPDATE = "update"  # (state, record) -> records emitted; stateful kinds only
    WINDOW = "window"  # a key's records into event-time windows, an aggregate per window (fn: the aggregate)
    AGGREGATE = "aggregate"  # a running aggregate per key (fn: the aggregate)
    DEDUPLICATE = "deduplicate"  # a key's first record within some seconds of event time passes


class Waits(str, Enum):
    """What a stateless per-record operator declared with `waits=` spends its time on. Such an
    operator runs under the in-worker elastic scheduler: several threads call its function at once
    (it must be thread-safe), as many as pay off, results in input order."""

    IO = "io"  # waits on I/O (a web service, a remote store, files): threads help even with the GIL
    GIL_FREE = "gil-free"  # native code that releases the GIL (NumPy, compression, hashing)


class BatchFormat(str, Enum):
    """How a per-batch operator receives its batch."""

    ARROW = "arrow"  # pyarrow.RecordBatch
    PANDAS = "pandas"  # pandas.DataFrame


SchemaSpec = typing.Union[pa.Schema, Mapping[str, typing.Any], None]

_PYTHON_TYPES: dict[typing.Any, pa.DataType] = {
    str: pa.string(),
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
    bytes: pa.binary(),
    datetime.datetime: pa.timestamp("us", tz="UTC"),
    datetime.date: pa.date32(),
}


def arrow_type(python_type: typing.Any, where: str) -> pa.DataType:
    """The Arrow type for a field's declared type (a Python type, `list[T]` or an Arrow type)."""
    if isinstance(python_type, pa.DataType):
        return python_type
    if python_type in _PYTHON_TYPES:
        return _PYTHON_TYPES[python_type]
    if typing.get_origin(python_type) is list:
        (item_type,) = typing.get_args(python_type) or (None,)
        if item_type is not None:
            return pa.list_(arrow_type(item_type, where))
    supported = ", ".join(sorted(t.__name__ for t in _PYTHON_TYPES)) + ", list[T] or a pyarrow type"
    raise PipelineError(f"{where}: unsupported field type {python_type!r}; use one of {supported}")


def to_arrow_schema(spec: SchemaSpec, where: str) -> pa.Schema | None:
    """Normalize a declared schema to a pyarrow Schema (None stays None: fields pass through)."""
    if spec is None or isinstance(spec, pa.Schema):
        schema = spec
    elif isinstance(spec, Mapping):
        schema = pa.schema([pa.field(name, arrow_type(kind, f"{where}, field {name!r}")) for name, kind in spec.items()])
    else:
        raise PipelineError(f"{where}: schema must be a mapping of field name to type or a pyarrow Schema, got {spec!r}")
    if schema is not None:
        if len(schema) == 0:
            raise PipelineError(f"{where}: schema declares no field")
        for name in schema.names:
            if name.startswith(RESERVED_FIELD_PREFIX):
                raise PipelineError(f"{where}: field {name!r} uses the prefix {RESERVED_FIELD_PREFIX!r} that fissure reserves")
    return schema


@dataclass(frozen=True)
class Hints:
    """What the user tells the planner about an operator before profiles exist."""

    cost_us: float | None = None  # CPU time per input record
    selectivity: float | None = None  # output records per input record
    max_scale: float | None = None  # bound u of the bounded-linear scalability; None: linear
    waits: Waits | None = None  # declared waiting: runs under the in-worker elastic scheduler


@dataclass(frozen=True)
class Operator:
    """One named step of a pipeline and everything the Spark runner needs to run it."""

    name: str
    kind: Kind
    action: Action
    fn: Callable
    key: tuple[str, ...] | None = None
    schema: pa.Schema | None = None  # declared output schema; None: same fields as the input
    reads: tuple[str, ...] = ()
    batch_format: BatchFormat | None = None  # per-batch operators only
    state_factory: Callable[[], typing.Any] | None = None  # stateful kinds only
    order_by: str | None = None  # stateful kinds: field a key's records are sorted by in a batch
    hints: Hints = field(default_factory=Hints)
    state_codec: str = "data"  # stateful kinds: "data" (MessagePack) or "pickle" (signed with the run's state key)
    state_version: int = 1  # stateful kinds: raised when the state's form changes (checkpoints record it)
    time: typing.Any = None  # fissure.program.eventtime's role of an event-time or time-aware operator

    @property
    def functions(self) -> tuple[typing.Any, ...]:
        """Every object of the user's this operator calls, to ship and check before a run: its
        function (a window's or aggregate's: the aggregate), state_factory, on_expire, and the
        function an `Aggregate.of` wraps."""
        found = [self.fn, self.state_factory, getattr(self.time, "on_expire", None),
                 getattr(getattr(self.time, "aggregate", None), "fn", None)]
        return tuple(item for item in dict.fromkeys(found) if item is not None and item is not self.time)

    @property
    def per_key(self) -> bool:
        """Runs once per key and micro-batch over the key's records (windows, aggregates,
        deduplication, expiry), not once per record."""
        return self.time is not None and self.kind is Kind.PARTITIONED

    @property
    def per_batch(self) -> bool:
        return self.action in (Action.MAP_BATCHES, Action.FILTER_BATCHES)

    @property
    def callable_name(self) -> str:
        return getattr(self.fn, "__qualname__", None) or repr(self.fn)

    def describe(self) -> str:
        """`name (kind action fn)`, for error messages and listings."""
        key = f" key={','.join(self.key)}" if self.key else ""
        waits = f" waits={self.hints.waits.value}" if self.hints.waits else ""
        return f"{self.name} ({self.kind.value} {self.action.value} {self.callable_name}{key}{waits})"


@dataclass(frozen=True)
class OperatorEstimate:
    """Measured or assumed cost and selectivity of one operator (from a profile, later)."""

    cost_us: float
    selectivity: float


def positional_capacity(fn: Callable) -> tuple[int, int] | None:
    """(required, maximum) positional parameters of fn; maximum -1 means *args; None: unknown."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    required = maximum = 0
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            maximum += 1
            if parameter.default is parameter.empty:
                required += 1
        elif parameter.kind is parameter.VAR_POSITIONAL:
            maximum = -1
        elif parameter.kind is parameter.KEYWORD_ONLY and parameter.default is parameter.empty:
            return (99, -1)  # a required keyword-only argument can never be supplied
    return required, maximum


_ARITY_HINTS = {
    1: "it must take exactly one argument: the record (a dict) or, per batch, the batch",
    2: "it must take exactly two arguments: the state object and the record (a dict)",
}


def check_arity(name: str, action: Action, fn: Callable, arguments: int) -> None:
    if not callable(fn):
        raise PipelineError(f"operator {name!r} ({action.value}): {fn!r} is not callable; pass a function")
    capacity = positional_capacity(fn)
    if capacity is None:
        return
    required, maximum = capacity
    if required <= arguments and (maximum == -1 or maximum >= arguments):
        return
    shown = getattr(fn, "__qualname__", repr(fn))
    try:
        parameters = str(inspect.signature(fn))
    except (TypeError, ValueError):
        parameters = "(...)"
    raise PipelineError(
        f"operator {name!r} ({action.value}): {shown}{parameters} cannot be called with "
        f"{arguments} argument{'s' if arguments > 1 else ''}; {_ARITY_HINTS[arguments]}"
    )


def normalize_key(name: str, key: str | Sequence[str] | None) -> tuple[str, ...]:
    if key is not None and not isinstance(key, str) and (
            isinstance(key, (bytes, bytearray)) or not isinstance(key, Sequence)):
        raise PipelineError(
            f"operator {name!r}: key must be a field name (a string) or a list of field names, got "
            f"{type(key).__name__} {key!r}; e.g. key='host' or key=['host', 'user']")
    if key is not None and not isinstance(key, str):
        key = tuple(key)
    if key is None or (not isinstance(key, str) and len(key) == 0) or key == "":
        raise PipelineError(
            f"operator {name!r} is partitioned stateful but has no key; pass key='field' (or a list of "
            f"fields) to partition its state, or use .stateful(...) for one state over the whole stream"
        )
    fields = (key,) if isinstance(key, str) else tuple(key)
    for field_name in fields:
        if not isinstance(field_name, str) or not field_name:
            raise PipelineError(f"operator {name!r}: key fields must be non-empty strings, got {key!r}")
    if len(set(fields)) != len(fields):
        raise PipelineError(f"operator {name!r}: key {fields} names a field twice")
    return fields


def normalize_reads(name: str, reads: Iterable[str] | str | None) -> tuple[str, ...]:
    if reads is None:
        return ()
    fields = (reads,) if isinstance(reads, str) else tuple(reads)
    for field_name in fields:
        if not isinstance(field_name, str) or not field_name:
            raise PipelineError(f"operator {name!r}: reads= must list field names, got {reads!r}")
    return fields


def normalize_waits(name: str, kind: Kind, action: Action, waits: object) -> Waits | None:
    """The declared `waits=`, checked: only stateless per-record operators can run on threads."""
    if waits is None:
        return None
    if kind is not Kind.STATELESS:
        what = "partitioned stateful" if kind is Kind.PARTITIONED else "stateful"
        raise PipelineError(
            f"operator {name!r} is {what}: waits={waits!r} would call its function on several threads "
            f"at once, which breaks the order in which it sees its records and races on its state; "
            f"move the waiting (the lookup, the call) into a stateless map, filter or flat_map before it and "
            f"declare waits= there")
    if action in (Action.MAP_BATCHES, Action.FILTER_BATCHES):
        raise PipelineError(
            f"operator {name!r} ({action.value}): waits= is for per-record operators (map, filter, flat_map); "
            f"a per-batch operator gets one call per Arrow batch, so threads would have no other call to run "
            f"beside it; declare a per-record operator with waits=, or release the GIL inside the batch function")
    try:
        return Waits(waits)
    except ValueError:
        raise PipelineError(
            f"operator {name!r}: waits must be 'io' (it waits on I/O: a service, a store, files) or 'gil-free' "
            f"(its native code releases the GIL), got {waits!r}; leave it out for pure Python work, which "
            f"threads do not speed up") from None


def check_state_version(where: str, version: object) -> None:
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise PipelineError(f"{where}: state_version must be a whole number >= 1 (raise it when the state's form "
                            f"changes), got {version!r}")


def check_operator_fields(operator: Operator, upstream: pa.Schema, input_description: str) -> None:
    """Refuse an operator that reads, is keyed on or is ordered by a field its input lacks."""
    needed = list(operator.reads) + list(operator.key or ()) + ([operator.order_by] if operator.order_by else [])
    for field_name in needed:
        if field_name not in upstream.names:
            role = ("is keyed on" if operator.key and field_name in operator.key else
                    "is ordered by" if field_name == operator.order_by else "reads")
            raise PipelineError(
                f"operator {operator.name!r} ({operator.callable_name}) {role} field {field_name!r}, "
                f"but {input_description} has only {', '.join(upstream.names)}; "
                f"rename the field upstream or declare it in the schema= of an earlier operator"
            )


def check_operator_name(name: object, action: Action, fn: object) -> None:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise PipelineError(
            f"operator name {name!r} ({action.value} {getattr(fn, '__qualname__', fn)!r}) is not valid; "
            f"use letters, digits, '_' or '-', starting with a letter or '_'"
        )


def batch_format_of(name: str, format: str) -> BatchFormat:
    try:
        return BatchFormat(format)
    except ValueError:
        raise PipelineError(f"operator {name!r}: format must be 'arrow' or 'pandas', got {format!r}") from None


def checked_state_factory(name: str, factory: Callable[[], typing.Any]) -> Callable[[], typing.Any]:
    if not callable(factory):
        raise PipelineError(f"operator {name!r}: state_factory must be callable (e.g. dict), got {factory!r}")
    return factory


def build_operator(name: str, kind: Kind, action: Action, fn: Callable, arguments: int, *,
                   key: tuple[str, ...] | None = None, schema: SchemaSpec = None, reads=None,
                   batch_format: BatchFormat | None = None, state_factory=None, order_by: str | None = None,
                   hints: Hints = Hints(), state_codec: str = "data", state_version: int = 1,
                   time: typing.Any = None) -> Operator:
    """The operator, every argument checked (PipelineError naming the operator and the fix);
    `arguments`: how many positional arguments its function takes (0: not checked). Its name's
    form is `check_operator_name`'s, its place in a program the program's."""
    if arguments:
        check_arity(name, action, fn, arguments)
    for label, value in (("cost_us", hints.cost_us), ("selectivity", hints.selectivity)):
        if value is not None and not value >= 0:
            raise PipelineError(f"operator {name!r}: {label} must be a number >= 0, got {value!r}")
    if order_by is not None and (not isinstance(order_by, str) or not order_by):
        raise PipelineError(f"operator {name!r}: order_by must name one field, got {order_by!r}")
    if hints.max_scale is not None and not hints.max_scale >= 1:
        raise PipelineError(f"operator {name!r}: max_scale must be >= 1, got {hints.max_scale!r}")
    hints = replace(hints, waits=normalize_waits(name, kind, action, hints.waits))
    if state_codec not in STATE_CODECS:
        raise PipelineError(f"operator {name!r}: state_codec must be \"data\" (plain data, the default) or "
                            f"\"pickle\" (any picklable object, signed with the run's state key), got {state_codec!r}")
    check_state_version(f"operator {name!r}", state_version)
    return Operator(
        name=name, kind=kind, action=action, fn=fn, key=key,
        schema=to_arrow_schema(schema, f"operator {name!r}"), reads=normalize_reads(name, reads),
        batch_format=batch_format, state_factory=state_factory, order_by=order_by, hints=hints,
        state_codec=state_codec, state_version=state_version, time=time,
    )
