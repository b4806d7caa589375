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
- readable (`unreadable_reason`): a compressed file decompresses to its end with the codec
  Spark's text, JSON and CSV readers pick by its suffix (gzip, bzip2, deflate, zstd; LZ4 and
  Snappy in Hadoop's block format), a file compressed in a way those readers do not decompress
  (.xz, .br, ...) is refused, a Parquet file has a footer. One that fails becomes one dead
  letter of the source naming the file and what is wrong (`FileSource(on_unreadable=
  "dead-letter")`, the default), or stops the run with the file named (`on_unreadable="stop"`);
  it is never linked, so Spark never fails on it nor reads it as garbage.

Links, not copies: Spark reads the file itself, nothing is duplicated, and a file deleted before
Spark reads it is missing as it would be without staging (`missing_files` reports it). The
staging directory keeps the source directory's layout (partition folders `key=value/` included).

Spark mechanism with no pyspark import: it prepares the directory Spark's file source reads.
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


# The suffixes Spark's text, JSON and CSV readers decompress (HadoopCodecStreams in Spark 4.x):
# Hadoop's CompressionCodecFactory (gzip, bzip2, deflate, lz4, snappy, zstd; matched whatever the
# case), and Spark's own .gzip and .zstd; zstd through zstd-jni when Hadoop's native library is
# absent (pip's pyspark has none). Measured on pyspark 4.3: each reads back what it holds.
SPARK_CODECS = {".gz": "gzip", ".gzip": "gzip", ".bz2": "bzip2", ".deflate": "deflate", ".lz4": "lz4",
                ".snappy": "snappy", ".zst": "zstd", ".zstd": "zstd"}
# Compressions those readers do not know: Spark reads such a file's compressed bytes as lines
# (measured: a .xz file of 1,000 lines gave 5 lines of binary), so fissure never hands it over.
UNDECODED_SUFFIXES = {".xz": "xz", ".txz": "xz (tar)", ".lzma": "LZMA", ".lz": "lzip", ".lzo": "LZO",
                      ".br": "Brotli", ".z": "compress", ".zip": "zip", ".7z": "7-Zip", ".rar": "RAR",
                      ".tgz": "gzip (tar)", ".tbz2": "bzip2 (tar)", ".sz": "Snappy framing"}
LZ4_FRAME_MAGIC = b"\x04\x22\x4d\x18"
SNAPPY_FRAMING_MAGIC = b"\xff\x06\x00\x00sNaPpY"


class _Unreadable(ValueError):
    """What is wrong with a file, said in full (not prefixed with the exception's name)."""


def unreadable_reason(path: str, file_format: str) -> str | None:
    """What is wrong with a file Spark's reader would fail on or read as garbage (None: nothing
    found). For text, JSON and CSV, by its suffix as Spark picks the codec (SPARK_CODECS): a
    compressed file is decompressed to its end (about the cost of Spark's own read of it), Hadoop's
    LZ4 and Snappy block format is checked block by block, and a compression Spark does not
    decompress (UNDECODED_SUFFIXES) is refused. A Parquet file, whatever its name, has its footer read."""
    try:
        if file_format == "parquet":
            import pyarrow.parquet as pq

            pq.read_metadata(path)
            return None
        _, suffix = os.path.splitext(path.lower())
        if suffix in UNDECODED_SUFFIXES:
            return (f"the file is compressed with {UNDECODED_SUFFIXES[suffix]} ({suffix}), which Spark's "
                    f"{file_format} reader does not decompress: it would read the compressed bytes as lines. "
                    f"Decompress it, or compress it as .gz, .bz2 or .zst")
        codec = SPARK_CODECS.get(suffix)
        if codec == "gzip":
            _read_to_end(gzip.open(path, "rb"))
        elif codec == "bzip2":
            _read_to_end(bz2.open(path, "rb"))
        elif codec == "deflate":
            _inflate_to_end(path)
        elif codec == "zstd":
            import pyarrow as pa

            _read_to_end(pa.CompressedInputStream(pa.OSFile(path), "zstd"))
        elif codec in ("lz4", "snappy"):
            _check_hadoop_blocks(path, codec)
    except _Unreadable as error:
        return str(error)
    except (EOFError, OSError, zlib.error, ValueError) as error:
        if isinstance(error, FileNotFoundError):
            return None  # deleted meanwhile: nothing to read, nothing to report here
        what = "the file's compressed stream is cut short" if isinstance(error, EOFError) else "the file cannot be read"
        return f"{what} ({type(error).__name__}: {error})"
    except Exception as error:  # noqa: BLE001 - pyarrow's errors: any of them means Spark would fail too
        return f"the file cannot be read ({type(error).__name__}: {error})"
    return None


