"""A file source on Spark reads whole, readable files only, and says which files went missing:
a truncated .gz, or an .xz file Spark would read as binary lines, is one dead letter naming it
(or stops the run), a file written in place while the stream runs is read once, whole, and a
file deleted after Spark listed it is reported."""

from __future__ import annotations

import gzip
import json
import lzma
import os
import time

import pytest

import fissure
from fissure import Pipeline
from fissure.spark.io.file_staging import UnreadableInputFile
from fissure.spark.io.sinks import ForeachBatchSink, MemorySink
from fissure.spark.io.sources import FileSource

pytestmark = pytest.mark.spark


def shout(record):
    return {"value": record["value"].upper()}


def program():
    return Pipeline("files").map("shout", shout)


def old_file(path, data: bytes, age_s: float = 100.0):
    with open(path, "wb") as out:
        out.write(data)
    then = time.time() - age_s
    os.utime(path, (then, then))


def test_a_truncated_gzip_is_one_dead_letter_naming_the_file_or_stops_the_run(spark, tmp_path):
    source_dir = tmp_path / "in"
    source_dir.mkdir()
    old_file(source_dir / "good.txt", b"a\nb\n")
    whole = gzip.compress(b"".join(b"line %d\n" % i for i in range(20000)))
    old_file(source_dir / "cut.txt.gz", whole[: len(whole) // 2])
    old_file(source_dir / "packed.txt.xz", lzma.compress(b"c\nd\n"))  # Spark would read its bytes as lines
    sink, letters = MemorySink(), MemorySink()
    report = fissure.run(program(), FileSource(str(source_dir)), sink, checkpoint=str(tmp_path / "ckpt"),
                         config=fissure.RunnerConfig(spark=spark, dead_letters=letters, progress="off", profiling=None))
    assert sorted(record["value"] for record in sink.records()) == ["A", "B"]
    letter, packed = sorted(letters.records(), key=lambda letter: letter["error"])
    assert letter["operator"] == "source" and "cut.txt.gz" in letter["error"] and "cut short" in letter["error"]
    assert json.loads(letter["record"])["file"].endswith("cut.txt.gz")
    assert "packed.txt.xz" in packed["error"] and "does not decompress" in packed["error"]
    assert report.dead_letters == 2
    with pytest.raises(UnreadableInputFile, match=r"cut.txt.gz cannot be read"):
        fissure.run(program(), FileSource(str(source_dir), on_unreadable="stop"), MemorySink(),
                    checkpoint=str(tmp_path / "ckpt-stop"),
                    config=fissure.RunnerConfig(spark=spark, progress="off", profiling=None))


def test_a_file_written_in_place_while_the_stream_runs_is_read_once_whole(spark, tmp_path):
    source_dir = tmp_path / "in"
    source_dir.mkdir()
    sink = MemorySink()
    runner = fissure.Runner(program(), FileSource(str(source_dir), settle_s=2.0), sink,
                            checkpoint=str(tmp_path / "ckpt"),
                            config=fissure.RunnerConfig(spark=spark, progress="off", profiling=None))
    runner.start(available_now=False)
    try:
        growing = source_dir / "a.txt"
        with open(growing, "w") as out:
            for half in range(2):
                out.write("".join(f"line {half} {i}\n" for i in range(500)))
                out.flush()
                time.sleep(1.0)  # the stream keeps listing the directory meanwhile
        deadline = time.monotonic() + 120
        while len(sink.records()) < 1000 and time.monotonic() < deadline and runner.query.isActive:
            time.sleep(0.5)
    finally:
        report = runner.stop()
    values = [record["value"] for record in sink.records()]
    assert len(values) == 1000 and len(set(values)) == 1000, report


def test_a_file_deleted_after_spark_listed_it_is_reported(spark, tmp_path):
    source_dir = tmp_path / "in"
    source_dir.mkdir()
    for index in range(2):
        old_file(source_dir / f"part-{index}.txt", f"x{index}\n".encode(), age_s=100.0 - index)
    source = FileSource(str(source_dir), max_files_per_trigger=1)

    def fails_on_the_second_batch(frame, batch_id):
        if batch_id == 1:
            raise RuntimeError("the driver dies here")

    with pytest.raises(Exception, match="the driver dies here"):
        fissure.run(program(), source, ForeachBatchSink(fails_on_the_second_batch), checkpoint=str(tmp_path / "ckpt"),
                    config=fissure.RunnerConfig(spark=spark, progress="off", profiling=None))
    os.remove(source_dir / "part-1.txt")  # listed for batch 1, which is replayed now
    sink = MemorySink()
    report = fissure.run(program(), source, sink, checkpoint=str(tmp_path / "ckpt"),
                         config=fissure.RunnerConfig(spark=spark, progress="off", profiling=None))
    assert sink.records() == []
    assert report.missing_files == (str(source_dir / "part-1.txt"),)
    assert "1 input file missing" in report.describe() and report.summary()["missing_files"] == list(report.missing_files)
