"""Time in the program model: the checks and schemas of event time, windows, aggregates,
deduplication and expiry, for chains and graphs alike (no pyspark, no worker code).

- Every `window` and `deduplicate` needs an event-time declaration upstream (`event_time(...)`);
  an `aggregate` or `partitioned` operator with `expire_after` uses it when there is one, else the
  micro-batch's processing time. The event-time field must reach the operator (its input schema has
  it) as a number or a datetime.
- What follows a window has `window_end` as its event time (a later `event_time(...)` re-declares).
- One lateness per program: every declaration gives the same.
- A window emits the key fields, `window_start`, `window_end` (floats, seconds) and the aggregate's
  result fields; an aggregate without window the key fields and the result fields.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from fissure.program.aggregates import check_aggregate, result_schema
from fissure.program.eventtime import (AggregateRole, DeduplicateRole, EventTimeRole, ExpiryRole, WindowRole,
                               seconds_option)
from fissure.program.joins import TumblingWindow
from fissure.program.nodes import NodeKind
from fissure.program.operators import Operator, PipelineError, positional_capacity
from fissure.program.windows import Tumbling, Window

WINDOW_START, WINDOW_END = "window_start", "window_end"


@dataclass(frozen=True)
class Declaration:
    """The event time a stream carries: its field, the program's lateness, who declared it."""
    field: str
    lateness: float
    by: str  # the event_time operator, or the window whose window_end it is


@dataclass(frozen=True)
class Conflict:
    """Streams merged (a union, a join) whose event times differ: no event time downstream."""
    reason: str


Resolved = typing.Union[Declaration, Conflict, None]


@dataclass(frozen=True)
class TimeLayout:
    """What running a program's time needs: per time-aware operator the event-time field it reads
    (None: processing time), the program's lateness (None: no event time declared) and its horizon:
    the longest chain of window sizes, gaps, `within`s and `expire_after`s along any path, which
    end of input adds to the largest event time so that every window and expiry fires."""

    fields: Mapping[str, str | None] = field(default_factory=dict)
    lateness: float | None = None
    horizon: float = 0.0

    @property
    def time_aware(self) -> tuple[str, ...]:
        return tuple(self.fields)


def passed_on(operator: Operator, upstream: Resolved) -> Resolved:
    """The event time of an operator's output, given its input's."""
    role = operator.time
    if isinstance(role, EventTimeRole):
        return Declaration(role.field, role.lateness, operator.name)
    if isinstance(role, WindowRole) and isinstance(upstream, Declaration):
        return Declaration(WINDOW_END, upstream.lateness, operator.name)
    return upstream


def _lateness_conflict(operator: Operator, earlier: float, where: str) -> PipelineError:
    return PipelineError(
        f"operator {operator.name!r} declares event time with lateness {operator.time.lateness:g} s, but {where} "
        f"declares {earlier:g} s; a program has one watermark, hence one lateness: give every .event_time(...) the "
        f"same lateness=")


def check_time_operator(operator: Operator, upstream: Resolved, schema: pa.Schema | None,
                        input_description: str) -> str | None:
    """Check a time-aware (or event-time) operator against the event time and schema of its input;
    returns the event-time field it reads (None: processing time, or not time-aware)."""
    role = operator.time
    if role is None:
        return None
    if isinstance(role, EventTimeRole):
        _check_time_type(operator, role.field, schema, input_description, f"operator {operator.name!r}")
        return None
    if not role.time_aware:
        return None
    if isinstance(upstream, Conflict):
        if role.needs_event_time:
            raise PipelineError(f"operator {operator.name!r} needs event time, but {upstream.reason}; declare "
                                f".event_time(...) after the merge, on the merged stream")
        upstream = None
    if upstream is None:
        if role.needs_event_time:
            kind = "window" if isinstance(role, WindowRole) else "deduplicate"
            raise PipelineError(
                f"operator {operator.name!r} ({kind}) needs event time, and none is declared upstream of it; "
                f"declare which field holds each record's event time before it: .event_time('ts', lateness=5.0) "
                f"(seconds as an int or float, or a datetime)")
        return None
    window = getattr(role, "window", None)
    if isinstance(window, TumblingWindow) and (window.time_field, window.lateness) != (upstream.field,
                                                                                        upstream.lateness):
        raise PipelineError(
            f"operator {operator.name!r}: window=TumblingWindow({window.time_field!r}, {window.size:g}, lateness="
            f"{window.lateness:g}) disagrees with the event time declared by {upstream.by!r} ({upstream.field!r}, "
            f"lateness {upstream.lateness:g}); use window=Tumbling({window.size:g}), which takes the declared event "
            f"time")
    if schema is not None and upstream.field not in schema.names:
        after = ("a window's output has window_end as its event time; " if upstream.field == WINDOW_END else "")
        raise PipelineError(
            f"operator {operator.name!r} reads the event-time field {upstream.field!r} declared by "
            f"{upstream.by!r}, but {input_description} has only {', '.join(schema.names)}; {after}keep the field in "
            f"the schema= of the operators between, or declare .event_time(...) again before {operator.name!r}")
    _check_time_type(operator, upstream.field, schema, input_description, f"operator {upstream.by!r}")
    return upstream.field


