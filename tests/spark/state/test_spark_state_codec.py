"""State in a real checkpoint is data or a signed pickle: a booby-trapped state object left in the
checkpoint is never unpickled when a run resumes on it; the run stops, naming the operator."""

from __future__ import annotations

import pytest

import fissure
from fissure import MemorySink, Pipeline
from fissure.program.operators import PipelineError
from fissure.spark.session.create import describe_failure
from fissure.testing import record_files

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EVENTS = {"user": str, "marker": str}
COUNTED = {"user": str, "n": int}


class Trap:
    """Unpickling it opens (creates) the marker file: as `os.system("id")` would run a command."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def keep_a_trap(state, record):
    state["n"] = state.get("n", 0) + 1
    state["trap"] = Trap(record["marker"])
    return {"user": record["user"], "n": state["n"]}


def count(state, record):
    state["n"] = state.get("n", 0) + 1
    return {"user": record["user"], "n": state["n"]}


def test_a_booby_trapped_state_in_the_checkpoint_is_refused_on_resume_and_never_runs(spark, tmp_path):
    marker = tmp_path / "the-trap-ran"
    records = [{"user": "u1", "marker": str(marker)}, {"user": "u2", "marker": str(marker)}]
    checkpoint = str(tmp_path / "checkpoint")
    planting = Pipeline("plant").partitioned("count", keep_a_trap, key="user", schema=COUNTED, state_codec="pickle")
    with pytest.raises(PipelineError, match="needs a state key"):
        fissure.run(planting, record_files(tmp_path / "in", records, EVENTS), MemorySink(),
                    checkpoint=str(tmp_path / "unused"), config=fissure.RunnerConfig(spark=spark, progress="off"))
    # someone else's program leaves pickled trap objects in the checkpoint, signed with their key
    fissure.run(planting, record_files(tmp_path / "in", records, EVENTS), MemorySink(), checkpoint=checkpoint,
                config=fissure.RunnerConfig(state_key="their key", spark=spark, progress="off"))
    assert not marker.exists()
    record_files(tmp_path / "in", records, EVENTS, first_file=1)
    resumes = [
        # a plain word count on that checkpoint: it does not read pickles at all
        (Pipeline("plant").partitioned("count", count, key="user", schema=COUNTED), fissure.RunnerConfig(),
         "does not declare state_codec=\"pickle\""),
        # the same program with another key: the signatures do not match
        (planting, fissure.RunnerConfig(state_key="my key"), "signature does not match"),
    ]
    for pipeline, config, refusal in resumes:
        config = fissure.RunnerConfig(state_key=config.state_key, query_restarts=0, spark=spark, progress="off")
        with pytest.raises(Exception) as raised:
            fissure.run(pipeline, fissure.FileSource(str(tmp_path / "in"), format="json", schema=EVENTS), MemorySink(),
                        checkpoint=checkpoint, config=config)
        summary = describe_failure(raised.value)
        assert "operator 'count'" in summary and refusal in summary, summary
        assert not marker.exists()


def word_count(state, record):
    state["n"] = state.get("n", 0) + 1
    if record["word"].startswith("gone-"):
        state.clear()  # deletes the key's state
    return {"word": record["word"], "n": state.get("n", 0)}


def test_keys_survive_the_switches_between_the_dense_and_the_sparse_layout(spark, tmp_path):
    """40,000 keys (about 625 a bucket): the first batch writes them all (coarse), a batch touching
    1 % switches every bucket to one entry per key, a batch touching 20 % switches them back; every
    count is the plain-Python one, and a cleared state is gone."""
    import random

    from fissure.runtime.state.key_buckets import FINE_MIN_KEYS

    words = [f"w{number}" for number in range(40_000)]
    assert len(words) / 64 > FINE_MIN_KEYS
    draw = random.Random(5)
    batches = [words, draw.sample(words, 400) + ["gone-1"], draw.sample(words, 8_000) + ["gone-1"],
               draw.sample(words, 400)]
    for number, batch in enumerate(batches):
        record_files(tmp_path / "in", [{"word": word} for word in batch], {"word": str}, first_file=number)
    sink = MemorySink()
    pipeline = Pipeline("wc").partitioned("count", word_count, key="word", schema={"word": str, "n": int})
    fissure.run(pipeline, fissure.FileSource(str(tmp_path / "in"), format="json", schema={"word": str},
                                             max_files_per_trigger=1), sink, checkpoint=str(tmp_path / "checkpoint"),
                config=fissure.RunnerConfig(query_restarts=0, spark=spark, progress="off"))
    expected: dict[str, int] = {}
    for batch in batches:
        for word in batch:
            expected[word] = 0 if word.startswith("gone-") else expected.get(word, 0) + 1
    counted: dict[str, int] = {}
    for record in sink.records():
        counted[record["word"]] = max(counted.get(record["word"], 0), record["n"])
    assert counted == expected
