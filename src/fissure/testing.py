"""Test helpers shipped with the library: in-memory sources and sinks, an in-process run of any
program, and file sources made of given records.

In process, no JVM (the operators run with the same worker code as on Spark; `run_local`):

    out = []
    run_main(pipeline, TestingSource(records, batch_size=2), TestingSink(out))
    assert out == [...]

The same source and sink on Spark (the source writes its batches as files it serves one per
micro-batch; the sink keeps each batch's results once, a replayed batch replacing its rows):

    fissure.run(pipeline, TestingSource(records, batch_size=2), TestingSink(out), config=fissure.RunnerConfig(spark=spark))

A graph takes them by name: `run_main(graph, {"lines": TestingSource(...)}, {"alerts": TestingSink(out)})`.

Time: explicit micro-batches and the watermark after each (in process):

    steps = run_batches(pipeline, [[{"ts": 1.0, ...}], [{"ts": 12.0, ...}], []])
    print(describe_batches(steps))      # batch, records in, watermark it ran with, after, out, late
    steps[-1].results["sink"]           # what the end of input flushed

`TestingSource(batches=[[...], [...]])` feeds the same explicit batches to `run_main` and to Spark.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from fissure.program.chain import Pipeline
from fissure.program.operators import PipelineError, SchemaSpec, to_arrow_schema
from fissure.spark.io.sinks import MemorySink
from fissure.spark.io.sources import FileSource
from fissure.program.graph import StreamGraph, as_graph
from fissure.local.executor import LocalDeadLetter, LocalGraphRun
from fissure.runtime.records.unreadable_lines import LineFormat

__all__ = ["BatchStep", "MemorySink", "TestingSink", "TestingSource", "describe_batches", "record_files",
           "run_batches", "run_main", "text_files"]


class TestingSource:
    """Given records (dicts) for one source, cut into micro-batches of `batch_size` records
    (None: one batch), or given as explicit micro-batches (`batches=[[...], [], [...]]`, an empty
    one included: a batch in which the watermark moves on and due windows fire). `schema`
    declares the fields (default: inferred from the records)."""

    __test__ = False  # not a pytest test class

    def __init__(self, records: Sequence[Mapping] = (), batch_size: int | None = None, schema: SchemaSpec = None,
                 *, batches: Sequence[Sequence[Mapping]] | None = None) -> None:
        if batch_size is not None and batch_size < 1:
            raise PipelineError(f"TestingSource: batch_size must be >= 1 or None, got {batch_size!r}")
        if batches is not None and (records or batch_size is not None):
            raise PipelineError("TestingSource: give records (and batch_size) or batches=, not both")
        self._explicit = None if batches is None else [[dict(record) for record in batch] for batch in batches]
        self.records = [dict(record) for record in records] if batches is None else \
            [record for batch in self._explicit for record in batch]
        self.batch_size = batch_size
        self.schema = to_arrow_schema(schema, "TestingSource")
        if self.schema is None and self.records:
            self.schema = pa.Table.from_pylist(self.records).schema
        self._directory: str | None = None

    def batches(self) -> list[list[dict]]:
        if self._explicit is not None:
            return [list(batch) for batch in self._explicit]
        size = self.batch_size or max(1, len(self.records))
        return [self.records[start:start + size] for start in range(0, len(self.records), size)]

    def known_schema(self):
        """The declared or inferred schema (None: no records to infer one from)."""
        return self.schema

    def line_format(self):
        """On Spark its records are JSON lines (`open`)."""
        return LineFormat("json")

    def open(self, spark):
        """On Spark: the records as JSON-lines files, one per batch, read one per micro-batch."""
        if self.schema is None:
            raise PipelineError("TestingSource: no records to infer a schema from; pass schema={...}")
        if self._directory is None:
            self._directory = tempfile.mkdtemp(prefix="fissure-testing-source-")
            atexit.register(shutil.rmtree, self._directory, True)
            for number, batch in enumerate(self.batches()):
                target = os.path.join(self._directory, f"part-{number:06d}.json")
                _write_atomically(target, "".join(json.dumps(record) + "\n" for record in batch), number)
        return FileSource(self._directory, format="json", schema=self.schema, max_files_per_trigger=1).open(spark)


class TestingSink(MemorySink):
    """Results appended to the list `out` (dicts), in batch order; on Spark a replayed batch
    replaces its rows, so `out` holds each result once."""

    __test__ = False

    def __init__(self, out: list) -> None:
        super().__init__()
        self.out = out
        self._records_by_batch: dict[int, list[dict]] = {}

    def write(self, frame, batch_id: int) -> None:
        super().write(frame, batch_id)
        self.out[:] = self.records()

    def append_batch(self, batch_id: int, records: Sequence[dict]) -> None:
        """In process: one batch's results."""
        self._records_by_batch[batch_id] = list(records)
        self.out[:] = [record for number in sorted(self._records_by_batch) for record in self._records_by_batch[number]]


