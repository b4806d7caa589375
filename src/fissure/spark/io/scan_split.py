"""How a file source's scan splits a micro-batch over the cores, so that a replicated first stage
can run on the scan's own tasks instead of behind a numbering stage and a round-robin exchange
(fissure.spark.query.compile_graph).

Spark cuts a batch's files into tasks (its FilePartition): every file longer than

    max_split = min(maxPartitionBytes, max(openCostInBytes, sum(size + openCostInBytes) / minPartitionNum))

is cut into pieces of that length; the pieces, longest first, fill one task after another up to
`max_split`, each counted `openCostInBytes` longer than it is. With Spark's defaults (4 MB of
opening cost, minPartitionNum = the cores) the scan's tasks follow the files, not the cores: a
batch of one 5.35 MB file splits 89 % / 11 % of its lines on 2 cores, five such files make tasks
of 2, 2 and 1 files (both checked on Spark 4.3's batch read, local[2]). `scan_split_settings`
sets no opening cost and `SPLITS_PER_CORE` tasks per core: one or two files are cut into even
pieces, many small files pack evenly, and a batch whose files are each about a task's share
still makes whole-file tasks (five equal files on two cores: 2, 2 and 1 files, the last wave on
one core). Splitting finer would even those too, at a task's fixed cost each: 10 tasks a batch
ran LogWatch at 94,798 lines/s against 110,488 with 3 (docs/profiling.md). `scan_tasks`
computes the split as Spark does, for tests and the docs.

Spark mechanism with no pyspark import: the settings are set on the session before the query
starts (`apply_scan_split`, with the runner's query settings); a streaming query keeps the ones
it started with.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_PARTITION_BYTES = 128 << 20  # Spark's spark.sql.files.maxPartitionBytes (left as it is)
SPARK_OPEN_COST_BYTES = 4 << 20  # Spark's default spark.sql.files.openCostInBytes
SPLITS_PER_CORE = 1


def scan_split_settings(cores: int) -> dict[str, str]:
    """The session settings under which a file scan splits each micro-batch over `cores`."""
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    return {"spark.sql.files.openCostInBytes": "0",
            "spark.sql.files.minPartitionNum": str(SPLITS_PER_CORE * cores)}


def scan_tasks(file_sizes: Sequence[int], min_partitions: int, open_cost: int = 0,
               max_partition_bytes: int = MAX_PARTITION_BYTES, splitable: bool = True) -> list[int]:
    """The bytes of each task Spark's scan makes of files of `file_sizes` (its FilePartition
    packing, Spark 4.x), under minPartitionNum `min_partitions` and openCostInBytes `open_cost`."""
    if min_partitions < 1:
        raise ValueError(f"min_partitions must be >= 1, got {min_partitions}")
    total = sum(size + open_cost for size in file_sizes)
    max_split = min(max_partition_bytes, max(open_cost, total // min_partitions))
    pieces = []
    for size in file_sizes:
        if not splitable or max_split <= 0:
            pieces.append(size)
            continue
        offset = 0
        while offset < size:
            pieces.append(min(max_split, size - offset))
            offset += max_split
    tasks: list[int] = []
    current, filled = 0, 0
    opened = False
    for piece in sorted(pieces, reverse=True):
        if opened and filled + piece > max_split:
            tasks.append(current)
            current, filled, opened = 0, 0, False
        filled += piece + open_cost
        current += piece
        opened = True
    if opened:
        tasks.append(current)
    return tasks


def apply_scan_split(conf, cores: int, spread: bool) -> None:
    """Set `scan_split_settings` on a session's conf (Spark's RuntimeConfig) before a query whose
    first stage the scan spreads; before any other query, take back the ones an earlier query
    left (a value still the one set here), so its scan splits as Spark's defaults do."""
    for name, value in scan_split_settings(cores).items():
        if spread:
            conf.set(name, value)
        elif conf.get(name, None) == value:
            conf.unset(name)
