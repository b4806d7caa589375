"""A query's progress updates, each brought over from the JVM once.

`query.recentProgress` converts every update Spark keeps (up to 100) from JSON through py4j on
each call. The adaptive loop polls for the next batch's update several times a batch and the
progress line once a second, so reading `recentProgress` each time made the driver's CPU per
batch grow with the length of the run, on the cores the workers use: in
benchmarks/adaptive_spark.py's scenario (a) the adaptive run's rate fell as it went on, and it
ended at 0.79 of the best static plan while the plan it kept ran within 2 % of it alone
(results at revision ca4d5a9; 0.95 with this feed). The feed reads `lastProgress` (one update)
and reads `recentProgress` only when it may have missed an update: a new query, or a batch id
beyond the one it saw last plus one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

# As many updates as Spark keeps by default (spark.sql.streaming.numRecentProgressUpdates).
KEPT_UPDATES = 100


class ProgressFeed:
    """The progress updates of the query `current_query()` returns (the query may be replaced:
    a restart on the same checkpoint, the end-of-input batch), oldest first, the newest
    KEPT_UPDATES of them. Thread-safe: the progress line's thread and the caller share it."""

    def __init__(self, current_query: Callable[[], Any]) -> None:
        self._current_query = current_query
        self._lock = threading.Lock()
        self._updates: list = []
        self._seen: set[tuple[int, str]] = set()
        self._query = None
        self._newest_batch_of_query: int | None = None

    def updates(self) -> list:
        """Every update known now, oldest first (a copy)."""
        with self._lock:
            self._refresh()
            return list(self._updates)

    def newer_than(self, batch_id: int) -> list:
        """The known updates of batches after `batch_id`, oldest first."""
        with self._lock:
            self._refresh()
            return [update for update in self._updates if int(update["batchId"]) > batch_id]

    def _refresh(self) -> None:
        query = self._current_query()
        if query is None:
            return
        if query is not self._query:
            self._query, self._newest_batch_of_query = query, None
        last = query.lastProgress
        if last is None or _key(last) in self._seen:
            return
        batch_id = int(last["batchId"])
        newest = self._newest_batch_of_query
        if newest is not None and batch_id in (newest, newest + 1):
            self._add(last)
        else:  # a new query, or more than one batch since the last look: read what Spark kept
            for update in sorted(query.recentProgress, key=lambda item: int(item["batchId"])):
                self._add(update)

    def _add(self, update) -> None:
        key = _key(update)
        if key in self._seen:
            return
        self._seen.add(key)
        self._updates.append(update)
        batch_id = key[0]
        if self._newest_batch_of_query is None or batch_id > self._newest_batch_of_query:
            self._newest_batch_of_query = batch_id
        if len(self._updates) > KEPT_UPDATES:
            dropped = self._updates.pop(0)
            self._seen.discard(_key(dropped))


def _key(update) -> tuple[int, str]:
    """An update's identity: its batch and its timestamp (an idle query repeats a batch id)."""
    return int(update["batchId"]), str(update.get("timestamp"))
