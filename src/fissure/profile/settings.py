"""The profiler's settings, in one typed place, with their defaults and what they are for."""

from __future__ import annotations

from dataclasses import dataclass

COST_BASES = ("cpu", "wall")


@dataclass(frozen=True)
class ProfileSettings:
    """How fissure profiles a running pipeline. Every field has a default that works as it is.

    Counting records in and out per operator is always exact; only timing is sampled.
    """

    # Profile at all (off: no accumulator, no wrappers, no log).
    enabled: bool = True
    # A fused stage times every n-th Arrow batch it processes (1: every batch; a timed batch costs
    # two clock reads per operator, against milliseconds of work for a batch of 10,000 records).
    timed_every_batches: int = 1
    # A stateful operator is called per record: it times every n-th record (a timed record costs
    # two thread-CPU clock reads, a system call of about a microsecond each here).
    timed_every_records: int = 32
    # Micro-batches a summary (the live table, the planner's estimates) rests on: the latest ones.
    window_batches: int = 20
    # What an operator's cost is: "cpu" (thread CPU time per record: what it takes of a core, and
    # robust on a busy machine) or "wall" (elapsed time per record: counts waiting on I/O too).
    cost_basis: str = "cpu"
    # Seconds between redraws of the live statistics table under the progress line.
    table_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if self.timed_every_batches < 1 or self.timed_every_records < 1:
            raise ValueError("timed_every_batches and timed_every_records must be >= 1 (1: time everything)")
        if self.window_batches < 1:
            raise ValueError(f"window_batches must be >= 1, got {self.window_batches}")
        if self.cost_basis not in COST_BASES:
            raise ValueError(f"cost_basis must be one of {', '.join(COST_BASES)}, got {self.cost_basis!r}")
        if not self.table_interval_s > 0:
            raise ValueError(f"table_interval_s must be > 0, got {self.table_interval_s}")
