"""The time examples (Nexmark's hot items, per-user sessions) against plain-Python references
written from the definitions, not from fissure's code."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))

import fissure  # noqa: E402
import hot_items  # noqa: E402
import sessions  # noqa: E402
from generators.clicks import click_lines, generate_clicks  # noqa: E402
from generators.nexmark import bid_lines, generate_bids  # noqa: E402


def hottest_reference(bids: list[dict], size: float) -> dict[float, tuple[int, int]]:
    """Per window start: (auction with the most bids, its bids), the lower auction id on a tie."""
    counts: dict[float, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for bid in bids:
        counts[(bid["ts"] // size) * size][bid["auction"]] += 1
    hottest = {}
    for start, per_auction in counts.items():
        auction = min(per_auction, key=lambda candidate: (-per_auction[candidate], candidate))
        hottest[start] = (auction, per_auction[auction])
    return hottest


def sessions_reference(clicks: list[dict], gap: float) -> list[tuple]:
    """Per user, clicks in event-time order; a click `gap` or more after the previous one starts a
    new session [first, last + gap)."""
    by_user: dict[str, list[dict]] = defaultdict(list)
    for click in clicks:
        by_user[click["user"]].append(click)
    found = []
    for user, theirs in by_user.items():
        theirs.sort(key=lambda click: click["ts"])
        current = [theirs[0]]
        for click in theirs[1:]:
            if click["ts"] - current[-1]["ts"] >= gap:
                found.append(current)
                current = []
            current.append(click)
        found.append(current)
    return sorted((group[0]["user"], group[0]["ts"], group[-1]["ts"] + gap, len(group),
                   len({click["page"] for click in group})) for group in found)


def test_hot_items_finds_the_hottest_auction_of_every_window():
    bids = generate_bids(6_000)
    results = fissure.run_local(hot_items.build_pipeline(), [{"value": line} for line in bid_lines(bids)])
    assert results.dead_letters == []
    expected = hottest_reference(bids, hot_items.WINDOW_S)
    got = {record["period"]: (record["auction"], record["bids"]) for record in results["sink"]}
    assert len(results["sink"]) == len(got)  # one result per window
    assert got == expected and len(got) == 6  # 6,000 bids 0.01 s apart: one minute


def test_sessions_emits_every_session_the_last_ones_at_the_end_of_input():
    clicks = generate_clicks(400)
    results = fissure.run_local(sessions.build_pipeline(), [{"value": line} for line in click_lines(clicks)])
    assert results.dead_letters == []
    got = sorted((visit["user"], visit["window_start"], visit["window_end"], visit["clicks"], visit["pages"])
                 for visit in results["sink"])
    expected = sessions_reference(clicks, sessions.GAP_S)
    assert len(expected) > 400  # users come back: more sessions than users
    assert got == pytest.approx(expected)


def test_the_examples_in_micro_batches_give_the_same_answer():
    # Cut into micro-batches the watermark moves between them: the same windows, none late.
    bids = generate_bids(3_000, seed=9)
    lines = [{"value": line} for line in bid_lines(bids)]
    steps = fissure.testing.run_batches(hot_items.build_pipeline(), [lines[i:i + 700] for i in range(0, 3_000, 700)])
    emitted = [record for step in steps for record in step.results["sink"]]
    assert sum(step.late_records for step in steps) == 0
    assert sorted((r["period"], r["auction"], r["bids"]) for r in emitted) == sorted(
        (r["period"], r["auction"], r["bids"]) for r in fissure.run_local(hot_items.build_pipeline(), lines)["sink"])


@pytest.mark.spark
@pytest.mark.slow
def test_the_examples_on_spark_under_the_planners_plan_give_the_references_answers(spark, tmp_path):
    from fissure.testing import text_files

    bids = generate_bids(1_500, seed=2)
    clicks = generate_clicks(120, seed=4)
    cases = [(hot_items.build_pipeline(), bid_lines(bids), "hot"), (sessions.build_pipeline(), click_lines(clicks), "visits")]
    outputs = {}
    for pipeline, lines, name in cases:
        source = text_files(tmp_path / name / "in", lines, lines_per_file=500, max_files_per_trigger=1)
        sink = fissure.MemorySink()
        report = fissure.run(pipeline, source, sink, plan="planner", checkpoint=str(tmp_path / name / "ckpt"),
                             config=fissure.RunnerConfig(spark=spark, progress="off"))
        assert report.dead_letters == 0 and report.late_records == 0
        outputs[name] = sink.records()
    got = {record["period"]: (record["auction"], record["bids"]) for record in outputs["hot"]}
    assert got == hottest_reference(bids, hot_items.WINDOW_S)
    visits = sorted((v["user"], v["window_start"], v["window_end"], v["clicks"], v["pages"]) for v in outputs["visits"])
    assert visits == pytest.approx(sessions_reference(clicks, sessions.GAP_S))
