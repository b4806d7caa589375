"""Event-time windows in process against plain-Python references: tumbling, sliding and session
windows on out-of-order input over several micro-batches, late records, the end of input, and
any cut of the input into micro-batches giving the same windows when no record is late."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fissure
from fissure import Count, Pipeline, Session, Sliding, Sum, Tumbling
from fissure.testing import run_batches

SCHEMA = {"user": str, "ts": float, "v": int}


def program(window, lateness: float, aggregate=None) -> Pipeline:
    return (Pipeline("windows").event_time("ts", lateness=lateness)
            .window("w", key="user", window=window, aggregate=aggregate or Sum("v")))


def watermarks(batches: list[list[dict]], lateness: float) -> list[float]:
    """W_N for each batch: the largest event time of the batches before it, minus the lateness."""
    marks, largest = [], -math.inf
    for batch in batches:
        marks.append(largest - lateness)
        largest = max([largest] + [event["ts"] for event in batch])
    return marks


def windows_of(t: float, size: float, every: float) -> list[tuple[float, float]]:
    """The sliding windows [s, s + size) with s a multiple of `every` that hold t (tumbling: every = size)."""
    found = []
    start = math.floor(t / every) * every
    while start + size > t:
        found.append((start, start + size))
        start -= every
    return found


def reference_windows(batches, size, every, lateness):
    """(key, start, end, sum, emitted in batch) for every window, and the late events, by hand."""
    marks = watermarks(batches, lateness)
    sums, first_batch, late = {}, {}, []
    for number, batch in enumerate(batches):
        previous = marks[number - 1] if number else -math.inf
        for event in batch:
            open_windows = [w for w in windows_of(event["ts"], size, every) if w[1] > previous]
            if not open_windows:
                late.append(event)
            for start, end in open_windows:
                key = (event["user"], start, end)
                sums[key] = sums.get(key, 0) + event["v"]
                first_batch.setdefault(key, number)
    emitted = set()
    for (user, start, end), total in sums.items():
        fired = next((n for n in range(first_batch[(user, start, end)], len(batches)) if marks[n] >= end), "end")
        emitted.add((user, start, end, total, fired))
    return emitted, late


def emitted_by_batch(steps) -> set:
    return {(record["user"], record["window_start"], record["window_end"], record["sum"],
             "end" if step.end_of_input else step.batch)
            for step in steps for record in step.results["sink"]}


def shuffled_events(seed: int, count: int = 60, disorder: float = 0.0) -> list[dict]:
    """Events in arrival order; `disorder` > 0: an event arrives after others up to that much later."""
    rng = random.Random(seed)
    events = [{"user": rng.choice("abc"), "ts": float(rng.randrange(0, 200)), "v": rng.randrange(1, 9)}
              for _ in range(count)]
    return sorted(events, key=lambda event: event["ts"] - rng.uniform(0, disorder)) if disorder else events


def cut(events: list, sizes: list[int]) -> list[list]:
    batches, start = [], 0
    for size in sizes:
        batches.append(events[start:start + size])
        start += size
    return batches + [events[start:]] if start < len(events) else batches


@pytest.mark.parametrize("size,every", [(10.0, 10.0), (20.0, 5.0), (15.0, 10.0)])
def test_tumbling_and_sliding_windows_match_the_reference_with_late_records_over_micro_batches(size, every):
    events = shuffled_events(7, 80, disorder=100.0)  # out of order by up to 100 s, lateness 5: some are late
    batches = cut(events, [12, 5, 20, 0, 15, 8])
    window = Tumbling(size) if size == every else Sliding(size, every)
    steps = run_batches(program(window, 5.0), batches, schema=SCHEMA)
    expected, late = reference_windows(batches, size, every, 5.0)
    assert late, "the input must have late records to test the late rule"
    assert emitted_by_batch(steps) == expected
    letters = [letter for step in steps for letter in step.dead_letters]
    assert len(letters) == len(late) and all(letter.node == "w" and letter.error.startswith("Late: event time ")
                                             for letter in letters)
    assert sorted(letter.record for letter in letters) == sorted(fissure.runtime.records.fate.record_text(e) for e in late)


def test_a_late_record_names_its_window_and_the_watermark_it_closed_at():
    steps = run_batches(program(Tumbling(10.0), 2.0), [[{"user": "a", "ts": 5.0, "v": 1}], [{"user": "a", "ts": 25.0,
                                                                                                "v": 1}],
                                                       [{"user": "a", "ts": 12.0, "v": 1}],
                                                       [{"user": "a", "ts": 9.0, "v": 1}]])
    # W: -inf, 3, 23, 23. [0, 10) fires in batch 1 (W 3? no: 10 > 3) -> batch 2 (W 23); ts 12 in
    # batch 2 is judged against W_1 = 3: not late; ts 9 in batch 3 against W_2 = 23: late.
    (letter,) = [letter for step in steps for letter in step.dead_letters]
    assert letter.error == "Late: event time 9 is in window [0, 10) that closed at watermark 23"
    assert steps[3].late_records == 1 and [step.watermark for step in steps[:4]] == [-math.inf, 3.0, 23.0, 23.0]
    assert [(r["window_start"], r["sum"]) for r in steps[2].results["sink"]] == [(0.0, 1), (10.0, 1)]


def reference_sessions(events: list[dict], gap: float) -> set:
    """(user, start, end, count, sum): each user's events sorted, split where the next is gap or more later."""
    sessions = set()
    for user in {event["user"] for event in events}:
        times = sorted((event["ts"], event["v"]) for event in events if event["user"] == user)
        group = [times[0]]
        for item in times[1:] + [None]:
            if item is None or item[0] - group[-1][0] >= gap:
                sessions.add((user, group[0][0], group[-1][0] + gap, len(group), sum(v for _, v in group)))
                group = [item]
            else:
                group.append(item)
    return sessions


