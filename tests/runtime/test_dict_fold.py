"""A combined operator's records folded from the dicts of the fused run that emits them
(fissure.runtime.operators.dict_fold) give what the Arrow path gives: the same partials, the same
dead letters (operator, reason, record, sequence number) in the same place, the same rows out."""

from __future__ import annotations

import pyarrow as pa
import pytest

from fissure import StreamGraph, Sum
from fissure.program.aggregates import Aggregate, Count
from fissure.compile.pieces import build_pieces
from fissure.compile.stages import plan_graph_stages
from fissure.runtime.operators import dict_fold, fused
from fissure.runtime.operators.combine import FOLD_CPU_S, CombinePlan, Combiner
from fissure.runtime.operators.dict_fold import RecordFold
from fissure.runtime.records.carried import live_batch
from fissure.runtime.records.envelopes import EnvelopeLayout
from fissure.spark.query.stages import fold_envelopes


def tricky_words(record: dict) -> list:
    """One line's words, with the records a user's function can get wrong spelled in the line."""
    out = []
    for word in record["value"].split():
        if word == "boom":
            raise ValueError("boom")  # the flat_map's own dead letter
        if word == "nokey":
            out.append({"n": 1})  # missing the key field: the schema's dead letter
        elif word == "nullkey":
            out.append({"word": None, "n": 1})  # null key: the aggregate's dead letter
        elif word == "intword":
            out.append({"word": 5, "n": 1})  # an int in a text field
        elif word == "halfn":
            out.append({"word": word, "n": 2.5})  # a fraction in an integer field
        elif word == "nulln":
            out.append({"word": word, "n": None})  # Sum cannot add it
        elif word == "text":
            out.append("text")  # not a dict
        elif word == "wholefloat":
            out.append({"word": word, "n": 2.0})  # fits, but Arrow gives back 2: through Arrow
        elif word == "huge":
            out.append({"word": word, "n": 1 << 70})  # only Arrow finds it out of range
        elif word == "surrogate":
            out.append({"word": "\ud800", "n": 1})  # only Arrow finds it is not UTF-8
        else:
            out.append({"word": word, "n": len(word)})
    return out


class Longest(Aggregate):
    """An aggregate of the program's own: gets a fresh dict per record."""

    result_schema = {"longest": str}

    def create(self):
        return ""

    def add(self, acc, record):
        record["seen"] = True  # changes the dict it is given
        return max(acc, record["word"])

    def merge(self, first, second):
        return max(first, second)

    def result(self, acc):
        return {"longest": acc}


def setup(aggregate, fn=tricky_words, between: bool = False, batch_step: bool = False, boundaries=()):
    g = StreamGraph("words")
    words = g.source("lines", schema={"value": str}).flat_map("words", fn, schema={"word": str, "n": int})
    if between:
        words = words.filter("kept", lambda record: record["word"] != "drop")
    if batch_step:
        words = words.map_batches("same", lambda batch: batch, schema={"word": str, "n": int})
    words.aggregate("counts", key="word", aggregate=aggregate).sink("out")
    layout = g.check()
    schemas = {name: schema for name, schema in layout.schemas.items() if name not in g.sinks}
    envelope = EnvelopeLayout(schemas)
    stages = plan_graph_stages(g)
    stage = next(stage for stage in stages if "words" in stage.nodes)
    pieces = build_pieces(g, schemas, envelope, stages, stage, boundaries)
    stream = g.node("counts").inputs[0]
    plan = CombinePlan.of(g.node("counts").operator, schemas[stream], None, stream)
    return pieces, plan, envelope


def line_batches(envelope: EnvelopeLayout, lines_per_batch: list[list[tuple[str, int]]]) -> list[pa.RecordBatch]:
    return [envelope.wrap(live_batch(pa.RecordBatch.from_pylist([{"value": line} for line, _ in lines],
                                                                schema=pa.schema([("value", pa.string())])),
                                     [seq for _, seq in lines]), "lines") for lines in lines_per_batch]


