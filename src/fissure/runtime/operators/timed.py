"""Time-aware operators per key and micro-batch (no pyspark here): windows, running aggregates,
deduplication and expiry, the late rule and firing.

Each is a per-key function `fn(state, records, seqs, time) -> KeyEmitted` (fissure.runtime.operators.keyed),
called once per key and batch with the key's records of the batch (none for a key that is only
due) and the batch's `BatchTime(previous, current)`: the watermark of the batch before (W_prev,
the late rule) and the batch's own (W_now, firing). Per key, in that order:

1. the batch's records, in event-time order, then sequence order (a record without a usable event
   time is a `NoEventTime` dead letter; a late record a `Late` dead letter);
2. everything due at or before W_now fires: windows and sessions emit, expired state goes.

A record is late when every window it would go into ended at or before W_prev: that window was
emitted in an earlier batch (or would have been). For a session, its window is the session it
would join, or its own [t, t + gap); for expiry, the key's state it would create ([t, t +
expire_after), a key without state only); for deduplication, a record below W_prev is late (a
record it duplicates may have been forgotten: a passed time k is forgotten once W >= k + within).

The state of a key is plain data (dicts with string keys, lists, numbers, the key's values, the
aggregate's accumulators), so any state codec stores it; None deletes it. `deadline` is the
earliest W at which the key has something to fire. Sequence numbers: a window's, session's or
aggregate's output takes the sequence number of the last record added to it; on_expire's output
that of the key's last record.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Sequence

from fissure.program.eventtime import (AggregateRole, DeduplicateRole, ExpiryRole, WindowRole, event_seconds,
                                       no_event_time)
from fissure.runtime.operators.keyed import BatchTime, KeyEmitted, StatefulStep
from fissure.runtime.records.fate import (DeadLetter, OperatorFailedError, describe_error, normalize_emitted,
                                          operator_stopped, record_failed, record_text)

LATE = "Late"  # the reason of every late record's dead letter: "Late: ..."


def seconds_text(value: float) -> str:
    """Seconds as a reader expects them: 1700000000, 12.5, -inf."""
    return str(int(value)) if value == value and abs(value) != float("inf") and value == int(value) else repr(value)


def late_reason(t: float, start: float, end: float, watermark: float, what: str = "window") -> str:
    return (f"{LATE}: event time {seconds_text(t)} is in {what} [{seconds_text(start)}, {seconds_text(end)}) that "
            f"closed at watermark {seconds_text(watermark)}")


def open_windows(window, t: float, watermark: float) -> tuple[list[tuple[float, float]], str | None]:
    """The windows of event time `t` still open at `watermark`, and the late reason when none is
    (the record is then a `Late` dead letter)."""
    spans = window.windows_of(t)
    open_spans = [span for span in spans if span[1] > watermark]
    if open_spans:
        return open_spans, None
    start, end = spans[-1]
    return [], late_reason(t, start, end, watermark)


class TimedKeyFunction:
    """The base of the per-key functions: the operator's name, key fields and event-time field
    (None: processing time, or no time at all), and the records of a key in order."""

    def __init__(self, name: str, key: Sequence[str], time_field: str | None) -> None:
        self.name = name
        self.key = tuple(key)
        self.time_field = time_field

    def __call__(self, state: dict, records: list[dict], seqs: list[int], time: BatchTime | None) -> KeyEmitted:
        raise NotImplementedError

    def ordered(self, records: list[dict], seqs: list[int], time: BatchTime | None,
                dead: list[DeadLetter]) -> list[tuple[float, int, dict]]:
        """(event time, seq, record) in event-time then sequence order; processing time: the
        batch's time for each, in sequence order. Records without event time become dead letters."""
        if self.time_field is None:
            now = time.current if time is not None else 0.0
            return sorted(((now, seq, record) for record, seq in zip(records, seqs)), key=lambda item: item[1])
        field, items = self.time_field, []
        for record, seq in zip(records, seqs):
            t = event_seconds(record.get(field))
            if t is None:
                dead.append(DeadLetter(self.name, no_event_time(field, record), record_text(record), seq))
            else:
                items.append((t, seq, record))
        items.sort(key=lambda item: (item[0], item[1]))
        return items

    def key_values(self, state: dict, records: list[dict]) -> list:
        if "key" in state:
            return state["key"]
        return [records[0][name] for name in self.key] if records else []

    def dead(self, error: BaseException, record: object, seq: int) -> DeadLetter:
        if isinstance(error, (SystemExit, KeyboardInterrupt)):
            raise operator_stopped(self.name, error) from error
        return record_failed(self.name, error, record, seq)