class SumAndCount(fissure.Aggregate):
    """A user's own aggregate (the protocol without subclassing a builtin)."""

    result_schema = {"n": int, "total": int}

    def create(self):
        return [0, 0]

    def add(self, acc, record):
        return [acc[0] + 1, acc[1] + record["v"]]

    def merge(self, first, second):
        return [first[0] + second[0], first[1] + second[1]]

    def result(self, acc):
        return {"n": acc[0], "total": acc[1]}


def test_every_session_comes_out_once_the_last_ones_at_end_of_input():
    events = shuffled_events(3, 120, disorder=30.0)
    batches = cut(events, [25, 25, 0, 30])
    steps = run_batches(program(Session(8.0), 30.0, SumAndCount()), batches, schema=SCHEMA)
    assert not [letter for step in steps for letter in step.dead_letters]
    got = [(r["user"], r["window_start"], r["window_end"], r["n"], r["total"]) for step in steps
           for r in step.results["sink"]]
    assert len(got) == len(set(got)) and set(got) == reference_sessions(events, 8.0)
    # the sessions still open when the input ends (each user's last one, at least) come out at its end
    last = {user: max(s[2] for s in got if s[0] == user) for user in "abc"}
    flushed = {(r["user"], r["window_end"]) for r in steps[-1].results["sink"]}
    assert steps[-1].end_of_input and set(last.items()) <= flushed
    # and a session came out in the first batch whose watermark passed its end after its last event
    marks = watermarks(batches, 30.0)
    for number, step in enumerate(steps[:-1]):
        for r in step.results["sink"]:
            assert marks[number] >= r["window_end"]