def both_paths(aggregate, lines_per_batch, **options):
    pieces, plan, envelope = setup(aggregate, **options)
    batches = line_batches(envelope, lines_per_batch)
    (piece,) = pieces
    by_arrow = Combiner(plan)
    arrow_out = [fold_envelopes(by_arrow, envelope, output) for batch in batches
                 if (output := piece(batch)).num_rows]
    by_dicts = Combiner(plan)
    fold = RecordFold.of(by_dicts, pieces)
    assert fold is not None
    dict_out = [fold_envelopes(by_dicts, envelope, output)
                for output in fold.outputs(piece, iter(batches), envelope)]
    return (rows(arrow_out), partials(by_arrow)), (rows(dict_out), partials(by_dicts)), fold


def rows(outputs: list[pa.RecordBatch]) -> list[dict]:
    return [row for batch in outputs for row in batch.to_pylist()]


def partials(combiner: Combiner) -> list[dict]:
    return [{name: value for name, value in row.items() if name != FOLD_CPU_S}
            for row in combiner.partials().to_pylist()]


TRICKY = [
    [("a b a nokey c", 7), ("", 3), ("nullkey a intword halfn text", 1), ("b boom a", 4)],
    [(" ".join(["many"] * 40 + ["b"] * 3), 20), ("nulln a", 12), ("c", 11)],
    [("d a", 30)],
]


@pytest.mark.parametrize("aggregate", [Count(), Sum("n"), Longest()], ids=["count", "sum", "own"])
def test_folding_the_emitted_dicts_gives_the_arrow_paths_partials_dead_letters_and_rows(aggregate):
    (arrow_rows, arrow_partials), (dict_rows, dict_partials), fold = both_paths(aggregate, TRICKY)
    assert dict_partials == arrow_partials
    assert dict_rows == arrow_rows
    dead = [(row["_fissure_dead_operator"], row["_fissure_dead_error"].split(":")[0], row["_fissure_seq"])
            for row in dict_rows]
    assert ("words", "SchemaMismatch", 7) in dead and ("words", "TypeError", 1) in dead
    assert ("counts", "NullKey", 1) in dead and ("words", "ValueError", 4) in dead
    assert fold.batches_taken == 3 and fold.batches_refused == 0
    null_keys = sum(1 for operator, reason, _ in dead if reason == "NullKey")
    assert fold.folded == sum(row["_fissure_records"] for row in dict_partials) + null_keys


@pytest.mark.parametrize("word", ["wholefloat", "huge", "surrogate"])
def test_a_batch_with_a_record_only_arrow_judges_goes_through_arrow(word):
    lines = [[("a b", 2), (f"c {word} a", 1)], [("a d", 5)]]
    (arrow_rows, arrow_partials), (dict_rows, dict_partials), fold = both_paths(Count(), lines)
    assert dict_partials == arrow_partials and dict_rows == arrow_rows
    assert fold.batches_refused == 1 and fold.batches_taken == 1


@pytest.mark.parametrize("aggregate", [Count(), Sum("n"), Longest()], ids=["count", "sum", "own"])
def test_a_chunk_only_arrow_judges_sends_it_and_the_batchs_later_chunks_through_arrow(aggregate, monkeypatch):
    """A batch's per-record run goes in chunks of rows: the chunks before the one the fold
    refuses are folded from dicts, that one and the later ones go through Arrow, and the combiner
    still sees the records in order (`Longest` keeps the last record's sequence number)."""
    monkeypatch.setattr(fused, "RECORD_CHUNK_ROWS", 2)
    lines = [[("a b", 2), ("c a", 3), ("d wholefloat", 4), ("b e", 5), ("a a", 6)], [("a d", 9)]]
    (arrow_rows, arrow_partials), (dict_rows, dict_partials), fold = both_paths(aggregate, lines)
    assert dict_partials == arrow_partials and dict_rows == arrow_rows
    assert (fold.batches_taken, fold.batches_refused) == (2, 1)  # chunk 1 of batch 1, batch 2; chunk 2 refused
    assert fold.folded == 4 + 2


