"""Wire format between the pipelines of a processing element: framed Arrow IPC over OS pipes.

A frame is a 16-byte header (kind, payload length) followed by the payload. A batch travels as
one complete Arrow IPC stream (schema + one record batch), so consecutive batches may change
schema and dictionary-encoded columns need no shared state between sender and receiver.

Readers and writers work on raw file descriptors: blocking ones in the child processes (a simple
read-process-write loop) and non-blocking ones in the parent, which must read results while it
writes input, or the chain of bounded pipes would deadlock.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import struct
from collections import deque
from dataclasses import dataclass
from enum import IntEnum

import pyarrow as pa

FRAME_HEADER = struct.Struct("<B7xQ")  # kind, 7 pad bytes, payload length in bytes
# Linux pipes hold 64 KiB by default; 1 MiB (the default /proc/sys/fs/pipe-max-size) means fewer
# wake-ups per large batch. A refused resize is harmless: the pipe keeps its default.
DEFAULT_PIPE_CAPACITY_BYTES = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_STAGING_BYTES = 256 * 1024
_MAX_IOVECS = 512  # below IOV_MAX (1024 on Linux)
_IPC_WRITE_OPTIONS = pa.ipc.IpcWriteOptions(use_threads=False)
_IPC_READ_OPTIONS = pa.ipc.IpcReadOptions(use_threads=False)


class FrameKind(IntEnum):
    BATCH = 1  # payload: an Arrow IPC stream holding one record batch
    GROUP_END = 2  # everything derived from one input batch of the call has been sent
    CALL_END = 3  # end of the call; payload: JSON list of per-pipeline call statistics
    FAILURE = 4  # payload: JSON stage failure report; the sender exits after it


@dataclass(frozen=True)
class Frame:
    kind: FrameKind
    payload: pa.Buffer | None


class PipeClosed(Exception):
    """The other end of a pipe is gone: EOF while reading, EPIPE while writing."""


class _ViewSink:
    """A write-only file for Arrow's IPC writer that keeps what it is handed instead of copying:
    the small metadata pieces arrive as bytes, the column buffers as zero-copy pyarrow Buffers
    (which keep the batch's memory alive until the views are dropped)."""

    closed = False

    def __init__(self) -> None:
        self.views: list[memoryview] = []

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        if len(view):
            self.views.append(view)
        return len(view)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def encode_batch(batch: pa.RecordBatch) -> list[memoryview]:
    """One record batch as a self-contained Arrow IPC stream, as byte views to write in order.

    No copy of the column data: a pipe write copies it once, straight from the batch's memory.
    """
    sink = _ViewSink()
    with pa.ipc.new_stream(sink, batch.schema, options=_IPC_WRITE_OPTIONS) as writer:
        writer.write_batch(batch)
    return sink.views


def decode_batch(buffer: pa.Buffer) -> pa.RecordBatch:
    """Inverse of `encode_batch` (its views concatenated); zero-copy: the batch keeps `buffer`."""
    return pa.ipc.open_stream(buffer, options=_IPC_READ_OPTIONS).read_next_batch()


def frame_views(kind: FrameKind, payload: list[memoryview] | bytes = ()) -> list[memoryview]:
    """The byte views that make up one frame, ready for `os.writev`."""
    if isinstance(payload, (bytes, pa.Buffer)):
        payload_views = [memoryview(payload).cast("B")]
    else:
        payload_views = payload
    payload_size = sum(len(view) for view in payload_views)
    return [memoryview(FRAME_HEADER.pack(kind, payload_size)), *payload_views]


def batch_frame_views(batch: pa.RecordBatch) -> list[memoryview]:
    return frame_views(FrameKind.BATCH, encode_batch(batch))


def make_pipe(capacity_bytes: int | None = DEFAULT_PIPE_CAPACITY_BYTES) -> tuple[int, int]:
    """An OS pipe (read fd, write fd), enlarged to `capacity_bytes` where the kernel allows."""
    read_fd, write_fd = os.pipe()
    if capacity_bytes:
        try:
            fcntl.fcntl(write_fd, _F_SETPIPE_SZ, capacity_bytes)
        except OSError:
            pass
    return read_fd, write_fd


class FrameReader:
    """Reassembles frames from the bytes of one pipe.

    On a blocking fd `next_frame` waits for a whole frame; on a non-blocking fd `read_available`
    returns the frames completed by the bytes that are there now. Small frames are parsed out of
    a staging buffer (one read serves many frames); a large payload is read straight into its own
    Arrow buffer, so the decoded batch needs no further copy.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._staging = bytearray(_STAGING_BYTES)
        self._staged_start = 0
        self._staged_end = 0
        self._pending_kind: FrameKind | None = None
        self._payload: pa.Buffer | None = None
        self._payload_view: memoryview | None = None
        self._payload_filled = 0
        self._complete: deque[Frame] = deque()
        self._at_end = False

    def next_frame(self) -> Frame:
        """The next frame, blocking. Raises PipeClosed at end of stream."""
        while not self._complete:
            self._read_once()
        return self._complete.popleft()

    def read_available(self) -> list[Frame]:
        """Frames completed by what the (non-blocking) fd holds now. Raises PipeClosed at EOF."""
        if self._at_end and not self._complete:
            raise PipeClosed(f"end of stream on fd {self.fd}")
        while not self._at_end:
            try:
                self._read_once()
            except BlockingIOError:
                break
            except PipeClosed:
                self._at_end = True  # hand out the frames that came before the end first
                if not self._complete:
                    raise
        frames = list(self._complete)
        self._complete.clear()
        return frames

    def _read_once(self) -> None:
        if self._payload_view is not None and self._payload_missing() >= _STAGING_BYTES:
            count = os.readv(self.fd, [self._payload_view[self._payload_filled :]])
            if count == 0:
                raise PipeClosed(f"end of stream on fd {self.fd} inside a frame")
            self._payload_filled += count
            self._finish_payload_if_full()
            return
        if self._staged_start == self._staged_end:
            self._staged_start = self._staged_end = 0
        elif self._staged_end == len(self._staging):
            staged = self._staging[self._staged_start : self._staged_end]
            self._staging[: len(staged)] = staged
            self._staged_start, self._staged_end = 0, len(staged)
        count = os.readv(self.fd, [memoryview(self._staging)[self._staged_end :]])
        if count == 0:
            inside_frame = self._payload_view is not None or self._staged_start != self._staged_end
            raise PipeClosed(f"end of stream on fd {self.fd}{' inside a frame' if inside_frame else ''}")
        self._staged_end += count
        self._parse_staged()

    def _payload_missing(self) -> int:
        return len(self._payload_view) - self._payload_filled

    def _parse_staged(self) -> None:
        staging = memoryview(self._staging)
        while True:
            if self._payload_view is not None:
                take = min(self._payload_missing(), self._staged_end - self._staged_start)
                end = self._staged_start + take
                self._payload_view[self._payload_filled : self._payload_filled + take] = staging[
                    self._staged_start : end
                ]
                self._staged_start = end
                self._payload_filled += take
                if not self._finish_payload_if_full():
                    return
            if self._staged_end - self._staged_start < FRAME_HEADER.size:
                return
            kind_code, payload_size = FRAME_HEADER.unpack_from(self._staging, self._staged_start)
            self._staged_start += FRAME_HEADER.size
            kind = FrameKind(kind_code)
            if payload_size == 0:
                self._complete.append(Frame(kind, None))
                continue
            self._pending_kind = kind
            self._payload = pa.allocate_buffer(payload_size)
            self._payload_view = memoryview(self._payload).cast("B")
            self._payload_filled = 0

    def _finish_payload_if_full(self) -> bool:
        if self._payload_missing():
            return False
        self._complete.append(Frame(self._pending_kind, self._payload))
        self._pending_kind = self._payload = self._payload_view = None
        return True


class PendingWrites:
    """Byte views waiting to be written to one fd, in order; partial writes resume where they
    stopped. Raises PipeClosed when the reader is gone."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._views: deque[memoryview] = deque()

    def add(self, views: list[memoryview]) -> None:
        self._views.extend(views)

    @property
    def empty(self) -> bool:
        return not self._views

    def write_available(self) -> bool:
        """Write what the (non-blocking) fd accepts now; True when nothing is left."""
        while self._views:
            try:
                self._write_once()
            except BlockingIOError:
                return False
        return True

    def write_all(self) -> None:
        """Write everything, blocking."""
        while self._views:
            self._write_once()

    def _write_once(self) -> None:
        try:
            written = os.writev(self.fd, list(itertools.islice(self._views, _MAX_IOVECS)))
        except BrokenPipeError as error:
            raise PipeClosed(f"reader of fd {self.fd} is gone") from error
        while written:
            head = self._views[0]
            if written >= len(head):
                written -= len(head)
                self._views.popleft()
            else:
                self._views[0] = head[written:]
                written = 0
