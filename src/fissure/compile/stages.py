"""A plan compiled into the stages of one query over a stream graph (pure decisions, no pyspark).

A plan (fissure.model.types.Plan over the graph's execution order) cuts the graph into stages
(`plan_graph_stages`): runs of stateless nodes ("pe" stages, one mapInArrow each, replicated
where a region starts) and one stage per keyed node (a partitioned or stateful operator, or a
join: transformWithStateInPandas behind a hash exchange). Within a pe stage, pipeline boundaries
cut the subgraph into pieces (`pieces_for`), run as a chain of processes by the processing
element (fissure.compile.pieces builds them). Between stages travel the envelopes of the streams
still needed after them (`stream_lifetimes`, fissure.runtime.records.envelopes).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fissure.program.chain import Pipeline
from fissure.model.types import Kind, Plan, RegionPlan
from fissure.program.nodes import NodeKind
from fissure.program.graph import StreamGraph



@dataclass(frozen=True)
class GraphStage:
    """One Spark-side step: a pe stage (stateless nodes, one mapInArrow) or a keyed node.

    `replicas`: a pe stage that starts a plan region runs in this many partitions (its input is
    spread round-robin when that changes its partitioning); None: it runs where its input is.
    `boundaries`: the nodes whose input port starts a new process of the stage's PE (the first
    node of each of the plan's pipelines after the first)."""

    position: int  # 0-based, in execution order
    kind: str  # "pe" or "keyed"
    nodes: tuple[str, ...]  # in execution order
    replicas: int | None = None
    boundaries: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"pe{self.position}" if self.kind == "pe" else self.nodes[0]


def plan_graph_stages(graph: StreamGraph, plan: Plan | None = None) -> tuple[GraphStage, ...]:
    """The stages that run `plan` (default: the sequential plan), in execution order.

    The plan lists the graph's operators in execution order (`StreamGraph.names`); each keyed
    node becomes a stage of its own, and each run of stateless nodes that no keyed node or region
    boundary interrupts becomes one pe stage, cut into processes where the plan's pipelines start.
    Runs of the sequential plan are the graph's `execution_stages`: PE_0 K_1 PE_1 K_2 ..."""
    if plan is None:
        plan = Plan(regions=(RegionPlan(pipelines=(graph.names,)),), method="sequential")
    stages: list[GraphStage] = []
    for region in plan.regions:
        pipelines: list[list[str]] = []  # the stateless parts of the pipelines of the pending pe stage
        starts_region = True

        def close_pe_stage() -> None:
            nonlocal starts_region
            if pipelines:
                nodes = tuple(name for part in pipelines for name in part)
                stages.append(GraphStage(len(stages), "pe", nodes, region.replicas if starts_region else None,
                                         tuple(part[0] for part in pipelines[1:])))
                pipelines.clear()
            starts_region = False

        for names in region.pipelines:
            part: list[str] = []
            for name in names:
                if not graph.node(name).keyed:
                    part.append(name)
                    continue
                if part:
                    pipelines.append(part)
                    part = []
                close_pe_stage()
                stages.append(GraphStage(len(stages), "keyed", (name,)))
            if part:
                pipelines.append(part)
        close_pe_stage()
    return tuple(stages)


def state_partitions_of(program: StreamGraph | Pipeline, plan: Plan, default: int = 1) -> int:
    """State partitions of the query of any program: the most replicas of a region with a
    partitioned (keyed) operator, else `default` (Spark gives every stateful operator of a query
    the same number)."""
    keyed = [region.replicas for region in plan.regions
             if any(program.kind_of(name) is Kind.PARTITIONED for name in region.operators)]
    return max(keyed, default=default)


def pieces_for(graph: StreamGraph, nodes: Sequence[str], boundaries: Iterable[str]) -> tuple[tuple[str, ...], ...]:
    """A pe stage's nodes cut at the pipeline boundaries (operators whose input port starts a new
    process), as a chain of pieces in topological order. A boundary node opens a new piece; any
    other node runs in the latest piece of its inputs in this stage (the first if none is)."""
    cut = set(boundaries)
    piece_of: dict[str, int] = {}
    pieces: list[list[str]] = [[]]
    for name in nodes:
        if name in cut and pieces[-1]:
            pieces.append([])
            index = len(pieces) - 1
        elif name in cut:
            index = 0
        else:
            index = max((piece_of[source] for source in graph.node(name).inputs if source in piece_of), default=0)
        piece_of[name] = index
        pieces[index].append(name)
    return tuple(tuple(piece) for piece in pieces if piece)


def consumers_after(graph: StreamGraph, stream: str, done: set[str]) -> bool:
    """Whether a sink reads `stream`, or some operator that reads it is not in `done`."""
    return bool(graph.sinks_of(stream)) or any(consumer not in done for consumer in graph.consumers(stream))




def stream_lifetimes(graph: StreamGraph, stages: Sequence[GraphStage]) -> tuple[frozenset[str], ...]:
    """The streams whose rows a query carries between its stages: entry b (0 .. len(stages)) holds
    those live before stage b (entry 0: the sources; the last: the sinks' streams). A stream lives
    from the stage after the one that makes it until the last stage that reads it, or to the end
    when a sink reads it."""
    made_in = {name: -1 for name in graph.sources}
    made_in.update({name: stage.position for stage in stages for name in stage.nodes})
    end = len(stages)
    last_read = {stream: end if graph.sinks_of(stream) else max(made_in[consumer] for consumer in graph.consumers(stream))
                 for stream in made_in}
    return tuple(frozenset(stream for stream, made in made_in.items() if made < boundary <= last_read[stream])
                 for boundary in range(end + 1))




def fusion_runs(graph: StreamGraph, piece: Sequence[str]) -> list[list[str]]:
    """A piece's nodes (in order) grouped into runs to fuse: an operator joins the run of the node
    before it when it reads only that node's output and nothing else (no node, no sink) does."""
    runs: list[list[str]] = []
    for name in piece:
        node = graph.node(name)
        previous = runs[-1][-1] if runs else None
        if (previous is not None and node.kind is NodeKind.OPERATOR and node.inputs == (previous,)
                and graph.node(previous).kind is NodeKind.OPERATOR and graph.consumers(previous) == (name,) and not graph.sinks_of(previous)):
            runs[-1].append(name)
        else:
            runs.append([name])
    return runs


