"""The reference executor of a stream graph: in process, deterministic, no Spark.

    results = run_local(graph, {"lines": [{"value": "..."}, ...]})
    results["alerts"]          # the records that reached sink "alerts", as dicts
    results.dead_letters       # every record an operator could not process, with the reason
    results                    # {'alerts': [...]} with 1 dead letter: 'parse': ValueError: ...

Each operator runs with the same per-operator code as on Spark (fissure.runtime.operators.fused for
stateless operators, fissure.runtime.operators.keyed for stateful ones, fissure.runtime.operators.join for
joins), so records, types and dead letters are the same; what differs is the routing, done here
node by node over whole streams. A call is one micro-batch: a keyed operator gets each key's
records in (order_by, source order) order, as on Spark within a batch. `LocalGraphRun` keeps
the state between calls, to run several micro-batches.

Time (fissure.runtime.operators.timed, fissure.runtime.operators.watermark): `LocalGraphRun` keeps the query's watermark
across `run_batch` calls, each batch running with the watermark of the batches before it (its
results carry it: `results.watermark`); every key due at that watermark fires, records or not.
`finish()` is the end of input: the watermark passes every pending window, session and expiry.
`run_local` is one batch and the end of input: the complete answer.
"""

from __future__ import annotations

import math
import secrets
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from fissure.model.types import Kind
from fissure.program.chain import Pipeline
from fissure.program.nodes import NodeKind
from fissure.program.operators import PipelineError
from fissure.program.graph import StreamGraph, as_graph
from fissure.runtime.records.columns import (DEAD_COLUMNS, DEAD_ERROR, DEAD_OPERATOR, DEAD_RECORD, SEQ, SOURCE_SHIFT,
                                             carried_schema)
from fissure.runtime.operators.fused import FusedStage, Step
from fissure.runtime.records.carried import assemble, conform, live_batch, split_dead
from fissure.runtime.operators.join import LEFT, RIGHT, JoinArrival, JoinStep, arrivals_of, joined_batch, run_join_group
from fissure.runtime.operators.keyed import BatchTime, StatefulStep, key_text, run_group, run_keys
from fissure.runtime.state.codec import StateCodec
from fissure.runtime.operators.timed import LATE, max_event_time, per_key_step
from fissure.runtime.operators.watermark import Deadlines, ProcessingTime, Watermark



@dataclass(frozen=True)
class LocalDeadLetter:
    node: str
    error: str
    record: str  # JSON
    seq: int


