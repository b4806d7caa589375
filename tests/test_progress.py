"""Progress output: the policy's decisions under a fake clock, and the lines form's text."""

from __future__ import annotations

import io
from datetime import datetime, timedelta, timezone

import pytest

from fissure.control.progress import ProgressForm, ProgressPolicy, ProgressState, progress_form, requested_mode
from fissure.spark.progress_output import ProgressOutput


class FakeClock:
    def __init__(self, now=100.0):
        self.now = now

    def __call__(self):
        return self.now


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def state(batch_id, records=0, plan="[a,b]", **fields):
    if batch_id is None:
        return ProgressState(None, None, 0, 0, plan, **fields)
    return ProgressState(batch_id, 100.0, records, 0, plan, **fields)


@pytest.mark.parametrize("mode, terminal, form", [
    ("auto", True, ProgressForm.LIVE), ("auto", False, ProgressForm.LINES),
    ("live", False, ProgressForm.LIVE), ("lines", True, ProgressForm.LINES), ("off", True, ProgressForm.OFF)])
def test_the_form_follows_the_mode_and_whether_the_output_is_a_terminal(mode, terminal, form):
    assert progress_form(mode, terminal) is form


def test_a_runs_progress_argument_resolves_against_the_configured_mode():
    assert requested_mode(None, "lines") == "lines"
    assert requested_mode(False, "auto") == "off"
    assert requested_mode(True, "lines") == "lines" and requested_mode(True, "off") == "auto"
    assert requested_mode("live", "auto") == "live"
    with pytest.raises(ValueError, match="progress must be one of auto, live, lines, off"):
        requested_mode("fancy", "auto")


def test_lines_come_at_the_first_batch_each_plan_change_the_interval_and_the_end():
    clock = FakeClock()
    policy = ProgressPolicy(ProgressForm.LINES, lines_interval_s=10.0, clock=clock)
    decisions = []

    def look(at, shown_state, **options):
        clock.now = 100.0 + at
        decisions.append((at, policy.should_show(shown_state, **options)))

    look(1, state(None))  # the first batch runs: nothing yet
    look(10, state(None))  # ... for a whole interval: a line says so
    look(11, state(None))
    look(12, state(0, 10))  # the first batch completed
    look(13, state(1, 20))  # within the interval: no line
    look(21, state(2, 30))
    look(22, state(3, 40))  # 10 s after the last line, something changed
    look(23, state(3, 40, plan="[a]x2"))  # a plan change: at once
    look(40, state(3, 40, plan="[a]x2"))  # nothing changed, however long: no line
    look(41, state(4, 50, plan="[a]x2"))  # changed, the interval passed
    look(42, state(5, 60, plan="[a]x2"), final=True)  # the end: its state, once
    look(43, state(5, 60, plan="[a]x2"), final=True)
    assert [at for at, shown in decisions if shown] == [10, 12, 22, 23, 41, 42]


def test_the_live_line_redraws_on_every_change_and_while_the_first_batch_runs():
    clock = FakeClock()
    policy = ProgressPolicy(ProgressForm.LIVE, lines_interval_s=10.0, clock=clock)
    shown = [policy.should_show(item) for item in (state(None), state(None), state(0, 5), state(0, 5), state(1, 9))]
    assert shown == [True, True, True, False, True]
    assert not ProgressPolicy(ProgressForm.OFF, clock=clock).should_show(state(0, 5), final=True)


def test_the_lines_form_prints_timestamped_plain_lines():
    clock = FakeClock()
    stream = io.StringIO()  # not a terminal: "auto" prints lines
    start = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=1)))
    output = ProgressOutput("auto", interval_s=10.0, stream=stream, clock=clock,
                            wall_clock=lambda: start + timedelta(seconds=clock.now - 100.0))
    clock.now = 110.0
    output.show(state(None))
    clock.now = 112.0
    output.show(ProgressState(0, 1234.5, 5000, 2, "[parse|count]x2(user)", threads="enrich 8,6"))
    clock.now = 113.0
    output.close(ProgressState(1, 2000.0, 9000, 2, "[parse|count]x2(user)", decision="keep: no better plan"))
    assert stream.getvalue().splitlines() == [
        "2026-01-02T03:04:15+01:00 fissure | first batch running for 10 s (Spark starts its Python workers) | "
        "plan [a,b]",
        "2026-01-02T03:04:17+01:00 fissure | batch 0 | 1,234 records/s | 5,000 records | 2 dead letters | "
        "threads enrich 8,6 | plan [parse|count]x2(user)",
        "2026-01-02T03:04:18+01:00 fissure | batch 1 | 2,000 records/s | 9,000 records | 2 dead letters | "
        "plan [parse|count]x2(user) | keep: no better plan"]
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()


def test_the_live_form_redraws_one_line_in_place_and_ends_it():
    clock = FakeClock()
    terminal = FakeTerminal()
    output = ProgressOutput("auto", interval_s=10.0, stream=terminal, clock=clock)
    output.show(state(0, 5))
    output.show(state(1, 9), table=lambda: "operator table")
    output.close(state(1, 9))
    text = terminal.getvalue()
    assert text.startswith("\rfissure | 100 records/s | batch 0 | 5 records | 0 dead letters | plan [a,b]\x1b[K")
    assert "\r\x1b[Joperator table\nfissure | 100 records/s | batch 1 |" in text
    assert text.endswith("\n") and text.count("\n") == 2
