"""A bucket's keyed state in Spark's MapState entries, laid out by how densely batches touch it
(no pyspark here).

A partitioned operator's keys reach Spark's state handler a bucket at a time (crc32 of the key's
text mod the checkpoint's bucket count, `fissure.runtime.operators.packing`); each bucket has one MapState of `entry int ->
value binary`, and every read or write of an entry is a request to PySpark's state server
(fissure.spark.state.requests sends a batch's requests back to back). Two layouts trade those
requests against the bytes Spark's state store writes (its changelog, and the snapshots that
follow it), and a bucket switches between them by the share of its keys a call touches:

- coarse: sub-buckets of about `KEYS_PER_SUB_BUCKET` keys, each one entry, grown by linear hashing
  (Litwin, VLDB 1980: a level and a split pointer address every key; one sub-bucket splits at a
  time, in order). A call pays two requests per sub-bucket it touches, a few microseconds per key
  of them: right when a batch touches many of the bucket's keys (a word count touches most of its
  vocabulary in each batch). But touching one key rewrites its whole sub-bucket: with 1 % of a
  1,000,000-key state touched, 72 % of the sub-buckets were rewritten each batch.
- fine: one entry per key (its entry is a hash of the key text; keys whose hashes collide share
  it). A call pays two requests per key it touches, about 30-50 us each (measured with the
  state-size benchmark's 100,000-key state on local[2]: 4 keys an entry instead of 128 made a batch
  touching 30 % of the keys 1.6 s slower), and writes only the keys it changed.

A call touching fewer than `FINE_BELOW` of the bucket's keys leaves it fine, more than
`COARSE_ABOVE` leaves it coarse (in between it stays as it is); a switch rewrites the bucket once,
which is about what a coarse call at that density writes anyway. Buckets of fewer than
`FINE_MIN_KEYS` keys stay coarse (a few entries; nothing to save).

A key whose state is deleted (`store(key, None)`) is removed, and an entry left without keys is
removed from the MapState. The layout (mode, level, split pointer, key count) is the entry
`LAYOUT_ENTRY`. Every entry is sealed by the operator's StateCodec (fissure.runtime.state.codec): a
header, a signature when the operator pickles its state, then a MessagePack map of key text to the
key's state bytes. Entries written by an earlier fissure (bare pickles) are refused, or converted
once while migrating (`StateCodec.trust_legacy_pickle`): every entry of the bucket is read,
unpickled and rewritten.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from fissure.runtime.state.codec import StateCodec, StateIntegrityError, decode_data, encode_data

# Coarse layout: mean keys per sub-bucket before the next split. A state-server round trip costs
# about 190 us unpipelined (380 us a key's read and write with an entry per key, calibrated) and a
# key's share of a sub-bucket's decoding a microsecond or two, so about a hundred keys per entry
# keeps both small (32 and 512, tried by hand on the 1,000,000-key state, were not faster).
KEYS_PER_SUB_BUCKET = 128
# A call touching less than this share of the bucket's keys leaves it fine; more than COARSE_ABOVE,
# coarse. At 2 % a coarse call rewrites 92 % of the bucket (1 - e^(-0.02 x 128)) for 2 % changed;
# at 8 % it rewrites all of it, while fine would send 12x the requests.
FINE_BELOW = 0.02
COARSE_ABOVE = 0.08
FINE_MIN_KEYS = 4 * KEYS_PER_SUB_BUCKET
# key_hash drops crc32's low bits that chose a key's bucket among 64 (every checkpoint's count
# divides 64, so a bucket's keys share them); fixed for good: entries are addressed by it.
KEY_HASH_DROPPED = 64
LAYOUT_ENTRY = -1  # the MapState entry holding the layout; coarse sub-buckets are 0, 1, 2, ...
COARSE, FINE = 0, 1
_MAX_LEVEL = 30


def key_hash(key: str) -> int:
    """A key text's hash within its bucket: crc32 of the text over KEY_HASH_DROPPED, i.e. without the
    bits that chose its bucket (every key of a bucket shares them); 26 bits."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) // KEY_HASH_DROPPED


