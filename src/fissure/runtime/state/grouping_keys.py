"""The grouping key values a keyed stage's rows carry, chosen so that Spark splits them evenly.

A keyed stage's rows are grouped by a bucket of keys (fissure.runtime.operators.packing), and
Spark sends each grouping key to the state partition `pmod(murmur3(value, 42), partitions)`
(its HashPartitioning of an int column). Sent as the plain bucket numbers 0..63, the 64 buckets
split 27 / 37 over 2 partitions and 32 / 19 / 13 over 3 (computed below, and by Spark's own
`hash`), so the fuller task of every keyed stage ran 37 of the 64 handler calls instead of 32,
and a third of the partitions' work went to one of three. The pass-through rows' spread keys -1
and -2 both went to partition 1 of 2.

`balanced_keys(buckets)` gives bucket b the value `BALANCED_BUCKET_VALUES[buckets][b]`: for each
bucket count a checkpoint may hold (fissure.model.state_buckets), ints whose Spark partitions are
as even as the count allows for every partition count from 2 to 12 (64 buckets: 32 / 32, 22 / 21 /
21, ..., 16 each over 4, 8 each over 8; 8 buckets: 4 / 4, 3 / 3 / 2, ..., one each on 8 of 12),
found once by a seeded greedy search and frozen here, since a checkpoint's state lives under
these values. Spread keys are negative (they touch no state, so they may change): for `spread`
partitions, the first negative ints that land one on each partition.

A checkpoint keeps the scheme and the bucket count it was created with
(fissure.spark.checkpoint.state_layout): one made before this scheme holds 64 buckets under the
plain numbers (`PLAIN_KEYS`), and keeps them.

Pure: no pyspark; `spark_partition` is Spark's arithmetic, checked against Spark in the tests.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from fissure.model.state_buckets import BUCKET_COUNTS, LEGACY_STATE_BUCKETS

_MASK = 0xFFFFFFFF
SPARK_HASH_SEED = 42  # Spark's Murmur3Hash seed, the one HashPartitioning uses


def _rotate_left(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def spark_hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's `Murmur3_x86_32.hashInt`: the hash of an int column's value, as a signed int."""
    k1 = ((value & _MASK) * 0xCC9E2D51) & _MASK
    k1 = (_rotate_left(k1, 15) * 0x1B873593) & _MASK
    h1 = _rotate_left(seed ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & _MASK
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def spark_partition(value: int, partitions: int) -> int:
    """The partition Spark's hash exchange sends an int grouping key to (`pmod(hash, partitions)`)."""
    return spark_hash_int(value) % partitions  # Python's % of a negative hash is Spark's pmod


# Per bucket count, found by `find_balanced_values(count, 12, seed=1)`; never change: checkpoints
# hold state under them.
BALANCED_BUCKET_VALUES = {
    2: (0, 12),
    4: (0, 2, 15, 202),
    8: (0, 1, 2, 6, 31, 56, 496, 4572),
    16: (172377, 78959, 192944, 185347, 3120, 1146, 65867, 50283, 166938, 60636, 3052, 51689, 156442, 153694,
         166102, 7804),
    32: (0, 1, 2, 3, 4, 5, 6, 8, 11, 12, 13, 14, 16, 19, 20, 23, 25, 31, 32, 34, 43, 48, 49, 50, 52, 56, 118, 322,
         496, 497, 2690, 3579),
    64: (
        177730, 12257, 36040, 116712, 58072, 156888, 20034, 98679, 123256, 197708, 18635, 158527, 99882, 150866,
        37401, 163774, 33414, 39849, 113327, 96413, 122056, 51277, 153825, 85235, 149462, 120492, 165147, 95840,
        182182, 169757, 28743, 68733, 76896, 126307, 194711, 123466, 161034, 7096, 46006, 46787, 88705, 47519,
        154032, 82450, 115943, 195860, 7672, 40755, 11639, 69992, 194939, 65419, 147893, 171874, 10875, 84014,
        163987, 131902, 191151, 155017, 8410, 88731, 46385, 123869,
    ),
}


def find_balanced_values(count: int, max_partitions: int, seed: int, candidates: int = 200_000,
                         tries: int = 50) -> tuple[int, ...] | None:
    """`count` non-negative ints that every partition count from 2 to `max_partitions` splits as
    evenly as possible (each partition floor or ceil of count / partitions): a greedy pass over
    the candidates 0..`candidates`-1, in order on the first try, then shuffled (random.Random(seed)).
    None when no try finds them."""
    import random

    rng = random.Random(seed)
    counts_of = range(2, max_partitions + 1)
    for attempt in range(tries):
        order = list(range(candidates))
        if attempt:
            rng.shuffle(order)
        counts = {partitions: [0] * partitions for partitions in counts_of}
        chosen: list[int] = []
        for value in order:
            places = {partitions: spark_partition(value, partitions) for partitions in counts_of}
            if all(_room(counts[partitions], places[partitions], count) for partitions in counts_of):
                chosen.append(value)
                for partitions, place in places.items():
                    counts[partitions][place] += 1
                if len(chosen) == count:
                    return tuple(chosen)
    return None


def _room(counts: list[int], place: int, total: int) -> bool:
    """Whether one more value fits in partition `place` with every partition ending at floor or
    ceil of total / partitions."""
    partitions = len(counts)
    low, extra = divmod(total, partitions)
    high = low + (1 if extra else 0)
    if counts[place] >= high:
        return False
    return not extra or counts[place] < low or sum(1 for value in counts if value == high) < extra


@functools.lru_cache(maxsize=None)
def balanced_spread_values(spread: int) -> tuple[int, ...]:
    """`spread` negative ints, the i-th landing on partition i of `spread` (the first such from -1 down)."""
    found: dict[int, int] = {}
    value = -1
    while len(found) < spread:
        found.setdefault(spark_partition(value, spread), value)
        value -= 1
    return tuple(found[place] for place in range(spread))


@dataclass(frozen=True)
class GroupingKeys:
    """A checkpoint's scheme of grouping key values: its buckets (as many as values) and spread
    keys to the int values their rows carry, and back (`bucket_of`)."""

    scheme: str
    bucket_values: tuple[int, ...]
    balanced_spread: bool

    def __post_init__(self) -> None:
        count = len(self.bucket_values)
        if count not in BUCKET_COUNTS or len(set(self.bucket_values)) != count or min(self.bucket_values) < 0:
            raise ValueError(f"a grouping key scheme needs distinct non-negative values, as many as one of "
                             f"{', '.join(map(str, BUCKET_COUNTS))}; got {count}")
        object.__setattr__(self, "_bucket_array", np.asarray(self.bucket_values, dtype=np.int32))
        object.__setattr__(self, "_buckets_by_value", {value: bucket for bucket, value in enumerate(self.bucket_values)})

    @property
    def buckets(self) -> int:
        return len(self.bucket_values)

    def bucket_value(self, bucket: int) -> int:
        return self.bucket_values[bucket]

    def bucket_array(self, buckets: np.ndarray) -> np.ndarray:
        """The values of an array of buckets."""
        return self._bucket_array[buckets]

    def bucket_of(self, value: int) -> int:
        """The bucket whose rows carry `value` (a bucket's value, not a spread key)."""
        return self._buckets_by_value[value]

    def spread_values(self, spread: int) -> tuple[int, ...]:
        """The spread keys of `spread` partitions, by index (`seq mod spread`); all negative."""
        spread = max(1, spread)
        return balanced_spread_values(spread) if self.balanced_spread else tuple(-1 - index for index in range(spread))


PLAIN_KEYS = GroupingKeys("plain", tuple(range(LEGACY_STATE_BUCKETS)), balanced_spread=False)
BALANCED_SCHEME = "balanced-1"


@functools.lru_cache(maxsize=None)
def balanced_keys(buckets: int) -> GroupingKeys:
    """The balanced scheme for `buckets` buckets (a count in BUCKET_COUNTS)."""
    if buckets not in BALANCED_BUCKET_VALUES:
        raise ValueError(f"no balanced grouping key values for {buckets} buckets "
                         f"(counts: {', '.join(map(str, BALANCED_BUCKET_VALUES))})")
    return GroupingKeys(BALANCED_SCHEME, BALANCED_BUCKET_VALUES[buckets], balanced_spread=True)


BALANCED_KEYS = balanced_keys(LEGACY_STATE_BUCKETS)  # 64 buckets, every new checkpoint's before counts were chosen


def scheme_keys(scheme: str, buckets: int) -> GroupingKeys | None:
    """The scheme named `scheme` with `buckets` buckets; None when this fissure has no such scheme."""
    if scheme == PLAIN_KEYS.scheme:
        return PLAIN_KEYS if buckets == PLAIN_KEYS.buckets else None
    if scheme == BALANCED_SCHEME and buckets in BALANCED_BUCKET_VALUES:
        return balanced_keys(buckets)
    return None


SCHEMES = (PLAIN_KEYS.scheme, BALANCED_SCHEME)
