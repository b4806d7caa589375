"""A bucket's keyed state in MapState entries: addressing, splits, one read and write per entry
touched, the fine layout for sparse calls, deletion, and entries that are data (never code)."""

import pickle
import random

import pytest

from fissure.runtime.state.key_buckets import (COARSE, FINE, FINE_MIN_KEYS, LAYOUT_ENTRY, SubBucketLayout, SubBucketStore,
                                               fine_entry, key_hash)
from fissure.runtime.state.codec import LegacyStateError, StateCodec, StateIntegrityError, decode_data

CODEC = StateCodec("count")


class DictState:
    """Spark's MapState as a dict, counting reads, writes (and the bytes written) and removals."""

    def __init__(self, codec: StateCodec = CODEC) -> None:
        self.codec = codec
        self.entries: dict[int, bytes] = {}
        self.reads: list[list[int]] = []
        self.writes: list[list[int]] = []
        self.removals: list[list[int]] = []
        self.bytes_written = 0

    def read(self, entries: list[int]) -> list[bytes | None]:
        self.reads.append(list(entries))
        return [self.entries.get(entry) for entry in entries]

    def write(self, pairs: list[tuple[int, bytes]]) -> None:
        self.writes.append([entry for entry, _ in pairs])
        self.bytes_written += sum(len(data) for _, data in pairs)
        self.entries.update(pairs)

    def remove(self, entries: list[int]) -> None:
        self.removals.append(list(entries))
        for entry in entries:
            self.entries.pop(entry, None)

    def listing(self):
        return iter(list(self.entries.items()))

    def store(self, per_sub_bucket: int = 128) -> SubBucketStore:
        return SubBucketStore(self.read, self.write, self.codec, remove=self.remove, entries=self.listing,
                              keys_per_sub_bucket=per_sub_bucket)

    def call(self, updates: dict[str, bytes | None], per_sub_bucket: int = 128) -> dict[str, bytes | None]:
        """One handler call: load every key, store its new state (None deletes), flush; returns what it loaded."""
        store = self.store(per_sub_bucket)
        store.prefetch(updates)
        loaded = {key: store.load(key) for key in updates}
        for key, state in updates.items():
            store.store(key, state)
        store.flush()
        return {key: None if value is None else value[0] for key, value in loaded.items()}

    def sub_buckets(self) -> dict[int, dict[str, bytes]]:
        return {entry: decode_data(self.codec.unseal(data)[0]) for entry, data in self.entries.items()
                if entry != LAYOUT_ENTRY}

    def layout(self) -> SubBucketLayout:
        stored = self.entries.get(LAYOUT_ENTRY)
        return SubBucketLayout.decode(self.codec.unseal(stored)[0] if stored is not None else None)

    def size(self) -> int:
        return sum(map(len, self.entries.values()))


def test_linear_hashing_addresses_every_hash_within_the_sub_buckets_and_splits_in_order():
    layout = SubBucketLayout()
    seen = []
    for _ in range(20):
        assert all(0 <= layout.address(hashed) < layout.sub_buckets for hashed in range(1000))
        seen.append(layout.sub_buckets)
        before = layout
        layout = layout.after_split()
        moved = {before.address(h) for h in range(1000) if layout.address(h) != before.address(h)}
        assert moved == {before.split}  # only the sub-bucket at the split pointer gives keys away
    assert seen == list(range(1, 21))
    assert SubBucketLayout.decode(layout.encode()) == layout


def test_keys_survive_calls_and_splits_and_sub_buckets_stay_bounded():
    state = DictState()
    keys = [f"word{i}" for i in range(2000)]
    for start in range(0, len(keys), 250):
        batch = {key: f"{key}:1".encode() for key in keys[start:start + 250]}
        loaded = state.call(batch, per_sub_bucket=16)
        assert loaded == dict.fromkeys(batch)  # every key is new
    loaded = state.call({key: f"{key}:2".encode() for key in keys}, per_sub_bucket=16)
    assert loaded == {key: f"{key}:1".encode() for key in keys}
    assert state.layout().keys == 2000
    sub_buckets = state.sub_buckets()
    assert len(sub_buckets) == state.layout().sub_buckets >= 2000 // 16
    assert sorted(key for entries in sub_buckets.values() for key in entries) == sorted(keys)
    assert max(len(entries) for entries in sub_buckets.values()) <= 4 * 16
    layout = state.layout()
    assert all(layout.address(key_hash(key)) == entry for entry, entries in sub_buckets.items() for key in entries)


def test_a_call_reads_and_writes_each_touched_sub_bucket_once_in_one_batch():
    state = DictState()
    state.call({f"k{i}": b"0" for i in range(400)}, per_sub_bucket=8)
    layout = state.layout()
    touched = {f"k{i}" for i in range(0, 400, 37)}
    state.reads.clear(), state.writes.clear()
    state.call({key: b"1" for key in touched}, per_sub_bucket=8)
    sub_buckets = sorted({layout.address(key_hash(key)) for key in touched})
    assert state.reads == [[LAYOUT_ENTRY], sub_buckets]  # the layout, then every touched sub-bucket at once
    assert state.writes == [sub_buckets]  # one batch; no new key: the layout is not rewritten


def test_a_call_that_stores_nothing_writes_nothing():
    state = DictState()
    state.call({"a": b"1"}, per_sub_bucket=8)
    state.writes.clear()
    store = state.store(8)
    store.prefetch(["a", "b"])
    assert store.load("a") == (b"1", False) and store.load("b") is None
    store.flush()
    assert state.writes == []
    assert state.layout().keys == 1


