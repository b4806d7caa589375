"""Input generators for the examples: realistic records of any size, shipped with the repository."""

from __future__ import annotations

import json


def in_arrival_order(events: list[dict]) -> list[dict]:
    """`events`, each with an "arrival" time, sorted by it and without it: the order a stream
    delivers events that left their source in event-time order and arrived a little late."""
    events.sort(key=lambda event: event["arrival"])
    for event in events:
        del event["arrival"]
    return events


def json_lines(records: list[dict]) -> list[str]:
    return [json.dumps(record) for record in records]
