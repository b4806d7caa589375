"""The state codec: plain data round-trips with its exact types, anything else is refused at the
first write with the fixes named, and stored bytes are never code: an earlier fissure's pickle,
a forged signature or a pickle behind the data header is refused before anything is unpickled."""

import datetime
import decimal
import math
import os
import pickle
import zoneinfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fissure import Pipeline
from fissure.program.operators import PipelineError
from fissure.config import RunnerConfig
from fissure.local.executor import LocalGraphRun
from fissure.runtime.operators.keyed import StatefulStep, run_group
from fissure.runtime.records.fate import OperatorFailedError
from fissure.runtime.state.codec import (DATA_HEADER, LegacyStateError, StateCodec, StateCodecError,
                                        StateIntegrityError, decode_data, encode_data)
from fissure.program.graph import as_graph


def same(left, right) -> bool:
    """Equal with the exact types all the way down (1 is not True, a tuple is not a list), NaN
    equal to NaN and -0.0 apart from 0.0."""
    if type(left) is not type(right):
        return False
    if type(left) is float:
        return (math.isnan(left) and math.isnan(right)) or (left == right and math.copysign(1, left) == math.copysign(1, right))
    if type(left) is decimal.Decimal:
        return str(left) == str(right)
    if type(left) in (list, tuple):
        return len(left) == len(right) and all(same(a, b) for a, b in zip(left, right))
    if type(left) is dict:
        return len(left) == len(right) and all(same(a, b) and same(left[a], right[b])
                                               for a, b in zip(left, right))
    if type(left) in (set, frozenset):
        return len(left) == len(right) and all(any(same(a, b) for b in right) for a in left)
    if type(left) in (datetime.datetime, datetime.time):
        return left == right and left.tzinfo == right.tzinfo and left.fold == right.fold and (
            left.utcoffset() == right.utcoffset() if type(left) is datetime.datetime else True)
    return left == right


fixed_zones = st.builds(datetime.timezone, st.timedeltas(min_value=datetime.timedelta(hours=-23),
                                                         max_value=datetime.timedelta(hours=23))
                        .map(lambda delta: datetime.timedelta(minutes=delta // datetime.timedelta(minutes=1))))
zones = st.one_of(st.none(), fixed_zones, st.sampled_from([datetime.timezone.utc, zoneinfo.ZoneInfo("Europe/Paris"),
                                                            datetime.timezone(datetime.timedelta(hours=5), "X")]))
text = st.text(st.characters(blacklist_categories=()), max_size=12)  # lone surrogates included
hashable_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2 ** 100), max_value=2 ** 100),
                             st.floats(allow_nan=False), text, st.binary(max_size=12),
                             st.dates(), st.timedeltas(),
                             st.decimals(allow_nan=False, places=3))
hashables = st.recursive(hashable_scalars, lambda inner: st.one_of(st.tuples(inner, inner),
                                                                   st.frozensets(inner, max_size=3)), max_leaves=6)
scalars = st.one_of(hashable_scalars, st.floats(), st.datetimes(timezones=zones), st.times(timezones=zones),
                    st.decimals())
plain_data = st.recursive(
    st.one_of(scalars, hashables),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
                            st.dictionaries(hashables, inner, max_size=4), st.sets(hashables, max_size=4),
                            st.frozensets(hashables, max_size=4)),
    max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(plain_data)
def test_plain_data_round_trips_with_its_exact_types(value):
    assert same(decode_data(encode_data(value)), value)


@pytest.mark.parametrize("value", [
    {"n": 3}, {1: "a", (2, "b"): [1.5, (None, True)], frozenset({1}): {2, 3}},
    2 ** 200, -(2 ** 64), 2 ** 64 - 1, -(2 ** 63), float("nan"), float("-inf"), -0.0,
    "key \udc80 with a lone surrogate", b"\x00\xff",
    datetime.datetime(2024, 3, 31, 2, 30, tzinfo=zoneinfo.ZoneInfo("Europe/Paris")),
    datetime.datetime(2024, 10, 27, 2, 30, fold=1, tzinfo=zoneinfo.ZoneInfo("Europe/Paris")),
    datetime.datetime(2024, 1, 1, 12), datetime.date(1, 1, 1), datetime.time(23, 59, 59, 999999, datetime.timezone.utc),
    datetime.timedelta(days=-3, microseconds=7), decimal.Decimal("-0.00"), decimal.Decimal("NaN"),
    [[], (), {}, set(), frozenset()],
])
def test_the_listed_types_round_trip(value):
    assert same(decode_data(encode_data(value)), value)


class Sensor:
    pass


