"""A click stream: users who come back after pauses, so that their clicks form sessions.

Each user alternates bursts of clicks (a few seconds apart) and pauses (minutes); the clicks of
all users are interleaved in event-time order, then delivered up to `disorder_s` late. Many users
click in a single burst only (one-time visitors), as real click streams have.
"""

from __future__ import annotations

import random

from generators import in_arrival_order, json_lines

PAGES = ("home", "search", "item", "cart", "checkout", "help", "account")


def generate_clicks(users: int, *, seed: int = 3, start_ts: float = 1_700_000_000.0, span_s: float = 3600.0,
                    disorder_s: float = 2.0) -> list[dict]:
    """Clicks in arrival order: {"user", "page", "ts"}."""
    rng = random.Random(seed)
    clicks = []
    for number in range(users):
        user = f"u{number:05d}"
        ts = start_ts + rng.uniform(0, span_s)
        for _ in range(1 if rng.random() < 0.4 else rng.randint(2, 5)):  # bursts (sessions)
            for _ in range(rng.randint(1, 12)):
                clicks.append({"user": user, "page": rng.choice(PAGES), "ts": round(ts, 3),
                               "arrival": ts + rng.uniform(0, disorder_s)})
                ts += rng.uniform(0.5, 20.0)
            ts += rng.uniform(40.0, 900.0)  # a pause longer than any session gap the example uses
    return in_arrival_order(clicks)


click_lines = json_lines
