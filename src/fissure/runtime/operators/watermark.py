"""The query's watermark across micro-batches, and which keys are due (pure bookkeeping, no
pyspark; the in-process runner keeps them, the Spark layer keeps the same figures in its offset
log and timers).

W_N, the watermark micro-batch N runs with, is the largest event time of the records that reached
a time-aware operator in the batches before N, minus the program's lateness (-inf before any);
it is fixed for the batch, so it does not depend on how the batch is cut into tasks. Batch N
judges late records against W_{N-1} and fires what is due at W_N (fissure.runtime.operators.timed). End of
input raises it past every pending deadline: to the largest event time + the program's horizon.
Operators on processing time (expiry without event time) use the batch's own time instead.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

from fissure.runtime.operators.keyed import BatchTime

NEVER = -math.inf


class Watermark:
    """One query's event-time watermark: `begin_batch` gives the batch's BatchTime, `observe`
    takes the largest event time each time-aware operator saw in it, `end_batch` closes it."""

    def __init__(self, lateness: float | None) -> None:
        self.lateness = lateness or 0.0
        self.largest: float | None = None  # the largest event time seen by a time-aware operator
        self.floor = NEVER  # where end of input left it
        self.last = NEVER  # the watermark the last batch ran with

    @property
    def next(self) -> float:
        """The watermark the next micro-batch runs with."""
        if self.largest is None:
            return self.floor
        return max(self.floor, self.largest - self.lateness, self.last)

    def begin_batch(self) -> BatchTime:
        return BatchTime(previous=self.last, current=self.next)

    def observe(self, largest: float | None) -> None:
        if largest is not None and (self.largest is None or largest > self.largest):
            self.largest = largest

    def end_batch(self, time: BatchTime) -> None:
        self.last = time.current

    def end_of_input(self, horizon: float) -> BatchTime:
        """The BatchTime of the end-of-input batch: past every window, session and expiry of the
        events seen (largest + horizon); the watermark stays there for whatever comes later."""
        final = self.next if self.largest is None else max(self.next, self.largest + horizon)
        self.floor = final
        return BatchTime(previous=self.last, current=final)


class ProcessingTime:
    """The batch times a processing-time step runs with: the batch before's and this batch's
    (never going back)."""

    def __init__(self) -> None:
        self.last = NEVER

    def batch(self, now_s: float, end_of_input: bool = False) -> BatchTime:
        """This batch's BatchTime; at end of input everything pending fires (current = inf), and
        later batches go on from `now_s`."""
        now = max(now_s, self.last)
        time = BatchTime(previous=self.last, current=math.inf if end_of_input else now)
        self.last = now
        return time


class Deadlines:
    """When each key of a per-key operator next has something to fire (plain data: key text ->
    seconds), to find the keys due in a batch without scanning their states."""

    def __init__(self, deadlines: dict[str, float] | None = None) -> None:
        self.deadlines: dict[str, float] = dict(deadlines or {})

    def set(self, key: str, deadline: float | None) -> None:
        if deadline is None:
            self.deadlines.pop(key, None)
        else:
            self.deadlines[key] = deadline

    def due(self, watermark: float, skip: Iterable[str] = ()) -> list[str]:
        """The keys whose deadline is at or before `watermark`, earliest first (not those in `skip`)."""
        skipped = set(skip)
        return [key for key, deadline in sorted(self.deadlines.items(), key=lambda item: (item[1], item[0]))
                if deadline <= watermark and key not in skipped]

    def earliest(self) -> float | None:
        return min(self.deadlines.values(), default=None)

    def __len__(self) -> int:
        return len(self.deadlines)


@dataclass(frozen=True)
class BatchClock:
    """The times one micro-batch of a query on Spark runs its time-aware operators with. The
    driver makes it from the clock of the batch before (`next_clock`) and writes it to the
    checkpoint before the batch runs, so a batch run again after a crash or a plan switch runs
    with the same times; `largest` (the largest event time through the batch) is added once the
    batch ran, for the next batch's watermark."""

    batch: int
    event: BatchTime | None  # the query's watermarks (None: no operator on event time)
    processing: BatchTime | None  # the batch times of operators on processing time
    end_of_input: bool = False
    largest_before: float | None = None  # the largest event time of the batches before
    processing_last: float = NEVER  # what the next batch's processing `previous` is
    largest: float | None = None  # the largest event time through this batch, once it ran
    done: bool = False  # `largest` is known

    def time_of(self, field: str | None) -> BatchTime | None:
        """The BatchTime of an operator reading event-time `field` (None: processing time)."""
        return self.event if field is not None else self.processing

    def ran(self, batch_largest: float | None) -> "BatchClock":
        """This clock once its batch ran, the largest event time its operators saw being `batch_largest`."""
        largest = self.largest_before
        if batch_largest is not None and (largest is None or batch_largest > largest):
            largest = batch_largest
        return replace(self, largest=largest, done=True)

    def to_json(self) -> str:
        """JSON (Python's, with -Infinity and Infinity for the watermarks before and after all)."""
        document = asdict(self)
        for name in ("event", "processing"):
            value = getattr(self, name)
            document[name] = None if value is None else [value.previous, value.current]
        return json.dumps(document, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "BatchClock":
        document = json.loads(text)
        for name in ("event", "processing"):
            value = document.get(name)
            document[name] = None if value is None else BatchTime(float(value[0]), float(value[1]))
        return cls(**document)


def next_clock(batch: int, before: BatchClock | None, lateness: float | None, horizon: float, *,
               event_time: bool, processing_time: bool, now_s: float, end_of_input: bool = False) -> BatchClock:
    """The clock of micro-batch `batch`, from the clock of the last batch that ran before it
    (None: the first), by the rules of `Watermark` and `ProcessingTime`, the in-process
    reference: W = max(the batch before's, largest event time before - lateness); end of input
    goes to largest + horizon (processing time: infinity)."""
    if before is not None and not before.done:
        raise ValueError(f"batch {before.batch}'s clock has no largest event time: it never finished, so batch "
                         f"{batch} cannot have run after it")
    largest = before.largest if before is not None else None
    event = None
    if event_time:
        watermark = Watermark(lateness)
        watermark.largest = largest
        if before is not None and before.event is not None:
            watermark.last = watermark.floor = before.event.current
        event = watermark.end_of_input(horizon) if end_of_input else watermark.begin_batch()
    processing, processing_last = None, before.processing_last if before is not None else NEVER
    if processing_time:
        clock = ProcessingTime()
        clock.last = processing_last
        processing = clock.batch(now_s, end_of_input)
        processing_last = clock.last
    return BatchClock(batch, event, processing, end_of_input, largest, processing_last)
