"""benchmarks/elastic_threads.py's comparison, on hand-made confirmation blocks: levels are
compared within the same blocks (whole blocks drift together), the best level is chosen over the
complete blocks only, and the paired ratio and its spread are plain arithmetic. Pure: no timing."""

from __future__ import annotations

import os
import sys

import pytest

from repository import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))

# The module pins BLAS to one thread on import; the rest of the test session keeps its own setting.
_environment = dict(os.environ)
import elastic_threads  # noqa: E402
from elastic_threads import PhaseSummary, Settings, closing_levels, compare  # noqa: E402

os.environ.clear()
os.environ.update(_environment)

SWEEP = {15: [4700.0], 16: [5000.0], 17: [4900.0], 20: [4800.0]}


def runs(level: int, rate: float, count: int) -> list[PhaseSummary]:
    return [PhaseSummary(settled_level=level, settled_throughput_per_s=rate, periods=90)] * count


class TestPairedComparison:
    # Three high blocks before level 15 joined, then three closing blocks 10 % lower in which
    # 15 is 1 % below 16: over all blocks, 16's median mixes high and low blocks.
    HIGH = [{16: 5200.0, 17: 5100.0}] * 3
    CLOSING = [{15: 4554.0, 16: 4600.0, 17: 4500.0}, {15: 4455.0, 16: 4500.0, 17: 4400.0},
               {15: 4653.0, 16: 4700.0, 17: 4600.0}]

    def test_a_level_measured_only_in_low_blocks_is_not_judged_worse_for_it(self):
        result = compare(SWEEP, self.HIGH + self.CLOSING, runs(15, 4500.0, 3))
        assert result["best_static_level"] == 16
        # 0.99 in every block; the medians over every block that measured each level give 4554 / 4950.
        assert result["static_at_settled_over_best"] == pytest.approx(0.99)
        assert result["complete_blocks"] == 3

    def test_the_best_level_is_chosen_over_the_complete_blocks_only(self):
        # 20 was measured high in early blocks only, and 16 is higher there than in any later
        # block; 15 joined late and beats 16 in every complete block.
        early = [{16: 5600.0, 17: 5500.0, 20: 6000.0}] * 3
        closing = [{15: 4600.0, 16: 4500.0, 17: 4400.0}, {15: 4500.0, 16: 4400.0, 17: 4300.0}]
        result = compare(SWEEP, early + closing, runs(16, 4400.0, 2))
        assert result["best_static_level"] == 15
        assert result["confirmed_median_per_s"] == {15: 4550.0, 16: 4450.0, 17: 4350.0}
        assert result["best_static_per_s"] == 4550.0
        assert result["complete_blocks"] == 2

    def test_a_between_runs_block_that_measured_every_level_counts_as_complete(self):
        blocks = [{16: 100.0, 17: 90.0}, {16: 100.0}, {16: 110.0, 17: 99.0}]
        result = compare(SWEEP, blocks, runs(17, 90.0, 2))
        assert result["complete_blocks"] == 2
        assert result["static_at_settled_over_best_per_block"] == pytest.approx([0.9, 0.9])


class TestArithmetic:
    BLOCKS = [{10: 100.0, 12: 95.0}, {10: 200.0, 12: 180.0}, {10: 50.0, 12: 49.0}]

    def test_ratio_spread_and_count(self):
        result = compare({10: [1.0], 12: [2.0]}, self.BLOCKS, runs(12, 142.5, 1) + runs(11, 125.0, 1))
        assert result["best_static_level"] == 10
        assert result["best_static_per_s"] == 100.0
        # The median settled level of (12, 11) is 11 (the lower middle), not among the candidates.
        assert result["static_at_settled_over_best_per_block"] == []
        assert result["elastic_over_best_static_per_run"] == pytest.approx([142.5 / 150, 125.0 / 125])

    def test_settled_level_ratio_per_block(self):
        result = compare({10: [1.0], 12: [2.0]}, self.BLOCKS, runs(12, 142.5, 3))
        assert result["static_at_settled_over_best_per_block"] == pytest.approx([0.95, 0.90, 0.98])
        assert result["static_at_settled_over_best"] == pytest.approx(0.95)
        assert result["static_at_settled_over_best_min"] == pytest.approx(0.90)
        assert result["static_at_settled_over_best_max"] == pytest.approx(0.98)
        assert result["complete_blocks"] == 3
        assert result["elastic_over_best_static_per_run"] == pytest.approx([0.95, 142.5 / 125, 142.5 / 50])
        assert result["elastic_over_best_static"] == pytest.approx(142.5 / 125)
        assert result["within_5_percent"] is True

    def test_a_run_with_no_measurement_of_the_best_level_around_it_is_counted(self):
        blocks = [{16: 100.0}, {16: 100.0}, {16: 100.0, 17: 120.0}]
        result = compare(SWEEP, blocks, runs(16, 100.0, 2))
        assert result["best_static_level"] == 17
        assert result["elastic_over_best_static_per_run"] == pytest.approx([100.0 / 120])
        assert result["elastic_runs_without_best_nearby"] == 1


class TestClosingLevels:
    SWEEP = {level: [float(100 - abs(level - 17))] for level in range(1, 33)}  # top: 17, 16, 18

    def test_top_levels_then_each_policys_median_then_the_most_frequent(self):
        settings = Settings(confirm_top_levels=3, closing_max_levels=6)
        settled = {"trust-trend": [12, 12, 25, 13, 13], "elastic-operator": [22, 22, 22, 21, 20]}
        # Medians: 13 and 22; then by frequency 12 (twice), then 20, 21, 25 (once each, lowest first).
        assert closing_levels(self.SWEEP, settled, settings) == (12, 13, 16, 17, 18, 22)

    def test_every_settled_level_fits_under_the_cap(self):
        settled = {"trust-trend": [15, 16, 19], "elastic-operator": [14, 17]}
        assert closing_levels(self.SWEEP, settled, Settings()) == (14, 15, 16, 17, 18, 19)


def test_settings_need_a_closing_block():
    with pytest.raises(ValueError, match="closing_blocks"):
        Settings(closing_blocks=0)
    assert elastic_threads.QUICK.closing_blocks == 1
