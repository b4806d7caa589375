"""The driver's heap over many queries in one session: does a stopped query leave anything behind?

PySpark keeps every `foreachBatch` function in py4j's callback pool for the session's life;
fissure's Runner cuts that function from itself when its query stops (`DetachableBatchFunction`
in fissure/spark/query/binding.py). This script runs the model-accuracy benchmark's stateless chain
(`model_accuracy.py`: four busy operators, 3,000 records in 4 files) `--queries` times in one
session, each a fresh Runner started, run to its end and stopped, and reads the driver JVM's used
heap after a full garbage collection (Python's first, so that the proxies it dropped release their
Java objects) every `--every` queries:

- `detached`: fissure as shipped;
- `kept`: the same with `detach` turned into a no-op, as before (run second: what it leaves
  behind would otherwise count against the other).

Not a timing benchmark: the figures are bytes, and a busy machine does not change them.

    ./dev python benchmarks/driver_heap.py [--queries 20 --every 5]
    ./dev python benchmarks/driver_heap.py --quick    # 4 queries each: a check

Results: driver_heap.md/.json under --out (default benchmarks/results/).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fissure  # noqa: E402
from fissure.spark.query import runner as runner_module  # noqa: E402

import method  # noqa: E402
import model_accuracy  # noqa: E402

MIB = 2 ** 20


def used_heap_mib(spark) -> float:
    """The driver's used heap after Python's and then the JVM's full collection."""
    gc.collect()
    jvm = spark._jvm
    jvm.java.lang.System.gc()
    runtime = jvm.java.lang.Runtime.getRuntime()
    return (runtime.totalMemory() - runtime.freeMemory()) / MIB


def heap_over_queries(spark, source, work: Path, queries: int, every: int) -> list[tuple[int, float]]:
    """(queries run, used heap MiB) at the start and after every `every` queries."""
    pipeline = model_accuracy.stateless_pipeline()
    points = [(0, used_heap_mib(spark))]
    for done in range(1, queries + 1):
        model_accuracy.measure_run(spark, pipeline, source, None, work, profile=None)
        if done % every == 0 or done == queries:
            points.append((done, used_heap_mib(spark)))
            print(f"  {done} queries: {points[-1][1]:.0f} MiB", flush=True)
    return points


def growth_per_query(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of the heap over the queries run, MiB per query, from the first reading
    after a query on: a session's first queries load code and caches once (44 -> 95 MiB here)."""
    points = [point for point in points if point[0] > 0]
    if len(points) < 2:
        return 0.0
    return statistics.linear_regression([x for x, _ in points], [y for _, y in points]).slope


def report(document: dict) -> str:
    lines = ["# The driver's heap over many queries in one session", "",
             f"Each query: the stateless chain of model_accuracy.py, {document['records']:,} records in "
             f"{document['files']} files, a fresh Runner started, run to its end and stopped. Used heap after a "
             f"full collection, of {document['max_heap_mib']:.0f} MiB.", "",
             "| variant | " + " | ".join(f"after {x}" for x, _ in document["variants"]["detached"]["points"])
             + " | growth per query (from the first reading after a query) |",
             "| --- |" + " --- |" * (len(document["variants"]["detached"]["points"]) + 1)]
    for name, variant in document["variants"].items():
        lines.append(f"| {name} | " + " | ".join(f"{y:.0f} MiB" for _, y in variant["points"])
                     + f" | {variant['growth_mib_per_query']:.2f} MiB |")
    lines += ["", "`detached`: fissure as shipped. `kept`: the Runner's `detach` made a no-op, so PySpark's "
              "callback pool keeps every stopped query's Runner, its query proxy and the Java query's plans."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser, repeats=None)
    parser.add_argument("--queries", type=int, default=20, help="queries per variant")
    parser.add_argument("--every", type=int, default=5, help="read the heap after every N queries")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    if args.quick:
        args.queries, args.every = 4, 2
    run = method.Run("driver_heap.py", argv, quick=args.quick, out=args.out, master=args.master, timed=False)
    model_accuracy.LOOPS_PER_US = model_accuracy.busy_loops_per_us()
    from fissure.spark.session.create import create_session

    records, files = 3000, 4
    with method.scratch_folder("driver_heap.py") as work:
        spark = create_session(fissure.RunnerConfig(master=args.master))
        try:
            source = model_accuracy.synthetic_source(work / "in", records, files)
            variants = {}
            detach = runner_module.DetachableBatchFunction.detach
            for name in ("detached", "kept"):
                print(f"{name}:", flush=True)
                if name == "kept":
                    runner_module.DetachableBatchFunction.detach = lambda self: None
                try:
                    points = heap_over_queries(spark, source, work, args.queries, args.every)
                finally:
                    runner_module.DetachableBatchFunction.detach = detach
                variants[name] = {"points": points, "growth_mib_per_query": round(growth_per_query(points), 3)}
            max_heap = spark._jvm.java.lang.Runtime.getRuntime().maxMemory() / MIB
        finally:
            spark.stop()
    document = {"records": records, "files": files, "queries": args.queries, "max_heap_mib": max_heap,
                "variants": variants}
    run.write_results("driver_heap_quick" if args.quick else "driver_heap", report(document), document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
