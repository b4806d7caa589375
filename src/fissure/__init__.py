"""fissure: sequential Python stream programs, parallelized on Apache Spark by themselves.

    import fissure
    program = fissure.Pipeline("name").map(...).partitioned(...)    # a chain, or
    program = fissure.StreamGraph("name")                           # a graph of sources, operators, sinks
    fissure.run(program, source(s), sink(s), plan="planner")        # on Spark
    fissure.run_local(program, records)                             # in this process, no JVM

Time: `.event_time(field, lateness=)`, `.window(name, key=, window=Tumbling|Sliding|Session,
aggregate=Count()|Sum|Min|Max|Mean|Aggregate.of)`, `.aggregate(...)`, `.deduplicate(...)`,
`partitioned(..., expire_after=, on_expire=)` (docs/pipeline-api.md, Time).

The program definition (no Spark needed to build one) is imported eagerly; the Spark layer's
names load pyspark on first use, so `import fissure` and the planner stay light. Test helpers
(in-memory sources and sinks, an in-process run): `fissure.testing`.
"""

from fissure.aggregates import Aggregate, Count, Max, Mean, Min, Sum
from fissure.graph import OperatorEstimate, Pipeline, PipelineError
from fissure.streamgraph import StreamGraph, TumblingWindow
from fissure.windows import Session, Sliding, Tumbling
from fissure.worker.graph_local import run_local

__version__ = "0.1.0"

# name -> module of the Spark layer that defines it
_SPARK_EXPORTS = {
    "run": "fissure.spark.run",
    "Runner": "fissure.spark.runner",
    "RunReport": "fissure.spark.runner",
    "RunnerConfig": "fissure.spark.config",
    "FileSource": "fissure.spark.sources",
    "RateSource": "fissure.spark.sources",
    "SocketSource": "fissure.spark.sources",
    "KafkaSource": "fissure.spark.sources",
    "FileSink": "fissure.spark.sinks",
    "ForeachBatchSink": "fissure.spark.sinks",
    "ConsoleSink": "fissure.spark.sinks",
    "MemorySink": "fissure.spark.sinks",
    "NoopSink": "fissure.spark.sinks",
    "run_graph": "fissure.spark.run",
    "RunTimedOut": "fissure.spark.run",
    "migrate_state": "fissure.spark.checkpoint_guard",
}

__all__ = ["Aggregate", "Count", "Max", "Mean", "Min", "OperatorEstimate", "Pipeline", "PipelineError", "Session",
           "Sliding", "StreamGraph", "Sum", "Tumbling", "TumblingWindow", "run_local", "__version__", *_SPARK_EXPORTS]


def __getattr__(name: str):
    module_name = _SPARK_EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'fissure' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
