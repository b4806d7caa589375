"""Nexmark's hot items: bids per auction in 10-second event-time windows, and the auction with
the most bids in each window.

    ./dev python examples/hot_items.py [--bids 50000] [--plan planner|sequential|FILE]

The bids (examples/generators/nexmark.py) arrive up to 2 s out of order; the program declares
5 s of lateness, so none is late, and the end of the input closes the last windows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fissure import Count, Pipeline, Tumbling  # noqa: E402
from example_support import example_parser, run_lines_for_people  # noqa: E402
from generators.nexmark import bid_lines, generate_bids  # noqa: E402

WINDOW_S = 10.0
LATENESS_S = 5.0
BID = {"auction": int, "bidder": int, "price": float, "ts": float}


def parse_bid(record):
    bid = json.loads(record["value"])
    return {"auction": int(bid["auction"]), "bidder": int(bid["bidder"]), "price": float(bid["price"]),
            "ts": float(bid["ts"])}


def as_period(record):
    """A window's count, keyed by the window it counts (the next window groups by it; window_end
    stays: it is the event time of a window's output)."""
    return {"period": record["window_start"], "window_end": record["window_end"], "auction": record["auction"],
            "count": record["count"]}


class MostBids:
    """The auction with the most bids in a period (ties: the lower auction id); a fold with a
    merge, so it combines like any aggregate."""

    result_schema = {"auction": int, "bids": int}

    def create(self):
        return [-1, 0]  # auction, bids

    def add(self, acc, record):
        return self.merge(acc, [record["auction"], record["count"]])

    def merge(self, left, right):
        if right[1] > left[1] or (right[1] == left[1] and 0 <= right[0] < left[0]) or left[0] < 0:
            return list(right)
        return left

    def result(self, acc):
        return {"auction": acc[0], "bids": acc[1]}


def build_pipeline() -> Pipeline:
    return (Pipeline("hot_items")
            .map("parse", parse_bid, schema=BID, reads=["value"])
            .event_time("ts", lateness=LATENESS_S)
            .window("bids", key="auction", window=Tumbling(WINDOW_S), aggregate=Count())
            .map("as_period", as_period, schema={"period": float, "window_end": float, "auction": int, "count": int})
            .window("hottest", key="period", window=Tumbling(WINDOW_S), aggregate=MostBids()))


def main(argv=None) -> int:
    parser = example_parser(__doc__, files=5)
    parser.add_argument("--bids", type=int, default=50_000)
    args = parser.parse_args(argv)
    _, hottest = run_lines_for_people(build_pipeline(), bid_lines(generate_bids(args.bids)), args, "hot_items",
                                      what="bids")
    hottest.sort(key=lambda record: record["period"])
    print(f"{len(hottest)} windows of {WINDOW_S:g} s; the hottest auction of the first ten:")
    for record in hottest[:10]:
        print(f"  [{record['period']:.0f}, {record['period'] + WINDOW_S:.0f})  auction {record['auction']:5d}"
              f"  {record['bids']:4d} bids")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