class WindowKeys(TimedKeyFunction):
    """Tumbling and sliding windows. State: {"key": [...], "windows": [[start, end, acc, seq], ...]}."""

    def __init__(self, name: str, key: Sequence[str], time_field: str, role: WindowRole) -> None:
        super().__init__(name, key, time_field)
        self.window, self.aggregate = role.window, role.aggregate

    def __call__(self, state, records, seqs, time):
        dead: list[DeadLetter] = []
        key = self.key_values(state, records)
        windows = {entry[0]: list(entry) for entry in state.get("windows", ())}
        aggregate = self.aggregate
        for t, seq, record in self.ordered(records, seqs, time, dead):
            open_spans, late = open_windows(self.window, t, time.previous)
            if late:
                dead.append(DeadLetter(self.name, late, record_text(record), seq))
                continue
            try:
                added = [(start, end, aggregate.add(windows[start][2] if start in windows else aggregate.create(),
                                                    record)) for start, end in open_spans]
            except BaseException as error:  # noqa: BLE001 - the aggregate's error: the record's dead letter
                dead.append(self.dead(error, record, seq))
                continue
            for start, end, acc in added:
                windows[start] = [start, end, acc, seq]
        out, out_seqs = [], []
        for start, end, acc, seq in sorted(entry for entry in windows.values() if entry[1] <= time.current):
            del windows[start]
            emit_window(self, aggregate, key, start, end, acc, seq, out, out_seqs, dead)
        remaining = sorted(windows.values(), key=lambda entry: entry[0])
        if not remaining:
            return KeyEmitted(out, out_seqs, dead, None)
        return KeyEmitted(out, out_seqs, dead, {"key": key, "windows": remaining},
                          min(entry[1] for entry in remaining))


def emit_window(function: TimedKeyFunction, aggregate, key: list, start: float, end: float, acc, seq: int,
                out: list, out_seqs: list[int], dead: list[DeadLetter]) -> None:
    """One window's output record: the key fields, window_start, window_end, the result's fields."""
    record = dict(zip(function.key, key))
    record["window_start"], record["window_end"] = start, end
    try:
        result = aggregate.result(acc)
        if not isinstance(result, typing.Mapping):
            raise TypeError(f"{aggregate!r}.result must return a dict, got {type(result).__name__}")
    except BaseException as error:  # noqa: BLE001 - the window's dead letter
        dead.append(function.dead(error, record, seq))
        return
    record.update(result)
    out.append(record)
    out_seqs.append(seq)


class SessionKeys(TimedKeyFunction):
    """Session windows. State: {"key": [...], "sessions": [[start, end, acc, seq], ...],
    "closed": [start, end] of the last session emitted, or None}: a record that would join an
    emitted session is late, so two sessions that one run would merge never both come out; the
    mark goes once no record could join it without being late anyway (W_now >= end + gap)."""

    def __init__(self, name: str, key: Sequence[str], time_field: str, role: WindowRole) -> None:
        super().__init__(name, key, time_field)
        self.gap, self.aggregate = role.window.horizon, role.aggregate

    def __call__(self, state, records, seqs, time):
        dead: list[DeadLetter] = []
        key = self.key_values(state, records)
        sessions = [list(entry) for entry in state.get("sessions", ())]
        closed = state.get("closed")
        aggregate, gap = self.aggregate, self.gap
        for t, seq, record in self.ordered(records, seqs, time, dead):
            own_end = t + gap
            if closed is not None and closed[0] < own_end and t < closed[1]:
                dead.append(DeadLetter(self.name, late_reason(t, closed[0], closed[1], time.previous, "session"),
                                       record_text(record), seq))
                continue
            joined = [entry for entry in sessions if entry[0] < own_end and t < entry[1]]
            if not joined and own_end <= time.previous:
                dead.append(DeadLetter(self.name, late_reason(t, t, own_end, time.previous, "session"),
                                       record_text(record), seq))
                continue
            try:
                acc = aggregate.create()
                for entry in joined:  # in start order: the sessions' records, then this one
                    acc = aggregate.merge(acc, entry[2])
                acc = aggregate.add(acc, record)
            except BaseException as error:  # noqa: BLE001 - the aggregate's error: the record's dead letter
                dead.append(self.dead(error, record, seq))
                continue
            start = min([t] + [entry[0] for entry in joined])
            end = max([own_end] + [entry[1] for entry in joined])
            sessions = sorted([entry for entry in sessions if not any(entry is other for other in joined)]
                              + [[start, end, acc, seq]], key=lambda entry: entry[0])
        out, out_seqs = [], []
        for start, end, acc, seq in sorted((entry for entry in sessions if entry[1] <= time.current),
                                           key=lambda entry: (entry[1], entry[0])):
            emit_window(self, aggregate, key, start, end, acc, seq, out, out_seqs, dead)
            if closed is None or end > closed[1]:
                closed = [start, end]
        sessions = [entry for entry in sessions if entry[1] > time.current]
        if closed is not None and closed[1] + gap <= time.current:
            closed = None
        deadlines = [entry[1] for entry in sessions] + ([closed[1] + gap] if closed is not None else [])
        if not deadlines:
            return KeyEmitted(out, out_seqs, dead, None)
        return KeyEmitted(out, out_seqs, dead, {"key": key, "sessions": sessions, "closed": closed}, min(deadlines))


