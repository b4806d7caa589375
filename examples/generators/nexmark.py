"""Nexmark bids: auctions open over time, most bids go to a few hot auctions, events arrive a
little out of order.

After the bid stream of Nexmark (Tucker, Tufte, Papadimos and Maier, "NEXMark - A Benchmark for
Queries over Data Streams", 2008) as Apache Beam's Nexmark generator shapes it: one auction opens
every `bids_per_auction` bids, a bid goes to one of the `active_auctions` most recent auctions,
and all but one in `hot_ratio` of the bids go to a hot auction (an id that is a multiple of
`hot_ratio`). Event times advance `interval_s` a bid; each bid is delivered up to `disorder_s`
seconds of event time late (the order of the lines is the arrival order).
"""

from __future__ import annotations

import random

from generators import in_arrival_order, json_lines


def generate_bids(count: int, *, seed: int = 5, start_ts: float = 1_700_000_000.0, interval_s: float = 0.01,
                  bids_per_auction: int = 50, active_auctions: int = 100, hot_ratio: int = 10,
                  disorder_s: float = 2.0) -> list[dict]:
    """`count` bids in arrival order: {"auction", "bidder", "price", "ts"}."""
    rng = random.Random(seed)
    bids = []
    for number in range(count):
        newest = number // bids_per_auction
        auction = newest - rng.randrange(min(active_auctions, newest + 1))
        if rng.randrange(hot_ratio) > 0:
            auction = (auction // hot_ratio) * hot_ratio
        ts = start_ts + number * interval_s
        bids.append({"auction": auction, "bidder": rng.randrange(1000), "price": round(rng.uniform(1, 500), 2),
                     "ts": round(ts, 3), "arrival": ts + rng.uniform(0, disorder_s)})
    return in_arrival_order(bids)


bid_lines = json_lines
