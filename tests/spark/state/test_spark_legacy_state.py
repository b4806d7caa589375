"""Checkpoints an earlier fissure wrote, its states bare pickles (tests/data/legacy_state): a run
on one refuses it, naming the migration step, and never unpickles it (a booby-trapped state stays
inert); the explicit migration run rewrites every bucket's state as data, and the runs after it
need no trust."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

import fissure
from fissure import MemorySink, Pipeline
from fissure.model.state_buckets import LEGACY_STATE_BUCKETS
from fissure.spark.session.create import describe_failure
from fissure.runtime.operators.packing import key_bucket
from repository import DATA

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FIXTURES = DATA / "legacy_state"
TRAP_MARKER = "/tmp/fissure-legacy-state-trap-ran"  # what the trapped state creates when unpickled


def count(state, record):
    state["n"] = state.get("n", 0) + 1
    return {"word": record["word"], "n": state["n"]}


def installed(fixture: str, work: Path) -> Path:
    """A copy of a fixture under `work`, its absolute paths (the state schema file, the source's
    files) pointed at the copy."""
    shutil.copytree(FIXTURES / fixture, work)
    for relative, folder in (("state/0/_metadata/v2/0", "checkpoint"), ("sources/0/0", "input")):
        path = work / "checkpoint" / relative
        path.write_text(re.sub(rf'file:[^"]*/{folder}/', f"file://{work / folder}/", path.read_text()))
    return work


def resume(spark, work: Path, words: list[str], migration: str | None = None) -> dict[str, int]:
    """Add a file of `words`, run the count on the checkpoint: the last count of each word."""
    number = len(os.listdir(work / "input"))
    (work / "input" / f"part-{number}.json").write_text("".join(json.dumps({"word": w}) + "\n" for w in words))
    sink = MemorySink()
    fissure.run(Pipeline("legacy").partitioned("count", count, key="word", schema={"word": str, "n": int}),
                fissure.FileSource(str(work / "input"), format="json", schema={"word": str}), sink,
                checkpoint=str(work / "checkpoint"),
                config=fissure.RunnerConfig(query_restarts=0, state_migration=migration, spark=spark, progress="off"))
    counts: dict[str, int] = {}
    for record in sink.records():
        counts[record["word"]] = max(counts.get(record["word"], 0), record["n"])
    return counts


def test_a_booby_trapped_state_an_earlier_fissure_left_is_refused_and_never_runs(spark, tmp_path):
    if os.path.exists(TRAP_MARKER):
        os.remove(TRAP_MARKER)
    work = installed("trap", tmp_path / "trap")
    with pytest.raises(Exception) as raised:
        resume(spark, work, ["trap", "a"])
    summary = describe_failure(raised.value)
    assert "LegacyStateError: operator 'count'" in summary and "trust-pickle" in summary, summary
    assert not os.path.exists(TRAP_MARKER)


def test_the_migration_run_rewrites_every_buckets_state_once(spark, tmp_path):
    work = installed("counts", tmp_path / "counts")  # a: 3, b: 2, c: 1, d: 1, e: 1
    with pytest.raises(Exception, match="LegacyStateError|earlier fissure"):
        resume(spark, work, ["a", "z"])
    # the migration run: the batch the refusal left (a, z) and its own (a): the counts go on
    assert resume(spark, work, ["a"], migration="trust-pickle") == {"a": 5, "z": 1}
    # after it, no trust: b, c and e sat in buckets no record of the migration run reached
    legacy_bucket = {w: key_bucket((w,), LEGACY_STATE_BUCKETS) for w in "abcez"}  # an earlier fissure's 64
    assert {legacy_bucket[w] for w in "bce"}.isdisjoint({legacy_bucket[w] for w in "az"})
    assert resume(spark, work, ["b", "c", "e"]) == {"b": 3, "c": 2, "e": 2}
