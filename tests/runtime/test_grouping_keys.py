"""Grouping key values (fissure.runtime.state.grouping_keys): buckets that Spark's hash splits evenly."""

from __future__ import annotations

import numpy as np
import pytest

from fissure.model.types import BALANCED_PARTITIONS_UP_TO as BALANCED_UP_TO
from fissure.model.state_buckets import BUCKET_COUNTS
from fissure.runtime.state.grouping_keys import (
    BALANCED_BUCKET_VALUES, BALANCED_KEYS, PLAIN_KEYS, SCHEMES, GroupingKeys, balanced_keys, balanced_spread_values,
    find_balanced_values, scheme_keys, spark_hash_int, spark_partition,
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


def test_every_bucket_count_a_checkpoint_may_hold_has_its_values():
    assert sorted(BALANCED_BUCKET_VALUES) == list(BUCKET_COUNTS)
    assert all(len(BALANCED_BUCKET_VALUES[count]) == count for count in BUCKET_COUNTS)


@pytest.mark.parametrize("buckets", BUCKET_COUNTS)
@pytest.mark.parametrize("partitions", range(2, BALANCED_UP_TO + 1))
def test_balanced_values_split_as_evenly_as_their_count_allows_up_to_12_partitions(buckets, partitions):
    counts = split(BALANCED_BUCKET_VALUES[buckets], partitions)
    assert max(counts) - min(counts) <= 1 and sum(counts) == buckets


@pytest.mark.slow
@pytest.mark.parametrize("buckets", BUCKET_COUNTS)
def test_the_frozen_values_are_what_the_seeded_search_finds(buckets):
    assert find_balanced_values(buckets, BALANCED_UP_TO, seed=1) == BALANCED_BUCKET_VALUES[buckets]


def test_a_search_that_cannot_succeed_says_so():
    assert find_balanced_values(3, 4, seed=1, candidates=2, tries=2) is None


@pytest.mark.parametrize("spread", range(1, 17))
def test_balanced_spread_keys_are_negative_and_land_one_on_each_partition(spread):
    values = balanced_spread_values(spread)
    assert all(value < 0 for value in values) and len(set(values)) == spread
    assert [spark_partition(value, spread) for value in values] == list(range(spread))


def test_a_bucket_and_its_value_map_both_ways_in_every_scheme():
    for keys in (PLAIN_KEYS, BALANCED_KEYS, balanced_keys(8)):
        every_bucket = range(keys.buckets)
        assert [keys.bucket_of(keys.bucket_value(bucket)) for bucket in every_bucket] == list(every_bucket)
        last = keys.buckets - 1
        assert keys.bucket_array(np.array([0, 5, last])).tolist() == [keys.bucket_value(b) for b in (0, 5, last)]
    assert (PLAIN_KEYS.buckets, BALANCED_KEYS.buckets, balanced_keys(8).buckets) == (64, 64, 8)
    assert PLAIN_KEYS.spread_values(3) == (-1, -2, -3)
    assert BALANCED_KEYS.spread_values(3) == balanced_keys(8).spread_values(3) == balanced_spread_values(3)


def test_a_scheme_is_found_by_its_name_and_bucket_count():
    assert SCHEMES == ("plain", "balanced-1")
    assert scheme_keys("plain", 64) is PLAIN_KEYS and scheme_keys("balanced-1", 64) is BALANCED_KEYS
    assert scheme_keys("balanced-1", 8) is balanced_keys(8)
    assert scheme_keys("balanced-1", 8).bucket_values == BALANCED_BUCKET_VALUES[8]
    assert scheme_keys("plain", 8) is None  # plain numbers only ever held 64 buckets
    assert scheme_keys("balanced-1", 12) is None and scheme_keys("balanced-9", 64) is None
    with pytest.raises(ValueError, match="no balanced grouping key values for 12 buckets"):
        balanced_keys(12)


@pytest.mark.parametrize("values", [tuple(range(63)), (0,) * 64, tuple(range(-1, 63)), tuple(range(12))])
def test_a_scheme_needs_distinct_non_negative_values_as_many_as_a_bucket_count(values):
    with pytest.raises(ValueError, match="distinct non-negative values, as many as one of 2, 4, 8, 16, 32, 64"):
        GroupingKeys("bad", values, balanced_spread=True)