@pytest.mark.parametrize("aggregate", [Count(), Sum("n"), Longest()], ids=["count", "sum", "own"])
def test_plain_records_are_judged_and_folded_from_their_columns_alike(aggregate, monkeypatch):
    judged = []
    fitting = dict_fold.fitting_records
    monkeypatch.setattr(dict_fold, "fitting_records", lambda *args: judged.append(1) or fitting(*args))
    lines = [[("a b a", 3), ("é c", 1), ("", 2)], [(" ".join(["many"] * 30), 9), ("b", 8)]]
    (arrow_rows, arrow_partials), (dict_rows, dict_partials), fold = both_paths(aggregate, lines)
    assert dict_partials == arrow_partials and dict_rows == arrow_rows == []
    assert fold.batches_taken == 2 and fold.folded == 36
    assert judged == []  # every record a plain dict of its fields: no record judged one by one


def test_a_run_of_several_per_record_operators_folds_from_its_last_ones_dicts():
    lines = [[("a drop b nokey", 1), ("drop", 2)], [("c a", 3)]]
    (arrow_rows, arrow_partials), (dict_rows, dict_partials), fold = both_paths(Count(), lines, between=True)
    assert dict_partials == arrow_partials and dict_rows == arrow_rows
    assert fold.stream == "kept" and fold.folded == 4  # a, b, c, a


def test_a_flat_map_emitting_nothing_makes_no_partial():
    (arrow_rows, arrow_partials), (dict_rows, dict_partials), fold = both_paths(Count(), [[("", 1), ("  ", 2)]])
    assert dict_partials == arrow_partials == [] and dict_rows == arrow_rows == []


def test_no_arrow_row_is_made_of_the_folded_records(monkeypatch):
    built = []
    to_batch = fused.records_to_batch
    monkeypatch.setattr(fused, "records_to_batch",
                        lambda records, *rest: built.append(len(records)) or to_batch(records, *rest))
    pieces, plan, envelope = setup(Count())
    combiner = Combiner(plan)
    fold = RecordFold.of(combiner, pieces)
    batches = line_batches(envelope, [[(" ".join(f"w{i % 5}" for i in range(12)), seq) for seq in range(50)]])
    assert list(fold.outputs(pieces[0], iter(batches), envelope)) == []  # every record folded
    assert built == [] and combiner.records_as_dicts == 0
    assert fold.folded == 600 and combiner.partials().num_rows == 5
    list(fold.outputs(pieces[0], iter(line_batches(envelope, [[("a wholefloat", 60)]])), envelope))
    assert built == [2]  # refused: that batch is made Arrow as before


def test_no_dict_fold_across_processes_or_after_a_per_batch_operator():
    pieces, plan, _ = setup(Count(), between=True, boundaries=["kept"])
    assert len(pieces) == 2 and RecordFold.of(Combiner(plan), pieces) is None
    pieces, plan, _ = setup(Count(), batch_step=True)
    assert RecordFold.of(Combiner(plan), pieces) is None
    assert RecordFold.of(None, setup(Count())[0]) is None


def timed_words(record: dict) -> list:
    """`word@time` items; a time `none` is null, `late` an hour back."""
    out = []
    for item in record["value"].split():
        word, _, at = item.partition("@")
        out.append({"word": None if word == "null" else word,
                    "ts": None if at == "none" else (-3600.0 if at == "late" else float(at))})
    return out


