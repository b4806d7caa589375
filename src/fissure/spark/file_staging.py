"""A file source's files, handed to Spark only once they are whole and readable.

Spark's file source takes every file its listing finds: a file still being written is read as far
as it got and never again (its name is seen), and a compressed file cut short (a truncated `.gz`)
fails the micro-batch every time it is replayed. So for a local directory fissure lists the files
itself and gives Spark a staging directory in the checkpoint (`fissure/staging/<source>/files`)
holding a symbolic link to each file that is

- settled (`SettleRule`): its modification time is at least `settle_s` in the past and its size
  and modification time are those of the listing before (a writer that appends or rewrites in
  place touches both); a file written elsewhere and renamed into the directory is settled at
  once, as its modification time is that of its last write;
- readable (`unreadable_reason`): a gzip or bzip2 file decompresses to its end, a Parquet file
  has a footer. One that does not becomes one dead letter of the source naming the file and
  what is wrong (`FileSource(on_unreadable="dead-letter")`, the default), or stops the run with
  the file named (`on_unreadable="stop"`); it is never linked, so Spark never fails on it.

Links, not copies: Spark reads the file itself, nothing is duplicated, and a file deleted before
Spark reads it is missing as it would be without staging (`missing_files` reports it). The
staging directory keeps the source directory's layout (partition folders `key=value/` included).
"""

from __future__ import annotations

import bz2
import gzip
import json
import logging
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

log = logging.getLogger(__name__)

STAGING_FOLDER = "fissure/staging"
CHUNK_BYTES = 1 << 20
ON_UNREADABLE = ("dead-letter", "stop")


class UnreadableInputFile(RuntimeError):
    """A file of a source that cannot be read (a truncated or garbled compressed file), with
    FileSource(on_unreadable="stop"); the message names the file and what is wrong."""


@dataclass(frozen=True)
class Seen:
    """A file as one listing saw it."""

    size: int
    modified_ns: int


@dataclass(frozen=True)
class SettleDecision:
    """Which files of a listing are settled (ready to read) and which are still being written."""

    settled: tuple[str, ...]
    writing: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class SettleRule:
    """A file is settled when it has not been written for `settle_s` seconds: its modification
    time is at least that old, and its size and modification time have not changed since the
    listing before (when there was one)."""

    settle_s: float

    def decide(self, listing: Mapping[str, Seen], before: Mapping[str, Seen], now_s: float) -> SettleDecision:
        settled, writing = [], []
        for name, seen in sorted(listing.items()):
            quiet = now_s - seen.modified_ns / 1e9 >= self.settle_s
            unchanged = before.get(name, seen) == seen
            (settled if quiet and unchanged else writing).append(name)
        return SettleDecision(tuple(settled), tuple(writing),
                              f"{len(settled)} file(s) unchanged for {self.settle_s:g} s, {len(writing)} written "
                              f"to within {self.settle_s:g} s")


def unreadable_reason(path: str, file_format: str) -> str | None:
    """What is wrong with a file Spark's reader would fail on (None: nothing found): a gzip or
    bzip2 file is decompressed to its end (about the cost of Spark's own read of it), a Parquet
    file's footer is read."""
    lower = path.lower()
    try:
        if lower.endswith(".gz"):
            _read_to_end(gzip.open(path, "rb"))
        elif lower.endswith(".bz2"):
            _read_to_end(bz2.open(path, "rb"))
        elif file_format == "parquet":
            import pyarrow.parquet as pq

            pq.read_metadata(path)
    except (EOFError, OSError, zlib.error, ValueError) as error:
        if isinstance(error, FileNotFoundError):
            return None  # deleted meanwhile: nothing to read, nothing to report here
        kind = "compressed stream is cut short" if isinstance(error, EOFError) else "cannot be read"
        return f"the file's {kind} ({type(error).__name__}: {error})"
    except Exception as error:  # noqa: BLE001 - pyarrow's errors: any of them means Spark would fail too
        return f"the file cannot be read ({type(error).__name__}: {error})"
    return None


