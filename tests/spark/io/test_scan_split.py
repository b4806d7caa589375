"""How a file scan splits a micro-batch over the cores (fissure.spark.io.scan_split): the split
computed as Spark computes it, and Spark's own split of the same files under the settings."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fissure.spark.io.scan_split import SPARK_OPEN_COST_BYTES, apply_scan_split, scan_split_settings, scan_tasks

MB = 1 << 20
FILE = 5 * MB + 350 * 1024  # LogWatch's benchmark files: 50,000 lines each


def split_waves(tasks: Sequence[int], cores: int) -> float:
    """How evenly `tasks` (their bytes) keep `cores` busy: the batch's bytes over cores times the
    busiest core's, tasks taken in order by the first free core (1.0: even)."""
    if not tasks:
        return 1.0
    loads = [0] * cores
    for task in tasks:
        loads[loads.index(min(loads))] += task
    return sum(tasks) / (cores * max(loads))


def test_spark_defaults_split_by_the_files_and_the_settings_by_the_cores():
    # Spark's defaults on 2 cores: one file splits 4.67 MB / 0.68 MB, five make tasks of 2, 2, 1 files
    one = scan_tasks([FILE], 2, open_cost=SPARK_OPEN_COST_BYTES)
    assert len(one) == 2 and one[0] > 6 * one[1]
    assert scan_tasks([FILE] * 5, 2, open_cost=SPARK_OPEN_COST_BYTES) == [2 * FILE, 2 * FILE, FILE]
    # without the opening cost, one or two files are cut into even pieces, many small files pack evenly
    assert split_waves(scan_tasks([FILE], 2), 2) == pytest.approx(1.0, abs=1e-6)
    assert scan_tasks([FILE] * 2, 2) == [FILE, FILE]
    assert split_waves(scan_tasks([1000] * 40, 2), 2) == 1.0
    # files each about a task's share stay whole: five equal files, three tasks, the last wave on one core
    assert scan_tasks([FILE] * 5, 2) == [2 * FILE, 2 * FILE, FILE]
    assert split_waves([2 * FILE, 2 * FILE, FILE], 2) == pytest.approx(5 / 6)
    # a file that cannot be split (gzip) is one task whatever its size
    assert scan_tasks([3 * FILE], 2, splitable=False) == [3 * FILE]


def test_settings_name_the_cores_and_refuse_none():
    assert scan_split_settings(2) == {"spark.sql.files.openCostInBytes": "0", "spark.sql.files.minPartitionNum": "2"}
    with pytest.raises(ValueError, match="cores"):
        scan_split_settings(0)
    with pytest.raises(ValueError, match="min_partitions"):
        scan_tasks([1], 0)


class RecordingConf:
    def __init__(self, values):
        self.values = dict(values)

    def get(self, name, default=None):
        return self.values.get(name, default)

    def set(self, name, value):
        self.values[name] = value

    def unset(self, name):
        self.values.pop(name, None)


def test_a_query_that_does_not_spread_takes_back_only_what_an_earlier_one_set():
    conf = RecordingConf({"spark.sql.files.minPartitionNum": "8"})  # the user's own
    apply_scan_split(conf, 2, spread=True)
    assert conf.values == scan_split_settings(2)
    apply_scan_split(conf, 2, spread=False)
    assert conf.values == {}
    mine = RecordingConf({"spark.sql.files.minPartitionNum": "8"})
    apply_scan_split(mine, 2, spread=False)
    assert mine.values == {"spark.sql.files.minPartitionNum": "8"}


@pytest.mark.spark
@pytest.mark.parametrize("files", [1, 2, 5])
def test_sparks_scan_splits_the_files_as_computed(spark, tmp_path, files):
    from pyspark.sql import functions as F

    line = "x" * 99  # 100 bytes a line with its newline
    lines_per_file = 3_000
    for number in range(files):
        (tmp_path / f"part-{number}.txt").write_text((line + "\n") * lines_per_file)
    size = 100 * lines_per_file
    cores = spark.sparkContext.defaultParallelism
    apply_scan_split(spark.conf, cores, spread=True)
    try:
        frame = spark.read.text(str(tmp_path))
        per_task = sorted((row["count"] for row in frame.groupBy(F.spark_partition_id().alias("task")).count()
                           .collect()), reverse=True)
        tasks = frame.rdd.getNumPartitions()
    finally:
        apply_scan_split(spark.conf, cores, spread=False)
    expected = scan_tasks([size] * files, cores)
    assert tasks == len(expected)
    # a task whose piece ends inside a line reads that line whole: its lines are within one of the bytes'
    assert len(per_task) == len(expected)
    assert all(abs(count - task_bytes / 100) <= 1 for count, task_bytes in zip(per_task, sorted(expected, reverse=True)))
    assert sum(per_task) == files * lines_per_file
