"""A bucket's keyed state in sub-buckets: addressing, splits, and one read and write per sub-bucket."""

import pickle

from fissure.worker.key_buckets import LAYOUT_ENTRY, SubBucketLayout, SubBucketStore, key_hash


class DictState:
    """Spark's MapState as a dict, counting reads and writes."""

    def __init__(self) -> None:
        self.entries: dict[int, bytes] = {}
        self.reads: list[int] = []
        self.writes: list[int] = []

    def read(self, entries: list[int]) -> list[bytes | None]:
        self.reads.append(list(entries))
        return [self.entries.get(entry) for entry in entries]

    def write(self, pairs: list[tuple[int, bytes]]) -> None:
        self.writes.append([entry for entry, _ in pairs])
        self.entries.update(pairs)

    def call(self, updates: dict[str, bytes], per_sub_bucket: int) -> dict[str, bytes | None]:
        """One handler call: load every key, store its new state, flush; returns what it loaded."""
        store = SubBucketStore(self.read, self.write, per_sub_bucket)
        store.prefetch(updates)
        loaded = {key: store.load(key) for key in updates}
        for key, state in updates.items():
            store.store(key, state)
        store.flush()
        return loaded

    def sub_buckets(self) -> dict[int, dict[str, bytes]]:
        return {entry: pickle.loads(data) for entry, data in self.entries.items() if entry != LAYOUT_ENTRY}

    def layout(self) -> SubBucketLayout:
        return SubBucketLayout.decode(self.entries.get(LAYOUT_ENTRY))


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
    store = SubBucketStore(state.read, state.write, 8)
    store.prefetch(["a", "b"])
    assert store.load("a") == b"1" and store.load("b") is None
    store.flush()
    assert state.writes == []
    assert state.layout().keys == 1
