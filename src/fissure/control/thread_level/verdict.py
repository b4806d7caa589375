"""Whether an operator waits enough for threads to pay: the verdict from its wall and CPU time per
record (`threading_verdict`), a frozen value with its reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Detection: wall time per record at least this many times the CPU time, over at least this many
# timed records (fewer cannot tell a waiting operator from a few slow calls).
WAIT_RATIO = 2.0
MIN_TIMED_RECORDS = 200


@dataclass(frozen=True)
class ThreadingVerdict:
    """Whether an operator should run under the in-worker scheduler, and why."""

    run_threaded: bool
    reason: str


def threading_verdict(
    operator: str,
    *,
    declared_io_bound: bool = False,
    declared_releases_gil: bool = False,
    wall_time_s: float | None = None,
    cpu_time_s: float | None = None,
    wait_ratio: float = 2.0,
) -> ThreadingVerdict:
    """Threads help an operator that waits (I/O) or releases the GIL, nothing else.

    A declaration decides; otherwise a profile whose wall time is at least `wait_ratio` times its
    CPU time shows waiting. Releasing the GIL does not show in such a profile (wall and CPU time
    grow together), so GIL-releasing operators must be declared.
    """
    if declared_io_bound or declared_releases_gil:
        what = "I/O-bound" if declared_io_bound else "GIL-releasing"
        return ThreadingVerdict(True, f"operator {operator!r} is declared {what}")
    if wall_time_s is None or cpu_time_s is None or not (math.isfinite(wall_time_s) and math.isfinite(cpu_time_s)):
        return ThreadingVerdict(False, f"operator {operator!r}: no wall/CPU time profile yet")
    if wall_time_s <= 0:
        return ThreadingVerdict(False, f"operator {operator!r}: no time measured yet")
    if wall_time_s >= wait_ratio * max(cpu_time_s, 0.0):
        return ThreadingVerdict(
            True,
            f"operator {operator!r} waits: wall time {wall_time_s:.3g} s is >= {wait_ratio:g} x CPU time {cpu_time_s:.3g} s",
        )
    return ThreadingVerdict(
        False,
        f"operator {operator!r} is CPU-bound: wall time {wall_time_s:.3g} s < {wait_ratio:g} x CPU time {cpu_time_s:.3g} s",
    )


def detect_waiting(operator: str, *, wall_us_per_record: float | None, cpu_us_per_record: float | None,
                   timed_records: int, min_timed_records: int = MIN_TIMED_RECORDS,
                   wait_ratio: float = WAIT_RATIO) -> ThreadingVerdict:
    """Whether an undeclared operator's profile shows it waiting, so that threads would help:
    wall time per record at least `wait_ratio` x its CPU time, over at least `min_timed_records`
    timed records. Pure; a missing or NaN measurement says no (with the reason).

    Only a waiting operator shows: native code that releases the GIL uses CPU for its whole wall
    time, so it must be declared `waits="gil-free"`. Wall time also grows when the machine is
    overloaded (a process waiting for a core), which is why the ratio is generous.
    """
    if timed_records < min_timed_records:
        return ThreadingVerdict(False, f"operator {operator!r}: {timed_records} timed records, fewer than the "
                                       f"{min_timed_records} needed to tell waiting from a few slow calls")
    wall_s = None if wall_us_per_record is None else wall_us_per_record / 1e6
    cpu_s = None if cpu_us_per_record is None else cpu_us_per_record / 1e6
    return threading_verdict(operator, wall_time_s=wall_s, cpu_time_s=cpu_s, wait_ratio=wait_ratio)