def filled(keys: int) -> tuple[DictState, list[str]]:
    state, names = DictState(), [f"key-{number}" for number in range(keys)]
    for start in range(0, keys, 5_000):
        state.call({key: b"\x01" for key in names[start:start + 5_000]})
    return state, names


def test_a_sparse_call_switches_the_bucket_to_one_entry_per_key_and_then_writes_only_what_it_touched():
    state, keys = filled(20_000)
    expected = dict.fromkeys(keys, b"\x01")
    assert state.layout().mode == COARSE
    first = random.Random(3).sample(keys, 100)  # 0.5 % of the bucket's keys
    state.call({key: b"\x02" for key in first})  # switches: every key rewritten once
    expected.update(dict.fromkeys(first, b"\x02"))
    assert state.layout().mode == FINE
    assert all(entry < LAYOUT_ENTRY for entry in state.entries if entry != LAYOUT_ENTRY)
    size = state.size()
    state.bytes_written = 0
    second = random.Random(4).sample(keys, 100)
    loaded = state.call({key: b"\x03" for key in second})
    assert loaded == {key: expected[key] for key in second}
    expected.update(dict.fromkeys(second, b"\x03"))
    assert state.bytes_written < 0.01 * size  # 0.5 % of the keys touched: about 0.5 % of the state written
    assert state.reads[-1] == sorted({fine_entry(key) for key in second})
    stored = {key: body for keys_of in state.sub_buckets().values() for key, body in keys_of.items()}
    assert stored == expected  # every key still there, with its state


def test_a_dense_call_switches_a_fine_bucket_back_to_sub_buckets_without_losing_a_key():
    state, keys = filled(FINE_MIN_KEYS * 4)
    state.call({keys[0]: b"\x02"})
    assert state.layout().mode == FINE
    state.call({key: b"\x05" for key in keys[: len(keys) // 5]})  # 20 % touched
    layout = state.layout()
    assert layout.mode == COARSE and layout.keys == len(keys)
    assert len(state.sub_buckets()) == layout.sub_buckets
    stored = {key: body for keys_of in state.sub_buckets().values() for key, body in keys_of.items()}
    assert stored == {key: b"\x05" if index < len(keys) // 5 else b"\x01" for index, key in enumerate(keys)}


@pytest.mark.parametrize("mode", ["coarse", "fine"])
def test_a_deleted_key_is_removed_and_an_empty_fine_entry_with_it(mode):
    state, keys = filled(FINE_MIN_KEYS * 2)
    if mode == "fine":
        state.call({keys[1]: b"\x02"})
    assert state.layout().mode == (FINE if mode == "fine" else COARSE)
    state.call({keys[0]: None})
    assert state.layout().keys == len(keys) - 1
    assert state.call({keys[0]: b"\x07"}) == {keys[0]: None}  # back as a new key
    state.call({keys[0]: None})
    if mode == "fine":
        assert fine_entry(keys[0]) not in state.entries and state.removals
    else:
        assert all(keys[0] not in keys_of for keys_of in state.sub_buckets().values())


def test_an_entry_an_earlier_fissure_pickled_is_refused_and_migrated_only_when_trusted():
    state = DictState()
    layout, sub_bucket = pickle.dumps((0, 0, 2)), pickle.dumps({"a": pickle.dumps({"n": 1}), "b": pickle.dumps({"n": 2})})
    state.entries = {LAYOUT_ENTRY: layout, 0: sub_bucket}
    with pytest.raises(LegacyStateError, match="migrate-pickled-state|trust-pickle"):
        state.store()
    migrating = DictState(StateCodec("count", trust_legacy_pickle=True))
    migrating.entries = dict(state.entries)
    store = migrating.store()
    store.prefetch(["a"])
    body, pickled = store.load("a")
    assert not pickled and CODEC.loads(body, pickled) == {"n": 1}
    store.flush()  # the whole bucket is rewritten as data
    assert all(not CODEC.is_legacy(data) for data in migrating.entries.values())
    assert {key: decode_data(body) for key, body in migrating.sub_buckets()[0].items()} == {"a": {"n": 1}, "b": {"n": 2}}


def test_entries_of_a_pickling_operator_are_signed_and_a_changed_one_is_refused_unread():
    signing = StateCodec("count", use_pickle=True, key=b"k" * 32)
    state = DictState(signing)
    state.call({"a": pickle.dumps({"n": 1})})
    (entry,) = [entry for entry in state.entries if entry != LAYOUT_ENTRY]
    body, pickled = signing.unseal(state.entries[entry])
    assert pickled and decode_data(body) == {"a": pickle.dumps({"n": 1})}  # a map of keys to their pickles
    forged = bytearray(state.entries[entry])
    forged[-2] ^= 1
    state.entries[entry] = bytes(forged)
    with pytest.raises(StateIntegrityError, match="signature"):
        state.call({"a": b"x"})
    other_key = DictState(StateCodec("count", use_pickle=True, key=b"j" * 32))
    other_key.entries = {LAYOUT_ENTRY: state.entries[LAYOUT_ENTRY]}
    with pytest.raises(StateIntegrityError, match="signature"):
        other_key.store()
    as_data = DictState(StateCodec("count"))
    as_data.entries = {LAYOUT_ENTRY: state.entries[LAYOUT_ENTRY]}
    with pytest.raises(StateIntegrityError, match="does not declare"):
        as_data.store()
