"""benchmarks/record_breakdown.py's arithmetic and its in-process parts, without Spark and
without timing goals: the parts subtract and scale as documented, and the in-process measurements
run the program's real code paths."""

from __future__ import annotations

import sys

import pytest

from repository import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))

import direct_loops  # noqa: E402
import record_breakdown  # noqa: E402
from record_breakdown import breakdown, ceiling, crossing_share, medians_of  # noqa: E402

MEDIANS = {"jvm": 1.0, "arrow": 3.0, "exchange-base": 5.0, "exchange": 9.0, "conversion": 4.0, "state": 2.0,
           "operator": 6.0, "total": 20.0}


def test_spark_parts_are_differences_and_in_process_parts_share_the_cores():
    parts = breakdown(MEDIANS, cores=2)
    assert parts["jvm"] == 1.0
    assert parts["arrow"] == 2.0  # the identity mapInArrow less the bare scan
    assert parts["exchange"] == 4.0  # with the repartition less without it
    assert (parts["conversion"], parts["state"], parts["operator"]) == (2.0, 1.0, 3.0)
    assert parts["explained"] == 13.0
    assert parts["unexplained"] == 7.0


def test_the_unexplained_part_keeps_its_sign():
    parts = breakdown({**MEDIANS, "total": 10.0}, cores=1)
    assert parts["explained"] == 1 + 2 + 4 + 4 + 2 + 6
    assert parts["unexplained"] == -9.0


def test_the_exchange_is_scaled_by_the_share_of_rows_that_cross():
    assert breakdown(MEDIANS, cores=2, crossing=0.25)["exchange"] == 1.0
    with pytest.raises(ValueError):
        breakdown(MEDIANS, cores=0)


def test_the_ceiling_is_the_direct_loop_over_what_no_run_on_the_path_avoids():
    parts = breakdown(MEDIANS, cores=2)  # jvm 1, arrow 2, conversion 2, operator 3, total 20
    bound = ceiling(parts, cores=2)
    assert bound["direct"] == 6.0  # the direct loop on one thread: the operator part times the cores
    assert bound["floor"] == 6.0  # jvm + arrow + operator
    assert bound["ceiling"] == 1.0
    assert bound["with_conversion"] == 6.0 / 8.0
    assert bound["fissure"] == 6.0 / 20.0


def test_the_ceiling_is_not_a_number_when_the_floor_is_not_positive():
    bound = ceiling({**breakdown(MEDIANS, cores=2), "jvm": -5.0}, cores=2)
    assert bound["ceiling"] != bound["ceiling"]  # nan: the parts overlap at this size, no bound
    with pytest.raises(ValueError):
        ceiling(breakdown(MEDIANS, cores=2), cores=0)


def test_at_most_one_partial_per_distinct_key_and_task_crosses():
    assert crossing_share([10], [1000], tasks=2) == pytest.approx(0.02)
    # a batch with fewer rows than tasks x keys sends every row
    assert crossing_share([10, 600], [1000, 1000], tasks=2) == pytest.approx((20 + 1000) / 2000)
    assert crossing_share([], [], tasks=2) == 0.0
    with pytest.raises(ValueError):
        crossing_share([1], [], tasks=2)


def test_a_workloads_medians_prefer_its_own_runs_over_the_familys():
    block = {**MEDIANS, "total (a)": 30.0, "state (a)": 8.0}
    chosen = medians_of(block, " (a)")
    assert chosen["total"] == 30.0 and chosen["state"] == 8.0 and chosen["jvm"] == 1.0


def test_the_state_part_counts_the_codec_only_in_the_batches_after_the_first():
    lines = ["a b a", "b c"]
    program = direct_loops.programs("wordcount")[""]
    # an empty second batch: nothing timed, whatever the first batch spent
    assert record_breakdown.state_us(program, [lines, []]) == 0.0
    assert record_breakdown.state_us(program, [lines, lines]) > 0.0


def test_the_codec_is_restored_after_timing():
    from fissure.runtime.state.codec import StateCodec

    before = StateCodec.dumps
    with record_breakdown.timed_state_codec():
        assert StateCodec.dumps is not before
    assert StateCodec.dumps is before


def test_the_keyed_records_are_the_programs_words():
    records = record_breakdown.exchanged_records("wordcount", ["The cat", "the"])
    assert records == [{"word": "the"}, {"word": "cat"}, {"word": "the"}]


def test_conversion_goes_through_fissures_arrow_rows(monkeypatch):
    seen = []
    import fissure.runtime.records.arrow_rows as arrow_rows

    original = arrow_rows.batch_records
    monkeypatch.setattr(arrow_rows, "batch_records", lambda batch: seen.append(batch.num_rows) or original(batch))
    assert record_breakdown.conversion_us([[{"value": "x"}] * 3, [{"word": "y"}] * 2], records=3) >= 0.0
    assert seen == [3, 2]


def test_the_hot_items_keyed_records_are_the_programs_bids():
    line = '{"auction": 30, "bidder": 7, "price": 12.5, "ts": 1700000004.5}'
    assert record_breakdown.exchanged_records("hot-items", [line]) == [
        {"auction": 30, "bidder": 7, "price": 12.5, "ts": 1700000004.5}]


def test_the_hot_items_partials_are_one_per_auction_and_window(tmp_path):
    bids = [(30, 1700000001.0), (30, 1700000009.9), (40, 1700000002.0), (30, 1700000010.0)]
    path = tmp_path / "bids.txt"
    path.write_text("".join(f'{{"auction": {a}, "bidder": 1, "price": 1.0, "ts": {ts}}}\n' for a, ts in bids))
    # (30, [0, 10)), (40, [0, 10)) and (30, [10, 20)): three partials for four bids
    assert record_breakdown.distinct_keys("hot-items", [[str(path)]]) == ([3], [4])


def test_the_hot_items_state_is_read_and_written_in_the_second_batch():
    from generators.nexmark import bid_lines, generate_bids

    lines = bid_lines(generate_bids(400))
    program = direct_loops.programs("hot-items")[""]
    assert record_breakdown.state_us(program, [lines[:200], []]) == 0.0
    assert record_breakdown.state_us(program, [lines[:200], lines[200:]]) > 0.0
