"""Framed Arrow IPC over pipes: what goes in comes out, whatever the sizes and the schemas."""

from __future__ import annotations

import os
import select
import threading

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fissure.runtime.pe.wire import (
    FrameKind,
    FrameReader,
    PendingWrites,
    PipeClosed,
    batch_frame_views,
    decode_batch,
    frame_views,
    make_pipe,
)


def sample_batches() -> list[pa.RecordBatch]:
    ints = pa.record_batch({"x": pa.array(range(1000), pa.int64())})
    words = pa.record_batch(
        {
            "word": pa.array(["alpha", None, "gamma"] * 50).dictionary_encode(),
            "flag": pa.array([True, False, None] * 50),
        }
    )
    big = pa.record_batch({"blob": pa.array([b"z" * 3000] * 400, pa.binary())})  # > staging
    sliced = pa.record_batch({"x": pa.array(range(100)), "y": pa.array([0.5] * 100)}).slice(7, 33)
    return [ints, words, big, sliced]


def write_in_thread(write_fd: int, frames: list[list[memoryview]]) -> threading.Thread:
    def run():
        writer = PendingWrites(write_fd)
        for views in frames:
            writer.add(views)
            writer.write_all()
        os.close(write_fd)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("pipe_capacity_bytes", [None, 1 << 20])
def test_blocking_reader_gets_every_frame_in_order(pipe_capacity_bytes):
    batches = sample_batches()
    read_fd, write_fd = make_pipe(pipe_capacity_bytes)
    frames = [batch_frame_views(batch) for batch in batches]
    frames += [frame_views(FrameKind.GROUP_END), frame_views(FrameKind.CALL_END, b'[{"a": 1}]')]
    thread = write_in_thread(write_fd, frames)
    reader = FrameReader(read_fd)
    for batch in batches:
        frame = reader.next_frame()
        assert frame.kind is FrameKind.BATCH
        assert decode_batch(frame.payload).equals(batch)
    assert reader.next_frame().kind is FrameKind.GROUP_END
    call_end = reader.next_frame()
    assert call_end.kind is FrameKind.CALL_END and call_end.payload.to_pybytes() == b'[{"a": 1}]'
    with pytest.raises(PipeClosed):
        reader.next_frame()
    thread.join()
    os.close(read_fd)


@settings(max_examples=20, deadline=None)
@given(sizes=st.lists(st.integers(min_value=1, max_value=40_000), min_size=1, max_size=12))
def test_non_blocking_reader_reassembles_frames_split_anywhere(sizes):
    batches = [pa.record_batch({"x": pa.array(range(size), pa.int32())}) for size in sizes]
    read_fd, write_fd = make_pipe(None)  # 64 KiB: larger batches arrive in pieces
    os.set_blocking(read_fd, False)
    thread = write_in_thread(write_fd, [batch_frame_views(batch) for batch in batches])
    reader = FrameReader(read_fd)
    received = []
    with pytest.raises(PipeClosed):
        while True:
            select.select([read_fd], [], [])
            received += reader.read_available()
    thread.join()
    os.close(read_fd)
    assert len(received) == len(batches)
    assert all(decode_batch(frame.payload).equals(batch) for frame, batch in zip(received, batches))


def test_frames_before_the_end_are_handed_out_before_the_end_is_reported():
    read_fd, write_fd = make_pipe(None)
    writer = PendingWrites(write_fd)
    writer.add(frame_views(FrameKind.FAILURE, b'{"why": "boom"}'))
    writer.write_all()
    os.close(write_fd)
    os.set_blocking(read_fd, False)
    reader = FrameReader(read_fd)
    frames = reader.read_available()
    assert [frame.kind for frame in frames] == [FrameKind.FAILURE]
    with pytest.raises(PipeClosed):
        reader.read_available()
    os.close(read_fd)


def test_writing_to_a_pipe_without_reader_raises_pipe_closed():
    read_fd, write_fd = make_pipe(None)
    os.close(read_fd)
    writer = PendingWrites(write_fd)
    writer.add(frame_views(FrameKind.GROUP_END))
    with pytest.raises(PipeClosed, match="reader of fd"):
        writer.write_all()
    os.close(write_fd)