def _by_name(graph: StreamGraph, value, role: str, names: tuple[str, ...]) -> Mapping:
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise PipelineError(f"graph {graph.name!r} has no {role} {', '.join(map(repr, unknown))}; its {role}s "
                                f"are {', '.join(names)}")
        return value
    if len(names) != 1:
        raise PipelineError(f"graph {graph.name!r} has {role}s {', '.join(names)}; pass a dict of them by name")
    return {names[0]: value}


def run_main(program: Pipeline | StreamGraph, source, sink, dead_letters: list | None = None, *,
             watermarks: list | None = None, end_of_input: bool = True) -> int:
    """Run `program` in this process, micro-batch by micro-batch, from TestingSources to
    TestingSinks (dicts by name for a graph; a sink left out is not collected). Keyed state lives
    across batches as on Spark. Dead letters (LocalDeadLetter) are appended to `dead_letters`;
    without that list, a dead letter raises PipelineError naming the operator and the error, so
    a test never passes over a record it lost. The sources are bounded: after their batches comes
    the end of input (every window, session and expiry fires, into the sinks), unless
    `end_of_input=False` (a run stopped early). `watermarks` gets the watermark after each batch
    (the one the next batch runs with), and after the end of input. Returns the number of
    batches run (the end of input not counted)."""
    graph = as_graph(program)
    sources = _by_name(graph, source, "source", graph.sources)
    sinks = _by_name(graph, sink, "sink", graph.sinks)
    batches = {name: source.batches() for name, source in sources.items()}
    count = max((len(parts) for parts in batches.values()), default=0)
    run = LocalGraphRun(graph)
    schemas = {name: source.schema for name, source in sources.items() if source.schema is not None}
    for batch_id in range(count):
        given = {name: parts[batch_id] if batch_id < len(parts) else [] for name, parts in batches.items()}
        for name in graph.sources:
            given.setdefault(name, [])
        _deliver(run.run_batch(given, schemas), batch_id, sinks, dead_letters, watermarks, run)
    if end_of_input and count:
        _deliver(run.finish(), count, sinks, dead_letters, watermarks, run)
    return count


def _deliver(results, batch_id: int, sinks: Mapping, dead_letters: list | None, watermarks: list | None,
             run: LocalGraphRun) -> None:
    _keep_dead_letters(results.dead_letters, dead_letters)
    for name, sink in sinks.items():
        sink.append_batch(batch_id, results[name])
    if watermarks is not None:
        watermarks.append(run.watermark)


@dataclass(frozen=True)
class BatchStep:
    """One micro-batch of `run_batches` (or its end of input): what went in, the watermark it ran
    with and the one after it, what each sink got and the dead letters."""

    batch: int
    end_of_input: bool
    records_in: int
    watermark: float  # the watermark the batch ran with: windows ending at or before it fired
    next_watermark: float  # the watermark after it: the next batch runs with it
    results: Mapping[str, list] = field(default_factory=dict)
    dead_letters: Sequence[LocalDeadLetter] = ()

    @property
    def late_records(self) -> int:
        return sum(1 for letter in self.dead_letters if letter.error.startswith("Late:"))


def run_batches(program: Pipeline | StreamGraph, batches: Sequence, *, schema: SchemaSpec = None,
                schemas: Mapping[str, SchemaSpec] | None = None, end_of_input: bool = True,
                batch_times: Sequence[float] | None = None) -> list[BatchStep]:
    """Feed `program` explicit micro-batches in this process: a chain takes a list of batches
    (each a list of records), a graph a list of dicts {source: records} (a source left out gets
    none). Returns one BatchStep per batch, then one for the end of input (unless
    `end_of_input=False`). `schema` declares a chain's source schema, `schemas` a graph's by
    source name (default: inferred from the records); `batch_times` gives each batch's
    processing time in seconds (for expiry on processing time)."""
    graph = as_graph(program)
    single = not isinstance(program, StreamGraph)
    if schema is not None:
        if not single:
            raise PipelineError(f"run_batches: graph {graph.name!r} takes schemas={{source: schema}}, not schema=")
        schemas = {graph.sources[0]: schema}
    bound = {name: to_arrow_schema(spec, f"source {name!r}") for name, spec in (schemas or {}).items()}
    if batch_times is not None and len(batch_times) < len(batches) + (1 if end_of_input else 0):
        raise PipelineError(f"run_batches: {len(batch_times)} batch_times for {len(batches)} batches"
                            f"{' and the end of input' if end_of_input else ''}; give one each")
    run = LocalGraphRun(graph)
    steps = []
    for number, batch in enumerate(batches):
        given = {graph.sources[0]: list(batch)} if single else dict(batch)
        for name in graph.sources:
            given.setdefault(name, [])
        results = run.run_batch(given, bound or None, batch_time_s=batch_times[number] if batch_times else None)
        steps.append(_step(number, False, sum(map(len, given.values())), results, run))
    if end_of_input:
        results = run.finish(batch_times[len(batches)] if batch_times else None)
        steps.append(_step(len(batches), True, 0, results, run))
    return steps