def fine_entry(key: str) -> int:
    """A key's entry in the fine layout: negative, below LAYOUT_ENTRY, so never a sub-bucket's."""
    return -2 - key_hash(key)


@dataclass(frozen=True)
class SubBucketLayout:
    """The bucket's mode, and linear hashing's addressing of the coarse mode: sub-buckets below
    `split` are already split into level + 1 bits."""

    level: int = 0
    split: int = 0
    keys: int = 0  # keys stored in the bucket
    mode: int = COARSE

    @property
    def sub_buckets(self) -> int:
        return (1 << self.level) + self.split

    def address(self, hashed: int) -> int:
        sub_bucket = hashed & ((1 << self.level) - 1)
        if sub_bucket < self.split:
            sub_bucket = hashed & ((1 << (self.level + 1)) - 1)
        return sub_bucket

    def needs_split(self, keys_per_sub_bucket: int = KEYS_PER_SUB_BUCKET) -> bool:
        return self.keys > keys_per_sub_bucket * self.sub_buckets

    def after_split(self) -> SubBucketLayout:
        """The layout once the sub-bucket at the split pointer has split (into itself and
        `self.split + 2**level`)."""
        split, level = self.split + 1, self.level
        if split == 1 << level:
            split, level = 0, level + 1
        return replace(self, level=level, split=split)

    def grown_for(self, keys: int, keys_per_sub_bucket: int = KEYS_PER_SUB_BUCKET) -> SubBucketLayout:
        """A fresh coarse layout split for `keys` keys."""
        layout = SubBucketLayout(keys=keys)
        while layout.needs_split(keys_per_sub_bucket):
            layout = layout.after_split()
        return layout

    def encode(self) -> bytes:
        return encode_data([self.mode, self.level, self.split, self.keys])

    @classmethod
    def decode(cls, data: bytes | None) -> SubBucketLayout:
        if data is None:
            return cls()
        fields = decode_data(data)
        if (type(fields) is not list or len(fields) != 4 or any(type(value) is not int for value in fields)
                or fields[0] not in (COARSE, FINE) or not 0 <= fields[1] <= _MAX_LEVEL
                or not 0 <= fields[2] < (1 << fields[1]) or fields[3] < 0):
            raise StateIntegrityError(f"a bucket's layout entry is not one fissure wrote: {fields!r:.80}")
        mode, level, split, keys = fields
        return cls(level, split, keys, mode)


# read(entries) -> each entry's bytes or None, in order; write([(entry, bytes), ...]); remove(entries);
# entries() -> every (entry, bytes) of the bucket's MapState
ReadEntries = Callable[[Sequence[int]], "list[bytes | None]"]
WriteEntries = Callable[[Sequence[tuple[int, bytes]]], None]
RemoveEntries = Callable[[Sequence[int]], None]
AllEntries = Callable[[], Iterator[tuple[int, bytes]]]


