"""Windowed joins of two streams: the window, the join's definition and the checks of its inputs.

Semantics (`StreamGraph.join`): an inner equi-join on `key` of two streams, in tumbling event-time
windows of `window.size` units of the numeric field `window.time_field` (window w holds
w * size <= t < (w + 1) * size). A left and a right record join when their keys are equal and
they fall in the same window; `fn(left, right)` runs once per such pair, when the later of the
two arrives (a symmetric hash join). State is kept per key: each key has a watermark, the largest
event time it has seen on either side; window w of that key closes, and its records are evicted,
once the watermark reaches (w + 1) * size + window.lateness.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa

from fissure.program.operators import PipelineError, positional_capacity
from fissure.program.windows import Tumbling, Window


@dataclass(frozen=True)
class TumblingWindow(Window):
    """Tumbling event-time windows of `size` units of the numeric field `time_field`; a window
    closes `lateness` units after its end (per key, see the module docstring). The windows of
    `Tumbling(size)`, with the field and lateness carried along: `StreamGraph.join` also takes a
    plain `Tumbling(size)`, whose field and lateness are the event time declared upstream."""

    time_field: str
    size: float
    lateness: float = 0.0

    def windows_of(self, t: float) -> list[tuple[float, float]]:
        return Tumbling(self.size).windows_of(t)

    @property
    def horizon(self) -> float:
        return float(self.size)

    def __post_init__(self) -> None:
        if not isinstance(self.time_field, str) or not self.time_field:
            raise PipelineError(f"a join window needs the name of its time field, got {self.time_field!r}")
        if not isinstance(self.size, (int, float)) or isinstance(self.size, bool) or not self.size > 0:
            raise PipelineError(f"a join window's size must be a number > 0, got {self.size!r}")
        if not isinstance(self.lateness, (int, float)) or isinstance(self.lateness, bool) or not self.lateness >= 0:
            raise PipelineError(f"a join window's lateness must be a number >= 0, got {self.lateness!r}")


@dataclass(frozen=True)
class JoinSpec:
    key: tuple[str, ...]
    window: TumblingWindow
    fn: Callable[[dict, dict], typing.Any]
    schema: pa.Schema  # the records fn emits
    state_version: int = 1  # raised when the stored records' form changes (checkpoints record it)

    @property
    def callable_name(self) -> str:
        return getattr(self.fn, "__qualname__", None) or repr(self.fn)


def check_join_fn(name: str, fn) -> None:
    if not callable(fn):
        raise PipelineError(f"join {name!r}: fn={fn!r} is not callable; pass fn=lambda left, right: {{...}}")
    capacity = positional_capacity(fn)
    if capacity is not None:
        required, maximum = capacity
        if not (required <= 2 and (maximum == -1 or maximum >= 2)):
            raise PipelineError(f"join {name!r}: {getattr(fn, '__qualname__', fn)!r} cannot be called with two "
                                f"arguments; it must take (left_record, right_record)")


def check_join_inputs(name: str, spec: JoinSpec, left: pa.Schema | None, right: pa.Schema | None,
                      names: Sequence[str]) -> None:
    """Refuse join inputs that lack the key or time field, or whose key types differ."""
    for side, schema, stream in (("left", left, names[0]), ("right", right, names[1])):
        if schema is None:
            continue
        for field_name in (*spec.key, spec.window.time_field):
            if field_name not in schema.names:
                role = "key" if field_name in spec.key else "time"
                raise PipelineError(
                    f"join {name!r}: its {side} input {stream!r} lacks the {role} field {field_name!r} (it has "
                    f"{', '.join(schema.names)}); add the field to {stream!r}'s schema or join on fields both sides have")
        time_type = schema.field(spec.window.time_field).type
        if not (pa.types.is_integer(time_type) or pa.types.is_floating(time_type)):
            raise PipelineError(f"join {name!r}: time field {spec.window.time_field!r} of {stream!r} is {time_type}; "
                                f"windows need a number (e.g. epoch seconds): convert it in a map before the join")
    if left is not None and right is not None:
        for field_name in spec.key:
            if left.field(field_name).type != right.field(field_name).type:
                raise PipelineError(
                    f"join {name!r}: key field {field_name!r} is {left.field(field_name).type} on the left "
                    f"({names[0]!r}) but {right.field(field_name).type} on the right ({names[1]!r}); equal keys need "
                    f"one type: convert one side in a map before the join")
