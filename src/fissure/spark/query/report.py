"""What a run on Spark reports: each micro-batch as the driver saw it (`GraphBatch`) and as Spark
reported it (`BatchTime`), and the run's `RunReport`, whose repr is one line of the key figures and
whose `summary()` is what `fissure run --json` prints (docs/commands.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fissure.lifecycle.watchdog import Stall
from fissure.model.types import Plan
from fissure.profile.window import ProfileSummary
from fissure.spark.io.batch_admission import SourceAdmission
from fissure.plan.plans import describe_plan
from fissure.runtime.elastic.stage import BatchThreadLevels


@dataclass(frozen=True)
class GraphBatch:
    """One micro-batch as the driver saw it: how long its writes took, under which pipeline
    boundaries it ran, its dead letters and the records it wrote to the sinks."""

    batch_id: int
    wall_s: float
    boundaries: tuple[str, ...]
    dead_letters: int
    output_records: int = 0
    late_records: int = 0  # dead letters with the reason Late
    watermark: float | None = None  # the event-time watermark the batch ran with (None: no event time)
    state_keys: int | None = None  # keys holding state after the batch, over the stateful operators


@dataclass(frozen=True)
class BatchTime:
    """One micro-batch as Spark reported it: records taken from the sources, seconds it took."""

    batch_id: int
    input_records: int
    duration_s: float


@dataclass
class BatchListeners:
    """Called with each GraphBatch at the end of its foreachBatch (the autopipelining loop)."""

    on_batch: list[Callable[[GraphBatch], None]] = field(default_factory=list)


@dataclass(frozen=True)
class RunReport:
    """What a finished (or stopped) run did. Its repr is one short line of the key figures
    (`describe()`); the batch logs and profiles are in the fields."""

    plan: Plan
    batches: int
    input_records: int
    dead_letters: int
    elapsed_s: float
    checkpoint: str
    profile: ProfileSummary | None = None  # the operators' statistics over the last batches
    # Per batch: the thread level of each waiting operator in each worker (docs/elastic-scheduler.md).
    thread_levels: tuple[BatchThreadLevels, ...] = ()
    # A graph's: every batch with its sinks' rows, the boundaries at the end, the autopipelining
    # loop's decisions in order (fissure.spark.adaptive.autopipelining).
    batch_log: tuple[GraphBatch, ...] = ()
    boundaries: tuple[str, ...] = ()
    decisions: tuple = ()
    batch_times: tuple[BatchTime, ...] = ()  # every batch Spark reported, in batch order
    admissions: tuple[SourceAdmission, ...] = ()  # batch sizes fissure chose for file sources
    # Files a batch's source log listed that were gone when the batch ran (Spark reads them as empty).
    missing_files: tuple[str, ...] = ()
    plan_text: str = ""  # the plan described when the report was made, with its keys: `[a|b]x2(user)`
    stalls: tuple[Stall, ...] = ()  # the watchdog's reports of stuck batches (fissure.lifecycle.watchdog)
    # Keys holding state after the last batch, summed over the stateful operators (their buckets
    # this run called; None: no stateful operator ran), and the most after any batch.
    state_keys: int | None = None
    state_keys_peak: int | None = None  # the most after any batch
    late_records: int = 0  # dead letters with the reason Late
    watermark: float | None = None  # where the event-time watermark ended (None: no event time)
    # The first batch of the end-of-input query (a time-aware run over files fires every window in
    # a query of its own, fissure.spark.query.runner.Runner.finish_input), None without one.
    end_of_input_from: int | None = None

    @property
    def output_records(self) -> int:
        """Records written to the sinks (every sink's, summed; a replayed batch's once per write)."""
        return sum(batch.output_records for batch in self.batch_log)

    @property
    def described_plan(self) -> str:
        """The plan as the progress line and `fissure run` show it (`plan_text`, else the plan
        described without its keys)."""
        return self.plan_text or describe_plan(self.plan)

    def summary(self, plan: str | None = None) -> dict:
        """The run as `fissure run --json` prints it (docs/commands.md); `plan`: the plan as
        described (default: the report's own description, `described_plan`)."""
        plan = self.described_plan if plan is None else plan
        times = sorted(self.batch_times, key=lambda time: time.batch_id)
        flushed = self.end_of_input_from
        # The steady rate leaves out the two starts: the first batch, and the end-of-input query's
        # batch, which starts a query again (its planning, PySpark's state-schema processes, the
        # state stores' first open) with no input record.
        running = [time for time in times if flushed is None or time.batch_id < flushed]
        flush = [time for time in times if flushed is not None and time.batch_id >= flushed]
        later = running[1:]
        later_s = sum(time.duration_s for time in later)
        return {"plan": plan, "batches": self.batches, "input_records": self.input_records,
                "output_records": self.output_records, "dead_letters": self.dead_letters,
                "elapsed_s": round(self.elapsed_s, 3),
                "first_batch_s": round(times[0].duration_s, 3) if times else None,
                "steady_records_per_s": round(sum(time.input_records for time in later) / later_s, 1)
                if later and later_s > 0 else None,
                "end_of_input_s": round(sum(time.duration_s for time in flush), 3) if flush else None,
                "state_keys": self.state_keys, "state_keys_peak": self.state_keys_peak,
                "late_records": self.late_records, "missing_files": list(self.missing_files)}

    @property
    def records_per_s(self) -> float:
        return self.input_records / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def describe(self) -> str:
        """The key figures on one line: plan, batches, records in and out, dead letters, elapsed
        seconds, throughput."""
        missing = (f", {len(self.missing_files)} input file{'' if len(self.missing_files) == 1 else 's'} missing"
                   if self.missing_files else "")
        return (f"plan {self.described_plan}, {self.batches} batch{'' if self.batches == 1 else 'es'}, "
                f"{self.input_records:,} records in, {self.output_records:,} out, {self.dead_letters:,} dead "
                f"letter{'' if self.dead_letters == 1 else 's'}{missing}, {self.elapsed_s:.1f} s, "
                f"{self.records_per_s:,.0f} records/s")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"
