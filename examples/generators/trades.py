"""Trades of a few symbols as a random walk around a price, for the VWAP example."""

from __future__ import annotations

import random

SYMBOLS = {"ACME": 120.0, "GLOBX": 54.5, "INITECH": 310.0, "UMBRL": 12.25, "HOOLI": 880.0}


def generate(count: int, seed: int = 11, start_ts: float = 1_700_000_000.0) -> list[dict]:
    rng = random.Random(seed)
    prices = dict(SYMBOLS)
    trades = []
    for number in range(count):
        symbol = rng.choice(list(prices))
        prices[symbol] = max(0.01, prices[symbol] * (1 + rng.gauss(0, 0.002)))
        trades.append({"id": number, "ts": start_ts + number * 0.01, "symbol": symbol,
                       "price": round(prices[symbol], 4), "volume": rng.randint(1, 50) * 100})
    return trades
