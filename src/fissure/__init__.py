"""fissure: sequential Python stream programs, parallelized on Apache Spark by themselves.

The pipeline definition (no Spark needed to build one) is imported eagerly; the Spark runner's
names load pyspark on first use, so `import fissure` and the planner stay light.
"""

from fissure.graph import OperatorEstimate, Pipeline, PipelineError
from fissure.streamgraph import StreamGraph, TumblingWindow

__version__ = "0.1.0"

# name -> module of the Spark layer that defines it
_SPARK_EXPORTS = {
    "Runner": "fissure.spark.runner",
    "RunReport": "fissure.spark.runner",
    "run": "fissure.spark.run",
    "RunnerConfig": "fissure.spark.config",
    "FileSource": "fissure.spark.sources",
    "RateSource": "fissure.spark.sources",
    "SocketSource": "fissure.spark.sources",
    "FileSink": "fissure.spark.sinks",
    "ForeachBatchSink": "fissure.spark.sinks",
    "ConsoleSink": "fissure.spark.sinks",
    "MemorySink": "fissure.spark.sinks",
    "NoopSink": "fissure.spark.sinks",
    "run_graph": "fissure.spark.graph_runner",
    "GraphRunner": "fissure.spark.graph_runner",
    "run_local": "fissure.worker.graph_local",
}

__all__ = ["OperatorEstimate", "Pipeline", "PipelineError", "StreamGraph", "TumblingWindow", "__version__", *_SPARK_EXPORTS]


def __getattr__(name: str):
    module_name = _SPARK_EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'fissure' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
