"""Grouping key values (fissure.runtime.state.grouping_keys): buckets that Spark's hash splits evenly."""

from __future__ import annotations

import numpy as np
import pytest

from fissure.model.types import BALANCED_PARTITIONS_UP_TO as BALANCED_UP_TO
from fissure.model.types import STATE_BUCKETS
from fissure.runtime.state.grouping_keys import (
    BALANCED_BUCKET_VALUES, BALANCED_KEYS, PLAIN_KEYS, SCHEMES, GroupingKeys, balanced_spread_values,
    find_balanced_values, spark_hash_int, spark_partition,
)


def split(values, partitions: int) -> list[int]:
    counts = [0] * partitions
    for value in values:
        counts[spark_partition(value, partitions)] += 1
    return counts


def test_the_hash_is_sparks_murmur3_of_an_int_column():
    # Spark 4.3: SELECT hash(CAST(v AS INT)) (tests/spark/state checks every value of the table against Spark)
    assert [spark_hash_int(value) for value in (0, 1, -1, 42)] == [933211791, -559580957, -1604776387, 29417773]


def test_plain_bucket_numbers_split_unevenly_which_is_why_the_values_are_chosen():
    assert split(PLAIN_KEYS.bucket_values, 2) == [27, 37]
    assert split(PLAIN_KEYS.bucket_values, 3) == [32, 19, 13]
    assert {spark_partition(value, 2) for value in PLAIN_KEYS.spread_values(2)} == {1}  # both spread keys on one


@pytest.mark.parametrize("partitions", range(2, BALANCED_UP_TO + 1))
def test_balanced_values_split_as_evenly_as_64_allows_up_to_12_partitions(partitions):
    counts = split(BALANCED_BUCKET_VALUES, partitions)
    assert max(counts) - min(counts) <= 1 and sum(counts) == STATE_BUCKETS


@pytest.mark.slow
def test_the_frozen_values_are_what_the_seeded_search_finds():
    assert find_balanced_values(STATE_BUCKETS, BALANCED_UP_TO, seed=1) == BALANCED_BUCKET_VALUES


def test_a_search_that_cannot_succeed_says_so():
    assert find_balanced_values(3, 4, seed=1, candidates=2, tries=2) is None


@pytest.mark.parametrize("spread", range(1, 17))
def test_balanced_spread_keys_are_negative_and_land_one_on_each_partition(spread):
    values = balanced_spread_values(spread)
    assert all(value < 0 for value in values) and len(set(values)) == spread
    assert [spark_partition(value, spread) for value in values] == list(range(spread))


def test_a_bucket_and_its_value_map_both_ways_in_either_scheme():
    for keys in (PLAIN_KEYS, BALANCED_KEYS):
        assert [keys.bucket_of(keys.bucket_value(bucket)) for bucket in range(STATE_BUCKETS)] == list(range(STATE_BUCKETS))
        assert keys.bucket_array(np.array([0, 5, 63])).tolist() == [keys.bucket_value(b) for b in (0, 5, 63)]
    assert PLAIN_KEYS.spread_values(3) == (-1, -2, -3)
    assert BALANCED_KEYS.spread_values(3) == balanced_spread_values(3)
    assert SCHEMES == {"plain": PLAIN_KEYS, "balanced-1": BALANCED_KEYS}


@pytest.mark.parametrize("values", [tuple(range(63)), (0,) * 64, tuple(range(-1, 63))])
def test_a_scheme_needs_64_distinct_non_negative_values(values):
    with pytest.raises(ValueError, match="64 distinct non-negative"):
        GroupingKeys("bad", values, balanced_spread=True)
