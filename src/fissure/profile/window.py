"""Aggregating per-batch profiles over a window into the planner's operator statistics (pure).

Per operator, over the window's micro-batches that gave it records (a batch that did not reach
an operator says nothing about it and never pulls its estimate towards zero):
- selectivity = records out / records in, summed over the window: exact for deterministic
  filters, since every record is counted;
- cost per record: per batch, timed time / timed records; the window's estimate is the median
  of those per-batch costs weighted by the batch's timed records (robust to a few outlier
  batches: a warm-up, a garbage collection, a neighbour's burst on the machine), with the
  weighted median absolute deviation (relative to the estimate) as its dispersion;
- key groups per micro-batch (stateful operators): the median over batches;
- per-port utilization (the autopipelining paper's mu(o, t)): the share of its process's wall
  time that a fused operator and the operators after it in the same pipeline take.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fissure.control.thread_level.verdict import detect_waiting
from fissure.profile.records import OperatorCounts, PipelineCounts, RegionCallCounts
from fissure.profile.settings import ProfileSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchProfile:
    """What the profiler and Spark's progress report say about one micro-batch."""

    batch_id: int
    plan: str  # the plan in force, as `describe_plan` prints it
    source_records: int | None = None  # Spark's numInputRows; None until the progress arrived
    duration_s: float | None = None  # Spark's triggerExecution time
    durations_ms: Mapping[str, float] = field(default_factory=dict)  # Spark's durationMs breakdown
    state_commit_ms: tuple[float, ...] = ()  # per state operator: state store commit time
    operators: tuple[OperatorCounts, ...] = ()
    pipelines: tuple[PipelineCounts, ...] = ()
    regions: tuple[RegionCallCounts, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "plan": self.plan, "source_records": self.source_records,
                "duration_s": self.duration_s, "durations_ms": dict(self.durations_ms),
                "state_commit_ms": list(self.state_commit_ms),
                "operators": [item.to_dict() for item in self.operators],
                "pipelines": [item.to_dict() for item in self.pipelines],
                "regions": [item.to_dict() for item in self.regions]}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> BatchProfile:
        return cls(batch_id=int(values["batch_id"]), plan=str(values.get("plan", "")),
                   source_records=values.get("source_records"), duration_s=values.get("duration_s"),
                   durations_ms=dict(values.get("durations_ms") or {}),
                   state_commit_ms=tuple(values.get("state_commit_ms") or ()),
                   operators=tuple(OperatorCounts.from_dict(item) for item in values.get("operators", ())),
                   pipelines=tuple(PipelineCounts.from_dict(item) for item in values.get("pipelines", ())),
                   regions=tuple(RegionCallCounts.from_dict(item) for item in values.get("regions", ())))


@dataclass(frozen=True)
class OperatorProfileEstimate:
    """One operator's statistics over a window, with what they rest on."""

    operator: str
    batches: int  # micro-batches in the window that gave it records
    records_in: int
    records_out: int
    dead_letters: int
    selectivity: float | None  # None: no record reached it
    cost_us: float | None  # per record in, on the settings' cost basis; None: nothing timed
    cpu_us: float | None
    wall_us: float | None
    cost_dispersion: float | None  # weighted median absolute deviation / cost (0: steady)
    timed_batches: int  # micro-batches with timed records
    timed_records: int
    key_groups_per_batch: float | None = None  # stateful operators: keys a micro-batch holds
    # combined operators: the partials a micro-batch's keyed stage merged, and the distinct keys
    # and windows they were of (what the Spark model's combine needs; fissure.model.spark_model)
    partials_per_batch: float | None = None
    combine_groups_per_batch: float | None = None
    utilization: float | None = None  # per-port utilization mu(o, t) of fused operators, 0..1
    # The profile shows it waiting (wall time per record >= WAIT_RATIO x its CPU time over enough
    # timed records): its cost is its wall time whatever the basis, so the planner can replicate it.
    waits: bool = False

    @property
    def wait_ratio(self) -> float | None:
        """Wall time over CPU time per record (47.0: it waits 46 parts of 47)."""
        if self.wall_us is None or self.cpu_us is None or self.cpu_us <= 0:
            return None
        return self.wall_us / self.cpu_us


