"""fissure's own files in a checkpoint (its lock, its program record), on any file system Spark
can checkpoint to, with what each one guarantees for a file created exclusively.

- Local file system (`file:`, or a path on a session whose default file system is local): the
  operating system's calls. A file is created exclusively by writing a temporary file and
  hard-linking it to its name (the link fails when the name exists: one winner, and a reader
  never sees half a record; where hard links are not supported, `O_CREAT | O_EXCL`).
- HDFS (`hdfs:`, `viewfs:`): Hadoop's FileSystem; a temporary file renamed to its name, which the
  NameNode refuses when the name exists (one winner).
- Object stores and anything else (`s3a:`, `gs:`, `abfs:`, ...): no create-exclusive exists. The
  record is written when its name is free, then read back after `settle_s`: of two runs whose
  check and write are each less than `settle_s` apart, the later write wins and the earlier one
  reads the other's record and steps back. That is a timing assumption, not a guarantee: keep to
  one driver per checkpoint there (Spark itself asks the same of its checkpoint).

Spark mechanism with no pyspark import: it reaches Hadoop's FileSystem through the session's JVM.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
import uuid
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlparse

RENAME_SCHEMES = ("hdfs", "viewfs")  # rename refuses an existing destination, atomically
SETTLE_S = 2.0  # object stores: between writing a record and reading it back


class CheckpointStore(Protocol):
    """Files under one checkpoint directory, by path relative to it ("" is the directory)."""

    location: str
    guarantee: str  # how create_exclusive picks one winner, for messages and docs

    def exists(self, relative: str) -> bool: ...
    def names(self, relative: str) -> list[str]: ...
    def read(self, relative: str) -> str | None: ...
    def write(self, relative: str, text: str) -> None: ...
    def create_exclusive(self, relative: str, text: str) -> bool: ...
    def delete(self, relative: str, recursive: bool = False) -> None: ...
    def modified_s(self, relative: str) -> float | None: ...
    def touch(self, relative: str, when_s: float) -> None: ...
    def make_directory(self) -> bool: ...


class LocalStore:
    """A checkpoint on the local file system (or a mount of one)."""

    guarantee = "exclusive (a hard link, or O_EXCL, on the local file system)"

    def __init__(self, directory: str) -> None:
        self.location = os.path.abspath(directory)

    def _path(self, relative: str) -> str:
        return os.path.join(self.location, relative) if relative else self.location

    def exists(self, relative: str) -> bool:
        return os.path.exists(self._path(relative))

    def names(self, relative: str) -> list[str]:
        try:
            return sorted(os.listdir(self._path(relative)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def read(self, relative: str) -> str | None:
        try:
            with open(self._path(relative), encoding="utf-8") as handle:
                return handle.read()
        except (FileNotFoundError, IsADirectoryError):
            return None

    def write(self, relative: str, text: str) -> None:
        """Replace the file whole (a reader sees the old or the new text)."""
        target = self._path(relative)
        temporary = self._temporary(target, text)
        os.replace(temporary, target)

    def create_exclusive(self, relative: str, text: str) -> bool:
        target = self._path(relative)
        temporary = self._temporary(target, text)
        try:
            os.link(temporary, target)
            return True
        except FileExistsError:
            return False
        except OSError as error:
            if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            return self._create_excl(target, text)  # no hard links here
        finally:
            os.unlink(temporary)

    @staticmethod
    def _create_excl(target: str, text: str) -> bool:
        try:
            descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        return True

    @staticmethod
    def _temporary(target: str, text: str) -> str:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        temporary = os.path.join(os.path.dirname(target), f".tmp-{uuid.uuid4().hex}")
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        return temporary

    def delete(self, relative: str, recursive: bool = False) -> None:
        path = self._path(relative)
        if os.path.isdir(path) and not os.path.islink(path):
            if recursive:
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.rmdir(path)
        elif os.path.lexists(path):
            os.unlink(path)

    def modified_s(self, relative: str) -> float | None:
        try:
            return os.stat(self._path(relative)).st_mtime
        except FileNotFoundError:
            return None

    def touch(self, relative: str, when_s: float) -> None:
        os.utime(self._path(relative), (when_s, when_s))

    def make_directory(self) -> bool:
        """Create the checkpoint directory; True when this call created it (False: it existed)."""
        os.makedirs(os.path.dirname(self.location), exist_ok=True)
        try:
            os.mkdir(self.location)
            return True
        except FileExistsError:
            return False


class HadoopStore:
    """A checkpoint on a file system reached through Hadoop's FileSystem (the JVM's view)."""

    def __init__(self, spark, location: str, mode: str, settle_s: float = SETTLE_S,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.location, self.mode, self.settle_s, self._sleep = location, mode, settle_s, sleep
        self._jvm = spark._jvm
        root = self._jvm.org.apache.hadoop.fs.Path(location)
        self._fs = root.getFileSystem(spark._jsc.hadoopConfiguration())
        self.guarantee = ("exclusive (rename refuses an existing name)" if mode == "rename" else
                          f"best effort (written, then read back after {settle_s:g} s: no create-exclusive here)")

    def _path(self, relative: str):
        path = self._jvm.org.apache.hadoop.fs.Path(self.location)
        for part in (relative.split("/") if relative else ()):
            path = self._jvm.org.apache.hadoop.fs.Path(path, part)
        return path

    def exists(self, relative: str) -> bool:
        return bool(self._fs.exists(self._path(relative)))

    def names(self, relative: str) -> list[str]:
        path = self._path(relative)
        if not self._fs.exists(path):
            return []
        return sorted(status.getPath().getName() for status in self._fs.listStatus(path))

    def read(self, relative: str) -> str | None:
        path = self._path(relative)
        if not self._fs.exists(path):
            return None
        stream = self._fs.open(path)
        try:
            return self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()

    def _put(self, path, text: str, overwrite: bool) -> None:
        stream = self._fs.create(path, overwrite)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()

    def write(self, relative: str, text: str) -> None:
        self._put(self._path(relative), text, True)

    def create_exclusive(self, relative: str, text: str) -> bool:
        target = self._path(relative)
        self._fs.mkdirs(target.getParent())
        if self._fs.exists(target):
            return False
        if self.mode == "rename":
            temporary = self._jvm.org.apache.hadoop.fs.Path(target.getParent(), f".tmp-{uuid.uuid4().hex}")
            self._put(temporary, text, False)
            if self._fs.rename(temporary, target):
                return True
            self._fs.delete(temporary, False)
            return False
        try:
            self._put(target, text, False)
        except Exception as error:  # noqa: BLE001 - py4j wraps FileAlreadyExistsException
            if "FileAlreadyExists" in str(error):
                return False
            raise
        self._sleep(self.settle_s)
        return self.read(relative) == text

    def delete(self, relative: str, recursive: bool = False) -> None:
        self._fs.delete(self._path(relative), recursive)

    def modified_s(self, relative: str) -> float | None:
        path = self._path(relative)
        if not self._fs.exists(path):
            return None
        return self._fs.getFileStatus(path).getModificationTime() / 1000.0

    def touch(self, relative: str, when_s: float) -> None:
        if self.mode == "rename":
            self._fs.setTimes(self._path(relative), int(when_s * 1000), -1)
        else:  # object stores keep no settable times: a rewrite renews the object's
            text = self.read(relative)
            if text is not None:
                self.write(relative, text)

    def make_directory(self) -> bool:
        root = self._path("")
        if self._fs.exists(root):
            return False
        return bool(self._fs.mkdirs(root))


def open_store(spark, checkpoint: str) -> CheckpointStore:
    """The checkpoint's store: the local one when the session resolves it to the local file system
    (or, without a session, when it names no other scheme), else Hadoop's."""
    jvm = getattr(spark, "_jvm", None) if spark is not None else None
    if jvm is None:
        parsed = urlparse(checkpoint)
        if parsed.scheme in ("", "file"):
            return LocalStore(parsed.path if parsed.scheme == "file" else checkpoint)
        raise ValueError(f"checkpoint {checkpoint}: a session is needed to reach a {parsed.scheme}: file system")
    path = jvm.org.apache.hadoop.fs.Path(checkpoint)
    file_system = path.getFileSystem(spark._jsc.hadoopConfiguration())
    uri = file_system.makeQualified(path).toUri()
    scheme = (uri.getScheme() or "").lower()
    if scheme == "file":
        return LocalStore(uri.getPath())
    return HadoopStore(spark, uri.toString(), "rename" if scheme in RENAME_SCHEMES else "settle")
