"""How many buckets of keys a new checkpoint's partitioned operators get (pure policy).

A partitioned operator's keys reach Spark's state handler a bucket at a time: its keyed stage
makes one handler call per bucket a batch touches (fissure.spark.query.keyed_stage), and each
call costs about 4.5 ms of the partitions' time whatever its records (PySpark's pandas frames and
implicit-key requests, fissure's state requests; docs/profiling.md, "Where hot items' time
goes"). With 64 buckets a hot-items micro-batch paid 2 x 64 such calls; with 8 its keyed stages'
state updates took 30-60 % less time. Buckets also bound the state partitions that still split
the operator's work (a bucket is never split), and a checkpoint keeps its count for good, since a
key's state lives under its bucket: the count is chosen once, for the cores the new checkpoint's
session has, with room to grow, and recorded in the checkpoint
(fissure.spark.checkpoint.state_layout). `RunnerConfig.state_buckets` overrides it for a
checkpoint that will move to a larger cluster.
"""

from __future__ import annotations

# Every count a checkpoint may hold: each has its frozen table of grouping key values
# (fissure.runtime.state.grouping_keys).
BUCKET_COUNTS = (2, 4, 8, 16, 32, 64)
# The count of every checkpoint made before the count was recorded.
LEGACY_STATE_BUCKETS = 64
# Buckets per core of the session a new checkpoint starts on: room for twice the cores, with two
# buckets per state partition even then (benchmarks/results/state_buckets.md compares the counts).
BUCKETS_PER_CORE = 4
MIN_NEW_BUCKETS = 8


def new_checkpoint_buckets(cores: int) -> int:
    """The bucket count of a new checkpoint on `cores` task slots: the smallest count in
    BUCKET_COUNTS holding BUCKETS_PER_CORE per core, at least MIN_NEW_BUCKETS, at most the largest."""
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    wanted = max(MIN_NEW_BUCKETS, BUCKETS_PER_CORE * cores)
    return next((count for count in BUCKET_COUNTS if count >= wanted), BUCKET_COUNTS[-1])


def check_bucket_count(buckets: int) -> int:
    """`buckets` when a checkpoint may hold it, else a ValueError naming the counts it may."""
    if buckets not in BUCKET_COUNTS:
        raise ValueError(f"a state bucket count must be one of {', '.join(map(str, BUCKET_COUNTS))}, got {buckets!r}")
    return buckets
