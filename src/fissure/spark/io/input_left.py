"""What a bounded run left unread when its timeout ended it: the files of its file sources that no
committed micro-batch read.

Spark's file source logs the files each batch reads in the checkpoint's `sources/<n>/<batch>`
(JSON lines after a `v1` line, `<batch>.compact` files every 10 batches); a batch's files count
as read once its `commits/<batch>` exists. Files are listed as Spark's file source lists them
(fissure.spark.io.batch_admission.data_files); a source that is not a local directory is reported
as not counted.

Spark mechanism with no pyspark import: it reads the file source's logs Spark keeps in the
checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from fissure.spark.io.batch_admission import bytes_per_record, data_files
from fissure.spark.checkpoint.files import CheckpointStore
from fissure.spark.checkpoint.guard import batch_ids
from fissure.spark.io.sources import FileSource


@dataclass(frozen=True)
class SourceLeft:
    """One source's input not yet read: files and bytes, records estimated from its first file."""

    source: str
    files: int
    total_files: int
    bytes: int
    records: int | None = None  # about; None: not known
    location: str = ""  # the source's directory

    def describe(self) -> str:
        records = f", about {self.records:,} records" if self.records is not None else ""
        where = f" ({self.location})" if self.location else ""
        return (f"{self.source}{where}: {self.files} of {self.total_files} file{'' if self.total_files == 1 else 's'} "
                f"not yet read ({self.bytes:,} bytes{records})")


@dataclass(frozen=True)
class InputLeft:
    """Every source's input left; `uncounted`: sources whose input cannot be counted here."""

    sources: tuple[SourceLeft, ...] = ()
    uncounted: tuple[str, ...] = ()

    @property
    def files(self) -> int:
        return sum(source.files for source in self.sources)

    @property
    def anything_left(self) -> bool:
        """Unread files, or sources nobody can say about."""
        return self.files > 0 or bool(self.uncounted)

    def describe(self) -> str:
        parts = [source.describe() for source in self.sources if source.files]
        parts += [f"{name}: not counted (not a local directory of files)" for name in self.uncounted]
        return "; ".join(parts) or "nothing left"


def local_path(uri: str) -> str:
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme in ("", "file") else uri


def files_left(source: str, listed: Sequence[tuple[str, int]], read: set[str],
               bytes_per_record: float | None = None, location: str = "") -> SourceLeft:
    """Pure: of the `listed` files (path, bytes), those not in `read`."""
    left = [(path, size) for path, size in listed if path not in read]
    total = sum(size for _, size in left)
    records = round(total / bytes_per_record) if bytes_per_record else None
    return SourceLeft(source, len(left), len(listed), total, records, location)


def committed_files(store: CheckpointStore) -> set[str]:
    """Local paths of the files committed batches read, over every file source of the checkpoint."""
    committed = batch_ids(store, "commits")
    if not committed:
        return set()
    last = committed[-1]
    read = set()
    for source in store.names("sources"):
        for name in store.names(f"sources/{source}"):
            if not name.removesuffix(".compact").isdigit():  # Hadoop's .crc files beside them
                continue
            try:
                text = store.read(f"sources/{source}/{name}") or ""
            except (OSError, ValueError):
                continue
            for line in text.splitlines()[1:]:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict) and int(entry.get("batchId", last + 1)) <= last and "path" in entry:
                    read.add(local_path(entry["path"]))
    return read


def input_left(sources: Mapping[str, object], store: CheckpointStore) -> InputLeft:
    """What the run's sources hold that no committed batch of the checkpoint read."""
    read = {str(Path(path).resolve()) for path in committed_files(store)}
    counted, uncounted = [], []
    for name, source in sources.items():
        path = source.local_path() if isinstance(source, FileSource) else None
        if path is None or any(character in path for character in "*?[{"):
            uncounted.append(name)
            continue
        listed = [(str(file.resolve()), file.stat().st_size) for file in data_files(path)]
        try:
            per_record = bytes_per_record(source)
        except (OSError, ValueError):
            per_record = None
        counted.append(files_left(name, listed, read, per_record, path))
    return InputLeft(tuple(counted), tuple(uncounted))