class LocalResults(dict):
    """Sink name -> records (dicts); `dead_letters` holds what operators could not process. Its
    repr shows the dead letters too: their count and the first SHOWN_DEAD_LETTERS with operator and
    reason."""

    SHOWN_DEAD_LETTERS = 3
    SHOWN_ERROR_CHARS = 120

    def __init__(self, *args, dead_letters: Sequence[LocalDeadLetter] = (), watermark: float = -math.inf,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.dead_letters: list[LocalDeadLetter] = list(dead_letters)
        self.watermark = watermark  # the event-time watermark the batch ran with (fired at)

    @property
    def late_records(self) -> int:
        """The dead letters of late records (reason `Late: ...`)."""
        return sum(1 for letter in self.dead_letters if letter.error.startswith(LATE + ":"))

    def describe_dead_letters(self) -> str:
        """`2 dead letters: 'parse': ValueError: ... (record {...}); ...`, the first few in full."""
        count = len(self.dead_letters)
        if not count:
            return "no dead letters"
        shown = []
        for letter in self.dead_letters[:self.SHOWN_DEAD_LETTERS]:
            error = letter.error if len(letter.error) <= self.SHOWN_ERROR_CHARS else \
                letter.error[:self.SHOWN_ERROR_CHARS - 3] + "..."
            record = letter.record if len(letter.record) <= 60 else letter.record[:57] + "..."
            shown.append(f"{letter.node!r}: {error} (record {record})")
        more = f"; and {count - len(shown)} more" if count > len(shown) else ""
        return f"{count} dead letter{'' if count == 1 else 's'}: {'; '.join(shown)}{more}"

    def __repr__(self) -> str:
        return f"{dict.__repr__(self)} with {self.describe_dead_letters()}"

    __str__ = __repr__


class DeadLettersWarning(UserWarning):
    """`run_local` returned results with dead letters (records an operator could not process)."""


@dataclass
class NodeWork:
    """What one node did over the calls so far: records in and out, and `clock` seconds."""

    records_in: int = 0
    records_out: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class _BatchClocks:
    event: BatchTime | None  # the query's event-time watermarks for this batch
    processing: BatchTime | None  # the batch times, for nodes on processing time

    def of(self, field: str | None) -> BatchTime | None:
        return self.event if field is not None else self.processing


class LocalGraphRun:
    """Runs micro-batches of `graph` one after another, keeping keyed state between them.

    With a `clock` (e.g. time.thread_time), `work` holds each operator and join node's records
    and clock seconds over every call (fissure.local.cost_sample measures a program this way).
    States are kept as Spark keeps them, sealed by each operator's StateCodec (so a state the codec
    cannot store fails here as on Spark); an operator declaring state_codec="pickle" signs them
    with a key made for this run, which never leaves the process.
    """

    def __init__(self, graph: StreamGraph, clock: Callable[[], float] | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.graph = graph
        self.states: dict[str, dict[str, bytes]] = {}  # node -> key -> sealed state
        self._state_key = secrets.token_bytes(32)
        self.clock = clock
        self.work: dict[str, NodeWork] = {}
        self.wall_clock = wall_clock  # processing time, seconds (expiry without event time)
        self.deadlines: dict[str, Deadlines] = {}  # per-key node -> when its keys next fire
        self._watermark: Watermark | None = None
        self._processing = ProcessingTime()
        self._bound: dict[str, pa.Schema] | None = None  # the source schemas of the last batch

    @property
    def watermark(self) -> float:
        """The event-time watermark the next micro-batch runs with (-inf before any event time)."""
        return self._watermark.next if self._watermark is not None else -math.inf

    def finish(self, batch_time_s: float | None = None) -> LocalResults:
        """End of input: one more micro-batch without records whose watermark passes every pending
        deadline (the largest event time seen + the program's horizon; processing-time expiry:
        all), so every window, session and expiry fires. Returns what it emitted. The watermark
        stays there: a later batch judges its records late against it."""
        if self._bound is None:  # no batch ran: nothing is pending
            return LocalResults({sink: [] for sink in self.graph.sinks}, watermark=self.watermark)
        return self.run_batch({name: [] for name in self.graph.sources}, self._bound, batch_time_s=batch_time_s,
                              end_of_input=True)

    def run_batch(self, sources: Mapping[str, Sequence[Mapping]],
                  schemas: Mapping[str, pa.Schema] | None = None, *, batch_time_s: float | None = None,
                  end_of_input: bool = False) -> LocalResults:
        """One micro-batch: the records of every source (by name). A source's schema is the
        graph's declared one, else `schemas[name]`, else inferred from its records.
        `batch_time_s`: the batch's processing time (default: `wall_clock()`)."""
        graph = self.graph
        schemas = schemas or {}
        unknown = sorted(set(sources) - set(graph.sources))
        if unknown:
            raise PipelineError(f"graph {graph.name!r} has no source {', '.join(map(repr, unknown))}; its sources are "
                                f"{', '.join(graph.sources)}")
        missing = [name for name in graph.sources if name not in sources]
        if missing:
            raise PipelineError(f"no records given for source(s) {', '.join(map(repr, missing))} of graph {graph.name!r}; "
                                f"pass an empty list for a source without records")
        declared = {name: graph.node(name).schema for name in graph.sources}
        earlier = self._bound or {}  # a source without records keeps the schema of its last batch
        bound = {name: declared[name] if declared[name] is not None else schemas[name] if name in schemas else
                 earlier[name] if name in earlier and not sources[name] else _inferred_schema(name, sources[name])
                 for name in graph.sources}
        layout = graph.check(bound)
        self._bound = bound
        schemas = layout.schemas
        clocks = self._begin_batch(layout, batch_time_s, end_of_input)
        streams: dict[str, pa.RecordBatch] = {}
        dead: list[LocalDeadLetter] = []
        for name in layout.order:
            node = graph.node(name)
            started = self.clock() if self.clock is not None else 0.0
            if node.kind is NodeKind.SOURCE:
                index = graph.sources.index(name)
                records = [dict(record) for record in sources[name]]
                data = pa.RecordBatch.from_pylist(records, schema=schemas[name])
                output = live_batch(data, [(index << SOURCE_SHIFT) + position for position in range(len(records))])
            elif node.kind is NodeKind.UNION:
                schema = carried_schema(schemas[name])
                merged = assemble([conform(streams[source], schema) for source in node.inputs], schema)
                output = merged.take(pc.sort_indices(merged, sort_keys=[(SEQ, "ascending")]))
            elif node.kind is NodeKind.JOIN:
                output = self._join(node, streams, schemas)
            elif node.keyed and node.operator.per_key:
                field = layout.time.fields.get(name)
                output = self._per_key(node, streams[node.inputs[0]], schemas, field,
                                       clocks.of(field) if name in layout.time.fields else None)
            elif node.keyed:
                output = self._stateful(node, streams[node.inputs[0]], schemas)
            else:
                operator = node.operator
                step = Step(name=operator.name, action=operator.action.value, fn=operator.fn,
                            output_schema=schemas[name],
                            batch_format=operator.batch_format.value if operator.batch_format else None)
                source = streams[node.inputs[0]]
                output = FusedStage([step], schemas[node.inputs[0]])(source) if source.num_rows else \
                    pa.RecordBatch.from_pylist([], schema=carried_schema(schemas[name]))
            live, new_dead = split_dead(output)
            if self.clock is not None and node.kind in (NodeKind.OPERATOR, NodeKind.JOIN):
                work = self.work.setdefault(name, NodeWork())
                work.seconds += self.clock() - started
                work.records_in += sum(streams[source].num_rows for source in node.inputs)
                work.records_out += live.num_rows
            if new_dead is not None:
                dead += [LocalDeadLetter(row[DEAD_OPERATOR], row[DEAD_ERROR], row[DEAD_RECORD], row[SEQ])
                         for row in new_dead.select([SEQ, *DEAD_COLUMNS]).to_pylist()]
            streams[name] = live
        results = LocalResults(dead_letters=dead, watermark=self._end_batch(layout, streams, clocks))
        for sink in graph.sinks:
            stream = graph.sink_node(sink).inputs[0]
            results[sink] = streams[stream].select(schemas[stream].names).to_pylist()
        return results

    def _begin_batch(self, layout, batch_time_s: float | None, end_of_input: bool) -> _BatchClocks:
        """The batch's times: the query's watermark, and processing time where a node uses it."""
        fields = layout.time.fields
        if not fields:
            return _BatchClocks(None, None)
        event = processing = None
        if any(field is not None for field in fields.values()):
            if self._watermark is None:
                self._watermark = Watermark(layout.time.lateness)
            event = self._watermark.end_of_input(layout.time.horizon) if end_of_input else \
                self._watermark.begin_batch()
        if any(field is None for field in fields.values()):
            now_s = self.wall_clock() if batch_time_s is None else batch_time_s
            processing = self._processing.batch(now_s, end_of_input)
        return _BatchClocks(event, processing)

    def _end_batch(self, layout, streams: Mapping[str, pa.RecordBatch], clocks: _BatchClocks) -> float:
        """Take in the event times the batch's time-aware nodes saw; returns the watermark it ran with."""
        if clocks.event is None:
            return self.watermark
        for name, field in layout.time.fields.items():
            carried = streams[self.graph.node(name).inputs[0]]
            if field is not None and carried.num_rows:
                self._watermark.observe(max_event_time(carried.column(field).to_pylist()))
        self._watermark.end_batch(clocks.event)
        return clocks.event.current

    def _per_key(self, node, carried: pa.RecordBatch, schemas, time_field: str | None,
                 time: BatchTime | None) -> pa.RecordBatch:
        """A window, aggregate, deduplication or expiring operator: once per key with records and
        once per key due at the batch's watermark, as on Spark per bucket of keys."""
        step = per_key_step(node.operator, schemas[node.inputs[0]], schemas[node.name], time_field)
        codec = step.state_codec
        states = self.states.setdefault(node.name, {})
        deadlines = self.deadlines.setdefault(node.name, Deadlines())

        load, store = _sealed_state_access(states, codec)

        due = deadlines.due(time.current) if time is not None else []
        return run_keys(step, carried, load, store, time=time, due=due, deadline=deadlines.set)

    def _stateful(self, node, carried: pa.RecordBatch, schemas) -> pa.RecordBatch:
        operator = node.operator
        input_schema = schemas[node.inputs[0]]
        codec = StateCodec(operator.name, use_pickle=operator.state_codec == "pickle", key=self._state_key)
        step = StatefulStep(name=operator.name, fn=operator.fn, state_factory=operator.state_factory,
                            input_schema=input_schema, output_schema=schemas[node.name], key=operator.key,
                            order_by=operator.order_by, codec=codec)
        states = self.states.setdefault(node.name, {})

        load, store = _sealed_state_access(states, codec)

        if operator.kind is Kind.PARTITIONED:  # every key's records at once, as a bucket on Spark
            return run_keys(step, carried, load, store)
        result = run_group(step, carried, load("all"))
        if result.deleted or result.state is not None:
            store("all", result.state)
        return result.batch

    def _join(self, node, streams, schemas) -> pa.RecordBatch:
        spec = node.join
        step = JoinStep(node.name, spec.fn, spec.window.time_field, spec.window.size, spec.window.lateness, spec.schema,
                        tuple(spec.key))
        states = self.states.setdefault(node.name, {})
        groups: dict[str, list[JoinArrival]] = {}
        for side, stream in ((LEFT, node.inputs[0]), (RIGHT, node.inputs[1])):
            for arrival in arrivals_of(streams[stream], schemas[stream], side):
                groups.setdefault(key_text(arrival.record, spec.key), []).append(arrival)
        records, seqs, dead = [], [], []
        for key, arrivals in groups.items():
            result = run_join_group(step, arrivals, states.get(key))
            states[key] = result.state
            records += result.records
            seqs += result.seqs
            dead += result.dead
        return joined_batch(step, records, seqs, dead)


def _inferred_schema(source: str, records: Sequence[Mapping]) -> pa.Schema:
    if not records:
        raise PipelineError(f"source {source!r} has no declared schema and no records to infer one from; declare "
                            f"graph.source({source!r}, schema={{...}})")
    return pa.Table.from_pylist([dict(record) for record in records]).schema


def run_local(program: Pipeline | StreamGraph, sources: Mapping[str, Sequence[Mapping]] | Sequence[Mapping]
              ) -> LocalResults:
    """Run `program` over the given records of every source, as one micro-batch followed by the
    end of input (every window, session and expiry fires: the complete answer; `results.watermark`
    is where the watermark ended); see the module docstring. A chain (a Pipeline) takes its
    records as a list and its results are under "sink".

    A batch with dead letters also warns (DeadLettersWarning, on stderr unless filtered): the
    results are printed and compared as sink records, where a record an operator could not process
    is simply absent, so a test or a notebook cell that looks only at the sinks would read a
    failing operator as a filter. The warning names the count and the first letters; the results'
    repr shows them too. Silence it where dead letters are expected with
    `warnings.simplefilter("ignore", DeadLettersWarning)` (or pytest's filterwarnings)."""
    graph = as_graph(program)
    if not isinstance(sources, Mapping):
        if len(graph.sources) != 1:
            raise PipelineError(f"graph {graph.name!r} has sources {', '.join(graph.sources)}; pass a dict of their "
                                f"records by name")
        sources = {graph.sources[0]: sources}
    run = LocalGraphRun(graph)
    results = run.run_batch(sources)
    flushed = run.finish()
    for sink, records in flushed.items():
        results[sink] = results[sink] + records
    results.dead_letters += flushed.dead_letters
    results.watermark = flushed.watermark
    if results.dead_letters:
        warnings.warn(DeadLettersWarning(f"run_local({graph.name!r}): {results.describe_dead_letters()}; they are "
                                         f"not in the sinks' records: read results.dead_letters"), stacklevel=2)
    return results


def _sealed_state_access(states: dict, codec):
    """`load(key)` and `store(key, state)` over a node's dict of sealed states: a state stored as
    None is removed, as Spark's state store removes it."""

    def load(key: str):
        stored = states.get(key)
        return codec.unseal(stored) if stored is not None else None

    def store(key: str, state: bytes | None) -> None:
        if state is None:
            states.pop(key, None)
        else:
            states[key] = codec.seal(state)

    return load, store