@pytest.mark.parametrize("aggregate", [Count(), Sum("ts")], ids=["count", "sum"])
def test_a_tumbling_window_folded_from_dicts_judges_lateness_and_event_times_as_through_arrow(aggregate):
    from fissure.program.windows import Tumbling
    from fissure.runtime.operators.keyed import BatchTime

    g = StreamGraph("timed")
    words = g.source("lines", schema={"value": str}).flat_map("words", timed_words, schema={"word": str, "ts": float})
    words.event_time("ts", lateness=3.0).window("counts", key="word", window=Tumbling(10.0),
                                                aggregate=aggregate).sink("out")
    layout = g.check()
    schemas = {name: schema for name, schema in layout.schemas.items() if name not in g.sinks}
    envelope = EnvelopeLayout(schemas)
    stages = plan_graph_stages(g)
    stage = next(stage for stage in stages if "words" in stage.nodes)
    (piece,) = build_pieces(g, schemas, envelope, stages, stage, ())
    stream = g.node("counts").inputs[0]
    plan = CombinePlan.of(g.node("counts").operator, schemas[stream], "ts", stream)
    time = BatchTime(previous=20.0, current=30.0)
    batches = line_batches(envelope, [[("a@21 b@25 a@none a@late null@22", 5), ("a@31.5 b@22", 2)],
                                      [("c@40 a@29", 9), ("", 8)]])
    by_arrow, by_dicts = Combiner(plan, time), Combiner(plan, time)
    arrow_out = [fold_envelopes(by_arrow, envelope, output) for batch in batches if (output := piece(batch)).num_rows]
    fold = RecordFold.of(by_dicts, [piece])
    dict_out = [fold_envelopes(by_dicts, envelope, output) for output in fold.outputs(piece, iter(batches), envelope)]
    assert rows(dict_out) == rows(arrow_out)
    assert partials(by_dicts) == partials(by_arrow)
    assert fold.batches_taken == 2 and by_dicts.largest == by_arrow.largest == 40.0
    reasons = sorted(row["_fissure_dead_error"].split(":")[0] for row in rows(dict_out))
    assert len(reasons) == 3  # no event time, late, null key


def test_the_profile_counts_the_same_records_in_and_out_on_both_paths():
    from uuid import uuid4

    from fissure.compile.pieces import StageProfiling
    from fissure.runtime.profiling.profiler import ProfileTally

    def counted(by_dicts: bool) -> tuple[dict, dict]:
        g = StreamGraph("profiled")
        words = g.source("lines", schema={"value": str}).flat_map("words", tricky_words,
                                                                   schema={"word": str, "n": int})
        words.filter("kept", lambda record: record["word"] != "drop") \
            .aggregate("counts", key="word", aggregate=Count()).sink("out")
        layout = g.check()
        schemas = {name: schema for name, schema in layout.schemas.items() if name not in g.sinks}
        envelope = EnvelopeLayout(schemas)
        stages = plan_graph_stages(g)
        stage = next(stage for stage in stages if "words" in stage.nodes)
        token = uuid4().hex[:8]
        (piece,) = build_pieces(g, schemas, envelope, stages, stage, (), profile_prefix=f"p-{token}",
                                stage_profiling=StageProfiling(f"s-{token}"))
        combiner = Combiner(CombinePlan.of(g.node("counts").operator, schemas["kept"], None, "kept"))
        batches = line_batches(envelope, TRICKY + [[("a drop wholefloat", 40)]])
        if by_dicts:
            fold = RecordFold.of(combiner, [piece])
            list(fold.outputs(piece, iter(batches), envelope))
            # profiled, a piece runs node by node: `kept` gets Arrow's 2 for 2.0 and folds it from dicts
            assert fold.batches_taken == 4 and fold.batches_refused == 0
        else:
            for batch in batches:
                fold_envelopes(combiner, envelope, piece(batch))
        tally = ProfileTally()
        for unit in piece.nodes:
            unit.stage.bind_profile().report(tally)
        piece.bind_profile().report(tally, 0.0)
        operators = {counts.operator: (counts.calls, counts.records_in, counts.records_out, counts.dead_letters)
                     for counts in tally.operator_counts()}
        ((_, (_, _, nodes, *_)),) = tally.pieces.items()
        return operators, {name: (values[0], values[1]) for name, values in nodes.items()}

    by_arrow, by_dicts = counted(False), counted(True)
    assert by_dicts == by_arrow
    assert by_dicts[1]["kept"][1] > 0  # the node's records out count the folded ones