def _read_to_end(handle) -> None:
    with handle:
        while handle.read(CHUNK_BYTES):
            pass


def listed_files(directory: str) -> dict[str, Seen]:
    """The files Spark's file source would read under `directory` (hidden and `_`-prefixed names
    skipped, as Spark does), by path relative to it."""
    found = {}
    root = os.path.abspath(directory)
    for folder, folders, files in os.walk(root):
        folders[:] = [name for name in folders if not name.startswith((".", "_"))]
        for name in files:
            if name.startswith((".", "_")):
                continue
            path = os.path.join(folder, name)
            try:
                stat = os.stat(path)
            except FileNotFoundError:
                continue
            found[os.path.relpath(path, root)] = Seen(stat.st_size, stat.st_mtime_ns)
    return found


@dataclass
class UnreadableFile:
    """A file never given to Spark, and the batch whose dead letters hold it (None: not yet written)."""

    source: str
    path: str
    reason: str
    batch: int | None = None

    def letter(self) -> tuple[str, str, str]:
        """(operator, error, record) of its dead letter: the source's name, the reason, the file."""
        return (self.source, f"unreadable input file {self.path}: {self.reason}",
                json.dumps({"file": self.path}))


@dataclass
class FileStager:
    """Links the settled, readable files of one local source directory into its staging directory."""

    source: str  # the source's name in the program
    directory: str  # the user's directory
    staging: str  # fissure/staging/<source> in the (local) checkpoint
    file_format: str
    rule: SettleRule
    on_unreadable: str = "dead-letter"
    clock: Callable[[], float] = time.time  # wall clock: compared with modification times
    _before: dict[str, Seen] = field(default_factory=dict)
    _said_waiting: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def files(self) -> str:
        return os.path.join(self.staging, "files")

    @property
    def _unreadable_path(self) -> str:
        return os.path.join(self.staging, "unreadable.jsonl")

    def unreadable(self) -> list[UnreadableFile]:
        """Every file of the source found unreadable so far (kept in the checkpoint)."""
        try:
            with open(self._unreadable_path, encoding="utf-8") as lines:
                return [UnreadableFile(**json.loads(line)) for line in lines if line.strip()]
        except FileNotFoundError:
            return []

    def save_unreadable(self, files: Iterable[UnreadableFile]) -> None:
        temporary = self._unreadable_path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as out:
            for file in files:
                out.write(json.dumps(file.__dict__) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self._unreadable_path)

    def letters_for(self, batch_id: int) -> list[UnreadableFile]:
        """The unreadable files whose dead letters batch `batch_id` writes: those assigned to it
        (a replayed batch writes them again) and those not written yet, assigned to it now."""
        with self._lock:
            files = self.unreadable()
            if any(file.batch is None for file in files):
                for file in files:
                    if file.batch is None:
                        file.batch = batch_id
                self.save_unreadable(files)
            return [file for file in files if file.batch == batch_id]

    def poll(self) -> SettleDecision:
        """One round: link every new settled readable file; record the unreadable ones (or raise
        UnreadableInputFile, with on_unreadable="stop"). Returns the round's decision."""
        os.makedirs(self.files, exist_ok=True)
        known = {file.path for file in self.unreadable()}
        listing = {name: seen for name, seen in listed_files(self.directory).items()
                   if not os.path.lexists(os.path.join(self.files, name))
                   and os.path.join(self.directory, name) not in known}
        decision = self.rule.decide(listing, self._before, self.clock())
        self._before = listing
        found = []
        for name in decision.settled:
            original = os.path.join(os.path.abspath(self.directory), name)
            reason = unreadable_reason(original, self.file_format)
            if reason is not None:
                if self.on_unreadable == "stop":
                    raise UnreadableInputFile(
                        f"file source {self.directory!r}: {original} cannot be read: {reason}. Replace or remove "
                        f"the file and run again, or let such files become dead letters "
                        f"(FileSource(on_unreadable='dead-letter'))")
                log.warning("fissure: %s cannot be read (%s): a dead letter of source %s", original, reason,
                            self.source)
                found.append(UnreadableFile(self.source, os.path.join(self.directory, name), reason))
                continue
            link = os.path.join(self.files, name)
            os.makedirs(os.path.dirname(link), exist_ok=True)
            try:
                os.symlink(original, link)
            except FileExistsError:
                pass
        if found:
            with self._lock:
                self.save_unreadable(self.unreadable() + found)
        waiting = set(decision.writing) - self._said_waiting
        if waiting:
            log.info("fissure: %d file(s) of %s still being written; read once unchanged for %g s: %s",
                     len(waiting), self.directory, self.rule.settle_s, ", ".join(sorted(waiting)[:5]))
            self._said_waiting |= waiting
        return decision

    def stage_all(self, poll_s: float, sleep: Callable[[float], None] = time.sleep) -> None:
        """Poll until no file of the directory is still being written (an available-now run reads
        what the directory holds when it starts, whole)."""
        while self.poll().writing:
            sleep(poll_s)


