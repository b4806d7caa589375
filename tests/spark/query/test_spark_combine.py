"""Aggregates combined before the exchange on Spark: the outputs and dead letters of the
in-process runner, with far fewer bytes through the exchange than when every record travels."""

from __future__ import annotations

import pytest

import fissure
from fissure import Pipeline, Sum
from fissure.config import RunnerConfig
from fissure.spark.session.stage_log import STAGE_LOG_CONF, StageLog
from fissure.testing import TestingSink, run_batches, text_files

pytestmark = pytest.mark.spark


def words_program(aggregate) -> Pipeline:
    return (Pipeline("combined")
            .flat_map("words", lambda record: [{"word": word, "n": None if word == "bad" else len(word)}
                                               for word in record["value"].split()],
                      schema={"word": str, "n": int}, reads=["value"])
            .aggregate("counts", key="word", aggregate=aggregate))


def run_on_spark(spark, tmp_path, name: str, aggregate, combine: bool):
    lines = [" ".join(f"w{(line * 7 + position) % 30}" for position in range(10)) for line in range(300)]
    lines[0] += " bad"
    source = text_files(str(tmp_path / f"in-{name}"), lines, lines_per_file=150, max_files_per_trigger=1)
    sink, dead = fissure.MemorySink(), []
    before = {stage["stageId"] for stage in StageLog(spark).get("/stages")}
    config = RunnerConfig(combine_aggregates=combine, spark_conf=STAGE_LOG_CONF, spark=spark,
                          dead_letters=TestingSink(dead), progress="off")
    report = fissure.run(words_program(aggregate), source, sink, checkpoint=str(tmp_path / f"ckpt-{name}"),
                         config=config)
    shuffled = sum(stage.get("shuffleWriteBytes", 0) for stage in StageLog(spark).get("/stages")
                   if stage["stageId"] not in before)
    return sink, dead, shuffled, lines, report.profile.operator("counts")


def per_batch(sink) -> list[list[tuple]]:
    return [sorted(tuple(sorted(row.asDict().items())) for row in sink._rows_by_batch.get(batch, []))
            for batch in range(max(sink._rows_by_batch) + 1)]


@pytest.mark.slow
def test_a_combined_aggregate_gives_the_in_process_outputs_through_a_smaller_exchange(spark, tmp_path):
    combined, combined_dead, combined_bytes, lines, combined_profile = run_on_spark(spark, tmp_path, "on", Sum("n"),
                                                                                  True)
    whole, whole_dead, whole_bytes, _, whole_profile = run_on_spark(spark, tmp_path, "off", Sum("n"), False)
    steps = run_batches(words_program(Sum("n")), [[{"value": line} for line in lines[:150]],
                                                  [{"value": line} for line in lines[150:]]],
                        schema={"value": str})
    expected = [sorted(tuple(sorted(record.items())) for record in step.results["sink"]) for step in steps
                if step.results.get("sink")]
    assert per_batch(combined) == expected == per_batch(whole)
    # "bad" has no n: a dead letter of the aggregate, as in process
    in_process = sorted((letter.node, letter.error, letter.record) for step in steps for letter in step.dead_letters)
    assert sorted((d["operator"], d["error"], d["record"]) for d in combined_dead) == in_process
    assert sorted((d["operator"], d["error"], d["record"]) for d in whole_dead) == in_process
    assert len(in_process) == 1 and in_process[0][0] == "counts"
    assert combined_bytes < whole_bytes / 2
    # the profile counts the aggregate's records, not its partials: the same statistics either way
    assert (combined_profile.records_in, combined_profile.records_out, combined_profile.dead_letters) == (
        whole_profile.records_in, whole_profile.records_out, whole_profile.dead_letters)
    assert combined_profile.records_in > 30 * 2 * 2  # more than two tasks' partials of 30 words in 2 batches


