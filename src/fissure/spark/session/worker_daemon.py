"""The Python worker daemon of the sessions fissure creates: PySpark's own (`pyspark.daemon`), with
the modules every fissure task needs imported once, before it forks its workers.

Spark starts one daemon per executor (`python -m <spark.python.daemon.module>`) and forks a worker
from it for each Python task slot it needs. PySpark's daemon imports nothing: each forked worker
then imports pyarrow, pandas and fissure's worker code when it unpickles its first task. Measured
on the LogWatch example's first micro-batch (PySpark 4.3, 2 cores, spark.log at INFO): a
worker's `init` (unpickling its task) took 0.8-1.6 s and its `boot` 0.6-0.8 s, in every stage
that started a new worker, on the critical path of the first result. Forked from a daemon that
imported them already, a worker starts with them loaded.

PySpark's daemon imports the worker module only after the fork, because pandas and pyarrow may
start threads when imported and a fork copies only the forking thread. fissure's processing
element already forks its pipeline processes from workers that imported pyarrow (numpy's BLAS and
pyarrow's allocator register fork handlers); the daemon does the same, one level up.

The preloaded modules' objects are then frozen (`gc.freeze()`): PySpark's daemon runs a full
`gc.collect()` in a reused worker after every task, and without the freeze each collection walked
the 80,000-odd objects of those modules again. Sampled over LogWatch's Python workers (PySpark
4.3, 250,000-line micro-batches, local[2]), those collections took 15 % of the workers' CPU, about
0.4 s a micro-batch of its 13 Python tasks (30-40 ms each); a worker's collection after the freeze
walks only what it made since the fork, a few thousand objects (1-2 ms, in process). Frozen objects
are never collected: the modules live as long as the daemon anyway, and a collection just before
the freeze reclaims the imports' own garbage. Frozen pages are also left alone by the collector, so
they stay shared between the daemon and its forked workers.
"""

from __future__ import annotations

# What a fissure task unpickles: the stage functions and their worker code, pyarrow and pandas
# (the Arrow and pandas UDF serializers), and PySpark's worker loop.
PRELOADED_MODULES = (
    "numpy",
    "pyarrow",
    "pyarrow.compute",
    "pandas",
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "fissure.spark.query.stages",
    "fissure.spark.query.keyed_stage",
)


def preload() -> list[str]:
    """Import PRELOADED_MODULES; returns those that failed (a daemon without them still works)."""
    import importlib

    failed = []
    for name in PRELOADED_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module missing on an executor costs time, not correctness
            failed.append(name)
    return failed


def freeze_preloaded() -> None:
    """Move every object alive now out of the collector's reach (see the module docstring)."""
    import gc

    gc.collect()
    gc.freeze()


def main() -> None:
    preload()
    freeze_preloaded()
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