def _step(number: int, end: bool, records_in: int, results, run: LocalGraphRun) -> BatchStep:
    return BatchStep(number, end, records_in, results.watermark, run.watermark, dict(results),
                     list(results.dead_letters))


def describe_batches(steps: Sequence[BatchStep]) -> str:
    """The batches as a table: records in, the watermark each ran with and the one after it,
    records out per sink, dead letters and late records among them."""
    rows = [("batch", "in", "watermark", "next", "out", "dead", "late")]
    for step in steps:
        out = ", ".join(f"{name} {len(records)}" for name, records in step.results.items())
        rows.append(("end" if step.end_of_input else str(step.batch), str(step.records_in), _seconds(step.watermark),
                     _seconds(step.next_watermark), out, str(len(step.dead_letters)), str(step.late_records)))
    widths = [max(len(row[index]) for row in rows) for index in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def _seconds(value: float) -> str:
    from fissure.runtime.operators.timed import seconds_text

    return seconds_text(value)


def _keep_dead_letters(letters: Sequence[LocalDeadLetter], kept: list | None) -> None:
    if kept is not None:
        kept.extend(letters)
    elif letters:
        first = letters[0]
        raise PipelineError(f"{len(letters)} dead letter(s); the first: operator {first.node!r}: {first.error} "
                            f"(record {first.record}); pass dead_letters=[] to collect them")


def _chunks(items: Sequence, size: int):
    for start in range(0, len(items), size):
        yield start // size, items[start:start + size]


def _write_atomically(target: str, text: str, number: int) -> None:
    """A streaming file source must never see half a file: write a hidden file, then rename it.

    Spark's file source takes files oldest first (ties in any order): file `number` gets a
    modification time `number` seconds after the first one's, so name order is reading order.
    """
    hidden = os.path.join(os.path.dirname(target), "." + os.path.basename(target) + ".tmp")
    with open(hidden, "w", encoding="utf-8") as handle:
        handle.write(text)
    modified_s = _FIRST_FILE_TIME_S + number
    os.utime(hidden, (modified_s, modified_s))
    os.replace(hidden, target)


_FIRST_FILE_TIME_S = int(time.time()) - 100_000


def record_files(path: str | os.PathLike, records: Sequence[Mapping], schema: SchemaSpec,
                 records_per_file: int | None = None, max_files_per_trigger: int | None = None,
                 first_file: int = 0) -> FileSource:
    """Write `records` as JSON-lines files under `path` (in name order) and return their FileSource."""
    os.makedirs(path, exist_ok=True)
    size = records_per_file or max(1, len(records))
    for number, chunk in _chunks(list(records), size):
        target = os.path.join(path, f"part-{first_file + number:06d}.json")
        _write_atomically(target, "".join(json.dumps(record) + "\n" for record in chunk), first_file + number)
    return FileSource(os.fspath(path), format="json", schema=schema, max_files_per_trigger=max_files_per_trigger)


def text_files(path: str | os.PathLike, lines: Sequence[str], lines_per_file: int | None = None,
               max_files_per_trigger: int | None = None) -> FileSource:
    """Write `lines` as text files under `path` and return their FileSource (one `value` column)."""
    os.makedirs(path, exist_ok=True)
    size = lines_per_file or max(1, len(lines))
    for number, chunk in _chunks(list(lines), size):
        target = os.path.join(path, f"part-{number:06d}.txt")
        _write_atomically(target, "".join(line + "\n" for line in chunk), number)
    return FileSource(os.fspath(path), format="text", max_files_per_trigger=max_files_per_trigger)
