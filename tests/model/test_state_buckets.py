"""A new checkpoint's bucket count (fissure.model.state_buckets)."""

from __future__ import annotations

import pytest

from fissure.model.state_buckets import BUCKET_COUNTS, check_bucket_count, new_checkpoint_buckets


@pytest.mark.parametrize("cores, buckets", [(1, 8), (2, 8), (3, 16), (4, 16), (5, 32), (8, 32), (9, 64), (16, 64),
                                            (200, 64)])
def test_a_new_checkpoint_gets_four_buckets_a_core_at_least_eight_at_most_64(cores, buckets):
    assert new_checkpoint_buckets(cores) == buckets
    assert buckets in BUCKET_COUNTS


def test_a_count_no_checkpoint_may_hold_is_refused():
    assert check_bucket_count(16) == 16
    with pytest.raises(ValueError, match="one of 2, 4, 8, 16, 32, 64, got 12"):
        check_bucket_count(12)
    with pytest.raises(ValueError, match="cores must be >= 1"):
        new_checkpoint_buckets(0)
