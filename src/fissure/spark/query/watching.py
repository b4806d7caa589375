"""The Runner's part that watches its query from the driver: the progress line (fissure.lifecycle.progress),
the watchdog's look at the batch running now (fissure.lifecycle.watchdog) and the operators'
statistics table under the progress line."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from fissure.lifecycle.progress import ProgressState, watermark_text
from fissure.lifecycle.watchdog import Stall, judge_batch, report_due, stuck_operator
from fissure.profile.window import render_table, waiting_advice
from fissure.plan.plans import describe_plan
from fissure.lifecycle.progress_output import ProgressOutput
from fissure.spark.session.create import read_heartbeats

log = logging.getLogger(__name__)


class QueryWatching:
    """Mixed into the Runner: its watcher thread's work, and what it shows."""

    # --- progress ----------------------------------------------------------------------------
    @property
    def progress(self) -> ProgressState | None:
        return self._last_progress

    def _require_started(self) -> None:
        if self.query is None:
            raise RuntimeError("the runner has not started: call start() first")

    def _collect_progress(self) -> None:
        if self.query is None:
            return
        newest = None
        updates = self.progress_feed.updates()
        if self.profiler is not None:
            self.profiler.on_progress(updates)
        for update in updates:
            batch_id = int(update["batchId"])
            self._seen_batches[batch_id] = int(update.get("numInputRows") or 0)
            self._batch_seconds[batch_id] = float((update.get("durationMs") or {}).get("triggerExecution") or 0) / 1e3
            if newest is None or batch_id >= int(newest["batchId"]):
                newest = update
        if newest is not None:
            self._last_progress = ProgressState(
                batch_id=int(newest["batchId"]),
                records_per_s=float(newest.get("processedRowsPerSecond") or 0.0),
                input_records=sum(self._seen_batches.values()),
                dead_letters=self.dead_letter_log.count,
                plan=describe_plan(self.plan, self.graph),
                threads=self.threads.latest_text() if self.threads is not None else "",
                time=watermark_text(self.watermark, time.time()),
            )

    def _watched(self, writer: Callable) -> Callable:
        """The foreachBatch function noting which batch runs since when (the batch's tasks run
        within it: its sinks' writes compute the micro-batch)."""
        def watched(frame, batch_id):
            self._running_batch = (int(batch_id), time.monotonic(), time.time())
            try:
                return writer(frame, batch_id)
            finally:
                self._running_batch, self._stall_reported_s, self._stall_text = None, None, ""
        return watched

    def check_stall(self, now_s: float | None = None) -> Stall | None:
        """The watchdog's look at the batch running now: a Stall when one is due to be reported
        (fissure.lifecycle.watchdog), also logged as a warning and shown on the progress line."""
        running = self._running_batch
        if running is None:
            return None
        batch_id, started_s, started_wall_s = running
        now_s = time.monotonic() if now_s is None else now_s
        predicted = [admission.decision.predicted_batch_s for admission in self.admissions]
        verdict = judge_batch(now_s - started_s, [batch.wall_s for batch in self.batch_log],
                              max(predicted) if predicted else None, self.stall_policy)
        if not report_due(verdict, self._stall_reported_s):
            return None
        beat = stuck_operator(read_heartbeats(), started_wall_s)
        stall = Stall(batch_id, verdict.elapsed_s, verdict.expected_s, beat.operator if beat else None,
                      time.time() - beat.since_s if beat else None, beat.pid if beat else None, verdict.reason)
        self._stall_reported_s = verdict.elapsed_s
        self._stall_text = (f"batch {batch_id} stuck {stall.elapsed_s:.0f} s"
                            + (f" in {stall.operator!r}" if stall.operator else ""))
        self.stalls.append(stall)
        log.warning("fissure: %s", stall.describe())
        return stall

    def _watch(self) -> None:
        while not self._stop_watching.wait(self.config.progress_interval_s):
            try:
                self._collect_progress()
                self.check_stall()
            except Exception:  # noqa: BLE001 - the query ending mid-poll: nothing to show
                continue
            self.progress_output.show(self._progress_state(), table=self.due_table)
            if self.query is not None and not self.query.isActive:
                break

    def _new_progress_output(self) -> ProgressOutput:
        return ProgressOutput(self.progress_mode, interval_s=self.config.progress_lines_interval_s)

    def _progress_state(self) -> ProgressState:
        """The newest completed batch's progress, or the first batch still running."""
        if self._last_progress is not None:
            return replace(self._last_progress, stall=self._stall_text)
        return ProgressState(batch_id=None, records_per_s=None, input_records=0,
                             dead_letters=self.dead_letter_log.count, plan=describe_plan(self.plan, self.graph),
                             stall=self._stall_text)

    def due_table(self) -> str | None:
        """With profiling, the operators' statistics table every `table_interval_s` (None: not due)."""
        now = time.monotonic()
        if self.profiler is None or now - self._table_drawn_at < self.profile_settings.table_interval_s:
            return None
        summary = self.profiler.summary()
        if not summary.batches:
            return None
        self._table_drawn_at = now
        kinds = {name: self.graph.kind_of(name).value for name in self.graph.names}
        declared = [operator.name for operator in self.graph.operators if operator.hints.waits is not None]
        for advice in waiting_advice(summary, declared):
            operator = advice.split(" waits:")[0]
            if operator not in self._advised_waiting:  # once a run, whatever the table's interval
                self._advised_waiting.add(operator)
                log.warning("fissure: %s", advice)
        return render_table(summary, kinds, declared)
