"""Files reach Spark only settled and readable (fissure.spark.io.file_staging), without Spark."""

from __future__ import annotations

import gzip
import os

import pytest

from fissure.spark.io.file_staging import (FileStager, Seen, SettleRule, UnreadableInputFile, batch_files,
                                           missing_files, unreadable_reason)
from fissure.spark.io.sources import FileSource
from repository import DATA


def test_a_file_is_settled_once_unwritten_for_the_settle_time_and_unchanged_since_the_last_listing():
    rule = SettleRule(1.0)
    old, fresh = Seen(10, 90 * 10**9), Seen(10, int(99.5 * 10**9))
    decision = rule.decide({"old": old, "fresh": fresh}, {}, now_s=100.2)
    assert decision.settled == ("old",) and decision.writing == ("fresh",)
    # Grown since the listing before: still being written, however old its time looks (cp -p).
    grown = rule.decide({"old": Seen(20, old.modified_ns)}, {"old": old}, now_s=200.0)
    assert grown.settled == () and grown.writing == ("old",)
    assert rule.decide({"fresh": fresh}, {"fresh": fresh}, now_s=100.6).settled == ("fresh",)


def test_a_truncated_gzip_is_unreadable_and_a_whole_one_is_not(tmp_path):
    data = gzip.compress(b"".join(b"line %d\n" % i for i in range(20000)))
    (tmp_path / "whole.txt.gz").write_bytes(data)
    (tmp_path / "cut.txt.gz").write_bytes(data[: len(data) // 2])
    (tmp_path / "garbled.gz").write_bytes(b"not gzip at all")
    assert unreadable_reason(str(tmp_path / "whole.txt.gz"), "text") is None
    assert "cut short" in unreadable_reason(str(tmp_path / "cut.txt.gz"), "text")
    assert "cannot be read" in unreadable_reason(str(tmp_path / "garbled.gz"), "text")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 no footer")
    assert unreadable_reason(str(tmp_path / "bad.parquet"), "parquet") is not None


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def stager(tmp_path, clock, on_unreadable="dead-letter") -> FileStager:
    return FileStager("lines", str(tmp_path / "in"), str(tmp_path / "ckpt" / "staging"), "text", SettleRule(1.0),
                      on_unreadable, clock=clock)


def test_a_file_written_in_place_is_linked_only_once_it_stopped_changing(tmp_path):
    (tmp_path / "in").mkdir()
    growing = tmp_path / "in" / "a.txt"
    growing.write_text("first half\n")
    clock = Clock(growing.stat().st_mtime + 0.3)
    staging = stager(tmp_path, clock)
    assert staging.poll().writing == ("a.txt",) and os.listdir(staging.files) == []
    with open(growing, "a") as out:
        out.write("second half\n")
    clock.now = growing.stat().st_mtime + 2.0
    assert staging.poll().writing == ("a.txt",)  # changed since the last listing
    assert staging.poll().settled == ("a.txt",)
    linked = os.path.join(staging.files, "a.txt")
    assert os.path.realpath(linked) == str(growing.resolve())
    assert staging.poll().settled == ()  # linked once


def test_an_unreadable_file_is_a_dead_letter_once_or_stops_with_its_name(tmp_path):
    (tmp_path / "in").mkdir()
    bad = tmp_path / "in" / "bad.txt.gz"
    bad.write_bytes(gzip.compress(b"x\n" * 10000)[:40])
    clock = Clock(bad.stat().st_mtime + 5)
    staging = stager(tmp_path, clock)
    staging.poll()
    staging.poll()
    (unreadable,) = staging.unreadable()
    assert os.listdir(staging.files) == [] and unreadable.path.endswith("bad.txt.gz")
    assert staging.letters_for(3) == [unreadable.__class__("lines", unreadable.path, unreadable.reason, 3)]
    assert len(staging.letters_for(3)) == 1 and staging.letters_for(4) == []  # a replay of batch 3 writes it again
    operator, error, record = staging.letters_for(3)[0].letter()
    assert operator == "lines" and "bad.txt.gz" in error and "cut short" in error and "bad.txt.gz" in record
    stopping = stager(tmp_path / "other", clock, on_unreadable="stop")
    os.makedirs(stopping.directory)
    os.link(bad, os.path.join(stopping.directory, "bad.txt.gz"))
    with pytest.raises(UnreadableInputFile, match="bad.txt.gz cannot be read"):
        stopping.poll()


def test_a_batchs_files_come_from_the_source_log_and_the_gone_ones_are_named(tmp_path):
    here, gone = tmp_path / "here.txt", tmp_path / "gone.txt"
    here.write_text("x\n")
    logs = {"sources/0/4": f'v1\n{{"path":"file://{here}","timestamp":1,"batchId":4}}\n'
                           f'{{"path":"file://{gone}","timestamp":1,"batchId":4}}\n',
            "sources/0/9.compact": f'v1\n{{"path":"file://{here}","timestamp":1,"batchId":4}}\n'
                                   f'{{"path":"file://{gone}","timestamp":1,"batchId":9}}\n'}
    files = batch_files(logs.get, lambda folder: ["0"], 4)
    assert missing_files(files) == [str(gone)]
    assert batch_files(logs.get, lambda folder: ["0"], 9) == [f"file://{gone}"]  # the compacted log's own batch


def test_file_source_settings_are_checked():
    with pytest.raises(ValueError, match="on_unreadable"):
        FileSource("in", on_unreadable="skip")
    with pytest.raises(ValueError, match="settle_s"):
        FileSource("in", settle_s=-1)


def _hadoop_blocks(data: bytes, codec: str, block: int = 4096, chunk_bytes: int | None = None) -> bytes:
    """`data` in Hadoop's block format (what Hadoop's and Spark's Lz4Codec and SnappyCodec write):
    per block, its length, then each compressed chunk's length and the chunk (one chunk per block
    unless `chunk_bytes` is smaller: Hadoop splits one write larger than its buffer so)."""
    import struct

    import pyarrow as pa

    out = b""
    for start in range(0, len(data), block):
        piece = data[start:start + block]
        out += struct.pack(">I", len(piece))
        step = chunk_bytes or len(piece)
        for offset in range(0, len(piece), step):
            chunk = pa.Codec(codec).compress(piece[offset:offset + step]).to_pybytes()
            out += struct.pack(">I", len(chunk)) + chunk
    return out


def test_each_compression_suffix_is_checked_as_sparks_text_readers_decompress_it(tmp_path):
    import bz2
    import lzma
    import zlib

    import pyarrow as pa

    data = b"".join(b"line %d\n" % i for i in range(5000))
    files = {
        "a.txt.gzip": gzip.compress(data),  # Spark's own suffix besides Hadoop's .gz
        "a.TXT.GZ": gzip.compress(data),  # suffixes match whatever their case
        "a.txt.bz2": bz2.compress(data),
        "a.txt.deflate": zlib.compress(data),
        "a.txt.zst": pa.Codec("zstd").compress(data, asbytes=True),
        "a.txt.zstd": pa.Codec("zstd").compress(data, asbytes=True),
        "a.txt.lz4": _hadoop_blocks(data, "lz4_raw"),
        "a.txt.snappy": _hadoop_blocks(data, "snappy"),
        "chunks.txt.lz4": _hadoop_blocks(data, "lz4_raw", block=20000, chunk_bytes=3000),
        "chunks.txt.snappy": _hadoop_blocks(data, "snappy", block=20000, chunk_bytes=3000),
    }
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
        assert unreadable_reason(str(tmp_path / name), "text") is None, name
    # Written by Spark 4.3 (`df.write.option("compression", ...).text(...)`, lines "line 0".."line 999").
    for written in sorted((DATA / "compressed").iterdir()):
        assert unreadable_reason(str(written), "text") is None, written.name
    broken = {
        "cut.zst": files["a.txt.zst"][:100],
        "cut.gzip": files["a.txt.gzip"][:100],
        "raw.deflate": zlib.compress(data)[2:-4],  # deflate without zlib's header: Spark fails on it
        "cut.lz4": files["a.txt.lz4"][:-50],
        "cut.snappy": files["a.txt.snappy"][:-50],
        "frame.lz4": b"\x04\x22\x4d\x18" + b"\x00" * 200,  # the lz4 command line's frame format
        "framed.snappy": b"\xff\x06\x00\x00sNaPpY" + b"\x00" * 200,
    }
    for name, content in broken.items():
        (tmp_path / name).write_bytes(content)
        assert unreadable_reason(str(tmp_path / name), "json") is not None, name
    assert "LZ4 frame" in unreadable_reason(str(tmp_path / "frame.lz4"), "text")
    # Compressions Spark's text, JSON and CSV readers do not decompress: read as the compressed bytes.
    for name, content in {"a.txt.xz": lzma.compress(data), "a.lzma": lzma.compress(data, format=lzma.FORMAT_ALONE),
                          "a.br": pa.Codec("brotli").compress(data, asbytes=True), "a.txt.Z": b"\x1f\x9d\x90",
                          "a.zip": b"PK\x03\x04"}.items():
        (tmp_path / name).write_bytes(content)
        reason = unreadable_reason(str(tmp_path / name), "csv")
        assert reason is not None and "does not decompress" in reason, name
    # A Parquet source's file is Parquet whatever its name ends with.
    (tmp_path / "part.gz").write_bytes(b"PAR1 no footer")
    assert "gzip" not in unreadable_reason(str(tmp_path / "part.gz"), "parquet")