def test_a_record_that_would_join_an_emitted_session_is_late_and_sessions_merge():
    def event(user, ts):
        return {"user": user, "ts": ts, "v": 1}

    batches = [[event("a", 0.0), event("b", 12.0)],
               [event("b", 13.0)],  # runs with W 12: a's [0, 10) comes out
               [event("a", 8.0), event("a", -20.0)],  # 8 would join [0, 10); -20's own [-20, -10) is closed
               [event("a", 30.0), event("a", 45.0)],  # two sessions, [30, 40) and [45, 55)
               [event("a", 38.0)]]  # bridges them: one session [30, 55) of 3
    steps = run_batches(program(Session(10.0), 0.0, Count()), batches, schema=SCHEMA)
    out = [[(r["user"], r["window_start"], r["window_end"], r["count"]) for r in step.results["sink"]]
           for step in steps]
    assert out == [[], [("a", 0.0, 10.0, 1)], [], [], [("b", 12.0, 23.0, 2)], [("a", 30.0, 55.0, 3)]]
    errors = [letter.error for step in steps for letter in step.dead_letters]
    assert errors == ["Late: event time -20 is in session [-20, -10) that closed at watermark 12",
                      "Late: event time 8 is in session [0, 10) that closed at watermark 12"]
    # in one batch, 8 would have joined 0: a session [0, 18) of 2, which the late rule keeps from
    # coming out beside the [0, 10) already emitted
    whole = fissure.run_local(program(Session(10.0), 0.0, Count()), [e for batch in batches for e in batch])
    assert ("a", 0.0, 18.0, 2) in [(r["user"], r["window_start"], r["window_end"], r["count"]) for r in whole["sink"]]


def test_keys_without_records_in_a_batch_still_fire_their_windows():
    batches = [[{"user": "a", "ts": 1.0, "v": 1}, {"user": "b", "ts": 2.0, "v": 5}],
               [{"user": "c", "ts": 50.0, "v": 1}], []]
    steps = run_batches(program(Tumbling(10.0), 0.0), batches, schema=SCHEMA)
    # batch 2 runs with W = 50: a's and b's windows fire though neither has a record in it
    assert sorted((r["user"], r["sum"]) for r in steps[2].results["sink"]) == [("a", 1), ("b", 5)]
    assert [(r["user"], r["window_end"]) for r in steps[3].results["sink"]] == [("c", 60.0)]


def test_stopping_early_flushes_nothing_and_a_later_batch_goes_on():
    batches = [[{"user": "a", "ts": 1.0, "v": 1}]]
    steps = run_batches(program(Tumbling(10.0), 0.0), batches, schema=SCHEMA, end_of_input=False)
    assert len(steps) == 1 and steps[0].results["sink"] == []


def test_run_local_is_one_batch_and_the_end_of_input():
    events = shuffled_events(11, 50, disorder=100.0)
    results = fissure.run_local(program(Tumbling(10.0), 0.0), events)
    expected, late = reference_windows([events], 10.0, 10.0, 0.0)
    assert not late and not results.dead_letters
    assert {(r["user"], r["window_start"], r["window_end"], r["sum"], "end") for r in results["sink"]} == expected
    assert results.watermark == max(event["ts"] for event in events) + 10.0


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), sizes=st.lists(st.integers(0, 30), max_size=8),
       window=st.sampled_from([Tumbling(10.0), Sliding(20.0, 5.0), Session(7.0)]))
def test_any_cut_into_micro_batches_gives_the_same_windows_when_no_record_is_late(seed, sizes, window):
    disorder = 25.0
    events = shuffled_events(seed, 60, disorder=disorder)
    batches = cut(events, sizes)
    steps = run_batches(program(window, disorder), batches, schema=SCHEMA)
    assert not [letter for step in steps for letter in step.dead_letters]  # lateness >= disorder: none late
    got = sorted((r["user"], r["window_start"], r["window_end"], r["sum"]) for step in steps
                 for r in step.results["sink"])
    whole = fissure.run_local(program(window, disorder), events)
    assert got == sorted((r["user"], r["window_start"], r["window_end"], r["sum"]) for r in whole["sink"])
    if isinstance(window, Session):
        assert {(u, s, e, total) for u, s, e, _, total in reference_sessions(events, 7.0)} == set(got)
    else:
        size, every = (10.0, 10.0) if isinstance(window, Tumbling) else (20.0, 5.0)
        expected, _ = reference_windows([events], size, every, disorder)
        assert {item[:4] for item in expected} == set(got)