class StagingThread:
    """Polls stagers while a query runs (a run that follows its directory); an error it meets
    (UnreadableInputFile) is kept for the runner, which stops the query on it."""

    def __init__(self, stagers: list[FileStager], poll_s: float, on_error: Callable[[BaseException], None]) -> None:
        self.stagers, self.poll_s, self.on_error = stagers, poll_s, on_error
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fissure-file-staging", daemon=True)

    def start(self) -> StagingThread:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                for stager in self.stagers:
                    stager.poll()
            except BaseException as error:  # noqa: BLE001 - handed to the runner, which raises it
                self.on_error(error)
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def poll_interval(stagers: Iterable[FileStager]) -> float:
    """How often the stagers look: half the shortest settle time, between 0.1 and 1 s."""
    return min([max(0.1, min(1.0, stager.rule.settle_s / 2)) for stager in stagers] or [1.0])


def batch_files(read: Callable[[str], str | None], names: Callable[[str], list[str]], batch_id: int) -> list[str]:
    """The files Spark's file sources took into micro-batch `batch_id`, from the checkpoint's
    source logs (`sources/<n>/<batch>`, or the compacted `<batch>.compact` every tenth batch)."""
    paths = []
    for source in names("sources"):
        text = read(f"sources/{source}/{batch_id}") or read(f"sources/{source}/{batch_id}.compact") or ""
        for line in text.splitlines()[1:]:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("batchId") == batch_id and "path" in entry:
                paths.append(entry["path"])
    return paths


def missing_files(paths: Iterable[str]) -> list[str]:
    """The local files (file: URLs) among `paths` that no longer exist (a link whose file is gone
    counts as missing); other schemes are not checked."""
    from urllib.parse import unquote, urlparse

    missing = []
    for path in paths:
        parsed = urlparse(path)
        if parsed.scheme != "file":
            continue
        local = unquote(parsed.path)
        if not os.path.exists(local):
            target = os.readlink(local) if os.path.islink(local) else None
            missing.append(target or local)
    return missing


def staged(source, staging: str):
    """`source` (a FileSource) reading its staging directory instead of its own."""
    return replace(source, path=os.path.join(staging, "files"))


def staging_path(checkpoint: str, source_name: str) -> str:
    return os.path.join(checkpoint, STAGING_FOLDER, source_name)


def staging_applies(source, checkpoint_local: str | None, fresh: bool, source_name: str) -> str | None:
    """Why `source` is read directly, not staged (None: it is staged): no settle time asked,
    a directory or checkpoint not on this machine, a glob, or a checkpoint whose stream began
    reading the directory directly (staging now would read every file again)."""
    if getattr(source, "settle_s", None) is None:
        return "settle_s=None"
    local = source.local_path()
    if local is None or checkpoint_local is None:
        return "the directory or the checkpoint is not on this machine's file system"
    if any(character in local for character in "*?[{"):
        return "a glob pattern"
    if not fresh and not os.path.isdir(staging_path(checkpoint_local, source_name)):
        return "the checkpoint's stream began reading the directory directly"
    return None