def test_a_class_instance_is_refused_at_the_first_write_naming_the_operator_the_type_where_and_the_fixes():
    def remember(state, record):
        state["last"] = [record["v"], (1, Sensor())]
        return None

    run = LocalGraphRun(as_graph(Pipeline("p").partitioned("remember", remember, key="k")))
    with pytest.raises(OperatorFailedError) as raised:
        run.run_batch({"source": [{"k": "a", "v": 1}]})
    message = str(raised.value)
    for part in ("operator 'remember'", "Sensor", "state['last'][1][1]", "plain data", 'state_codec="pickle"',
                 "state_key"):
        assert part in message, message


def test_pickle_is_opt_in_and_signed_with_a_key_the_run_must_have(tmp_path):
    def remember(state, record):
        state["sensor"] = Sensor()

    pipeline = Pipeline("p").partitioned("remember", remember, key="k", state_codec="pickle")
    run = LocalGraphRun(as_graph(pipeline))  # in process: a key of its own, never stored
    run.run_batch({"source": [{"k": "a"}]})
    run.run_batch({"source": [{"k": "a"}]})
    with pytest.raises(PipelineError, match="state_codec must be"):
        Pipeline("p").partitioned("remember", remember, key="k", state_codec="marshal")
    with pytest.raises(ValueError, match="needs a state key"):
        StateCodec("remember", use_pickle=True)
    assert "sekret" not in repr(RunnerConfig(state_key="sekret"))
    os.environ.pop("FISSURE_STATE_KEY", None)
    assert RunnerConfig().state_access().key is None
    assert RunnerConfig(state_key="sekret").state_access().key == b"sekret"


class Trap:
    """Unpickling it runs code: it writes a file (as `os.system("id")` would run a command)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_booby_trapped_pickle_in_the_stored_bytes_is_never_unpickled(tmp_path):
    marker = tmp_path / "ran"
    trap = pickle.dumps({"n": Trap(str(marker))})
    data, signing = StateCodec("count"), StateCodec("count", use_pickle=True, key=b"right key")
    attempts = [
        (data, trap, LegacyStateError, "migrate"),  # an earlier fissure's bare pickle
        (signing, trap, LegacyStateError, "migrate"),
        (data, DATA_HEADER + trap, StateIntegrityError, "not a state fissure wrote"),  # a pickle behind the data header
        (signing, StateCodec("count", use_pickle=True, key=b"wrong key").seal(trap), StateIntegrityError, "signature"),
        (data, StateCodec("count", use_pickle=True, key=b"right key").seal(trap), StateIntegrityError, "does not declare"),
    ]
    for codec, stored, error, words in attempts:
        with pytest.raises(error, match=words):
            body, pickled = codec.unseal(stored)
            codec.loads(body, pickled)
    assert not marker.exists()
    # the same bytes, legitimately signed with the run's key, would run: the signature is what protects
    body, pickled = signing.unseal(signing.seal(trap))
    signing.loads(body, pickled)
    assert marker.exists()


def test_an_unmarked_state_is_read_only_while_migrating_and_comes_out_as_data():
    legacy = pickle.dumps({"n": 41})
    with pytest.raises(LegacyStateError, match="trust-pickle"):
        StateCodec("count").unpickle_legacy(legacy)
    migrating = StateCodec("count", trust_legacy_pickle=True)
    assert migrating.unpickle_legacy(legacy) == {"n": 41}


def test_a_state_back_to_its_fresh_form_is_deleted_not_stored():
    def session(state, record):
        if record["kind"] == "end":
            state.clear()
        else:
            state.setdefault("pages", []).append(record["page"])
        return {"k": record["k"], "pages": len(state.get("pages", []))}

    run = LocalGraphRun(as_graph(Pipeline("s").partitioned("session", session, key="k",
                                                           schema={"k": str, "pages": int})))
    run.run_batch({"source": [{"k": "a", "kind": "view", "page": "p1"}, {"k": "b", "kind": "view", "page": "p2"}]})
    assert set(run.states["session"]) == {'["a"]', '["b"]'}
    run.run_batch({"source": [{"k": "a", "kind": "end", "page": ""}]})
    assert set(run.states["session"]) == {'["b"]'}
    out = run.run_batch({"source": [{"k": "a", "kind": "view", "page": "p3"}]})
    assert out["sink"] == [{"k": "a", "pages": 1}]


def test_an_unkeyed_state_cleared_is_deleted():
    import pyarrow as pa

    from fissure.runtime.records.carried import live_batch

    def total(state, record):
        state["n"] = state.get("n", 0) + record["v"]
        if state["n"] == 0:
            state.clear()

    schema = pa.schema([("v", pa.int64())])
    step = StatefulStep("total", total, dict, schema, schema)
    batch = live_batch(pa.RecordBatch.from_pylist([{"v": 2}], schema=schema), [0])
    stored = run_group(step, batch, None)
    assert stored.state is not None and not stored.deleted
    minus = live_batch(pa.RecordBatch.from_pylist([{"v": -2}], schema=schema), [1])
    result = run_group(step, minus, (stored.state, False))
    assert result.deleted and result.state is None