def _check_time_type(operator: Operator, field_name: str, schema: pa.Schema | None, input_description: str,
                     declarer: str) -> None:
    if schema is None or field_name not in schema.names:
        return
    kind = schema.field(field_name).type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_timestamp(kind)
            or pa.types.is_null(kind)):
        raise PipelineError(
            f"the event-time field {field_name!r} ({declarer}) of {input_description} is {kind}; event time is "
            f"seconds (int or float) or a datetime: convert it in a map before {operator.name!r}")


def output_schema(operator: Operator, upstream: pa.Schema | None) -> pa.Schema | None:
    """An operator's output schema: declared, derived (windows, aggregates) or its input's."""
    role = operator.time
    if isinstance(role, (WindowRole, AggregateRole)):
        if upstream is None:
            return None
        owner = f"operator {operator.name!r}"
        fields = [upstream.field(name) for name in operator.key]
        if isinstance(role, WindowRole):
            fields += [pa.field(WINDOW_START, pa.float64()), pa.field(WINDOW_END, pa.float64())]
        results = result_schema(owner, role.aggregate, upstream)
        taken = {item.name for item in fields}
        for item in results:
            if item.name in taken:
                raise PipelineError(
                    f"{owner}: its aggregate {role.aggregate!r} emits a field {item.name!r}, which the output "
                    f"already has ({', '.join(sorted(taken))}); rename the key field upstream, or the aggregate's "
                    f"result field")
        return pa.schema(fields + list(results))
    return operator.schema if operator.schema is not None else upstream


def chain_declaration(operators: Iterable[Operator]) -> Resolved:
    """The event time at the end of a chain of operators."""
    resolved: Resolved = None
    for operator in operators:
        resolved = passed_on(operator, resolved)
    return resolved


def check_chain_declarations(pipeline_name: str, operators: Iterable[Operator], added: Operator) -> None:
    """At the call that adds `added` to a chain: one lateness, and event time for what needs it."""
    resolved: Resolved = None
    for operator in operators:
        if isinstance(operator.time, EventTimeRole) and isinstance(added.time, EventTimeRole) \
                and operator.time.lateness != added.time.lateness:
            raise _lateness_conflict(added, operator.time.lateness, f"operator {operator.name!r}")
        resolved = passed_on(operator, resolved)
    check_time_operator(added, resolved, None, f"its input in pipeline {pipeline_name!r}")


def chain_time(operators: typing.Sequence[Operator], schemas: Mapping[str, pa.Schema | None],
               source_schema: pa.Schema | None) -> TimeLayout:
    """A chain's time layout, checking each time-aware operator against its input's schema."""
    resolved: Resolved = None
    fields: dict[str, str | None] = {}
    lateness = None
    horizon = total = 0.0
    upstream, label = source_schema, "its input from the source"
    for operator in operators:
        role = operator.time
        if isinstance(role, EventTimeRole):
            if lateness is not None and lateness != role.lateness:
                raise _lateness_conflict(operator, lateness, "an earlier operator")
            lateness = role.lateness
        reads = check_time_operator(operator, resolved, upstream, label)
        if role is not None and role.time_aware:
            fields[operator.name] = reads
            total += role.horizon
            horizon = max(horizon, total)
        resolved = passed_on(operator, resolved)
        upstream, label = schemas.get(operator.name), f"its input from operator {operator.name!r}"
    return TimeLayout(fields, lateness, horizon)


def graph_time(graph, order: typing.Sequence[str], schemas: Mapping[str, pa.Schema | None]) -> TimeLayout:
    """A graph's time layout (`StreamGraph.check`), checking each time-aware operator; a union or
    join passes event time on only where all its inputs carry the same field."""
    resolved: dict[str, Resolved] = {}
    paths: dict[str, float] = {}
    fields: dict[str, str | None] = {}
    lateness: tuple[float, str] | None = None
    for name in order:
        node = graph.node(name)
        inputs = [resolved[source] for source in node.inputs]
        path = max((paths[source] for source in node.inputs), default=0.0)
        if node.kind is NodeKind.SOURCE:
            resolved[name] = None
        elif node.kind in (NodeKind.UNION, NodeKind.JOIN):
            resolved[name] = _merged(node, inputs)
        else:
            operator = node.operator
            role = operator.time
            if isinstance(role, EventTimeRole):
                if lateness is not None and lateness[0] != role.lateness:
                    raise _lateness_conflict(operator, lateness[0], f"operator {lateness[1]!r}")
                lateness = (role.lateness, operator.name)
            upstream_name = node.inputs[0]
            reads = check_time_operator(operator, inputs[0], schemas.get(upstream_name), f"its input {upstream_name!r}")
            if role is not None and role.time_aware:
                fields[name] = reads
                path += role.horizon
            resolved[name] = passed_on(operator, inputs[0])
        paths[name] = path
    return TimeLayout(fields, lateness[0] if lateness else None, max(paths.values(), default=0.0))


