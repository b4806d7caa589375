"""What the Runner hands Spark besides the plan: the program's sources and sinks bound by name,
its operators' code made ready for the workers (shipped by value, checked to pickle), the
resource profiles of multi-process PEs, and the foreachBatch function, cut loose once its query
stopped."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping

from pyspark.sql import SparkSession

from fissure.program.graph import StreamGraph
from fissure.program.operators import PipelineError
from fissure.spark.io.batch_admission import input_records
from fissure.spark.session.create import is_local
from fissure.spark.io.sources import FileSource


def ship_operator_modules(graph: StreamGraph) -> None:
    """Pickle the operators' own modules by value, so workers need not import them.

    A function is pickled by reference to its module; a module that lives in a script's folder
    (not installed, not fissure) would be missing in the Python workers of a cluster.
    """
    from pyspark import cloudpickle

    functions = [fn for operator in graph.operators for fn in (operator.fn, operator.state_factory)]
    functions += [node.join.fn for node in graph.nodes if node.join is not None]
    for fn in functions:
        module = sys.modules.get(getattr(fn, "__module__", None) or "")
        path = getattr(module, "__file__", None) or ""
        if (module is None or module.__name__ in ("__main__", "builtins") or "site-packages" in path
                or module.__name__.split(".")[0] in ("fissure", "pyspark") or not path):
            continue
        cloudpickle.register_pickle_by_value(module)


def check_serializable(graph: StreamGraph) -> None:
    """Every operator's function and state_factory pickle as Spark will send them to its workers;
    one that does not fails here, named, before any query starts."""
    from pyspark import cloudpickle

    for operator in graph.operators:
        for role, fn in (("function", operator.fn), ("state_factory", operator.state_factory)):
            if fn is None:
                continue
            try:
                cloudpickle.dumps(fn)
            except Exception as error:  # noqa: BLE001 - any pickling failure is the same to the user
                raise PipelineError(
                    f"operator {operator.name!r}: its {role} cannot be serialized for Spark's workers"
                    f" ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); a closure"
                    f" must not capture open files, locks, sockets, sessions or generators") from error


def resource_profiles(session: SparkSession):
    """ResourceProfile factory for PEs of several processes where Spark honours per-stage CPUs.

    Local mode refuses TaskResourceProfiles ("only supported for Standalone, Yarn and Kubernetes
    cluster for now when dynamic allocation is disabled"); there the plan's thread budget keeps
    replicas x processes within the cores instead.
    """
    conf = session.sparkContext.getConf()
    if is_local(session) or conf.get("spark.dynamicAllocation.enabled", "false") == "true":
        return lambda processes: None
    from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

    profiles = {}

    def profile_for(processes: int):
        if processes <= 1:
            return None
        if processes not in profiles:
            profiles[processes] = ResourceProfileBuilder().require(TaskResourceRequests().cpus(processes)).build
        return profiles[processes]

    return profile_for


def _bound(graph: StreamGraph, given, role: str, names: tuple[str, ...]) -> dict:
    """A graph's sources or sinks by name: a mapping as given (every name bound, no other), or one
    object where the graph has one."""
    if not isinstance(given, Mapping):
        if len(names) == 1 and given is not None:
            return {names[0]: given}
        raise PipelineError(f"graph {graph.name!r} has {role}s {', '.join(names)}; pass a dict of them by name "
                            f"({{{names[0]!r}: ...}})")
    missing = [name for name in names if name not in given]
    unknown = sorted(set(given) - set(names))
    if role == "sink" and (missing or unknown):
        raise PipelineError(f"graph {graph.name!r} has sinks {', '.join(names)}; bind each one by name: "
                            f"missing {', '.join(missing) or 'none'}, unknown {', '.join(unknown) or 'none'}")
    if unknown:
        raise PipelineError(f"graph {graph.name!r} has no {role} {', '.join(map(repr, unknown))}; its {role}s are "
                            f"{', '.join(names)}")
    return dict(given)


def input_records_once(sources: Mapping[str, object], beyond: float | None = None) -> float | None:
    """The records a run that reads its sources once will read, when every source is a local file
    source (None otherwise: unknown, or more may come); each source counted until it passes `beyond`."""
    if not sources or not all(isinstance(source, FileSource) for source in sources.values()):
        return None
    counts = [input_records(source, beyond=beyond) for source in sources.values()]
    return None if any(count is None for count in counts) else float(sum(counts))


def bind_sources(graph: StreamGraph, given) -> dict:
    """A graph's sources by name, as `Runner` binds them (PipelineError naming the fix)."""
    return _bound(graph, given, "source", graph.sources)


def bind_sinks(graph: StreamGraph, given) -> dict:
    """A graph's sinks by name, every one bound and no other (PipelineError naming the fix)."""
    return _bound(graph, given, "sink", graph.sinks)


class DetachableBatchFunction:
    """The function a query's `foreachBatch` calls, cut from the Runner once its query stopped.

    PySpark keeps every `foreachBatch` function in py4j's callback pool for the session's life.
    A function that holds the Runner holds its `query` proxy, and so the stopped Java query with
    its plans: measured on PySpark 4.3, each stopped query of a four-operator chain kept 4.1 MiB of
    the driver's heap (benchmarks/driver_heap.py), and a session that ran 134 LogWatch and
    synthetic queries (a benchmark; the adaptive loop starts a query per restart) ran out of its
    1 GiB. Detached, the pooled function holds nothing.
    """

    def __init__(self, function: Callable) -> None:
        self._function: Callable | None = function

    def __call__(self, frame, batch_id: int):
        function = self._function
        if function is None:
            raise RuntimeError(f"fissure: micro-batch {batch_id} reached the foreachBatch of a stopped query")
        return function(frame, batch_id)

    def detach(self) -> None:
        self._function = None