def _expiry_late(function: TimedKeyFunction, t: float, seconds: float, time: BatchTime, record: dict,
                 seq: int) -> DeadLetter:
    return DeadLetter(function.name, late_reason(t, t, t + seconds, time.previous, "the expiry window"),
                      record_text(record), seq)


class AggregateKeys(TimedKeyFunction):
    """A running aggregate per key; one record per key that got records in the batch. State:
    {"key": [...], "acc": acc, "last": last event time or None, "seq": seq}; with `expire_after`
    it is deleted once W_now >= last + expire_after."""

    def __init__(self, name: str, key: Sequence[str], time_field: str | None, role: AggregateRole) -> None:
        super().__init__(name, key, time_field)
        self.aggregate, self.expire_after = role.aggregate, role.expire_after

    def __call__(self, state, records, seqs, time):
        dead: list[DeadLetter] = []
        key = self.key_values(state, records)
        aggregate, expire_after = self.aggregate, self.expire_after
        has_state = "acc" in state
        acc = state["acc"] if has_state else aggregate.create()
        last, last_seq, changed = state.get("last"), state.get("seq"), False
        items = self.ordered(records, seqs, time, dead) if expire_after is not None else \
            [(None, seq, record) for record, seq in zip(records, seqs)]
        for t, seq, record in items:
            if expire_after is not None and not has_state and t + expire_after <= time.previous:
                dead.append(_expiry_late(self, t, expire_after, time, record, seq))
                continue
            try:
                acc = aggregate.add(acc, record)
            except BaseException as error:  # noqa: BLE001 - the aggregate's error: the record's dead letter
                dead.append(self.dead(error, record, seq))
                continue
            has_state, changed, last_seq = True, True, seq
            if t is not None:
                last = t if last is None else max(last, t)
        out, out_seqs = [], []
        if changed:
            record = dict(zip(self.key, key))
            try:
                result = aggregate.result(acc)
                if not isinstance(result, typing.Mapping):
                    raise TypeError(f"{aggregate!r}.result must return a dict, got {type(result).__name__}")
                record.update(result)
                out.append(record)
                out_seqs.append(last_seq)
            except BaseException as error:  # noqa: BLE001 - the key's result: a dead letter
                dead.append(self.dead(error, record, last_seq))
        if not has_state or (expire_after is not None and last + expire_after <= time.current):
            return KeyEmitted(out, out_seqs, dead, None)
        deadline = last + expire_after if expire_after is not None else None
        return KeyEmitted(out, out_seqs, dead, {"key": key, "acc": acc, "last": last, "seq": last_seq}, deadline)


class DeduplicateKeys(TimedKeyFunction):
    """A record passes unless one of its key passed less than `within` seconds of event time from
    it. State: {"kept": [event time of each record that passed and is not forgotten yet]}; a kept
    time is forgotten once W_now >= it + within."""

    def __init__(self, name: str, key: Sequence[str], time_field: str, role: DeduplicateRole) -> None:
        super().__init__(name, key, time_field)
        self.within = role.within

    def __call__(self, state, records, seqs, time):
        dead: list[DeadLetter] = []
        kept = list(state.get("kept", ()))
        within = self.within
        out, out_seqs = [], []
        for t, seq, record in self.ordered(records, seqs, time, dead):
            if t < time.previous:
                dead.append(DeadLetter(
                    self.name, f"{LATE}: event time {seconds_text(t)} is below watermark "
                               f"{seconds_text(time.previous)}, so a record of its key within {seconds_text(within)} "
                               f"s of it may have been forgotten already", record_text(record), seq))
            elif not any(abs(t - other) < within for other in kept):
                kept.append(t)
                out.append(record)
                out_seqs.append(seq)
        kept = [t for t in kept if t + within > time.current]
        if not kept:
            return KeyEmitted(out, out_seqs, dead, None)
        return KeyEmitted(out, out_seqs, dead, {"kept": kept}, min(kept) + within)


