"""fissure: sequential Python stream programs, parallelized on Apache Spark by themselves.

    import fissure
    program = fissure.Pipeline("name").map(...).partitioned(...)    # a chain, or
    program = fissure.StreamGraph("name")                           # a graph of sources, operators, sinks
    fissure.run(program, source(s), sink(s), plan="planner",        # on Spark
                checkpoint="ckpt/", config=fissure.RunnerConfig(...))  # every other setting (fissure.config)
    fissure.run_local(program, records)                             # in this process, no JVM

Time: `.event_time(field, lateness=)`, `.window(name, key=, window=Tumbling|Sliding|Session,
aggregate=Count()|Sum|Min|Max|Mean|Aggregate.of)`, `.aggregate(...)`, `.deduplicate(...)`,
`partitioned(..., expire_after=, on_expire=)` (docs/pipeline-api.md, Time).

Every name loads its module on first use (PEP 562): `import fissure` imports nothing heavy, so
a process that needs one module of the package (PySpark's state-schema processes unpickling a
handler, fissure.spark.state.handler) pays for that module alone; the Spark layer's names load
pyspark. Test helpers (in-memory sources and sinks, an in-process run): `fissure.testing`.
"""

__version__ = "0.1.0"

# name -> module that defines it: the program definition (no Spark needed to build one), then
# the Spark layer
_EXPORTS = {
    "Aggregate": "fissure.program.aggregates",
    "Count": "fissure.program.aggregates",
    "Max": "fissure.program.aggregates",
    "Mean": "fissure.program.aggregates",
    "Min": "fissure.program.aggregates",
    "Sum": "fissure.program.aggregates",
    "OperatorEstimate": "fissure.program.operators",
    "Pipeline": "fissure.program.chain",
    "PipelineError": "fissure.program.operators",
    "StreamGraph": "fissure.program.graph",
    "TumblingWindow": "fissure.program.joins",
    "Session": "fissure.program.windows",
    "Sliding": "fissure.program.windows",
    "Tumbling": "fissure.program.windows",
    "run_local": "fissure.local.executor",
    "run": "fissure.spark.run",
    "Runner": "fissure.spark.query.runner",
    "RunReport": "fissure.spark.query.report",
    "RunnerConfig": "fissure.config",
    "FileSource": "fissure.spark.io.sources",
    "RateSource": "fissure.spark.io.sources",
    "SocketSource": "fissure.spark.io.sources",
    "KafkaSource": "fissure.spark.io.sources",
    "FileSink": "fissure.spark.io.sinks",
    "ForeachBatchSink": "fissure.spark.io.sinks",
    "ConsoleSink": "fissure.spark.io.sinks",
    "MemorySink": "fissure.spark.io.sinks",
    "NoopSink": "fissure.spark.io.sinks",
    "run_graph": "fissure.spark.run",
    "RunTimedOut": "fissure.spark.query.run_end",
    "migrate_state": "fissure.spark.checkpoint.guard",
}

__all__ = ["__version__", *_EXPORTS]
_SUBMODULES = ("testing",)  # reachable as fissure.testing after `import fissure`


def __getattr__(name: str):
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f"fissure.{name}")
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'fissure' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
