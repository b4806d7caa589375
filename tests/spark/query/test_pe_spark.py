"""The processing element inside real Spark Python workers (mapInArrow, local[2])."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def make_region_function():
    """The mapInArrow function, built here so cloudpickle ships it (and its stages) by value."""

    def tag_worker_pid(batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.append_column("worker_pid", pa.array([os.getpid()] * batch.num_rows, pa.int64()))

    def tag_child_pid_and_square(batch: pa.RecordBatch) -> pa.RecordBatch:
        return pa.record_batch(
            {
                "id": batch.column("id"),
                "square": pc.multiply(batch.column("id"), batch.column("id")),
                "worker_pid": batch.column("worker_pid"),
                "child_pid": pa.array([os.getpid()] * batch.num_rows, pa.int64()),
            }
        )

    def region_function(batches):
        from fissure.runtime.pe.registry import run_region

        pipelines = [[tag_worker_pid], [tag_child_pid_and_square]]
        yield from run_region("test-pe-spark/region-0", "cut-1", pipelines, batches)

    return region_function


def test_pipelines_run_in_a_forked_child_kept_across_jobs_and_order_is_kept(spark):
    schema = "id long, square long, worker_pid long, child_pid long"
    child_of_worker: dict[int, int] = {}
    for _ in range(2):  # two jobs: the second one reuses the workers and their children
        rows = (
            spark.range(0, 20_000, numPartitions=2)
            .mapInArrow(make_region_function(), schema)
            .toArrow()
        )
        ids = rows.column("id").to_pylist()
        assert sorted(ids) == list(range(20_000))
        # Within a partition (one worker), the output keeps the input order.
        for worker_pid in set(rows.column("worker_pid").to_pylist()):
            mine = pc.equal(rows.column("worker_pid"), worker_pid)
            worker_ids = rows.filter(mine).column("id").to_pylist()
            assert worker_ids == sorted(worker_ids)
            (child_pid,) = set(rows.filter(mine).column("child_pid").to_pylist())
            assert child_pid != worker_pid
            assert child_of_worker.setdefault(worker_pid, child_pid) == child_pid
        assert rows.column("square").to_pylist() == [i * i for i in ids]