def _read_to_end(handle) -> None:
    with handle:
        while handle.read(CHUNK_BYTES):
            pass


def _inflate_to_end(path: str) -> None:
    """Hadoop's .deflate: zlib streams (with their header), one after another."""
    inflater, begun = zlib.decompressobj(), False  # begun: a stream whose end is not seen yet
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            while chunk:
                begun = True
                inflater.decompress(chunk, CHUNK_BYTES)
                chunk = inflater.unconsumed_tail
                if inflater.eof:
                    chunk, inflater, begun = inflater.unused_data + chunk, zlib.decompressobj(), False
    if begun:
        raise EOFError("the deflate stream ends before its end marker")


def _check_hadoop_blocks(path: str, codec: str) -> None:
    """Hadoop's block format of .lz4 and .snappy (the only one Spark reads them in): blocks of a
    4-byte big-endian length, then chunks of a 4-byte length and the compressed bytes, which the
    block's length of data decompresses from. Spark allocates a chunk's announced length before
    reading it: on an LZ4 frame (the lz4 command line's format) that was an OutOfMemoryError that
    shut the local SparkContext down (measured on pyspark 4.3)."""
    import pyarrow as pa

    name = {"lz4": "LZ4", "snappy": "Snappy"}[codec]
    arrow = pa.Codec("lz4_raw" if codec == "lz4" else "snappy")
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        head = handle.read(len(SNAPPY_FRAMING_MAGIC))
        if head.startswith(LZ4_FRAME_MAGIC if codec == "lz4" else SNAPPY_FRAMING_MAGIC):
            other = "LZ4 frame" if codec == "lz4" else "Snappy framing"
            raise _Unreadable(
                f"the file is in the {other} format (what the {codec} command line and most libraries write); "
                f"Spark reads .{codec} files only in Hadoop's block format (as Hadoop and Spark write them) and "
                f"runs out of memory on this one. Decompress it, or compress it as .gz, .bz2 or .zst")
        handle.seek(0)
        while header := handle.read(4):
            if len(header) < 4:
                raise EOFError(f"the file ends inside a {name} block's header")
            left = int.from_bytes(header, "big")
            while left > 0:
                where = handle.tell()
                length_bytes = handle.read(4)
                if len(length_bytes) < 4:
                    raise EOFError(f"the file ends inside a {name} block, {left} bytes of it not there")
                length = int.from_bytes(length_bytes, "big")
                if length > size - where - 4:
                    raise _Unreadable(
                        f"the file is cut short or not in Hadoop's {name} block format: a chunk of {length} "
                        f"bytes is announced at byte {where}, and {size - where - 4} bytes follow")
                chunk = handle.read(length)
                produced = _snappy_length(chunk) if codec == "snappy" else _lz4_length(arrow, chunk, left)
                if produced > left:
                    raise _Unreadable(f"a {name} chunk at byte {where} holds {produced} bytes, more than its "
                                      f"block's {left} left: not Hadoop's {name} block format")
                arrow.decompress(chunk, decompressed_size=produced)
                left -= produced


def _lz4_length(arrow, chunk: bytes, most: int) -> int:
    """The bytes a raw LZ4 chunk decompresses to, at most `most`. A chunk usually fills its block,
    but Hadoop splits one write larger than its buffer into several chunks of one block. LZ4's
    safe decoder fails only when the room it is given is too small: one try with a byte less
    tells a full chunk, a bisection finds a shorter one's length (a corrupt chunk: `most`, on
    which the caller's decompression fails)."""
    try:
        arrow.decompress(chunk, decompressed_size=most - 1)
    except Exception:  # noqa: BLE001 - pyarrow's error: the room was too small
        return most
    low, high = 1, most - 1
    while low < high:
        middle = (low + high) // 2
        try:
            arrow.decompress(chunk, decompressed_size=middle)
            high = middle
        except Exception:  # noqa: BLE001 - as above
            low = middle + 1
    return high


def _snappy_length(chunk: bytes) -> int:
    """The uncompressed length a raw Snappy chunk starts with (a little-endian base-128 number)."""
    value = 0
    for position, byte in enumerate(chunk[:5]):
        value |= (byte & 0x7F) << (7 * position)
        if byte < 0x80:
            return value
    raise ValueError("a Snappy chunk without its length")


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

