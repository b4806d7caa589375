"""A bucket's keyed state in sub-buckets of about `KEYS_PER_SUB_BUCKET` keys (no pyspark here).

A partitioned operator's keys reach Spark's state handler a bucket at a time (crc32 of the key's
text mod STATE_BUCKETS, `fissure.worker.packing`). Every read or write of Spark's state is a round
trip to PySpark's state server; with one MapState entry per key a batch paid two round trips per
key it touched (380 us a key, measured with the word count: `state_key_us` before sub-buckets),
which made a 100,000-word vocabulary cost seconds per batch. Here a bucket's keys are spread over
sub-buckets, each ONE MapState entry holding its keys' pickled states: a batch pays two round
trips per sub-bucket it touches, plus a few microseconds per key of the sub-buckets it reads and
writes. Sub-buckets split as the bucket's keys grow (linear hashing, Litwin, VLDB 1980: a level
and a split pointer address every key; one sub-bucket splits at a time, in order), so a sub-bucket
holds at most about twice `KEYS_PER_SUB_BUCKET` keys however large the state grows: a batch's cost
follows the keys it touches, not the size of the state.

The layout (level, split pointer, key count) is one more entry of the same MapState, under
`LAYOUT_ENTRY`. The store does every read and write through the two callbacks it is given, a
batch of entries at a time: a call of the handler reads the layout, then the sub-buckets its keys
fall in (`prefetch`), and `flush` writes what changed, after any splits.
"""

from __future__ import annotations

import pickle
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from fissure.model.types import STATE_BUCKETS

# Mean keys per sub-bucket before the next split. A state-server round trip costs about 190 us
# (half the 380 us a key's read and write cost with an entry per key, calibrated) and a key's share
# of a sub-bucket's (un)pickling a microsecond or two, so about a hundred keys per entry keeps
# both small (32 and 512, tried by hand on the 1,000,000-key state, were not faster).
KEYS_PER_SUB_BUCKET = 128
LAYOUT_ENTRY = -1  # the MapState entry holding the layout; sub-buckets are 0, 1, 2, ...


def key_hash(key: str) -> int:
    """A key text's hash for its sub-bucket: crc32 of the text over STATE_BUCKETS, i.e. without the
    bits that chose its bucket (every key of a bucket shares them)."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) // STATE_BUCKETS


@dataclass(frozen=True)
class SubBucketLayout:
    """Linear hashing's addressing: sub-buckets below `split` are already split into level + 1 bits."""

    level: int = 0
    split: int = 0
    keys: int = 0  # keys stored in the bucket

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

    def encode(self) -> bytes:
        return pickle.dumps((self.level, self.split, self.keys), protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def decode(cls, data: bytes | None) -> SubBucketLayout:
        if data is None:
            return cls()
        level, split, keys = pickle.loads(data)
        return cls(level, split, keys)


# read(entries) -> each entry's bytes or None, in order; write([(entry, bytes), ...])
ReadEntries = Callable[[Sequence[int]], "list[bytes | None]"]
WriteEntries = Callable[[Sequence[tuple[int, bytes]]], None]


class SubBucketStore:
    """One handler call's view of a bucket's keyed state: `prefetch` with the call's keys, `load`
    and `store` per key (pickled state bytes), then `flush` once to split what grew too large and
    write what changed. Reads and writes go through the callbacks a batch of entries at a time
    (the Spark layer sends a batch's requests without waiting for each answer)."""

    def __init__(self, read: ReadEntries, write: WriteEntries, keys_per_sub_bucket: int = KEYS_PER_SUB_BUCKET) -> None:
        self._read, self._write = read, write
        self._keys_per_sub_bucket = keys_per_sub_bucket
        (layout,) = read([LAYOUT_ENTRY])
        self._layout = self._stored_layout = SubBucketLayout.decode(layout)
        self._entries: dict[int, dict[str, bytes]] = {}  # sub-buckets read (or created) in this call
        self._changed: set[int] = set()
        self._added = 0  # keys stored for the first time since the last flush (the layout counts them then)
        # each key's sub-bucket under the call's layout, hashed once (splits wait for `flush`)
        self._addresses: dict[str, int] = {}

    def _address(self, key: str) -> int:
        address = self._addresses.get(key)
        if address is None:
            address = self._addresses[key] = self._layout.address(key_hash(key))
        return address

    def prefetch(self, keys: Iterable[str]) -> None:
        """Read the sub-buckets `keys` fall in, in one batch."""
        self._read_sub_buckets({self._address(key) for key in keys})

    def _read_sub_buckets(self, sub_buckets: Iterable[int]) -> None:
        missing = sorted(set(sub_buckets) - self._entries.keys())
        if missing:
            for sub_bucket, data in zip(missing, self._read(missing)):
                self._entries[sub_bucket] = pickle.loads(data) if data is not None else {}

    def _sub_bucket(self, sub_bucket: int) -> dict[str, bytes]:
        if sub_bucket not in self._entries:
            self._read_sub_buckets((sub_bucket,))
        return self._entries[sub_bucket]

    def load(self, key: str) -> bytes | None:
        return self._sub_bucket(self._address(key)).get(key)

    def store(self, key: str, state: bytes) -> None:
        sub_bucket = self._address(key)
        entries = self._sub_bucket(sub_bucket)
        if key not in entries:
            self._added += 1
        entries[key] = state
        self._changed.add(sub_bucket)

    def flush(self) -> None:
        """Split while the bucket holds more than its share of keys, then write every changed
        sub-bucket and the layout, once each, in one batch."""
        if self._added:
            self._layout = replace(self._layout, keys=self._layout.keys + self._added)
            self._added = 0
        splitting, layout = [], self._layout
        while layout.needs_split(self._keys_per_sub_bucket):
            splitting.append(layout.split)
            layout = layout.after_split()
        self._read_sub_buckets(splitting)  # splits read sub-buckets no key of the call fell in
        for _ in splitting:
            self._split()
        writes = [(sub_bucket, pickle.dumps(self._entries[sub_bucket], protocol=pickle.HIGHEST_PROTOCOL))
                  for sub_bucket in sorted(self._changed)]
        if self._layout != self._stored_layout:
            writes.append((LAYOUT_ENTRY, self._layout.encode()))
            self._stored_layout = self._layout
        if writes:
            self._write(writes)
        self._changed.clear()
        self._addresses.clear()  # the layout may have split

    def _split(self) -> None:
        old = self._layout.split
        new = old + (1 << self._layout.level)
        entries = self._sub_bucket(old)
        after = self._layout.after_split()
        moving = [key for key in entries if after.address(key_hash(key)) == new]
        self._entries[new] = {key: entries.pop(key) for key in moving}
        self._changed.update((old, new))
        self._layout = after
