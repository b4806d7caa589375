"""The Runner's part that runs in every micro-batch's foreachBatch: the boundaries and the batch's
clock for its tasks, the micro-batch persisted once, its dead letters and every sink written from
it (each keyed by the batch id: a replayed batch overwrites what it wrote), what the batch left
(its watermark, state keys, late records) and the files its source log named that were gone."""

from __future__ import annotations

import json
import logging
import sys
import time

from pyspark.sql import Observation
from pyspark.sql import functions as F

from fissure.spark.checkpoint.guard import batch_ids
from fissure.spark.query.compile_graph import sink_frame
from fissure.spark.io.file_staging import batch_files, missing_files
from fissure.spark.query.report import GraphBatch
from fissure.spark.io.sinks import write_dead_letters
from fissure.spark.query.stages import BOUNDARIES_PROPERTY, PUBLISHED_PROPERTY, PIECE_COUNTING_PROPERTY
from fissure.spark.query.time_log import BATCH_CLOCK_PROPERTY
from fissure.runtime.records.columns import DEAD_ERROR, DEAD_OPERATOR, DEAD_RECORD, SEQ
from fissure.runtime.records.envelopes import ROUTE
from fissure.runtime.operators.time_tally import TimeTally
from fissure.runtime.operators.timed import LATE
from fissure.runtime.operators.watermark import BatchClock, next_clock

log = logging.getLogger(__name__)