@dataclass(frozen=True)
class PipelineUtilization:
    """One PE pipeline (a process per task) over a window: how busy its process was."""

    pipeline: str
    operators: tuple[str, ...]
    utilization: float | None  # busy wall time / call wall time, 0..1
    overhead_us: float | None  # wall time per record outside the operators (conversions)


@dataclass(frozen=True)
class ProfileSummary:
    """A window of micro-batches, summarized: the live table's rows and the planner's inputs."""

    plan: str
    batches: int
    first_batch_id: int | None
    last_batch_id: int | None
    source_records: int
    records_per_s: float | None  # source records / summed batch durations
    median_batch_s: float | None
    operators: tuple[OperatorProfileEstimate, ...]
    pipelines: tuple[PipelineUtilization, ...] = ()

    def operator(self, name: str) -> OperatorProfileEstimate | None:
        return next((item for item in self.operators if item.operator == name), None)

    def estimates(self, names: Iterable[str] | None = None) -> dict:
        """`graph.OperatorEstimate` per operator with a cost and a selectivity, for
        `Pipeline.operator_stats(estimates)`; operators without them are left out (logged), so the
        pipeline's hints or defaults stand in for them."""
        from fissure.program.operators import OperatorEstimate

        wanted = None if names is None else set(names)
        found = {}
        for item in self.operators:
            if wanted is not None and item.operator not in wanted:
                continue
            if item.cost_us is None or item.selectivity is None:
                log.info("profile: no estimate for operator %r yet (records in %d, timed %d): keeping its hints",
                         item.operator, item.records_in, item.timed_records)
                continue
            found[item.operator] = OperatorEstimate(cost_us=item.cost_us, selectivity=item.selectivity)
        return found


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The smallest value whose cumulative weight reaches half the total (weights > 0)."""
    pairs = sorted((value, weight) for value, weight in zip(values, weights, strict=True) if weight > 0)
    if not pairs:
        raise ValueError("weighted_median needs at least one positive weight")
    half = sum(weight for _, weight in pairs) / 2
    running = 0.0
    for value, weight in pairs:
        running += weight
        if running >= half:
            return value
    return pairs[-1][0]


def _robust_cost(per_batch: list[tuple[float, float]]) -> tuple[float | None, float | None]:
    """(weighted median, relative weighted MAD) of (cost, weight) pairs, finite ones only."""
    usable = [(cost, weight) for cost, weight in per_batch if math.isfinite(cost) and weight > 0]
    if not usable:
        return None, None
    costs, weights = [cost for cost, _ in usable], [weight for _, weight in usable]
    center = weighted_median(costs, weights)
    spread = weighted_median([abs(cost - center) for cost in costs], weights)
    return center, (spread / center if center > 0 else 0.0)


def latest_plan_batches(batches: Sequence[BatchProfile], window: int) -> list[BatchProfile]:
    """The last `window` batches run under the plan of the newest batch (a replayed batch id
    counts once: its newest profile)."""
    if not batches:
        return []
    by_id: dict[int, BatchProfile] = {}
    for batch in batches:
        by_id[batch.batch_id] = batch
    ordered = [by_id[batch_id] for batch_id in sorted(by_id)]
    plan = ordered[-1].plan
    return [batch for batch in ordered if batch.plan == plan][-window:]


def summarize(batches: Sequence[BatchProfile], settings: ProfileSettings = ProfileSettings()) -> ProfileSummary:
    """The summary of the latest plan's last `settings.window_batches` micro-batches."""
    window = latest_plan_batches(batches, settings.window_batches)
    per_operator: dict[str, list[OperatorCounts]] = {}
    for batch in window:
        for counts in batch.operators:
            if counts.records_in > 0:
                per_operator.setdefault(counts.operator, []).append(counts)
    pipelines, operator_utilization = _pipelines(window)
    operators = tuple(_operator_estimate(name, counts, settings, operator_utilization.get(name))
                      for name, counts in per_operator.items())
    durations = [batch.duration_s for batch in window if batch.duration_s is not None and batch.duration_s > 0]
    timed_records = sum(batch.source_records or 0 for batch in window
                        if batch.duration_s is not None and batch.duration_s > 0)
    return ProfileSummary(
        plan=window[-1].plan if window else "",
        batches=len(window),
        first_batch_id=window[0].batch_id if window else None,
        last_batch_id=window[-1].batch_id if window else None,
        source_records=sum(batch.source_records or 0 for batch in window),
        records_per_s=timed_records / sum(durations) if durations else None,
        median_batch_s=weighted_median(durations, [1.0] * len(durations)) if durations else None,
        operators=operators,
        pipelines=pipelines,
    )


