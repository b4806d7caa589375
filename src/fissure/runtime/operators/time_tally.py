"""What the time-aware and stateful stages of a query on Spark tell its driver per micro-batch
(no pyspark here): the largest event time their operators saw (for the next batch's watermark)
and how many keys each bucket of each stateful operator holds after the batch (`state_keys`).

It travels in a Spark accumulator (`TimeTallyParam`): a task's values reach the driver when the
task ends, before the batch's action returns. Both figures are idempotent, so a task run twice
(a retry, a recomputed partition) adds nothing wrong: the largest of two equal maxima, the
count of the same batch for the same bucket.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TimeTally:
    largest: dict[int, float] = field(default_factory=dict)  # batch -> largest event time seen in it
    # (operator, bucket) -> (batch, keys held after it); the newest batch's count wins
    keys: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)

    def saw(self, batch: int, largest: float | None) -> None:
        if largest is not None and (batch not in self.largest or largest > self.largest[batch]):
            self.largest[batch] = largest

    def held(self, batch: int, operator: str, bucket: int, keys: int) -> None:
        known = self.keys.get((operator, bucket))
        if known is None or known[0] <= batch:
            self.keys[(operator, bucket)] = (batch, keys)

    def merge(self, other: "TimeTally") -> "TimeTally":
        for batch, largest in other.largest.items():
            self.saw(batch, largest)
        for (operator, bucket), (batch, keys) in other.keys.items():
            self.held(batch, operator, bucket, keys)
        return self


class TimeTallyParam:
    """Spark AccumulatorParam (duck-typed) of a `TimeTally`."""

    def zero(self, value: TimeTally) -> TimeTally:
        return TimeTally()

    def addInPlace(self, value: TimeTally, term: TimeTally) -> TimeTally:  # noqa: N802 - Spark's name
        return value.merge(term)
