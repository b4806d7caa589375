"""Operator costs measured on a sample of the input in the driver (fissure.local.cost_sample), and the
sample read from a file source (fissure.spark.io.batch_admission.sample_rows); no JVM."""

from __future__ import annotations

import itertools
import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fissure import FileSource, Pipeline
from fissure.program.operators import OperatorEstimate
from fissure.local.cost_sample import (CHUNK_RECORDS, WARM_UP_RECORDS, SampleFailed, measure_sample,
                                    measure_sample_isolated)
from fissure.spark.io.batch_admission import sample_rows
from fissure.program.operators import PipelineError

TEXT = pa.schema([pa.field("value", pa.string())])


def ticking_clock():
    """A CPU clock that advances one second each time it is read: every node's call costs 1 s."""
    ticks = itertools.count()
    return lambda: float(next(ticks))


def program():
    return (Pipeline("sampled")
            .map("shout", lambda record: {"value": record["value"].upper()})
            .filter("odd", lambda record: int(record["value"][1:]) % 2 == 1)
            .filter("none", lambda record: False)
            .map("after_none", lambda record: record))


def test_costs_are_clock_seconds_per_input_record_and_selectivity_is_measured():
    rows = [{"value": f"a{i}"} for i in range(WARM_UP_RECORDS + 2 * CHUNK_RECORDS)]
    sample = measure_sample(program(), {"source": rows}, {"source": TEXT}, cpu_clock=ticking_clock(),
                            wall_clock=lambda: 0.0)
    calls = 2  # the warm-up call is not counted; two chunks are
    per_record_us = 1e6 * calls / (2 * CHUNK_RECORDS)
    assert sample.records == 2 * CHUNK_RECORDS
    # "after_none" received no record: no estimate, its hint stands
    assert sample.estimates == {"shout": OperatorEstimate(per_record_us, 1.0),
                                "odd": OperatorEstimate(per_record_us, 0.5),
                                "none": OperatorEstimate(2 * per_record_us, 0.0)}
    assert sample.seconds == 4 * calls  # every operator node's ticks, after_none's included


def test_the_wall_clock_budget_ends_the_sample_after_the_chunk_it_runs_out_in():
    rows = [{"value": f"a{i}"} for i in range(WARM_UP_RECORDS + 3 * CHUNK_RECORDS)]
    walls = iter([0.0, 0.2, 0.6, 9.0])  # the deadline (0.5 s after the first read) passes after chunk 2
    sample = measure_sample(program(), {"source": rows}, {"source": TEXT}, budget_s=0.5,
                            cpu_clock=ticking_clock(), wall_clock=lambda: next(walls))
    assert sample.records == 2 * CHUNK_RECORDS


def test_a_keyed_operator_is_measured_over_its_keys_as_a_batch():
    def count(state, record):
        state["n"] = state.get("n", 0) + 1
        return {"key": record["value"][0], "n": state["n"]}

    keyed = Pipeline("keyed").partitioned("count", count, key="value", schema={"key": str, "n": int})
    rows = [{"value": f"{i % 3}"} for i in range(WARM_UP_RECORDS + CHUNK_RECORDS)]
    sample = measure_sample(keyed, {"source": rows}, {"source": TEXT}, cpu_clock=ticking_clock())
    assert sample.estimates == {"count": OperatorEstimate(1e6 / CHUNK_RECORDS, 1.0)}  # one call for all 3 keys
    assert sample.describe().startswith(
        f"operator costs measured on a sample of {CHUNK_RECORDS:,} records")


def test_rows_for_a_source_the_program_lacks_are_an_error():
    with pytest.raises(PipelineError, match="no source 'lines'"):
        measure_sample(program(), {"lines": [{"value": "a1"}]}, {"lines": TEXT})