class ExpiringKeys(TimedKeyFunction):
    """`partitioned(fn, expire_after=, on_expire=)`: the user's fn(state, record) per record, in
    event-time order; the key's state goes once W_now >= its last event time + expire_after, after
    on_expire(state, key)'s records, or at once when fn returned it to a fresh state_factory().
    State: {"key": [...], "state": the user's state, "last": last event time, "seq": seq}."""

    def __init__(self, name: str, key: Sequence[str], time_field: str | None, role: ExpiryRole,
                 fn: Callable, state_factory: Callable[[], typing.Any]) -> None:
        super().__init__(name, key, time_field)
        self.expire_after, self.on_expire = role.expire_after, role.on_expire
        self.fn, self.state_factory = fn, state_factory

    def __call__(self, state, records, seqs, time):
        dead: list[DeadLetter] = []
        key = self.key_values(state, records)
        has_state = "state" in state
        user_state = state["state"] if has_state else None
        last, last_seq = state.get("last"), state.get("seq")
        out, out_seqs = [], []
        expire_after, fn = self.expire_after, self.fn
        for t, seq, record in self.ordered(records, seqs, time, dead):
            if not has_state:
                if t + expire_after <= time.previous:
                    dead.append(_expiry_late(self, t, expire_after, time, record, seq))
                    continue
                user_state, has_state = self._fresh(), True
            last = t if last is None else max(last, t)
            last_seq = seq
            try:
                emitted = normalize_emitted(fn(user_state, record))
            except BaseException as error:  # noqa: BLE001 - the user's error: the record's dead letter
                dead.append(self.dead(error, record, seq))
                continue
            out.extend(emitted)
            out_seqs.extend([seq] * len(emitted))
        if not has_state or user_state == self._fresh():
            return KeyEmitted(out, out_seqs, dead, None)
        if last + expire_after > time.current:
            return KeyEmitted(out, out_seqs, dead, {"key": key, "state": user_state, "last": last, "seq": last_seq},
                              last + expire_after)
        if self.on_expire is not None:
            key_argument = key[0] if len(key) == 1 else tuple(key)
            try:
                emitted = normalize_emitted(self.on_expire(user_state, key_argument))
            except BaseException as error:  # noqa: BLE001 - the expired state: a dead letter
                dead.append(self.dead(error, {"key": key_argument, "state": user_state}, last_seq))
            else:
                out.extend(emitted)
                out_seqs.extend([last_seq] * len(emitted))
        return KeyEmitted(out, out_seqs, dead, None)

    def _fresh(self) -> typing.Any:
        try:
            return self.state_factory()
        except Exception as error:
            raise OperatorFailedError(f"operator {self.name!r}: its state_factory raised "
                                      f"{describe_error(error)}") from error


def key_function(operator, time_field: str | None) -> TimedKeyFunction:
    """The per-key function of a per-key operator (`Operator.per_key`), reading `time_field`
    (the program's `TimeLayout.fields[name]`; None: processing time or no time)."""
    role = operator.time
    if isinstance(role, WindowRole):
        kind = SessionKeys if role.window.merging else WindowKeys
        return kind(operator.name, operator.key, time_field, role)
    if isinstance(role, AggregateRole):
        return AggregateKeys(operator.name, operator.key, time_field, role)
    if isinstance(role, DeduplicateRole):
        return DeduplicateKeys(operator.name, operator.key, time_field, role)
    if isinstance(role, ExpiryRole):
        return ExpiringKeys(operator.name, operator.key, time_field, role, operator.fn, operator.state_factory)
    raise ValueError(f"operator {operator.name!r} is not a per-key operator")


def per_key_step(operator, input_schema, output_schema, time_field: str | None,
                 wrap: Callable[[TimedKeyFunction], Callable] | None = None) -> StatefulStep:
    """The StatefulStep that runs a per-key operator through fissure.runtime.operators.keyed.run_keys;
    `wrap` (e.g. fissure.runtime.profiling.profiler.ProfiledKeyFunction) wraps its function."""
    function = key_function(operator, time_field)
    return StatefulStep(name=operator.name, fn=wrap(function) if wrap is not None else function, state_factory=dict,
                        input_schema=input_schema, output_schema=output_schema, key=operator.key, per_key=True)


def max_event_time(values: Iterable) -> float | None:
    """The largest usable event time among the values of an event-time field (None: none is
    usable): what a batch's records add to the watermark."""
    largest = None
    for value in values:
        t = event_seconds(value)
        if t is not None and (largest is None or t > largest):
            largest = t
    return largest