def _merged(node, inputs: list[Resolved]) -> Resolved:
    what = f"{node.kind.value} {node.name!r}"
    conflicts = [item for item in inputs if isinstance(item, Conflict)]
    if conflicts:
        return conflicts[0]
    declared = [item for item in inputs if item is not None]
    if not declared:
        return None
    if len(declared) < len(inputs):
        return Conflict(f"{what} merges streams with and without event time ({', '.join(node.inputs)})")
    if len({item.field for item in declared}) > 1:
        return Conflict(f"{what} merges streams whose event times are different fields "
                        f"({', '.join(sorted({item.field for item in declared}))})")
    return Declaration(declared[0].field, declared[0].lateness, declared[0].by)


def upstream_declaration(graph, name: str) -> Resolved | typing.Literal["unknown"]:
    """The event time the stream `name` carries as far as the graph is built ("unknown" where a
    node on the way is not added yet), for the checks at the call that adds an operator."""
    try:
        node = graph.node(name)
    except PipelineError:
        return "unknown"
    if node.kind is NodeKind.SOURCE:
        return None
    inputs = [upstream_declaration(graph, source) for source in node.inputs]
    if "unknown" in inputs:
        return "unknown"
    if node.kind in (NodeKind.UNION, NodeKind.JOIN):
        return _merged(node, inputs)
    return passed_on(node.operator, inputs[0])


def join_window(graph, name: str, window: Tumbling, inputs: tuple[str, ...]) -> TumblingWindow:
    """A join's `Tumbling(size)` with the event-time field and lateness declared upstream of both
    sides (the join keeps its own per-key watermark: fissure.program.graph's docstring)."""
    sides = [upstream_declaration(graph, stream) for stream in inputs]
    if all(isinstance(side, Declaration) for side in sides) and sides[0].field == sides[1].field:
        return TumblingWindow(sides[0].field, window.size, sides[0].lateness)
    found = ", ".join(f"{stream!r}: {side.field!r}" if isinstance(side, Declaration) else
                      f"{stream!r}: {'not added yet' if side == 'unknown' else 'none'}"
                      for stream, side in zip(inputs, sides))
    raise PipelineError(
        f"join {name!r}: window=Tumbling({window.size:g}) takes its time field from the event time declared upstream "
        f"of both inputs, the same field on each side, but they have {found}; declare .event_time(field, "
        f"lateness=...) on both inputs before the join, or pass TumblingWindow(time_field, {window.size:g}, lateness)")


def expiry_role(name: str, expire_after: object, on_expire: object) -> ExpiryRole | None:
    """`partitioned(..., expire_after=, on_expire=)`'s role, checked (None: no expiry)."""
    if expire_after is None:
        if on_expire is not None:
            raise PipelineError(f"operator {name!r}: on_expire= runs when a key's state expires; give expire_after="
                                f"SECONDS too")
        return None
    seconds = seconds_option(f"operator {name!r}", "expire_after", expire_after)
    if on_expire is not None:
        capacity = positional_capacity(on_expire) if callable(on_expire) else (99, 0)
        if capacity is not None and not (capacity[0] <= 2 and (capacity[1] == -1 or capacity[1] >= 2)):
            raise PipelineError(f"operator {name!r}: on_expire={on_expire!r} must be a function of (state, key) "
                                f"returning the records to emit (a dict, an iterable of dicts, or None)")
    return ExpiryRole(seconds, on_expire)


def deduplicate_role(name: str, within: object) -> DeduplicateRole:
    return DeduplicateRole(seconds_option(f"operator {name!r}", "within", within))


def window_role(name: str, window: object, aggregate: object) -> WindowRole:
    if not isinstance(window, Window):
        raise PipelineError(f"operator {name!r}: window must be Tumbling(size), Sliding(size, every) or "
                            f"Session(gap), got {window!r}")
    check_aggregate(f"operator {name!r}", aggregate)
    return WindowRole(window, aggregate)


def aggregate_role(name: str, aggregate: object, expire_after: object) -> AggregateRole:
    check_aggregate(f"operator {name!r}", aggregate)
    seconds = None if expire_after is None else seconds_option(f"operator {name!r}", "expire_after", expire_after)
    return AggregateRole(aggregate, seconds)


def event_time_role(field_name: object, lateness: object) -> EventTimeRole:
    if not isinstance(field_name, str) or not field_name:
        raise PipelineError(f"event_time needs the name of the field holding each record's event time, got "
                            f"{field_name!r}; e.g. .event_time('ts', lateness=5.0)")
    return EventTimeRole(field_name, seconds_option(f"event_time({field_name!r})", "lateness", lateness,
                                                    allow_zero=True))


def free_name(taken: Iterable[str], base: str) -> str:
    """`base`, or `base_2`, `base_3`, ... : the first name not taken."""
    taken = set(taken)
    if base not in taken:
        return base
    number = 2
    while f"{base}_{number}" in taken:
        number += 1
    return f"{base}_{number}"
