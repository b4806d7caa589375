"""Printing a run's progress (the mechanism; when and in which form: fissure.lifecycle.progress).

    output = ProgressOutput("auto", interval_s=10.0)    # live on a terminal, lines elsewhere
    output.show(state)                                  # each look at the run
    output.close(state)                                 # the end

Both forms show the same fields: the batch, records/s, records, dead letters, the waiting
operators' thread levels, the plan (with its keys), an adaptive run's last decision, and the
profiler's operator table when one is due. The live form redraws one line in place (a carriage
return, then erase-to-end-of-line), with the table above it (cursor moves up over the last
table, erase below); its plan is abbreviated to the terminal's width. The lines form prints
whole lines, each starting with the local time in ISO 8601 with its offset, the plan in full,
and the table as plain lines under the line it came with:

    2026-11-25T13:40:12+00:00 fissure | batch 17 | 12,345 records/s | 210,000 records | 3 dead letters | plan [parse|events]x2 -> [results]

Both the chain/graph runner (fissure.spark.query.runner) and the adaptive run (fissure.spark.adaptive.loop)
print through this class.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import TextIO

from fissure.lifecycle.progress import ProgressForm, ProgressPolicy, ProgressState, progress_form
from fissure.plan.plans import plan_line

WAITING_NOTE = "(Spark starts its Python workers)"


def local_now() -> datetime:
    return datetime.now().astimezone()


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def terminal_columns(stream: TextIO) -> int | None:
    """The width a live line may take on `stream` (None: not a terminal, or its width unknown)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns if is_terminal(stream) else 0
    except (AttributeError, OSError, ValueError):
        return None
    return columns - 1 if columns > 1 else None  # a terminal that reports no width (0): not cut


def progress_fields(state: ProgressState, waiting_s: float, *, batch_first: bool = False) -> str:
    """The state's fields before its plan, each followed by ` | `."""
    stall = f"{state.stall} | " if state.stall else ""
    if state.waiting:
        return f"first batch running for {waiting_s:.0f} s {WAITING_NOTE} | {stall}"
    rate = f"{state.records_per_s:,.0f} records/s" if state.records_per_s is not None else "- records/s"
    batch = f"batch {state.batch_id}"
    fields = [batch, rate] if batch_first else [rate, batch]
    fields += [f"{state.input_records:,} records", f"{state.dead_letters} dead letters"]
    if state.threads:
        fields.append(f"threads {state.threads}")
    if state.time:
        fields.append(state.time)
    if state.stall:
        fields.append(state.stall)
    return "".join(field + " | " for field in fields)


def live_line(state: ProgressState, waiting_s: float, max_chars: int | None) -> str:
    """The live form's line; longer than `max_chars` (a terminal's width), its plan is abbreviated."""
    decision = f" | {state.decision}" if state.decision else ""
    return plan_line(f"fissure | {progress_fields(state, waiting_s)}plan ", state.plan + decision, max_chars)


def timestamped_line(state: ProgressState, waiting_s: float, at: datetime) -> str:
    """The lines form's line: the time, then the batch (lines are read batch by batch), the plan
    in full, no terminal codes."""
    decision = f" | {state.decision}" if state.decision else ""
    return (f"{at.isoformat(timespec='seconds')} fissure | {progress_fields(state, waiting_s, batch_first=True)}"
            f"plan {state.plan}{decision}")


class ProgressOutput:
    """Shows a run's progress on `stream` (stderr) in the form `mode` takes there, when the
    policy says so. `clock`: seconds for the policy and the first batch's wait; `wall_clock`:
    the time printed on each line."""

    def __init__(self, mode: str, *, interval_s: float, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], datetime] = local_now) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.form = progress_form(mode, is_terminal(self.stream))
        self.policy = ProgressPolicy(self.form, lines_interval_s=interval_s, clock=clock)
        self._clock, self._wall_clock = clock, wall_clock
        self._started_s = clock()
        self._table_lines = 0  # lines of the table drawn above the live line
        self._line_open = False  # a live line is on the screen without its newline

    @property
    def enabled(self) -> bool:
        return self.form is not ProgressForm.OFF

    def show(self, state: ProgressState, *, table: Callable[[], str | None] | None = None,
             final: bool = False) -> bool:
        """Show `state` if the policy says so (True then). `table`: the profiler's table when one
        is due (None: not now), asked for only when a line is shown: drawn above the live line,
        printed under a timestamped line."""
        if not self.policy.should_show(state, final=final):
            return False
        waiting_s = self._clock() - self._started_s
        if self.form is ProgressForm.LINES:
            drawn = table() if table else None
            print(timestamped_line(state, waiting_s, self._wall_clock()) + ("\n" + drawn if drawn else ""),
                  file=self.stream, flush=True)
            return True
        self._draw(live_line(state, waiting_s, terminal_columns(self.stream)), table() if table else None)
        return True

    def close(self, state: ProgressState | None = None) -> None:
        """The end of the run: `state` shown a last time (if the policy says so); the live line
        is ended with its newline."""
        if state is not None:
            self.show(state, final=True)
        if self._line_open:
            print(file=self.stream, flush=True)
            self._line_open = False

    def _draw(self, line: str, table: str | None) -> None:
        if table is None:
            print("\r" + line + "\x1b[K", end="", file=self.stream, flush=True)
        else:
            up = f"\x1b[{self._table_lines}F" if self._table_lines else "\r"
            print(up + "\x1b[J" + table + "\n" + line, end="", file=self.stream, flush=True)
            self._table_lines = table.count("\n") + 1
        self._line_open = True
