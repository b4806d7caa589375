"""The pipeline definition users write: a chain of named operators, each a plain Python function.

    pipeline = (
        Pipeline("logwatch")
        .map("parse", parse_line, schema={"host": str, "user": str, "ts": float}, reads=["value"])
        .filter("failures", lambda record: record["failed"])
        .partitioned("per_host", count_failures, key="host", schema={...})
        .stateful("results", keep_totals)
    )

Operator kinds (the paper's k(o)):
- stateless: `map`, `filter`, `flat_map` (one record, a dict, in), and `map_batches` /
  `filter_batches` (a whole Arrow RecordBatch or pandas DataFrame in, for speed);
- partitioned stateful: `partitioned(name, fn, key=...)`, `fn(state, record)`, one state per key;
- stateful without a key: `stateful(name, fn)`, `fn(state, record)`, one state for the stream.

A stateful function receives its state object (made by `state_factory`, `dict` by default) and
mutates it in place; it returns the records it emits: an iterable of dicts, a single dict, or
None. fissure keeps the state in Spark's state store, so it survives restarts. The state is plain
data (dicts, lists, tuples, sets, numbers, strings, bytes, datetimes, Decimal: stored as data, never
as code; fissure.runtime.state.codec), unless the operator opts in to pickle with
`state_codec="pickle"` (signed with a state key the run is given). A state that ends a batch equal
to a fresh `state_factory()` (a cleared dict) is deleted: that is how a function drops its key.

Schemas: an operator that changes the shape of its records declares `schema=` (a mapping of
field name to a Python type such as `str`, `int`, `float`, `bool`, `bytes`, `datetime`,
`list[str]`, or a pyarrow type; or a pyarrow Schema). Without it the operator emits records of
the same fields as its input. `reads=` names the input fields an operator needs, so a pipeline
that does not fit its source fails at start with the operator and the field named.

Waiting: a stateless per-record operator that waits on I/O (`waits="io"`) or runs native code
that releases the GIL (`waits="gil-free"`) says so, and runs under the in-worker elastic scheduler
on as many threads as pay off (docs/elastic-scheduler.md); its function must be thread-safe.
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

from fissure.model.types import Kind, OperatorStats
from fissure.time_methods import TimeMethods

# Planner inputs used until profiles exist: costs in microseconds per record.
DEFAULT_COST_US = 10.0
DEFAULT_SELECTIVITY = 1.0

_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
STATE_CODECS = ("data", "pickle")  # Operator.state_codec (fissure.runtime.state.codec)
# Field names that fissure uses for its own columns between Spark stages.
RESERVED_FIELD_PREFIX = "_fissure_"


class PipelineError(ValueError):
    """A pipeline definition that cannot run; the message names the operator and the fix."""


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
    time: typing.Any = None  # fissure.eventtime's role of an event-time or time-aware operator

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


def _positional_capacity(fn: Callable) -> tuple[int, int] | None:
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


def _check_arity(name: str, action: Action, fn: Callable, arguments: int) -> None:
    if not callable(fn):
        raise PipelineError(f"operator {name!r} ({action.value}): {fn!r} is not callable; pass a function")
    capacity = _positional_capacity(fn)
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


def _normalize_key(name: str, key: str | Sequence[str] | None) -> tuple[str, ...]:
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


def _normalize_reads(name: str, reads: Iterable[str] | str | None) -> tuple[str, ...]:
    if reads is None:
        return ()
    fields = (reads,) if isinstance(reads, str) else tuple(reads)
    for field_name in fields:
        if not isinstance(field_name, str) or not field_name:
            raise PipelineError(f"operator {name!r}: reads= must list field names, got {reads!r}")
    return fields


def _normalize_waits(name: str, kind: Kind, action: Action, waits: object) -> Waits | None:
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


class Pipeline(TimeMethods):
    """A chain of named operators, in the order records flow through them.

    Every builder method returns the pipeline itself, so calls chain; a definition error raises
    PipelineError at once, naming the operator and what to change.
    """

    def __init__(self, name: str = "pipeline") -> None:
        self.name = name
        self._operators: list[Operator] = []

    @classmethod
    def of_operators(cls, name: str, operators: Iterable[Operator]) -> Pipeline:
        """A pipeline of operators already built (by a Pipeline or a StreamGraph), in this order."""
        pipeline = cls(name)
        for operator in operators:
            if operator.name in pipeline.names:
                raise PipelineError(f"operator name {operator.name!r} is used twice in pipeline {name!r}")
            pipeline._operators.append(operator)
        return pipeline

    # --- stateless, per record -------------------------------------------------------------
    def map(self, name: str, fn: Callable[[dict], dict], *, schema: SchemaSpec = None,
            reads: Iterable[str] | None = None, cost_us: float | None = None,
            waits: str | None = None) -> Pipeline:
        """One record in, one record out. `waits="io"` or `"gil-free"`: see `Waits`."""
        return self._add(name, Kind.STATELESS, Action.MAP, fn, 1, schema=schema, reads=reads,
                         hints=Hints(cost_us=cost_us, waits=waits))

    def filter(self, name: str, fn: Callable[[dict], bool], *, reads: Iterable[str] | None = None,
               cost_us: float | None = None, selectivity: float | None = None,
               waits: str | None = None) -> Pipeline:
        """Keep the records for which fn returns a true value. `waits=`: see `Waits`."""
        return self._add(name, Kind.STATELESS, Action.FILTER, fn, 1, reads=reads,
                         hints=Hints(cost_us=cost_us, selectivity=selectivity, waits=waits))

    def flat_map(self, name: str, fn: Callable[[dict], Iterable[dict]], *, schema: SchemaSpec = None,
                 reads: Iterable[str] | None = None, cost_us: float | None = None,
                 selectivity: float | None = None, waits: str | None = None) -> Pipeline:
        """One record in, any number of records out (an iterable of dicts; None for none). A dict,
        a string, bytes or a non-iterable returned is a dead letter of the input record.
        `waits=`: see `Waits`."""
        return self._add(name, Kind.STATELESS, Action.FLAT_MAP, fn, 1, schema=schema, reads=reads,
                         hints=Hints(cost_us=cost_us, selectivity=selectivity, waits=waits))

    # --- stateless, per batch --------------------------------------------------------------
    def map_batches(self, name: str, fn: Callable, *, schema: SchemaSpec = None, format: str = "arrow",
                    reads: Iterable[str] | None = None, cost_us: float | None = None,
                    waits: str | None = None) -> Pipeline:
        """A whole batch in (pyarrow.RecordBatch or pandas.DataFrame), as many rows out, in order.
        (`waits=` is refused with the reason: it is for per-record operators.)"""
        return self._add(name, Kind.STATELESS, Action.MAP_BATCHES, fn, 1, schema=schema, reads=reads,
                         batch_format=self._batch_format(name, format), hints=Hints(cost_us=cost_us, waits=waits))

    def filter_batches(self, name: str, fn: Callable, *, format: str = "arrow",
                       reads: Iterable[str] | None = None, cost_us: float | None = None,
                       selectivity: float | None = None, waits: str | None = None) -> Pipeline:
        """A whole batch in; a boolean mask out (one value per row: True keeps the row)."""
        return self._add(name, Kind.STATELESS, Action.FILTER_BATCHES, fn, 1, reads=reads,
                         batch_format=self._batch_format(name, format),
                         hints=Hints(cost_us=cost_us, selectivity=selectivity, waits=waits))

    # --- stateful --------------------------------------------------------------------------
    def partitioned(self, name: str, fn: Callable[[typing.Any, dict], typing.Any], *,
                    key: str | Sequence[str] | None = None, schema: SchemaSpec = None,
                    state_factory: Callable[[], typing.Any] = dict, order_by: str | None = None,
                    reads: Iterable[str] | None = None, cost_us: float | None = None,
                    selectivity: float | None = None, max_scale: float | None = None,
                    waits: str | None = None, state_codec: str = "data", state_version: int = 1,
                    expire_after: float | None = None,
                    on_expire: Callable[[typing.Any, typing.Any], typing.Any] | None = None) -> Pipeline:
        """Partitioned stateful: fn(state, record) with one state object per value of `key`.

        Within a micro-batch a key's records arrive in source order (sequence numbers), or sorted
        by the field `order_by` (an event time, say) when given. A record whose key field is null
        or missing is a dead letter ("NullKey"): no state is kept for it. A key's state that ends
        a batch equal to a fresh `state_factory()` (e.g. `state.clear()`) is deleted.
        `state_codec`: "data" (plain data, the default) or "pickle" (any picklable object, signed
        with the run's state key: RunnerConfig(state_key=...) or FISSURE_STATE_KEY).
        `state_version`: raise it when the state's form changes; a checkpoint of another version
        is refused (docs/pipeline-api.md).

        `expire_after=SECONDS`: a key's state is dropped once the watermark passes the key's last
        event time + SECONDS (processing time where the program declares no event time), after
        `on_expire(state, key)` has emitted what it returns; a key's records then come in
        event-time order (docs/pipeline-api.md, Time).
        """
        from fissure.time_program import expiry_role

        fields = _normalize_key(name, key)
        role = expiry_role(name, expire_after, on_expire)
        if role is not None and order_by is not None:
            raise PipelineError(f"operator {name!r}: with expire_after= a key's records come in event-time order; "
                                f"leave out order_by={order_by!r}")
        return self._add(name, Kind.PARTITIONED, Action.UPDATE, fn, 2, key=fields, schema=schema,
                         reads=reads, state_factory=self._state_factory(name, state_factory), order_by=order_by,
                         hints=Hints(cost_us=cost_us, selectivity=selectivity, max_scale=max_scale, waits=waits),
                         state_codec=state_codec, state_version=state_version, time=role)

    def stateful(self, name: str, fn: Callable[[typing.Any, dict], typing.Any], *,
                 schema: SchemaSpec = None, state_factory: Callable[[], typing.Any] = dict,
                 order_by: str | None = None, reads: Iterable[str] | None = None,
                 cost_us: float | None = None, selectivity: float | None = None,
                 waits: str | None = None, state_codec: str = "data", state_version: int = 1) -> Pipeline:
        """Stateful without a key: fn(state, record) with one state object for the whole stream
        (`state_codec` and `state_version` as for `partitioned`)."""
        return self._add(name, Kind.STATEFUL, Action.UPDATE, fn, 2, schema=schema, reads=reads,
                         state_factory=self._state_factory(name, state_factory), order_by=order_by,
                         hints=Hints(cost_us=cost_us, selectivity=selectivity, waits=waits), state_codec=state_codec,
                         state_version=state_version)

    # --- reading the definition ------------------------------------------------------------
    @property
    def operators(self) -> tuple[Operator, ...]:
        return tuple(self._operators)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(operator.name for operator in self._operators)

    def operator(self, name: str) -> Operator:
        for operator in self._operators:
            if operator.name == name:
                return operator
        raise PipelineError(f"pipeline {self.name!r} has no operator {name!r}; it has {', '.join(self.names)}")

    def kind_of(self, name: str) -> Kind:
        return self.operator(name).kind

    def key_of(self, name: str) -> tuple[str, ...] | None:
        return self.operator(name).key

    def __len__(self) -> int:
        return len(self._operators)

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r}: {' -> '.join(self.names) or 'empty'})"

    def check_not_empty(self) -> None:
        if not self._operators:
            raise PipelineError(f"pipeline {self.name!r} has no operator; add one with .map(...), .filter(...), ...")

    def operator_stats(self, estimates: Mapping[str, OperatorEstimate] | None = None) -> list[OperatorStats]:
        """The planner's input: per operator, the estimate if given, else the hints, else defaults.

        Defaults: DEFAULT_COST_US per record, selectivity DEFAULT_SELECTIVITY (a filter without a
        hint counts as 1.0: the planner then over-provisions what follows it, never under).
        """
        self.check_not_empty()
        estimates = estimates or {}
        unknown = sorted(set(estimates) - set(self.names))
        if unknown:
            raise PipelineError(f"estimates name operators the pipeline does not have: {', '.join(unknown)}")
        from fissure.combine_policy import combine_decision  # it imports aggregates, which import this module

        stats = []
        for operator in self._operators:
            estimate = estimates.get(operator.name)
            hints = operator.hints
            if estimate is not None:
                cost_us, selectivity = estimate.cost_us, estimate.selectivity
            else:
                cost_us = DEFAULT_COST_US if hints.cost_us is None else hints.cost_us
                selectivity = DEFAULT_SELECTIVITY if hints.selectivity is None else hints.selectivity
            stats.append(OperatorStats(name=operator.name, kind=operator.kind, cost_us=cost_us,
                                       selectivity=selectivity, key=operator.key, max_scale=hints.max_scale,
                                       combined=combine_decision(operator, sole_reader=True).combine))
        return stats

    # --- building ----------------------------------------------------------------------------
    @staticmethod
    def _batch_format(name: str, format: str) -> BatchFormat:
        try:
            return BatchFormat(format)
        except ValueError:
            raise PipelineError(f"operator {name!r}: format must be 'arrow' or 'pandas', got {format!r}") from None

    @staticmethod
    def _state_factory(name: str, factory: Callable[[], typing.Any]) -> Callable[[], typing.Any]:
        if not callable(factory):
            raise PipelineError(f"operator {name!r}: state_factory must be callable (e.g. dict), got {factory!r}")
        return factory

    def _add(self, name: str, kind: Kind, action: Action, fn: Callable, arguments: int, *,
             key: tuple[str, ...] | None = None, schema: SchemaSpec = None, reads=None,
             batch_format: BatchFormat | None = None, state_factory=None, order_by: str | None = None,
             hints: Hints = Hints(), state_codec: str = "data", state_version: int = 1,
             time: typing.Any = None) -> Pipeline:
        if not isinstance(name, str) or not _NAME_PATTERN.match(name):
            raise PipelineError(
                f"operator name {name!r} ({action.value} {getattr(fn, '__qualname__', fn)!r}) is not valid; "
                f"use letters, digits, '_' or '-', starting with a letter or '_'"
            )
        if name in self.names:
            raise PipelineError(f"operator name {name!r} is used twice in pipeline {self.name!r}; give each operator its own name")
        if arguments:
            _check_arity(name, action, fn, arguments)
        for label, value in (("cost_us", hints.cost_us), ("selectivity", hints.selectivity)):
            if value is not None and not value >= 0:
                raise PipelineError(f"operator {name!r}: {label} must be a number >= 0, got {value!r}")
        if order_by is not None and (not isinstance(order_by, str) or not order_by):
            raise PipelineError(f"operator {name!r}: order_by must name one field, got {order_by!r}")
        if hints.max_scale is not None and not hints.max_scale >= 1:
            raise PipelineError(f"operator {name!r}: max_scale must be >= 1, got {hints.max_scale!r}")
        hints = replace(hints, waits=_normalize_waits(name, kind, action, hints.waits))
        if state_codec not in STATE_CODECS:
            raise PipelineError(f"operator {name!r}: state_codec must be \"data\" (plain data, the default) or "
                                f"\"pickle\" (any picklable object, signed with the run's state key), got {state_codec!r}")
        check_state_version(f"operator {name!r}", state_version)
        operator = Operator(
            name=name, kind=kind, action=action, fn=fn, key=key,
            schema=to_arrow_schema(schema, f"operator {name!r}"), reads=_normalize_reads(name, reads),
            batch_format=batch_format, state_factory=state_factory, order_by=order_by, hints=hints,
            state_codec=state_codec, state_version=state_version, time=time,
        )
        if time is not None:
            self._check_time(operator)
        self._operators.append(operator)
        return self

    def _check_time(self, operator: Operator) -> None:
        """A chain knows what is upstream of the operator it adds: check its event time now."""
        from fissure.time_program import check_chain_declarations

        check_chain_declarations(self.name, self._operators, operator)


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


def output_schemas(pipeline: Pipeline, source_schema: pa.Schema) -> dict[str, pa.Schema]:
    """Each operator's output schema, checking that every operator gets the fields it reads.

    Raises PipelineError naming the operator and the missing or reserved field.
    """
    pipeline.check_not_empty()
    for name in source_schema.names:
        if name.startswith(RESERVED_FIELD_PREFIX):
            raise PipelineError(f"the source has a field {name!r}; the prefix {RESERVED_FIELD_PREFIX!r} is reserved by fissure")
    from fissure.time_program import chain_time, output_schema

    schemas: dict[str, pa.Schema] = {}
    upstream, upstream_label = source_schema, "the source"
    for operator in pipeline.operators:
        check_operator_fields(operator, upstream, f"its input from {upstream_label}")
        schemas[operator.name] = output_schema(operator, upstream)
        upstream, upstream_label = schemas[operator.name], f"operator {operator.name!r}"
    chain_time(pipeline.operators, schemas, source_schema)
    return schemas
