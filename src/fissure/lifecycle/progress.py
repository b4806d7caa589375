"""When a run's progress is shown, and in which form (pure policy: no Spark, no printing).

Forms, chosen by `progress_form(mode, is_terminal)` from a mode (RunnerConfig.progress,
`fissure run --progress`):

- "live": one line redrawn in place, the profiler's table above it (a terminal);
- "lines": plain lines, each starting with the ISO time, for a file, a pipe or a CI log: no
  carriage returns, no escape codes;
- "off": nothing;
- "auto" (the default): "live" where the output is a terminal, "lines" elsewhere.

`ProgressPolicy` decides, at each look at the run, whether the newest `ProgressState` is shown:

- live: whenever it changed, and every look while the first batch runs (its seconds count up);
  looks come every `RunnerConfig.progress_interval_s` (1 s), or at each adaptive decision;
- lines: a line when the first batch completes, when the plan changes, at the end (unless that
  state was the last line), and otherwise at most one line per `lines_interval_s`
  (`RunnerConfig.progress_lines_interval_s`, 10 s) when something changed; while the first
  batch runs, one line per interval says so. An idle stream adds no lines: the last line's time
  says since when it has been idle.

The clock comes in (seconds, any origin): tests drive the policy with a fake one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

PROGRESS_MODES = ("auto", "live", "lines", "off")
DEFAULT_LINES_INTERVAL_S = 10.0


class ProgressForm(Enum):
    LIVE = "live"
    LINES = "lines"
    OFF = "off"


def check_progress_mode(mode: str) -> str:
    if mode not in PROGRESS_MODES:
        raise ValueError(f"progress must be one of {', '.join(PROGRESS_MODES)}, got {mode!r}")
    return mode


def progress_form(mode: str, is_terminal: bool) -> ProgressForm:
    """The form `mode` takes on an output that is (or is not) a terminal."""
    if check_progress_mode(mode) == "auto":
        return ProgressForm.LIVE if is_terminal else ProgressForm.LINES
    return ProgressForm(mode)


def watermark_text(watermark: float | None, now_s: float) -> str:
    """The progress line's time field: the watermark, and how far it is behind `now_s` (the
    wall clock) when the event times are seconds since the epoch (after 2001); "" without one."""
    if watermark is None:
        return ""
    if watermark == float("-inf"):
        return "watermark -inf"
    shown = f"{watermark:.0f}" if abs(watermark) >= 1000 or watermark == int(watermark) else f"{watermark:g}"
    lag = f" (lag {max(0.0, now_s - watermark):.0f} s)" if 1e9 <= watermark <= now_s + 86400 * 365 else ""
    return f"watermark {shown}{lag}"


@dataclass(frozen=True)
class ProgressState:
    """What the progress output shows about a run at one moment."""

    batch_id: int | None  # the newest completed micro-batch; None while the first one runs
    records_per_s: float | None  # that batch's input records per second (None: not known)
    input_records: int  # total over the run so far
    dead_letters: int  # total over the run so far
    plan: str  # the plan in force, described
    threads: str = ""  # waiting operators' thread level per worker after the batch: "enrich 8,6"
    time: str = ""  # the event-time watermark the newest batch ran with, and its lag: "watermark 1700000000 (lag 12 s)"
    decision: str = ""  # an adaptive run's last decision: "keep: ..."
    stall: str = ""  # the watchdog's note on the batch running now: "batch 3 stuck 95 s in 'parse'"

    @property
    def waiting(self) -> bool:
        return self.batch_id is None


class ProgressPolicy:
    """Whether each look at a run shows its state (see the module docstring)."""

    def __init__(self, form: ProgressForm, *, lines_interval_s: float = DEFAULT_LINES_INTERVAL_S,
                 clock: Callable[[], float]) -> None:
        if lines_interval_s <= 0:
            raise ValueError(f"lines_interval_s must be positive, got {lines_interval_s!r}")
        self.form = form
        self.lines_interval_s = lines_interval_s
        self._clock = clock
        self._last_shown: ProgressState | None = None
        self._last_shown_at = clock()  # the run's start counts as a shown moment: the first wait line is due later

    @property
    def last_shown(self) -> ProgressState | None:
        return self._last_shown

    def should_show(self, state: ProgressState, *, final: bool = False) -> bool:
        """Whether `state` is shown now (`final`: the run's last look); a yes is remembered."""
        now = self._clock()
        if self.form is ProgressForm.OFF:
            return False
        changed = state != self._last_shown
        if self.form is ProgressForm.LIVE:
            show = changed or state.waiting or final
        elif final:
            show = changed
        elif self._last_shown is not None and state.plan != self._last_shown.plan:
            show = True
        elif not state.waiting and (self._last_shown is None or self._last_shown.waiting):
            show = True  # the first completed batch
        else:
            show = now - self._last_shown_at >= self.lines_interval_s and (changed or state.waiting)
        if show:
            self._last_shown, self._last_shown_at = state, now
        return show
