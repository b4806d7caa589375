"""The driver side of profiling: one `BatchProfile` per micro-batch, from the workers' tallies and
Spark's progress, kept for summaries and appended to the profile log.

The runner wraps its foreachBatch function with `wrap`: the profile accumulator's value is read
before and after the batch's writes (PySpark merges every finished task's tally into it before
the action returns), and the difference is the batch's tally. Spark's progress report for the
batch (records, durations) comes a moment later; `on_progress` joins the two by batch id.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fissure.profile.log import ProfileLogWriter
from fissure.profile.settings import ProfileSettings
from fissure.profile.window import BatchProfile, ProfileSummary, summarize

log = logging.getLogger(__name__)

# Batch profiles kept in memory (the log keeps them all).
MAX_KEPT_BATCHES = 1000


def batch_profile(batch_id: int, plan: str, tally, progress: Mapping[str, Any] | None) -> BatchProfile:
    """A BatchProfile from a worker tally (fissure.runtime.profiling.profiler.ProfileTally, or None) and a
    Spark progress report (a StreamingQueryProgress as a dict, or None)."""
    durations: dict[str, float] = {}
    records = duration_s = None
    commits: tuple[float, ...] = ()
    if progress is not None:
        durations = {str(name): float(value) for name, value in (progress.get("durationMs") or {}).items()
                     if isinstance(value, (int, float))}
        records = int(progress.get("numInputRows") or 0)
        duration_s = durations["triggerExecution"] / 1e3 if "triggerExecution" in durations else None
        commits = tuple(float(item.get("commitTimeMs") or 0.0) for item in progress.get("stateOperators") or ())
    return BatchProfile(
        batch_id=batch_id, plan=plan, source_records=records, duration_s=duration_s, durations_ms=durations,
        state_commit_ms=commits,
        operators=tally.operator_counts() if tally is not None else (),
        pipelines=tally.pipeline_counts() if tally is not None else (),
        regions=tally.region_counts() if tally is not None else (),
    )


class ProfileCollector:
    """Collects one run's batch profiles (thread-safe: foreachBatch and the watcher call it)."""

    def __init__(self, accumulator, plan: str, settings: ProfileSettings = ProfileSettings(),
                 log_path: str | None = None) -> None:
        self.accumulator = accumulator
        self.plan = plan
        self.settings = settings
        self.writer = ProfileLogWriter(log_path) if log_path else None
        self._pending: dict[int, Any] = {}  # batch id -> tally delta awaiting its progress report
        self._batches: list[BatchProfile] = []
        self._lock = threading.Lock()

    def wrap(self, write: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
        """The foreachBatch function `write`, with the batch's tally taken around it."""

        def profiled_write(frame, batch_id: int) -> None:
            before = self._read_tally()
            try:
                write(frame, batch_id)
            finally:
                after = self._read_tally()
                if before is not None and after is not None:
                    with self._lock:
                        self._pending[int(batch_id)] = after.minus(before)

        return profiled_write

    def _read_tally(self):
        try:
            return self.accumulator.value.copy()
        except Exception as error:  # noqa: BLE001 - profiling never stops the stream
            log.info("profile: accumulator unreadable (%s); this batch goes without operator counts", error)
            return None

    def on_progress(self, updates: Iterable[Mapping[str, Any]]) -> None:
        """Join the progress reports seen so far with the pending tallies."""
        finished = []
        with self._lock:
            for update in updates:
                batch_id = int(update["batchId"])
                tally = self._pending.pop(batch_id, None)
                if tally is None:
                    continue
                finished.append(batch_profile(batch_id, self.plan, tally, update))
            self._keep(finished)

    def flush(self) -> None:
        """Keep the tallies whose progress never came (the query stopped) without durations."""
        with self._lock:
            finished = [batch_profile(batch_id, self.plan, tally, None) for batch_id, tally in sorted(self._pending.items())]
            self._pending.clear()
            self._keep(finished)

    def _keep(self, finished: list[BatchProfile]) -> None:
        for batch in sorted(finished, key=lambda item: item.batch_id):
            self._batches.append(batch)
            if self.writer is not None:
                self.writer.append(batch)
        del self._batches[:-MAX_KEPT_BATCHES]

    @property
    def batches(self) -> tuple[BatchProfile, ...]:
        with self._lock:
            return tuple(self._batches)

    def summary(self) -> ProfileSummary:
        return summarize(self.batches, self.settings)