def _operator_estimate(name: str, counts: list[OperatorCounts], settings: ProfileSettings,
                       utilization: float | None) -> OperatorProfileEstimate:
    records_in = sum(item.records_in for item in counts)
    records_out = sum(item.records_out for item in counts)
    timed = [item for item in counts if item.timed_records_in > 0]
    cpu_us, dispersion_cpu = _robust_cost([(1e6 * item.timed_cpu_s / item.timed_records_in, item.timed_records_in)
                                           for item in timed])
    wall_us, dispersion_wall = _robust_cost([(1e6 * item.timed_wall_s / item.timed_records_in, item.timed_records_in)
                                             for item in timed])
    timed_records = sum(item.timed_records_in for item in timed)
    waits = detect_waiting(name, wall_us_per_record=wall_us, cpu_us_per_record=cpu_us,
                           timed_records=timed_records).run_threaded
    # A waiting operator occupies its thread for its wall time: priced on its CPU time, the
    # planner would see nothing to gain from replicating it (a lookup waiting 2 ms a record
    # showed 44 us of CPU).
    use_wall = settings.cost_basis != "cpu" or waits
    cost_us, dispersion = (wall_us, dispersion_wall) if use_wall else (cpu_us, dispersion_cpu)
    groups = [item.key_groups for item in counts if item.key_groups > 0]
    combined = [item for item in counts if item.partials > 0]
    return OperatorProfileEstimate(
        operator=name,
        batches=len(counts),
        records_in=records_in,
        records_out=records_out,
        dead_letters=sum(item.dead_letters for item in counts),
        selectivity=records_out / records_in if records_in else None,
        cost_us=cost_us,
        cpu_us=cpu_us,
        wall_us=wall_us,
        cost_dispersion=dispersion,
        timed_batches=len(timed),
        timed_records=timed_records,
        key_groups_per_batch=weighted_median(groups, [1.0] * len(groups)) if groups else None,
        partials_per_batch=weighted_median([item.partials for item in combined], [1.0] * len(combined))
        if combined else None,
        combine_groups_per_batch=weighted_median([item.combine_groups for item in combined], [1.0] * len(combined))
        if combined else None,
        utilization=utilization,
        waits=waits,
    )


def _pipelines(window: Sequence[BatchProfile]) -> tuple[tuple[PipelineUtilization, ...], dict[str, float]]:
    """Per pipeline: utilization and overhead; per fused operator: its per-port utilization."""
    pipelines: dict[str, PipelineCounts] = {}
    regions: dict[str, RegionCallCounts] = {}
    operators: dict[str, list[OperatorCounts]] = {}
    for batch in window:
        for counts in batch.pipelines:
            pipelines[counts.pipeline] = pipelines[counts.pipeline] + counts if counts.pipeline in pipelines else counts
        for counts in batch.regions:
            regions[counts.region] = regions[counts.region] + counts if counts.region in regions else counts
        for counts in batch.operators:
            operators.setdefault(counts.operator, []).append(counts)
    results = []
    per_port: dict[str, float] = {}
    for name, counts in pipelines.items():
        region = regions.get(name.rsplit("/", 1)[0])
        scale = counts.records_in / counts.timed_records_in if counts.timed_records_in else None
        overhead_us = (1e6 * counts.timed_overhead_wall_s / counts.timed_records_in
                       if counts.timed_records_in else None)
        utilization = None
        if scale is not None and region is not None and region.wall_s > 0:
            utilization = min(1.0, counts.timed_wall_s * scale / region.wall_s)
            downstream_s = counts.timed_overhead_wall_s * scale
            for operator in reversed(counts.operators):
                downstream_s += _estimated_wall_s(operators.get(operator, []))
                per_port[operator] = min(1.0, downstream_s / region.wall_s)
        results.append(PipelineUtilization(name, counts.operators, utilization, overhead_us))
    return tuple(results), per_port


