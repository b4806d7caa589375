"""Event time in the program model: what a record's event time is, and the roles of the operators
that work on it (no pyspark, no worker code).

A record's event time is the value of the field `Pipeline.event_time(field, ...)` declared: an int
or float (seconds), or a datetime (taken as UTC seconds since the epoch when it has no time zone).
A record whose field is missing, None, NaN, infinite, a bool or of another type has none: it is a
dead letter with the reason `NoEventTime: ...` (at the declaration and at every time-aware operator).
"""

from __future__ import annotations

import datetime
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass

from fissure.program.operators import PipelineError, RecordRejected, shown_value
from fissure.program.windows import Window

_UTC = datetime.timezone.utc
# The planner's cost of the event-time check until profiles exist: a dict lookup and a type test.
EVENT_TIME_COST_US = 0.5


def event_seconds(value: object) -> float | None:
    """A value's event time in seconds, or None where it has none (see the module docstring)."""
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is int:
        return float(value)
    if isinstance(value, datetime.datetime):
        return (value if value.tzinfo is not None else value.replace(tzinfo=_UTC)).timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool):  # numpy scalars and the like
        seconds = float(value)
        return seconds if math.isfinite(seconds) else None
    return None


def no_event_time(field: str, record: typing.Mapping) -> str:
    """The dead-letter reason of a record without a usable event time in `field`."""
    if field not in record:
        what = "is missing"
    else:
        value = record[field]
        if value is None:
            what = "is None"
        elif isinstance(value, float) and math.isnan(value):
            what = "is NaN"
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            what = f"is {value!r}"
        else:
            what = f"is {type(value).__name__} {shown_value(value)}"
    return (f"NoEventTime: field {field!r} {what}; an event time is seconds (an int or a float) or a datetime: "
            f"parse it in a map before .event_time(...), or filter the record out")


class EventTimeCheck:
    """The function of an `event_time` operator: passes a record with a usable event time, makes
    any other a dead letter (RecordRejected: `NoEventTime: ...`)."""

    def __init__(self, field: str) -> None:
        self.field = field

    def __call__(self, record: dict) -> bool:
        if event_seconds(record.get(self.field)) is None:
            raise RecordRejected(no_event_time(self.field, record))
        return True

    def __repr__(self) -> str:
        return f"event_time({self.field!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EventTimeCheck) and other.field == self.field

    def __hash__(self) -> int:
        return hash(("event_time", self.field))


def seconds_option(owner: str, label: str, value: object, allow_zero: bool = False) -> float:
    """A duration in seconds, checked: a finite number > 0 (or >= 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise PipelineError(f"{owner}: {label} must be a number of seconds {bound}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class EventTimeRole:
    """An `event_time` operator: declares the field and the program's lateness."""

    field: str
    lateness: float
    horizon: typing.ClassVar[float] = 0.0
    needs_event_time: typing.ClassVar[bool] = False
    time_aware: typing.ClassVar[bool] = False


@dataclass(frozen=True)
class WindowRole:
    """A `window` operator: its window family and aggregate."""

    window: Window
    aggregate: typing.Any
    needs_event_time: typing.ClassVar[bool] = True
    time_aware: typing.ClassVar[bool] = True
    expire_after: typing.ClassVar[None] = None

    @property
    def horizon(self) -> float:
        return self.window.horizon


@dataclass(frozen=True)
class AggregateRole:
    """An `aggregate` operator (no window): a running aggregate per key, its state dropped
    `expire_after` seconds after the key's last record when given."""

    aggregate: typing.Any
    expire_after: float | None = None
    needs_event_time: typing.ClassVar[bool] = False

    @property
    def time_aware(self) -> bool:
        return self.expire_after is not None

    @property
    def horizon(self) -> float:
        return self.expire_after or 0.0


@dataclass(frozen=True)
class DeduplicateRole:
    """A `deduplicate` operator: a record passes unless one of its key passed less than `within`
    seconds of event time from it."""

    within: float
    needs_event_time: typing.ClassVar[bool] = True
    time_aware: typing.ClassVar[bool] = True
    expire_after: typing.ClassVar[None] = None

    @property
    def horizon(self) -> float:
        return self.within

    def __repr__(self) -> str:
        return f"within {self.within:g} s"


@dataclass(frozen=True)
class ExpiryRole:
    """A `partitioned(..., expire_after=...)` operator: the key's state is dropped once the
    watermark passes the key's last event time + `expire_after`, after `on_expire(state, key)`'s
    records are emitted."""

    expire_after: float
    on_expire: Callable[[typing.Any, typing.Any], typing.Any] | None = None
    needs_event_time: typing.ClassVar[bool] = False
    time_aware: typing.ClassVar[bool] = True

    @property
    def horizon(self) -> float:
        return self.expire_after


TimeRole = typing.Union[EventTimeRole, WindowRole, AggregateRole, DeduplicateRole, ExpiryRole]