class BatchWriting:
    """Mixed into the Runner: the foreachBatch function and what it keeps (the batch log, late
    records, the watermark, state keys, missing files)."""

    def _write_batch(self, frame, batch_id: int) -> None:
        """The foreachBatch function: the boundaries for the batch's tasks, then the micro-batch
        persisted once, its dead letters and every sink written from it."""
        batch_id = int(batch_id)
        with self._lock:
            boundaries, publication, counting = self.boundaries, self.publication, self.piece_counting
        context = self.spark.sparkContext
        context.setLocalProperty(BOUNDARIES_PROPERTY, json.dumps({self.graph.name: list(boundaries)}))
        context.setLocalProperty(PIECE_COUNTING_PROPERTY, json.dumps({self.graph.name: counting}))
        context.setLocalProperty(PUBLISHED_PROPERTY, publication.text())
        clock = self._batch_clock(batch_id)
        if clock is not None:
            context.setLocalProperty(BATCH_CLOCK_PROPERTY, clock.to_json())
        started_s = time.monotonic()
        self._report_missing_files(batch_id)
        frame = frame.persist()
        try:
            dead_count, written, late = self._write_sinks(frame, batch_id)
        finally:
            frame.unpersist()
        state_keys = self._after_batch(batch_id, clock, late)
        record = GraphBatch(batch_id, time.monotonic() - started_s, boundaries, dead_count, written, late,
                            clock.event.current if clock is not None and clock.event is not None else None, state_keys)
        self.batch_log.append(record)
        for listener in list(self.listeners.on_batch):
            try:
                listener(record)
            except Exception as error:  # noqa: BLE001 - a listener must not fail the batch
                print(f"fissure: batch listener failed: {error!r}", file=sys.stderr)

    def _batch_clock(self, batch_id: int) -> BatchClock | None:
        """The clock micro-batch `batch_id` runs with: the one written before it ran, when it runs
        again; else made from the batch before's and written to the checkpoint before it runs."""
        if not self.time_aware:
            return None
        recorded = self.time_log.clock(batch_id)
        if recorded is not None:
            self._end_of_input_next = self._end_of_input_next and not recorded.end_of_input
            return recorded
        layout = self.compiled.time
        fields = layout.fields.values()
        clock = next_clock(batch_id, self.time_log.last_before(batch_id), layout.lateness, layout.horizon,
                           event_time=any(field is not None for field in fields),
                           processing_time=any(field is None for field in fields), now_s=time.time(),
                           end_of_input=self._end_of_input_next)
        self._end_of_input_next = False
        self.time_log.write(clock)
        return clock

    def _after_batch(self, batch_id: int, clock: BatchClock | None, late: int) -> int | None:
        """After a batch wrote its sinks: its largest event time into its clock (the next batch's
        watermark), the run's state keys and late records."""
        tally = self.time_tally.value if self.time_tally is not None else TimeTally()
        if clock is not None:
            self.time_log.write(clock.ran(tally.largest.get(batch_id)))
            if clock.event is not None:
                self.watermark = clock.event.current
        self.late_records += late
        if not tally.keys:
            return None
        state_keys = sum(keys for _, keys in tally.keys.values())
        self.state_keys_peak = max(self.state_keys_peak or 0, state_keys)
        return state_keys

    @property
    def state_keys(self) -> int | None:
        """Keys holding state now, summed over the stateful operators (the buckets the run has
        called: every bucket of a time-aware operator; a plain partitioned operator's buckets
        once they got records in this run)."""
        tally = self.time_tally.value if self.time_tally is not None else None
        return sum(keys for _, keys in tally.keys.values()) if tally is not None and tally.keys else None

    def _write_sinks(self, frame, batch_id: int) -> tuple[int, int, int]:
        """Every sink's rows and the dead letters of a persisted micro-batch; (dead letters,
        records written). One observation counts both on the first action over the batch: a
        sink that reads every row (FileSink, MemorySink, NoopSink) when the first sink is one,
        which makes the dead-letter job unnecessary in a batch without dead letters; else the
        dead-letter job, which runs every batch."""
        observation = Observation(f"fissure_batch_{batch_id}")
        live = F.col(DEAD_OPERATOR).isNull()
        routes = [self.compiled.layout.route_of(self.graph.sink_node(sink).inputs[0]) for sink in self.graph.sinks]
        observed = frame.observe(observation, F.count_if(~live).alias("dead"),
                                 F.count_if(~live & F.col(DEAD_ERROR).startswith(f"{LATE}:")).alias("late"),
                                 *[F.count_if(live & (F.col(ROUTE) == route)).alias(f"sink{index}")
                                   for index, route in enumerate(routes)])
        first, *others = self.graph.sinks
        letters = [file.letter() for stager in self.stagers for file in stager.letters_for(batch_id)]
        if getattr(self.sinks[first], "reads_every_row", False):
            self.sinks[first].write(sink_frame(self.compiled, self.graph, first, observed), batch_id)
            counts = observation.get
            dead_count = write_dead_letters(frame, batch_id, self.dead_letter_log, self.dead_letter_sink,
                                            count=int(counts["dead"]), extra=letters)
        else:
            dead_count = write_dead_letters(observed, batch_id, self.dead_letter_log, self.dead_letter_sink,
                                            extra=letters)
            counts = observation.get
            self.sinks[first].write(sink_frame(self.compiled, self.graph, first, frame), batch_id)
        for sink in others:
            self.sinks[sink].write(sink_frame(self.compiled, self.graph, sink, frame), batch_id)
        return (dead_count, sum(int(counts[f"sink{index}"]) for index in range(len(routes))),
                int(counts["late"] or 0))

    def _report_missing_files(self, batch_id: int) -> None:
        """Warn of the files Spark's source log lists for the batch that are gone (deleted after
        Spark listed them: Spark reads a missing file as empty, silently), and keep them for the report."""
        store = self.lock.store if self.lock is not None else None
        if store is None:
            return
        try:
            gone = missing_files(batch_files(store.read, store.names, batch_id))
        except OSError:
            return
        new = [path for path in gone if path not in self.missing_files]
        if new:
            self.missing_files.extend(new)
            message = (f"fissure: batch {batch_id}: {len(new)} input file(s) listed for it no longer exist and are "
                       f"read as empty: {', '.join(new[:5])}{' ...' if len(new) > 5 else ''}")
            log.warning("%s", message)
            print(message, file=sys.stderr)

    def _write_unwritten_file_letters(self) -> None:
        """Dead letters of unreadable files no batch has written (no batch ran after they were
        found): written now under the next batch's id, which writes them again if it runs."""
        if not self.stagers or self.lock is None:
            return
        committed = batch_ids(self.lock.store, "commits")
        next_batch = committed[-1] + 1 if committed else 0
        pending = [file for stager in self.stagers for file in stager.unreadable() if file.batch is None]
        if not pending:
            return
        letters = [file.letter() for stager in self.stagers for file in stager.letters_for(next_batch)]
        try:
            frame = self.spark.createDataFrame([(*letter, -1) for letter in letters],
                                               f"{DEAD_OPERATOR} string, {DEAD_ERROR} string, "
                                               f"{DEAD_RECORD} string, {SEQ} long")
            write_dead_letters(frame, next_batch, self.dead_letter_log, self.dead_letter_sink, count=len(letters))
        except Exception as error:  # noqa: BLE001 - a stopped session: the letters stay for the next run
            log.warning("fissure: could not write the dead letters of unreadable files: %s", error)