def _estimated_wall_s(counts: Sequence[OperatorCounts]) -> float:
    """An operator's whole wall time, scaled up from its timed part."""
    timed_records = sum(item.timed_records_in for item in counts)
    if not timed_records:
        return 0.0
    return sum(item.timed_wall_s for item in counts) * sum(item.records_in for item in counts) / timed_records


def waiting_advice(summary: ProfileSummary, declared: Iterable[str] = ()) -> tuple[str, ...]:
    """One line per operator the profile shows waiting that declares nothing: what it waits and
    the declaration that gives it threads (fissure.program.operators' `waits=`)."""
    declared = set(declared)
    lines = []
    for item in summary.operators:
        if not item.waits or item.operator in declared:
            continue
        ratio = item.wait_ratio
        times = f", {ratio:,.0f}x its CPU time" if ratio is not None else ""
        lines.append(f"{item.operator} waits: {item.wall_us:,.0f} us a record of wall time{times}; planned on its"
                     f" wall time; declare waits=\"io\" (or waits=\"gil-free\" for native code that releases the"
                     f" GIL) to give it threads in the workers")
    return tuple(lines)


def render_table(summary: ProfileSummary, kinds: Mapping[str, str] | None = None,
                 declared_waits: Iterable[str] = ()) -> str:
    """The statistics as a fixed-width table, operators in the order given (the chain's), with a
    line of advice under it for each operator that waits undeclared (`waiting_advice`)."""
    kinds = kinds or {}

    def number(value: float | None, digits: int = 1, scale: float = 1.0, suffix: str = "") -> str:
        return "-" if value is None else f"{value * scale:,.{digits}f}{suffix}"

    header = ("operator", "kind", "records in", "sel.", "cost us", "wall us", "+/-", "keys/b", "util", "dead")
    rows = [header]
    order = list(kinds) or [item.operator for item in summary.operators]
    for name in order + [item.operator for item in summary.operators if item.operator not in order]:
        item = summary.operator(name)
        if item is None:
            rows.append((name, kinds.get(name, ""), "0", "-", "-", "-", "-", "-", "-", "0"))
            continue
        rows.append((name, kinds.get(name, ""), f"{item.records_in:,}", number(item.selectivity, 3),
                     number(item.cost_us, 2), number(item.wall_us, 2), number(item.cost_dispersion, 0, 100, "%"),
                     number(item.key_groups_per_batch, 0), number(item.utilization, 0, 100, "%"),
                     f"{item.dead_letters:,}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [f"profile | plan {summary.plan} | {summary.batches} batches "
             f"({summary.first_batch_id}..{summary.last_batch_id}) | "
             f"{number(summary.records_per_s, 0)} records/s | median batch {number(summary.median_batch_s, 2)} s"]
    for index, row in enumerate(rows):
        cells = [cell.ljust(width) if column < 2 else cell.rjust(width)
                 for column, (cell, width) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    for pipeline in summary.pipelines:
        lines.append(f"  pipeline {pipeline.pipeline} ({', '.join(pipeline.operators)}): busy "
                     f"{number(pipeline.utilization, 0, 100, '%')}, conversions {number(pipeline.overhead_us, 2)} us/record")
    lines += [f"  {advice}" for advice in waiting_advice(summary, declared_waits)]
    return "\n".join(lines)
