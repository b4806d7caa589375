"""benchmarks/cost.py's baselines compute what the fissure programs compute: each direct loop (and,
when bytewax is installed, each bytewax flow) against fissure's in-process run over the same
files. No Spark, no timing."""

from __future__ import annotations

import sys
import warnings

import pytest

from repository import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))

import direct_loops  # noqa: E402
from direct_loops import input_files, programs, write_input  # noqa: E402
from fissure import run_local  # noqa: E402
from fissure.testing import text_files  # noqa: E402


def spark_text_records(paths):
    """What a Spark text source gives fissure: one record per line, without its line end."""
    return [{"value": line.rstrip("\n")} for path in paths for line in open(path, encoding="utf-8")]


def fissure_answer(family, variant, records):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LogWatch's unparsed lines are dead letters, as in its example
        output = run_local(programs(family)[variant], records)["sink"]
    return getattr(direct_loops, f"{family}_answer")(output)


@pytest.fixture(scope="module")
def logwatch_files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("logwatch")
    write_input("logwatch", directory, records=12_000, files=3, files_per_batch=1)
    return input_files(directory)


@pytest.fixture(scope="module")
def word_files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("words")
    write_input("wordcount", directory, records=400, files=2, files_per_batch=1, vocabulary=300)
    # Beyond the generator: capitals (the example lowercases), runs of spaces, tabs, an empty line.
    text_files(str(directory / "mixed"), ["The  the\tTHE stream", "", "  Stream spark  "])
    (directory / "mixed" / "part-000000.txt").rename(directory / "part-999999.txt")
    (directory / "mixed").rmdir()
    return input_files(directory)


def test_logwatch_loop_finds_the_break_ins_fissure_finds(logwatch_files):
    loop = direct_loops.direct_answer("logwatch", logwatch_files)
    assert len(loop) >= 2  # the generator injects a break-in every 5,000 lines
    assert loop == fissure_answer("logwatch", "", spark_text_records(logwatch_files))


@pytest.mark.parametrize("variant", ["", "aggregate"])
def test_wordcount_loop_counts_what_both_programs_count(word_files, variant):
    loop = direct_loops.direct_answer("wordcount", word_files)
    assert loop["the"] >= 3 and "THE" not in loop
    assert loop == fissure_answer("wordcount", variant, spark_text_records(word_files))


def test_cpu_loop_computes_the_chain(tmp_path):
    write_input("cpu", tmp_path, records=40, files=2, files_per_batch=1)
    paths = input_files(tmp_path)
    import json

    records = [json.loads(line) for path in paths for line in open(path, encoding="utf-8")]
    loop = direct_loops.direct_answer("cpu", paths)
    assert loop != sorted(record["x"] for record in records)  # the chain changed every value
    assert loop == fissure_answer("cpu", "", records)


@pytest.mark.parametrize("family", ["logwatch", "wordcount", "cpu", "hot-items"])
def test_bytewax_flow_computes_what_the_direct_loop_computes(family, logwatch_files, word_files, tmp_path):
    import peers

    if peers.bytewax_missing():
        pytest.skip(peers.bytewax_missing())
    if family == "cpu":
        write_input("cpu", tmp_path, records=40, files=2, files_per_batch=1)
    if family == "hot-items":  # 60 s of bids a little out of order: six windows, every one closed at the end
        write_input("hot-items", tmp_path, records=6_000, files=2, files_per_batch=1)
    paths = {"logwatch": logwatch_files, "wordcount": word_files}.get(family) or input_files(tmp_path)
    answer = getattr(direct_loops, f"{family.replace('-', '_')}_answer")
    assert answer(peers.bytewax_output(family, paths)) == direct_loops.direct_answer(family, paths)
