"""The pieces a pe stage runs, built from the plan's cut: each a chain of fused runs of
stateless nodes (fissure.runtime.pe.graph_piece), with the streams it must forward and how its
operators profile themselves. No pyspark here: the Spark layer (fissure.spark.query.stages)
builds them in its workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from fissure.compile.stages import GraphStage, consumers_after, fusion_runs, pieces_for
from fissure.runtime.elastic.stage import WaitingOperator
from fissure.runtime.operators.fused import FusedStage, Step
from fissure.runtime.pe.graph_piece import GraphPiece, StatelessNode
from fissure.runtime.records.envelopes import EnvelopeLayout
from fissure.program.nodes import Node, NodeKind
from fissure.program.graph import StreamGraph


def _step(node: Node, schemas: Mapping[str, pa.Schema], waiting: WaitingOperator | None) -> Step:
    operator = node.operator
    return Step(name=operator.name, action=operator.action.value, fn=operator.fn, output_schema=schemas[node.name],
                batch_format=operator.batch_format.value if operator.batch_format else None, waiting=waiting)


@dataclass(frozen=True)
class StageProfiling:
    """How a graph PE's fused operators profile themselves (fissure.runtime.profiling.profiler): counter ids
    start with `prefix` (unique per query), every `timed_every`-th batch is timed."""

    prefix: str
    timed_every: int = 1


def fused_nodes(nodes: Sequence[Node], schemas: Mapping[str, pa.Schema],
                waiting: Mapping[str, WaitingOperator] | None = None, profile_id: str | None = None,
                profile_label: str | None = None, timed_every: int = 1) -> StatelessNode:
    """A union alone, or operators each reading the one before (a run `fusion_runs` found);
    with `profile_id`, its FusedStage counts and times its operators under that id."""
    last = nodes[-1]
    if last.kind is NodeKind.UNION:
        return StatelessNode(last.name, last.inputs, schemas[last.name], None)
    waiting = waiting or {}
    steps = [_step(node, schemas, waiting.get(node.name)) for node in nodes]
    stage = FusedStage(steps, schemas[nodes[0].inputs[0]], profile_id=profile_id, timed_every=timed_every,
                       profile_label=profile_label)
    return StatelessNode(last.name, nodes[0].inputs, schemas[last.name], stage, tuple(node.name for node in nodes))


def build_pieces(graph: StreamGraph, schemas: Mapping[str, pa.Schema], layout: EnvelopeLayout,
                 stages: Sequence[GraphStage], stage: GraphStage, boundaries: Iterable[str],
                 profile_prefix: str | None = None,
                 waiting: Mapping[str, WaitingOperator] | None = None,
                 stage_profiling: StageProfiling | None = None, by_node: bool = True) -> list[GraphPiece]:
    """The pieces of pe `stage` under `boundaries`, each with the streams it must forward;
    `waiting`: the elastic threads of the stage's waiting operators, by name. Unprofiled, a
    piece fuses its runs of operators (`fusion_runs`); profiled, it runs node by node, so that
    each node's CPU time is its own (the autopipelining optimizer reads it per input port), or,
    with `by_node` False, fused, counting each run under its last operator's name.
    `stage_profiling`: the operators count and time themselves as a chain's do (per fused run)."""
    waiting = waiting or {}
    done = {name for earlier in stages[:stage.position] for name in earlier.nodes}
    done |= set(graph.sources)
    pieces = []
    names = pieces_for(graph, stage.nodes, boundaries)
    for number, piece in enumerate(names):
        done |= set(piece)
        readable = set(piece) | {stream for name in piece for stream in graph.node(name).inputs}
        forward = {stream for stream in readable if consumers_after(graph, stream, done)}
        profile_id = f"{profile_prefix}/{stage.label}/{'|'.join(','.join(p) for p in names)}/p{number}" \
            if profile_prefix else None
        runs = fusion_runs(graph, piece) if profile_id is None or not by_node else [[name] for name in piece]
        cut = "|".join(",".join(p) for p in names)
        units = []
        for unit, run in enumerate(runs, start=1):
            label = f"{stage.label}/p{number + 1}" + (f".{unit}" if len(runs) > 1 else "")
            units.append(fused_nodes(
                [graph.node(name) for name in run], schemas, waiting,
                f"{stage_profiling.prefix}/{stage.label}/{cut}/{label}" if stage_profiling is not None else None,
                label, stage_profiling.timed_every if stage_profiling is not None else 1))
        pieces.append(GraphPiece(units, layout, forward, profile_id))
    return pieces
