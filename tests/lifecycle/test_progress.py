"""Progress output: the policy's decisions under a fake clock, and the lines form's text."""

from __future__ import annotations

import io
from datetime import datetime, timedelta, timezone

import pytest

from fissure.lifecycle.progress import ProgressForm, ProgressPolicy, ProgressState, progress_form
from fissure.lifecycle.progress_output import ProgressOutput


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


def test_the_lines_form_prints_the_operator_table_under_the_line_it_comes_with():
    clock = FakeClock()
    stream = io.StringIO()
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    output = ProgressOutput("lines", interval_s=10.0, stream=stream, clock=clock, wall_clock=lambda: at)
    asked = []

    def table():
        asked.append(clock.now)
        return "profile | plan [a,b]\noperator  kind"

    output.show(state(0, 5), table=table)
    clock.now = 101.0
    output.show(state(1, 9), table=table)  # within the interval: no line, and no table asked for
    assert stream.getvalue().splitlines() == [
        "2026-01-02T03:04:05+00:00 fissure | batch 0 | 100 records/s | 5 records | 0 dead letters | plan [a,b]",
        "profile | plan [a,b]", "operator  kind"]
    assert asked == [100.0]


class FakeRunner:
    def __init__(self):
        self.tables = 0

    def due_table(self):
        self.tables += 1
        return "operator table"


def adaptive_progress(stream, clock):
    """An adaptive run's progress (DecisionProgress) over a query whose runner has a table due."""
    from types import SimpleNamespace

    from fissure import Pipeline
    from fissure.spark.adaptive.loop import DecisionProgress

    program = (Pipeline("p").map("tag", lambda r: r)
               .partitioned("count", lambda state, r: r, key="bucket"))
    runner = FakeRunner()
    queries = SimpleNamespace(current=SimpleNamespace(runner=runner), dead_letter_log=SimpleNamespace(count=1))
    observations = SimpleNamespace(input_records=50)
    output = ProgressOutput("auto", interval_s=10.0, stream=stream, clock=clock,
                            wall_clock=lambda: datetime(2026, 1, 2, tzinfo=timezone.utc))
    return DecisionProgress(queries, observations, output, program), runner


def decide(progress, batch_id=3):
    from fissure.control.adaptive.decisions import Decision
    from fissure.control.driver import TimelineEntry

    decision = Decision.keep(batch_id, 5.0, "[tag,count]x2", "no better plan")
    entry = TimelineEntry(batch_id, 5.0, 100.0, 50, None, "[tag,count]x2", 2, "keep", "no better plan",
                          "[tag,count]x2", thread_levels={"enrich": [8, 6]})
    progress(decision, entry)


FIELDS = ("50 records | 1 dead letters | threads enrich 8,6 | plan [tag,count]x2(bucket) | keep: no better plan")


def test_an_adaptive_runs_live_line_has_the_plain_runs_fields_and_its_operator_table():
    """The plan with its key, the thread levels and the operator table, as a plain run shows them."""
    terminal = FakeTerminal()
    progress, runner = adaptive_progress(terminal, FakeClock())
    decide(progress)
    progress.close()
    text = terminal.getvalue()
    assert text.startswith("\r\x1b[Joperator table\nfissure | 100 records/s | batch 3 | " + FIELDS)
    assert runner.tables == 1
    assert progress.last == ProgressState(3, 100.0, 50, 1, "[tag,count]x2(bucket)", threads="enrich 8,6",
                                          decision="keep: no better plan")


def test_an_adaptive_runs_timestamped_lines_have_the_same_fields():
    stream = io.StringIO()
    progress, runner = adaptive_progress(stream, FakeClock())
    decide(progress)
    assert stream.getvalue().splitlines() == [
        "2026-01-02T00:00:00+00:00 fissure | batch 3 | 100 records/s | " + FIELDS, "operator table"]
