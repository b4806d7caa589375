"""Test helpers shipped with the library: sources made of given records, sinks that keep results.

    source = record_files(tmp_path / "in", [{"user": "a", "n": 1}, ...], schema={"user": str, "n": int})
    sink = MemorySink()
    fissure.run(pipeline, source, sink, spark=spark)
    assert sink.records() == [...]
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence

from fissure.graph import SchemaSpec
from fissure.spark.sinks import MemorySink
from fissure.spark.sources import FileSource

__all__ = ["MemorySink", "record_files", "text_files"]


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
