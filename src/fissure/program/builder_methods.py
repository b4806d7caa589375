"""The builder methods of the program model, one set for every face of it: `fissure.Pipeline`
(a chain: each method returns the pipeline) and a StreamGraph's `Stream` (each returns the new
operator's stream). Each adds one operator through `_add`, which checks it
(fissure.program.operators.build_operator) and hands it to the face's `_place`.

Operator kinds (the paper's k(o)):
- stateless: `map`, `filter`, `flat_map` (one record, a dict, in), and `map_batches` /
  `filter_batches` (a whole Arrow RecordBatch or pandas DataFrame in, for speed);
- partitioned stateful: `partitioned(name, fn, key=...)`, `fn(state, record)`, one state per key;
- stateful without a key: `stateful(name, fn)`, `fn(state, record)`, one state for the stream;
- time (docs/pipeline-api.md, Time): `event_time`, `window`, `aggregate`, `deduplicate`, and
  `partitioned(..., expire_after=, on_expire=)`; their checks: fissure.program.time_rules.

A stateful function receives its state object (made by `state_factory`, `dict` by default) and
mutates it in place; it returns the records it emits: an iterable of dicts, a single dict, or
None. fissure keeps the state in Spark's state store, so it survives restarts. The state is plain
data (dicts, lists, tuples, sets, numbers, strings, bytes, datetimes, Decimal: stored as data, never
as code; fissure.runtime.state.codec), unless the operator opts in to pickle with
`state_codec="pickle"` (signed with a state key the run is given). A state that ends a batch equal
to a fresh `state_factory()` (a cleared dict) is deleted: that is how a function drops its key.

Waiting: a stateless per-record operator that waits on I/O (`waits="io"`) or runs native code
that releases the GIL (`waits="gil-free"`) says so, and runs under the in-worker elastic scheduler
on as many threads as pay off (docs/elastic-scheduler.md); its function must be thread-safe.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Sequence
from typing import Self

from fissure.model.types import Kind
from fissure.program.eventtime import EVENT_TIME_COST_US, EventTimeCheck
from fissure.program.operators import (Action, Hints, Operator, PipelineError, SchemaSpec, batch_format_of,
                                       build_operator, check_operator_name, checked_state_factory, normalize_key)
from fissure.program.time_rules import (aggregate_role, deduplicate_role, event_time_role, expiry_role, free_name,
                                        window_role)


class OperatorMethods:
    """The builder methods (see the module docstring). A face implements `_check_unique` (refuse
    a name it already has, in its words), `_names_taken` (the names `event_time` picks a free one
    among) and `_place` (put the checked operator in the program; what the method returns)."""

    def _check_unique(self, name: str) -> None:
        raise NotImplementedError

    def _names_taken(self) -> Iterable[str]:
        raise NotImplementedError

    def _place(self, operator: Operator) -> typing.Any:
        raise NotImplementedError

    def _add(self, name: str, kind: Kind, action: Action, fn: Callable, arguments: int, **parts) -> typing.Any:
        check_operator_name(name, action, fn)
        self._check_unique(name)
        return self._place(build_operator(name, kind, action, fn, arguments, **parts))

    # --- stateless, per record -------------------------------------------------------------
    def map(self, name: str, fn: Callable[[dict], dict], *, schema: SchemaSpec = None,
            reads: Iterable[str] | None = None, cost_us: float | None = None,
            waits: str | None = None) -> Self:
        """One record in, one record out. `waits="io"` or `"gil-free"`: see `Waits`."""
        return self._add(name, Kind.STATELESS, Action.MAP, fn, 1, schema=schema, reads=reads,
                         hints=Hints(cost_us=cost_us, waits=waits))

    def filter(self, name: str, fn: Callable[[dict], bool], *, reads: Iterable[str] | None = None,
               cost_us: float | None = None, selectivity: float | None = None,
               waits: str | None = None) -> Self:
        """Keep the records for which fn returns a true value. `waits=`: see `Waits`."""
        return self._add(name, Kind.STATELESS, Action.FILTER, fn, 1, reads=reads,
                         hints=Hints(cost_us=cost_us, selectivity=selectivity, waits=waits))

    def flat_map(self, name: str, fn: Callable[[dict], Iterable[dict]], *, schema: SchemaSpec = None,
                 reads: Iterable[str] | None = None, cost_us: float | None = None,
                 selectivity: float | None = None, waits: str | None = None) -> Self:
        """One record in, any number of records out (an iterable of dicts; None for none). A dict,
        a string, bytes or a non-iterable returned is a dead letter of the input record.
        `waits=`: see `Waits`."""
        return self._add(name, Kind.STATELESS, Action.FLAT_MAP, fn, 1, schema=schema, reads=reads,
                         hints=Hints(cost_us=cost_us, selectivity=selectivity, waits=waits))

    # --- stateless, per batch --------------------------------------------------------------
    def map_batches(self, name: str, fn: Callable, *, schema: SchemaSpec = None, format: str = "arrow",
                    reads: Iterable[str] | None = None, cost_us: float | None = None,
                    waits: str | None = None) -> Self:
        """A whole batch in (pyarrow.RecordBatch or pandas.DataFrame), as many rows out, in order.
        (`waits=` is refused with the reason: it is for per-record operators.)"""
        return self._add(name, Kind.STATELESS, Action.MAP_BATCHES, fn, 1, schema=schema, reads=reads,
                         batch_format=batch_format_of(name, format), hints=Hints(cost_us=cost_us, waits=waits))

    def filter_batches(self, name: str, fn: Callable, *, format: str = "arrow",
                       reads: Iterable[str] | None = None, cost_us: float | None = None,
                       selectivity: float | None = None, waits: str | None = None) -> Self:
        """A whole batch in; a boolean mask out (one value per row: True keeps the row)."""
        return self._add(name, Kind.STATELESS, Action.FILTER_BATCHES, fn, 1, reads=reads,
                         batch_format=batch_format_of(name, format),
                         hints=Hints(cost_us=cost_us, selectivity=selectivity, waits=waits))

    # --- stateful --------------------------------------------------------------------------
    def partitioned(self, name: str, fn: Callable[[typing.Any, dict], typing.Any], *,
                    key: str | Sequence[str] | None = None, schema: SchemaSpec = None,
                    state_factory: Callable[[], typing.Any] = dict, order_by: str | None = None,
                    reads: Iterable[str] | None = None, cost_us: float | None = None,
                    selectivity: float | None = None, max_scale: float | None = None,
                    waits: str | None = None, state_codec: str = "data", state_version: int = 1,
                    expire_after: float | None = None,
                    on_expire: Callable[[typing.Any, typing.Any], typing.Any] | None = None) -> Self:
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
        fields = normalize_key(name, key)
        role = expiry_role(name, expire_after, on_expire)
        if role is not None and order_by is not None:
            raise PipelineError(f"operator {name!r}: with expire_after= a key's records come in event-time order; "
                                f"leave out order_by={order_by!r}")
        return self._add(name, Kind.PARTITIONED, Action.UPDATE, fn, 2, key=fields, schema=schema,
                         reads=reads, state_factory=checked_state_factory(name, state_factory), order_by=order_by,
                         hints=Hints(cost_us=cost_us, selectivity=selectivity, max_scale=max_scale, waits=waits),
                         state_codec=state_codec, state_version=state_version, time=role)

    def stateful(self, name: str, fn: Callable[[typing.Any, dict], typing.Any], *,
                 schema: SchemaSpec = None, state_factory: Callable[[], typing.Any] = dict,
                 order_by: str | None = None, reads: Iterable[str] | None = None,
                 cost_us: float | None = None, selectivity: float | None = None,
                 waits: str | None = None, state_codec: str = "data", state_version: int = 1) -> Self:
        """Stateful without a key: fn(state, record) with one state object for the whole stream
        (`state_codec` and `state_version` as for `partitioned`)."""
        return self._add(name, Kind.STATEFUL, Action.UPDATE, fn, 2, schema=schema, reads=reads,
                         state_factory=checked_state_factory(name, state_factory), order_by=order_by,
                         hints=Hints(cost_us=cost_us, selectivity=selectivity, waits=waits), state_codec=state_codec,
                         state_version=state_version)

    # --- time ------------------------------------------------------------------------------
    def event_time(self, field: str, *, lateness: float = 0.0, name: str | None = None) -> Self:
        """Declare the field holding each record's event time (seconds as an int or float, or a
        datetime) from here on, and the lateness: the watermark of a micro-batch is the largest
        event time seen in the micro-batches before it, minus `lateness` seconds. A record without
        a usable event time is a dead letter (`NoEventTime`). Adds a stateless operator, `name`
        (default `event_time`, then `event_time_2`, ...)."""
        role = event_time_role(field, lateness)
        name = free_name(self._names_taken(), "event_time") if name is None else name
        return self._add(name, Kind.STATELESS, Action.FILTER, EventTimeCheck(field), 0, reads=[field],
                         hints=Hints(cost_us=EVENT_TIME_COST_US), time=role)

    def window(self, name: str, *, key: str | Sequence[str], window: typing.Any, aggregate: typing.Any,
               cost_us: float | None = None, selectivity: float | None = None, max_scale: float | None = None) -> Self:
        """Per key, `aggregate` over event-time windows (`Tumbling(size)`, `Sliding(size, every)`,
        `Session(gap)`): one record per window and key (the key fields, `window_start`,
        `window_end`, the aggregate's fields) once the watermark passes the window's end."""
        fields = normalize_key(name, key)
        role = window_role(name, window, aggregate)
        return self._add(name, Kind.PARTITIONED, Action.WINDOW, aggregate, 0, key=fields,
                         reads=getattr(aggregate, "reads", ()), state_factory=dict,
                         hints=Hints(cost_us=cost_us, selectivity=selectivity, max_scale=max_scale), time=role)

    def aggregate(self, name: str, *, key: str | Sequence[str], aggregate: typing.Any,
                  expire_after: float | None = None, cost_us: float | None = None,
                  selectivity: float | None = None, max_scale: float | None = None) -> Self:
        """A running `aggregate` per key, no window: each micro-batch emits one record per key that
        got records in it (the key fields and the aggregate's fields, its result so far).
        `expire_after=SECONDS` drops a key's accumulator once the watermark passes its last event
        time + SECONDS (processing time where the program declares no event time)."""
        fields = normalize_key(name, key)
        role = aggregate_role(name, aggregate, expire_after)
        return self._add(name, Kind.PARTITIONED, Action.AGGREGATE, aggregate, 0, key=fields,
                         reads=getattr(aggregate, "reads", ()), state_factory=dict,
                         hints=Hints(cost_us=cost_us, selectivity=selectivity, max_scale=max_scale), time=role)

    def deduplicate(self, name: str, *, key: str | Sequence[str], within: float, cost_us: float | None = None,
                    selectivity: float | None = None, max_scale: float | None = None) -> Self:
        """Pass a record unless a record of the same key passed less than `within` seconds of
        event time from it; duplicates are dropped (they are the operator's selectivity), not dead
        letters."""
        fields = normalize_key(name, key)
        role = deduplicate_role(name, within)
        return self._add(name, Kind.PARTITIONED, Action.DEDUPLICATE, role, 0, key=fields, state_factory=dict,
                         hints=Hints(cost_us=cost_us, selectivity=selectivity, max_scale=max_scale), time=role)
