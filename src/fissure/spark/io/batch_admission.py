"""Micro-batch size for file sources the user gave no size: the policy's records, in bytes.

fissure.plan.batch_size decides how many records a batch admits from the batch's fixed cost
and cost per record; here both come from the Spark model (fissure.model.spark_model) of the plan
in force, with the calibrated constants, evaluated at two batch sizes. The model's operator costs
are measured first on the first records of each source (`sample_rows`, fissure.local.cost_sample),
where the operators' declared hints would otherwise stand. Spark's file source
admits bytes (`maxBytesPerTrigger`), so the records become bytes at the directory's measured
bytes per record (a sample of its first file: newlines for text, JSON and CSV; the footer's row
count for Parquet). A directory with no file yet keeps Spark's default (all new files).

Spark mechanism with no pyspark import: its figure is Spark's file source option
`maxBytesPerTrigger`, set by the runner.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa

from fissure.plan.batch_size import BatchCost, BatchSizeDecision, choose_batch_records
from fissure.program.operators import to_arrow_schema
from fissure.spark.io.sources import FileSource
from fissure.local.cost_sample import SampleCosts

# The operator costs a checkpoint's first start measured (`sample_record`): its later starts (a
# restart after a crash, a resumed run) use them instead of running the operators again.
SAMPLE_RECORD = "fissure/cost_sample.json"

SAMPLE_BYTES = 4 << 20  # read at most this much of a file to count its records
SAMPLE_ROWS = 5_000  # records of a source the driver runs the program over to measure its costs


@dataclass(frozen=True)
class SourceAdmission:
    """A file source's chosen batch size: the decision in records and what it became in bytes."""

    source: str
    decision: BatchSizeDecision
    bytes_per_record: float
    max_bytes_per_trigger: int
    costs: str = "the operators' declared costs"  # where the model's operator costs came from

    def describe(self) -> str:
        return (f"batch size for {self.source}: {self.decision.records:,} records "
                f"({self.max_bytes_per_trigger / 1024:,.0f} KiB at {self.bytes_per_record:.0f} B a record); "
                f"{self.decision.reason}; {self.costs}")


def data_files(path: str) -> list[Path]:
    """The files Spark's file source would read in `path` (hidden and `_`-prefixed ones skipped)."""
    root = Path(path)
    if not root.is_dir():
        return []
    return sorted(item for item in root.rglob("*") if item.is_file()
                  and not any(part.startswith((".", "_")) for part in item.relative_to(root).parts))


def bytes_per_record(source: FileSource) -> float | None:
    """Average bytes per record of the source's first non-empty file, or None without one."""
    file = first_file(source)
    if file is None:
        return None
    if source.format == "parquet":
        import pyarrow.parquet as pq

        rows = pq.ParquetFile(file).metadata.num_rows
        return file.stat().st_size / rows if rows else None
    with open(file, "rb") as handle:
        sample = handle.read(SAMPLE_BYTES)
    lines = sample.count(b"\n") + (0 if sample.endswith(b"\n") else 1)
    if source.format == "csv":
        lines -= 1  # the header
    return len(sample) / lines if lines > 0 else None


def input_records(source: FileSource, beyond: float | None = None) -> float | None:
    """About how many records the source's directory holds now (its bytes at the first file's
    bytes per record), or None without a file; counting stops once it passes `beyond` (a large
    directory is not listed to its end to learn that it is large)."""
    per_record = bytes_per_record(source)
    if per_record is None:
        return None
    root, total = Path(source.path), 0
    for item in root.rglob("*"):
        if item.is_file() and not any(part.startswith((".", "_")) for part in item.relative_to(root).parts):
            total += item.stat().st_size
            if beyond is not None and total / per_record > beyond:
                break
    return total / per_record


def first_file(source: FileSource) -> Path | None:
    """The source's first non-empty file, which its sample and bytes per record come from."""
    return next((file for file in data_files(source.path) if file.stat().st_size > 0), None)