def test_a_text_sample_is_the_first_files_whole_lines(tmp_path):
    folder = tmp_path / "text"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"one\r\ntwo\nthree\n")
    (folder / "b.txt").write_bytes(b"later\n")
    rows, schema = sample_rows(FileSource(str(folder)))
    assert rows == [{"value": "one"}, {"value": "two"}, {"value": "three"}] and schema == TEXT
    (folder / "a.txt").write_bytes(b"x\ny")  # no newline at the end: the last line is whole
    assert sample_rows(FileSource(str(folder)), limit=5)[0] == [{"value": "x"}, {"value": "y"}]
    assert sample_rows(FileSource(str(tmp_path / "none"))) is None


def test_json_csv_and_parquet_samples_take_the_declared_schema(tmp_path):
    schema = {"user": str, "amount": int}
    declared = pa.schema([pa.field("user", pa.string()), pa.field("amount", pa.int64())])
    for name in ("json", "csv", "parquet"):
        (tmp_path / name).mkdir()
    records = [{"user": f"u{i}", "amount": i} for i in range(5)]
    (tmp_path / "json" / "a.json").write_text("".join(json.dumps({**r, "extra": 1}) + "\n" for r in records))
    (tmp_path / "csv" / "a.csv").write_text("amount,user\n" + "".join(f"{r['amount']},{r['user']}\n" for r in records))
    pq.write_table(pa.Table.from_pylist(records, schema=declared), tmp_path / "parquet" / "a.parquet")
    for name in ("json", "csv", "parquet"):
        rows, got = sample_rows(FileSource(str(tmp_path / name), format=name, schema=schema), limit=3)
        assert rows == records[:3] and got == declared, name


def test_lines_that_would_be_dead_letters_are_left_out_of_the_sample(tmp_path):
    schema = {"user": str, "amount": int}
    for name in ("json", "csv", "text"):
        (tmp_path / name).mkdir()
    (tmp_path / "json" / "a.json").write_text('{"user": "a", "amount": 1}\n{"user": "b", "amount": {}}\n'
                                              'not json\n{"user": "c", "amount": 3}\n')
    (tmp_path / "csv" / "a.csv").write_text("user,amount\na,1\nb,lots\nc,3\n")
    (tmp_path / "text" / "a.txt").write_bytes(b"good\n\xff\xfe bad\nalso good\n")
    for name in ("json", "csv"):
        rows, _ = sample_rows(FileSource(str(tmp_path / name), format=name, schema=schema))
        assert rows == [{"user": "a", "amount": 1}, {"user": "c", "amount": 3}], name
    assert sample_rows(FileSource(str(tmp_path / "text")))[0] == [{"value": "good"}, {"value": "also good"}]


def _ends_its_process(record):
    os._exit(3)


def _exits(record):
    sys.exit("no more")


def _hangs(record):
    time.sleep(60)


def _refuses(record):
    raise ValueError("bad record")


def test_the_isolated_sample_measures_in_a_child_and_answers_with_the_costs():
    rows = [{"value": f"a{i}"} for i in range(WARM_UP_RECORDS + CHUNK_RECORDS)]
    sample = measure_sample_isolated(program(), {"source": rows}, {"source": TEXT})
    assert sample.records == CHUNK_RECORDS and set(sample.estimates) == {"shout", "odd", "none"}
    assert sample.estimates["odd"].selectivity == 0.5


@pytest.mark.parametrize("fn, reason", [(_ends_its_process, "ended its process"), (_exits, "SystemExit: no more"),
                                        (_hangs, "did not finish its sample in 1 s")])
def test_code_that_ends_hangs_or_raises_in_the_sample_fails_the_sample_not_the_driver(fn, reason):
    rows = [{"value": "a"}] * (WARM_UP_RECORDS + 10)
    with pytest.raises(SampleFailed, match=reason):
        measure_sample_isolated(Pipeline("bad").map("bad", fn), {"source": rows}, {"source": TEXT}, timeout_s=1)


def test_an_operator_that_raises_makes_dead_letters_in_the_sample_as_on_spark():
    rows = [{"value": "a"}] * (WARM_UP_RECORDS + 100)
    sample = measure_sample_isolated(Pipeline("bad").map("bad", _refuses), {"source": rows}, {"source": TEXT})
    assert sample.estimates["bad"].selectivity == 0.0 and sample.records == 100
