"""The time builder methods of `fissure.Pipeline` (event_time, window, aggregate, deduplicate), the
same on a StreamGraph's streams. Semantics: docs/pipeline-api.md, Time; checks:
fissure.program.time_rules. Imports of fissure.program.chain are inside the methods: graph.py builds Pipeline on
this class."""

from __future__ import annotations

import typing
from collections.abc import Sequence


class TimeMethods:
    """Mixed into Pipeline: each method adds one operator through `Pipeline._add` (the name, hint
    and event-time checks of every operator) and returns the pipeline."""

    def event_time(self, field: str, *, lateness: float = 0.0, name: str | None = None):
        """Declare the field holding each record's event time (seconds as an int or float, or a
        datetime) from here on, and the lateness: the watermark of a micro-batch is the largest
        event time seen in the micro-batches before it, minus `lateness` seconds. A record without
        a usable event time is a dead letter (`NoEventTime`). Adds a stateless operator, `name`
        (default `event_time`, then `event_time_2`, ...)."""
        from fissure.program.eventtime import EVENT_TIME_COST_US, EventTimeCheck
        from fissure.program.chain import Action, Hints, Kind
        from fissure.program.time_rules import event_time_role, free_name

        role = event_time_role(field, lateness)
        name = free_name(self.names, "event_time") if name is None else name
        return self._add(name, Kind.STATELESS, Action.FILTER, EventTimeCheck(field), 0, reads=[field],
                         hints=Hints(cost_us=EVENT_TIME_COST_US), time=role)

    def window(self, name: str, *, key: str | Sequence[str], window: typing.Any, aggregate: typing.Any,
               cost_us: float | None = None, selectivity: float | None = None, max_scale: float | None = None):
        """Per key, `aggregate` over event-time windows (`Tumbling(size)`, `Sliding(size, every)`,
        `Session(gap)`): one record per window and key (the key fields, `window_start`,
        `window_end`, the aggregate's fields) once the watermark passes the window's end."""
        from fissure.program.chain import Action, Hints, Kind, _normalize_key
        from fissure.program.time_rules import window_role

        fields = _normalize_key(name, key)
        role = window_role(name, window, aggregate)
        return self._add(name, Kind.PARTITIONED, Action.WINDOW, aggregate, 0, key=fields,
                         reads=getattr(aggregate, "reads", ()), state_factory=dict,
                         hints=Hints(cost_us=cost_us, selectivity=selectivity, max_scale=max_scale), time=role)

    def aggregate(self, name: str, *, key: str | Sequence[str], aggregate: typing.Any,
                  expire_after: float | None = None, cost_us: float | None = None,
                  selectivity: float | None = None, max_scale: float | None = None):
        """A running `aggregate` per key, no window: each micro-batch emits one record per key that
        got records in it (the key fields and the aggregate's fields, its result so far).
        `expire_after=SECONDS` drops a key's accumulator once the watermark passes its last event
        time + SECONDS (processing time where the program declares no event time)."""
        from fissure.program.chain import Action, Hints, Kind, _normalize_key
        from fissure.program.time_rules import aggregate_role

        fields = _normalize_key(name, key)
        role = aggregate_role(name, aggregate, expire_after)
        return self._add(name, Kind.PARTITIONED, Action.AGGREGATE, aggregate, 0, key=fields,
                         reads=getattr(aggregate, "reads", ()), state_factory=dict,
                         hints=Hints(cost_us=cost_us, selectivity=selectivity, max_scale=max_scale), time=role)

    def deduplicate(self, name: str, *, key: str | Sequence[str], within: float, cost_us: float | None = None,
                    selectivity: float | None = None, max_scale: float | None = None):
        """Pass a record unless a record of the same key passed less than `within` seconds of
        event time from it; duplicates are dropped (they are the operator's selectivity), not dead
        letters."""
        from fissure.program.chain import Action, Hints, Kind, _normalize_key
        from fissure.program.time_rules import deduplicate_role

        fields = _normalize_key(name, key)
        role = deduplicate_role(name, within)
        return self._add(name, Kind.PARTITIONED, Action.DEDUPLICATE, role, 0, key=fields, state_factory=dict,
                         hints=Hints(cost_us=cost_us, selectivity=selectivity, max_scale=max_scale), time=role)
