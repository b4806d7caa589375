"""The graph processing element's share of work: pieces of a pe stage over envelopes.

Within a pe stage, the plan's pipeline boundaries cut the stage's subgraph into pieces, run as a
chain of processes by the ProcessingElement (fissure.runtime.pe.element); a piece runs its nodes
on the rows routed to them (fissure.runtime.records.envelopes) and passes every other row
through. The pieces of a stage are built by fissure.compile.pieces. No pyspark here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from fissure.runtime.operators.fused import FusedStage
from fissure.runtime.profiling.pieces import PieceProfile
from fissure.runtime.records.carried import assemble, conform, split_dead
from fissure.runtime.records.columns import carried_schema
from fissure.runtime.records.envelopes import EnvelopeLayout


@dataclass(frozen=True)
class StatelessNode:
    """Stateless nodes as a piece runs them: a union, or a run of operators fused into one
    FusedStage (one Arrow -> dicts -> Arrow conversion for a run of per-record operators, as in
    a chain's pipeline); `name` is the last one's, whose output the run gives."""

    name: str
    inputs: tuple[str, ...]
    output_schema: pa.Schema
    stage: FusedStage | None  # None: a union
    names: tuple[str, ...] = ()  # the fused operators, in order (empty: a union)

    def run(self, inputs: Sequence[pa.RecordBatch], fold=None) -> pa.RecordBatch:
        """Its carried output (live rows and new dead letters) from its inputs' live carried rows;
        `fold`: passed to its FusedStage (the records it folds are not in the output)."""
        present = [batch for batch in inputs if batch is not None and batch.num_rows]
        if self.stage is None:
            schema = carried_schema(self.output_schema)
            return assemble([conform(batch, schema) for batch in present], schema)
        if fold is not None:
            return assemble([self.stage(batch, fold) for batch in present], carried_schema(self.output_schema))
        return assemble([self.stage(batch) for batch in present], carried_schema(self.output_schema))


class GraphPiece:
    """One process's share of a pe stage: a `RecordBatch -> RecordBatch` stage over envelopes.

    Runs `nodes` (topological order) on the rows routed to them, emits the rows of the streams
    in `forward` (needed after this piece) and passes every row of other streams through. With
    `profile_id`, adds each node's thread-CPU and wall time and records into shared counters
    (fissure.runtime.profiling.pieces) that the driver turns into mu(t) and mu(o, t).
    """

    def __init__(self, nodes: Sequence[StatelessNode], layout: EnvelopeLayout, forward: Iterable[str],
                 profile_id: str | None = None) -> None:
        self.nodes = tuple(nodes)
        self.layout = layout
        self.forward = frozenset(forward)
        produced = {node.name for node in self.nodes}
        self.consumed = frozenset(stream for node in self.nodes for stream in node.inputs if stream not in produced)
        self.profile_id = profile_id
        self._profile = None

    @property
    def name(self) -> str:
        return ",".join(node.name for node in self.nodes)

    def __repr__(self) -> str:
        return f"GraphPiece({self.name})"

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_profile"] = None
        return state

    def bind_profile(self):
        if self.profile_id is not None and self._profile is None:
            self._profile = PieceProfile(self.profile_id, tuple(node.name for node in self.nodes))
        return self._profile

    def __call__(self, batch: pa.RecordBatch, fold=None) -> pa.RecordBatch:
        """`fold` (a fissure.runtime.operators.dict_fold.RecordFold): the node of its stream
        offers it its output records as dicts; those it folds leave the piece as partials only."""
        profile = self._profile if self._profile is not None else self.bind_profile()
        started_cpu_s = time.thread_time()
        present = self.layout.streams_in(batch) & self.consumed
        if not present:
            return self.layout.conform(batch)
        live, dead = split_dead(batch)
        route = live.column(0)
        dropped = sorted(self.layout.route_of(stream) for stream in present - self.forward)
        keep = pc.invert(pc.is_in(route, value_set=pa.array(dropped, pa.int32())))
        parts = [self.layout.conform(live.filter(keep)), self.layout.conform(dead) if dead is not None else None]
        available = {stream: self.layout.extract(live, stream) for stream in present}
        for index, node in enumerate(self.nodes):
            inputs = [available.get(stream) for stream in node.inputs]
            records_in = sum(batch.num_rows for batch in inputs if batch is not None)
            if not records_in:
                continue
            node_started_s, node_started_wall_s = time.thread_time(), time.perf_counter()
            folding = fold is not None and node.name == fold.stream
            folded_before = fold.folded if folding else 0
            output = node.run(inputs, fold) if folding else node.run(inputs)
            live_output, new_dead = split_dead(output)
            available[node.name] = live_output
            if profile is not None:
                records_out = live_output.num_rows + (fold.folded - folded_before if folding else 0)
                profile.node(index, records_in, records_out, time.thread_time() - node_started_s,
                             time.perf_counter() - node_started_wall_s)
            if new_dead is not None:
                parts.append(self.layout.wrap_dead(new_dead, node.name))
            if node.name in self.forward and live_output.num_rows:
                parts.append(self.layout.wrap(live_output, node.name))
        if profile is not None:
            profile.piece(time.thread_time() - started_cpu_s)
        return assemble(parts, self.layout.schema)
