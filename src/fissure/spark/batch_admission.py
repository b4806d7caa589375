"""Micro-batch size for file sources the user gave no size: the policy's records, in bytes.

fissure.control.batch_size decides how many records a batch admits from the batch's fixed cost
and cost per record; here both come from the Spark model (fissure.model.spark_model) of the plan
in force, with the calibrated constants, evaluated at two batch sizes. Spark's file source
admits bytes (`maxBytesPerTrigger`), so the records become bytes at the directory's measured
bytes per record (a sample of its first file: newlines for text, JSON and CSV; the footer's row
count for Parquet). A directory with no file yet keeps Spark's default (all new files).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from fissure.control.batch_size import BatchCost, BatchSizeDecision, choose_batch_records
from fissure.model.spark_model import evaluate_spark
from fissure.model.types import Plan
from fissure.spark.sources import FileSource

SAMPLE_BYTES = 4 << 20  # read at most this much of a file to count its records
# The two batch sizes the model is evaluated at to read off its fixed cost and cost per record.
_SMALL, _LARGE = 10_000, 100_000


@dataclass(frozen=True)
class SourceAdmission:
    """A file source's chosen batch size: the decision in records and what it became in bytes."""

    source: str
    decision: BatchSizeDecision
    bytes_per_record: float
    max_bytes_per_trigger: int

    def describe(self) -> str:
        return (f"batch size for {self.source}: {self.decision.records:,} records "
                f"({self.max_bytes_per_trigger / 1024:,.0f} KiB at {self.bytes_per_record:.0f} B a record); "
                f"{self.decision.reason}")


def data_files(path: str) -> list[Path]:
    """The files Spark's file source would read in `path` (hidden and `_`-prefixed ones skipped)."""
    root = Path(path)
    if not root.is_dir():
        return []
    return sorted(item for item in root.rglob("*") if item.is_file()
                  and not any(part.startswith((".", "_")) for part in item.relative_to(root).parts))


def bytes_per_record(source: FileSource) -> float | None:
    """Average bytes per record of the source's first non-empty file, or None without one."""
    for file in data_files(source.path):
        size = file.stat().st_size
        if size == 0:
            continue
        if source.format == "parquet":
            import pyarrow.parquet as pq

            rows = pq.ParquetFile(file).metadata.num_rows
            return size / rows if rows else None
        with open(file, "rb") as handle:
            sample = handle.read(SAMPLE_BYTES)
        lines = sample.count(b"\n") + (0 if sample.endswith(b"\n") else 1)
        if source.format == "csv":
            lines -= 1  # the header
        return len(sample) / lines if lines > 0 else None
    return None


def model_batch_cost(operators, plan: Plan, cores: int, settings) -> BatchCost:
    """The Spark model's batch time as F + R * c, read off at two batch sizes."""
    def batch_s(records: int) -> float:
        workload = replace(settings.workload, batch_records=records)
        return evaluate_spark(operators, plan, cores, settings.constants, workload).batch_time_s

    small, large = batch_s(_SMALL), batch_s(_LARGE)
    per_record = max((large - small) / (_LARGE - _SMALL), 1e-9)
    return BatchCost(max(0.0, small - per_record * _SMALL), per_record)


def needs_size(source: object) -> bool:
    """A file source the user gave no batch size."""
    return isinstance(source, FileSource) and not (source.max_bytes_per_trigger or source.max_files_per_trigger)


def admit_file_sources(sources: Mapping[str, object], cost: BatchCost, *, fixed_share: float,
                       latency_bound_s: float | None) -> tuple[dict[str, object], tuple[SourceAdmission, ...]]:
    """`sources` with a batch size set on every FileSource that has none, and the admissions made."""
    admitted, admissions = dict(sources), []
    for name, source in sources.items():
        if not needs_size(source):
            continue
        per_record = bytes_per_record(source)
        if per_record is None:
            continue
        decision = choose_batch_records(cost, fixed_share=fixed_share, latency_bound_s=latency_bound_s)
        limit = max(1, round(decision.records * per_record))
        admitted[name] = replace(source, max_bytes_per_trigger=limit)
        admissions.append(SourceAdmission(name, decision, per_record, limit))
    return admitted, tuple(admissions)