def sample_rows(source: FileSource, limit: int = SAMPLE_ROWS) -> tuple[list[dict], pa.Schema] | None:
    """The first `limit` records of the source's first non-empty file as the program's operators
    see them (text: `value`; other formats with the declared schema), or None without a file.
    Lines that do not parse are left out: they would be dead letters, not operator work."""
    file = first_file(source)
    if file is None:
        return None
    declared = to_arrow_schema(source.schema, f"file source {source.path!r}")  # None for text
    if source.format == "parquet":
        import pyarrow.parquet as pq

        batch = next(pq.ParquetFile(file).iter_batches(batch_size=limit, columns=declared.names), None)
        if batch is None:
            return None
        table = pa.Table.from_batches([batch]).cast(declared)
        return table.to_pylist(), declared
    with open(file, "rb") as handle:
        data = handle.read(SAMPLE_BYTES)
    lines = [line.removesuffix(b"\r") for line in data.split(b"\n")]
    if data.endswith(b"\n") or (len(data) == SAMPLE_BYTES and len(lines) > 1):
        lines.pop()  # after the last newline: nothing, or a line the sample cut
    if source.format == "text":
        rows = []
        for line in lines[:limit]:
            try:
                rows.append({"value": line.decode("utf-8")})
            except UnicodeDecodeError:  # a dead letter of the source on Spark
                continue
        return rows, pa.schema([pa.field("value", pa.string())])
    if source.format == "csv":
        header, lines = lines[:1], lines[1:]
    else:
        header = []
    try:
        return _parsed(source.format, header + lines[:limit], declared), declared
    except (pa.ArrowInvalid, ValueError):  # a line that would be a dead letter: parse the lines one by one
        rows = []
        for line in lines[:limit]:
            try:
                rows += _parsed(source.format, header + [line], declared)
            except (pa.ArrowInvalid, ValueError):
                continue
        return rows, declared


def _parsed(file_format: str, lines: list[bytes], declared: pa.Schema) -> list[dict]:
    """JSON or CSV lines read with the declared schema (CSV: the header line first)."""
    body = pa.BufferReader(b"\n".join(lines) + b"\n")
    if file_format == "json":
        import pyarrow.json as pj

        read = pj.read_json(body, parse_options=pj.ParseOptions(explicit_schema=declared,
                                                                 unexpected_field_behavior="ignore"))
    else:
        import pyarrow.csv as pc

        read = pc.read_csv(body, convert_options=pc.ConvertOptions(column_types=declared,
                                                                    include_columns=declared.names))
    return read.select(declared.names).cast(declared).to_pylist()


def needs_size(source: object) -> bool:
    """A file source the user gave no batch size."""
    return isinstance(source, FileSource) and not (source.max_bytes_per_trigger or source.max_files_per_trigger)


def admit_file_sources(sources: Mapping[str, object], cost: BatchCost, *, fixed_share: float,
                       latency_bound_s: float | None, costs: str = SourceAdmission.costs
                       ) -> tuple[dict[str, object], tuple[SourceAdmission, ...]]:
    """`sources` with a batch size set on every FileSource that has none, and the admissions made
    (`costs` says where the cost's operator costs came from)."""
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
        admissions.append(SourceAdmission(name, decision, per_record, limit, costs))
    return admitted, tuple(admissions)


def sample_record(sample: SampleCosts, operators: list[str]) -> str:
    """The text of the record of a measured sample, for the program of `operators`."""
    import json

    return json.dumps({"operators": operators, "records": sample.records, "seconds": sample.seconds,
                       "estimates": {name: [estimate.cost_us, estimate.selectivity]
                                     for name, estimate in sample.estimates.items()}}, sort_keys=True) + "\n"


def recorded_sample(text: str | None, operators: list[str]) -> SampleCosts | None:
    """The sample a record holds, when it was measured on a program of the same operators (None:
    no record, an unreadable one, or another program's: measure again)."""
    import json

    from fissure.program.operators import OperatorEstimate

    if not text:
        return None
    try:
        document = json.loads(text)
        if document["operators"] != operators:
            return None
        estimates = {name: OperatorEstimate(float(cost), float(selectivity))
                     for name, (cost, selectivity) in document["estimates"].items()}
        return SampleCosts(estimates, int(document["records"]), float(document["seconds"]))
    except (ValueError, KeyError, TypeError):
        return None