@pytest.mark.slow
@pytest.mark.parametrize("aggregate", ["sum", "count"])  # a Count is folded from the Arrow columns
def test_a_combined_window_gives_the_in_process_windows_and_late_records(spark, tmp_path, aggregate):
    from fissure import Count, Tumbling
    from fissure.testing import TestingSource

    batches = [[{"k": "abcde"[i % 5], "ts": float(base + i % 17), "v": i % 4} for i in range(300)]
               for base in (0, 20, 40)]
    batches[2] += [{"k": "a", "ts": 1.0, "v": 9}, {"k": "b", "ts": 2.0, "v": 9}]  # late: [0, 10) closed
    program = (Pipeline("windows").event_time("ts", lateness=2.0)
               .window("sums", key="k", window=Tumbling(10.0), aggregate=Sum("v") if aggregate == "sum" else Count()))
    results = {}
    for combine in (True, False):
        sink, dead = fissure.MemorySink(), []
        before = {stage["stageId"] for stage in StageLog(spark).get("/stages")}
        fissure.run(program, TestingSource(batches=batches), sink, checkpoint=str(tmp_path / f"ckpt-{combine}"),
                    config=RunnerConfig(combine_aggregates=combine, spark_conf=STAGE_LOG_CONF, spark=spark,
                                        dead_letters=TestingSink(dead), progress="off"))
        shuffled = sum(stage.get("shuffleWriteBytes", 0) for stage in StageLog(spark).get("/stages")
                       if stage["stageId"] not in before)
        results[combine] = (sorted(tuple(sorted(row.items())) for row in sink.records()),
                            sorted((d["operator"], d["error"], d["record"]) for d in dead), shuffled)
    steps = run_batches(program, batches)
    expected = sorted(tuple(sorted(record.items())) for step in steps for record in step.results["sink"])
    in_process_dead = sorted((letter.node, letter.error, letter.record) for step in steps
                             for letter in step.dead_letters)
    assert results[True][:2] == (expected, in_process_dead) == results[False][:2]
    assert len(in_process_dead) == 2 and all(error.startswith("Late") for _, error, _ in in_process_dead)
    assert results[True][2] < results[False][2] / 2


@pytest.mark.slow
def test_an_aggregate_reading_the_source_is_combined_where_the_source_becomes_envelopes(spark, tmp_path):
    from fissure.testing import TestingSource

    batches = [[{"user": "abc"[i % 3], "v": i} for i in range(600)], [{"user": "cd"[i % 2], "v": i} for i in range(50)]]
    program = Pipeline("direct").aggregate("totals", key="user", aggregate=Sum("v"))
    expected = sorted(tuple(sorted(record.items())) for step in run_batches(program, batches)
                      for record in step.results["sink"])
    shuffled = {}
    for combine in (True, False):
        sink = fissure.MemorySink()
        before = {stage["stageId"] for stage in StageLog(spark).get("/stages")}
        fissure.run(program, TestingSource(batches=batches), sink, checkpoint=str(tmp_path / f"ckpt-{combine}"),
                    config=RunnerConfig(combine_aggregates=combine, spark_conf=STAGE_LOG_CONF, spark=spark,
                                        progress="off"))
        shuffled[combine] = sum(stage.get("shuffleWriteBytes", 0) for stage in StageLog(spark).get("/stages")
                                if stage["stageId"] not in before)
        assert sorted(tuple(sorted(row.items())) for row in sink.records()) == expected
    assert len(expected) == 3 + 2
    assert shuffled[True] < shuffled[False] / 2


@pytest.mark.slow
def test_a_combined_count_folded_from_columns_gives_the_in_process_counts_and_dead_letters(spark, tmp_path):
    """A running Count is folded from the Arrow columns in the task (no dict per record): the same
    counts and sequence of outputs as in process, and a record without a key value is still a
    dead letter of the aggregate with its reason."""
    from fissure import Count
    from fissure.testing import TestingSource

    batches = [[{"value": " ".join(f"w{(line * 5 + position) % 13}" for position in range(6))
                 + (" -" if line % 40 == 0 else "")} for line in range(120)] for _ in range(2)]
    program = (Pipeline("counted")
               .flat_map("words", lambda record: [{"word": None if word == "-" else word}
                                                  for word in record["value"].split()],
                         schema={"word": str}, reads=["value"])
               .aggregate("counts", key="word", aggregate=Count()))
    sink, dead = fissure.MemorySink(), []
    fissure.run(program, TestingSource(batches=batches, schema={"value": str}), sink,
                checkpoint=str(tmp_path / "ckpt"),
                config=RunnerConfig(spark=spark, dead_letters=TestingSink(dead), progress="off"))
    steps = run_batches(program, batches, schema={"value": str})
    expected = sorted(tuple(sorted(record.items())) for step in steps for record in step.results["sink"])
    assert sorted(tuple(sorted(row.items())) for row in sink.records()) == expected
    in_process = sorted((letter.node, letter.error, letter.record) for step in steps for letter in step.dead_letters)
    assert sorted((d["operator"], d["error"], d["record"]) for d in dead) == in_process
    assert len(in_process) == 6 and all(error.startswith("NullKey") for _, error, _ in in_process)


