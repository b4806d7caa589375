"""The transformWithStateInPandas handler Spark pickles: light to unpickle, the real one inside.

At a query's first planning PySpark starts a fresh Python process on the driver for each
stateful operator (its state-schema "pre-init", not forked from the worker daemon), unpickles
the operator's handler there and calls its `init` to learn its state variables. Unpickling
fissure's handler (fissure.spark.query.keyed_stage.GraphStateProcessor) imports pandas, pyarrow, fissure's
worker layer and the user's module: about 0.5 s of a fresh process (`import fissure.spark.query.keyed_stage`
0.47-0.6 s against 0.13 s for PySpark's own handler module, 2 cores), paid once per stateful
operator before the first micro-batch (benchmarks/results/first_batch.md: 3 such processes,
4.7 s of the LogWatch example's first batch).

`LightStateProcessor` carries the real handler as bytes and the names and schemas of its state
variables: `init` registers them without unpickling anything, and the real handler is unpickled
when rows first arrive, in an executor's Python worker (forked from a daemon that has the
modules loaded). This module imports nothing of fissure's but the package (whose names load on
first use) and PySpark's StatefulProcessor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pyspark.sql.streaming.stateful_processor import StatefulProcessor


@dataclass(frozen=True)
class StateVariable:
    """One state variable a handler registers: "value" (schema) or "map" (key schema, value schema)."""

    kind: str
    name: str
    schemas: tuple[str, ...]


def register_state_variables(handle, variables: Iterable[StateVariable]) -> dict[str, object]:
    """Register `variables` with Spark's handle; the state objects by name."""
    states = {}
    for variable in variables:
        if variable.kind == "map":
            states[variable.name] = handle.getMapState(variable.name, *variable.schemas)
        elif variable.kind == "value":
            states[variable.name] = handle.getValueState(variable.name, *variable.schemas)
        else:
            raise ValueError(f"unknown state variable kind {variable.kind!r}")
    return states


class LightStateProcessor(StatefulProcessor):
    """A handler's state variables, and the handler itself pickled, unpickled on first rows."""

    def __init__(self, processor) -> None:
        from pyspark import cloudpickle

        self.variables = tuple(processor.state_variables())
        self.payload = cloudpickle.dumps(processor)
        self._processor = None
        self._states: Mapping[str, object] = {}

    def init(self, handle) -> None:
        self._states = register_state_variables(handle, self.variables)

    def _real(self):
        if self._processor is None:
            import pickle

            self._processor = pickle.loads(self.payload)
            self._processor.attach(self._states)
        return self._processor

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802 - Spark's name
        return self._real().handleInputRows(key, rows, timerValues)

    def close(self) -> None:
        if self._processor is not None:
            self._processor.close()

    def __getstate__(self) -> dict:
        return {"variables": self.variables, "payload": self.payload}

    def __setstate__(self, state: dict) -> None:
        self.variables, self.payload = state["variables"], state["payload"]
        self._processor, self._states = None, {}