class SubBucketStore:
    """One handler call's view of a bucket's keyed state: `prefetch` with the call's keys, `load`
    and `store` per key (a state's bytes; None deletes the key), then `flush` once to split or
    switch layout and write what changed. Reads, writes and removals go through the callbacks a
    batch of entries at a time."""

    def __init__(self, read: ReadEntries, write: WriteEntries, codec: StateCodec, *,
                 remove: RemoveEntries | None = None, entries: AllEntries | None = None,
                 keys_per_sub_bucket: int = KEYS_PER_SUB_BUCKET) -> None:
        self._read, self._write, self._codec = read, write, codec
        self._remove, self._all_entries = remove, entries
        self._keys_per_sub_bucket = keys_per_sub_bucket
        (stored_layout,) = read([LAYOUT_ENTRY])
        self._legacy = stored_layout is not None and codec.is_legacy(stored_layout)
        if self._legacy:
            level, split, keys = codec.unpickle_legacy(stored_layout)  # refused unless migrating
            self._layout = SubBucketLayout(int(level), int(split), int(keys))
            self._stored_layout = None
        else:
            self._layout = self._stored_layout = (
                SubBucketLayout.decode(codec.unseal(stored_layout)[0]) if stored_layout is not None else SubBucketLayout())
        # entries read (or created) in this call: key text -> state bytes, and whether those are pickles
        self._entries: dict[int, dict[str, bytes]] = {}
        self._pickled: dict[int, bool] = {}
        self._changed: set[int] = set()
        self._added = 0  # keys stored for the first time since the last flush (net of deletions)
        self._touched: set[str] = set()
        self._addresses: dict[str, int] = {}  # each key's entry under the call's layout
        if self._legacy:
            self._read_entries(range(self._layout.sub_buckets))
            self._changed.update(range(self._layout.sub_buckets))

    @property
    def keys(self) -> int:
        """The keys the bucket holds (after `flush`: as stored)."""
        return max(0, self._layout.keys + self._added)

    def _address(self, key: str) -> int:
        address = self._addresses.get(key)
        if address is None:
            address = self._addresses[key] = (fine_entry(key) if self._layout.mode == FINE
                                              else self._layout.address(key_hash(key)))
        return address

    def prefetch(self, keys: Iterable[str]) -> None:
        """Read the entries `keys` fall in, in one batch."""
        self._read_entries({self._address(key) for key in keys})

    def _read_entries(self, entries: Iterable[int]) -> None:
        missing = sorted(set(entries) - self._entries.keys())
        if missing:
            for entry, data in zip(missing, self._read(missing)):
                self._take(entry, data)

    def _take(self, entry: int, data: bytes | None) -> None:
        codec = self._codec
        if data is None:
            self._entries[entry], self._pickled[entry] = {}, codec.use_pickle
        elif codec.is_legacy(data):  # an earlier fissure's sub-bucket: a pickled {key: pickled state}
            self._entries[entry] = {key: codec.dumps(codec.loads(body, True), f"of key {key!r}")
                                    for key, body in codec.unpickle_legacy(data).items()}
            self._pickled[entry] = codec.use_pickle
            self._changed.add(entry)
        else:
            body, pickled = codec.unseal(data)
            keys = decode_data(body)
            if type(keys) is not dict:
                raise StateIntegrityError(f"operator {codec.operator!r}: a bucket entry is not a map of keys")
            self._entries[entry], self._pickled[entry] = keys, pickled

    def _entry(self, entry: int) -> dict[str, bytes]:
        if entry not in self._entries:
            self._read_entries((entry,))
        return self._entries[entry]

    def load(self, key: str) -> tuple[bytes, bool] | None:
        """The key's stored state as (bytes, pickled), or None for a key without state."""
        self._touched.add(key)
        entry = self._address(key)
        body = self._entry(entry).get(key)
        return None if body is None else (body, self._pickled[entry])

    def store(self, key: str, state: bytes | None) -> None:
        """The key's new state, encoded by the operator's codec; None removes the key's state."""
        self._touched.add(key)
        entry = self._address(key)
        keys = self._entry(entry)
        if state is None:
            if key in keys:
                del keys[key]
                self._added -= 1
                self._changed.add(entry)
            return
        if self._pickled[entry] != self._codec.use_pickle:
            self._recode(entry)
        if key not in keys:
            self._added += 1
        keys[key] = state
        self._changed.add(entry)

    def _recode(self, entry: int) -> None:
        """An entry's states in the operator's codec (it read data and now pickles, or the reverse)."""
        codec, pickled = self._codec, self._pickled[entry]
        self._entries[entry] = {key: codec.dumps(codec.loads(body, pickled), f"of key {key!r}")
                                for key, body in self._entries[entry].items()}
        self._pickled[entry] = codec.use_pickle
        self._changed.add(entry)

    def flush(self) -> None:
        """Choose the layout for the call's density, split what grew, and write every changed entry
        and the layout once each, in one batch (removals in another)."""
        if self._added:
            self._layout = replace(self._layout, keys=max(0, self._layout.keys + self._added))
            self._added = 0
        mode = self._chosen_mode()
        removed: list[int] = []
        if mode != self._layout.mode:
            removed = self._switch(mode)
        elif mode == COARSE:
            splitting, layout = [], self._layout
            while layout.needs_split(self._keys_per_sub_bucket):
                splitting.append(layout.split)
                layout = layout.after_split()
            self._read_entries(splitting)  # splits read sub-buckets no key of the call fell in
            for _ in splitting:
                self._split()
        writes = []
        for entry in sorted(self._changed):
            if self._pickled[entry] != self._codec.use_pickle:
                self._recode(entry)
            keys = self._entries[entry]
            if keys or self._layout.mode == COARSE and 0 <= entry < self._layout.sub_buckets:
                writes.append((entry, self._codec.seal(encode_data(keys))))
            else:
                removed.append(entry)
        if self._layout != self._stored_layout:
            writes.append((LAYOUT_ENTRY, self._codec.seal(self._layout.encode())))
            self._stored_layout = self._layout
        if writes:
            self._write(writes)
        if removed:
            self._removal(removed)
        self._changed.clear()
        self._addresses.clear()  # the layout may have split or switched
        self._touched.clear()

    def _chosen_mode(self) -> int:
        """The layout for this call's density (FINE_BELOW / COARSE_ABOVE); a store that cannot remove
        or list entries keeps the one it has."""
        current, keys, touched = self._layout.mode, self._layout.keys, len(self._touched)
        if self._remove is None or not touched or not keys:
            return current
        if current == COARSE and keys >= FINE_MIN_KEYS and touched / keys < FINE_BELOW:
            return FINE
        if current == FINE and self._all_entries is not None and touched / keys > COARSE_ABOVE:
            return COARSE
        return current

    def _removal(self, entries: list[int]) -> None:
        if self._remove is None:
            raise RuntimeError("this state store cannot remove entries")
        self._remove(sorted(set(entries)))

    def _switch(self, mode: int) -> list[int]:
        """Rewrite the bucket's every key under `mode`; returns the entries to remove."""
        if mode == FINE:  # every coarse sub-bucket, read
            self._read_entries(range(self._layout.sub_buckets))
        else:  # every fine entry, found by listing the bucket's entries
            for entry, data in self._all_entries():
                if entry < LAYOUT_ENTRY and entry not in self._entries:
                    self._take(entry, data)
        old = [entry for entry in self._entries if entry != LAYOUT_ENTRY]
        for entry in old:
            if self._pickled[entry] != self._codec.use_pickle:
                self._recode(entry)
        states = {key: body for entry in old for key, body in self._entries[entry].items()}
        layout = (replace(SubBucketLayout(), keys=len(states), mode=FINE) if mode == FINE
                  else SubBucketLayout().grown_for(len(states), self._keys_per_sub_bucket))
        self._layout = layout
        self._entries, self._changed, self._addresses = {}, set(), {}
        self._pickled = {}
        for key, body in states.items():
            entry = self._address(key)
            self._entries.setdefault(entry, {})[key] = body
            self._pickled[entry] = self._codec.use_pickle
            self._changed.add(entry)
        if mode == COARSE:  # every sub-bucket exists in the coarse layout, empty or not
            for entry in range(layout.sub_buckets):
                if entry not in self._entries:
                    self._entries[entry], self._pickled[entry] = {}, self._codec.use_pickle
                    self._changed.add(entry)
        return [entry for entry in old if entry not in self._changed]

    def _split(self) -> None:
        old = self._layout.split
        new = old + (1 << self._layout.level)
        keys = self._entry(old)
        after = self._layout.after_split()
        moving = [key for key in keys if after.address(key_hash(key)) == new]
        self._entries[new] = {key: keys.pop(key) for key in moving}
        self._pickled[new] = self._pickled[old]
        self._changed.update((old, new))
        self._layout = after