def run_both_ways(spark, tmp_path, program, batches, name: str) -> dict:
    """The sink's records, the dead letters and the bytes through the exchanges of `program` on
    Spark, combined and not."""
    from fissure.testing import TestingSource

    results = {}
    for combine in (True, False):
        sink, dead = fissure.MemorySink(), []
        before = {stage["stageId"] for stage in StageLog(spark).get("/stages")}
        fissure.run(program, TestingSource(batches=batches), sink, checkpoint=str(tmp_path / f"ckpt-{name}-{combine}"),
                    config=RunnerConfig(combine_aggregates=combine, spark_conf=STAGE_LOG_CONF, spark=spark,
                                        dead_letters=TestingSink(dead), progress="off"))
        shuffled = sum(stage.get("shuffleWriteBytes", 0) for stage in StageLog(spark).get("/stages")
                       if stage["stageId"] not in before)
        results[combine] = (sorted(tuple(sorted(row.items())) for row in sink.records()),
                            sorted((d["operator"], d["error"], d["record"], d["seq"]) for d in dead), shuffled)
    return results


def passed_on(state, record):
    return record


@pytest.mark.slow
def test_an_aggregate_after_a_keyed_operator_is_folded_by_that_stage_with_the_same_outputs(spark, tmp_path):
    from fissure.spark.query.compile_graph import compile_graph
    from fissure.program.graph import as_graph
    from fissure.testing import record_files

    program = (Pipeline("regions").partitioned("per_user", passed_on, key="user")
               .aggregate("per_region", key="region", aggregate=Sum("n")))
    source = record_files(tmp_path / "in", [{"user": "u", "region": "r", "n": 1}],
                          {"user": str, "region": str, "n": int}).open(spark)
    for combine in (True, False):
        steps = compile_graph(as_graph(program), {"source": source}, combine=combine).steps
        assert [step.combined for step in steps if step.kind == "state"] == [False, combine]
    # a user's records come out of one call of the per-user stage: a partial per region there
    batches = [[{"user": f"u{i % 5}", "region": "nesw"[i % 4], "n": i % 7} for i in range(600)],
               [{"user": f"u{i % 3}", "region": "ns"[i % 2], "n": i} for i in range(60)]]
    batches[1] += [{"user": "u1", "region": "n", "n": None}, {"user": "u2", "region": None, "n": 3}]
    results = run_both_ways(spark, tmp_path, program, batches, "aggregate")
    steps = run_batches(program, batches)
    expected = sorted(tuple(sorted(record.items())) for step in steps for record in step.results["sink"])
    assert results[True][0] == expected == results[False][0]
    assert results[True][1] == results[False][1]
    # Sum over None and a null region: the aggregate's dead letters, made in the per-user stage
    in_process_dead = sorted((letter.node, letter.error, letter.record) for step in steps
                             for letter in step.dead_letters)
    assert [(operator, error, record) for operator, error, record, _ in results[True][1]] == in_process_dead
    assert sorted((operator, error.split(":")[0]) for operator, error, _ in in_process_dead) == [
        ("per_region", "NullKey"), ("per_region", "NullValue")]
    # only the per-region exchange differs: partials instead of records
    assert results[True][2] < results[False][2]


@pytest.mark.slow
def test_windows_after_keyed_operators_judge_lateness_as_their_own_stage_would(spark, tmp_path):
    from fissure import Tumbling

    program = (Pipeline("windows").event_time("ts", lateness=2.0)
               .partitioned("per_user", passed_on, key="user")
               .window("sums", key="region", window=Tumbling(10.0), aggregate=Sum("v"))
               .window("wide", key="region", window=Tumbling(30.0), aggregate=Sum("sum")))
    batches = [[{"user": f"u{i % 11}", "region": "ab"[i % 2], "ts": float(base + i % 17), "v": i % 4}
                for i in range(200)] for base in (0, 20, 40, 70)]
    batches[2] += [{"user": "u1", "region": "a", "ts": 1.0, "v": 9}, {"user": "u2", "region": "b", "ts": 2.0, "v": 9}]
    results = run_both_ways(spark, tmp_path, program, batches, "windows")
    steps = run_batches(program, batches)
    expected = sorted(tuple(sorted(record.items())) for step in steps for record in step.results["sink"])
    in_process_dead = sorted((letter.node, letter.error, letter.record) for step in steps
                             for letter in step.dead_letters)
    assert results[True][0] == expected == results[False][0]
    assert results[True][1] == results[False][1]
    assert [(operator, error, record) for operator, error, record, _ in results[True][1]] == in_process_dead
    assert len(in_process_dead) == 2 and all(operator == "sums" and error.startswith("Late")
                                             for operator, error, _ in in_process_dead)
    assert expected  # the wide windows closed
    assert results[True][2] < results[False][2]  # partials crossed the windows' exchanges
