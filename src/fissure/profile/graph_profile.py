"""Graph PE profiles as the autopipelining optimizer's input (pure: no Spark, no clock).

A thread t is one piece (one process) of a graph pe stage under the cut it ran with; its piece
id is `prefix/stage/cut/pN` (fissure.compile.pieces.build_pieces). From the summed counts of
a window of micro-batches:
- mu(t) = the piece's thread-CPU seconds / the wall seconds of the mapInArrow calls it ran in;
- mu(o, t) = the CPU seconds of operator o and of every node downstream of o inside the piece,
  over the same wall seconds (the paper's "o and everything downstream of it", within t).
The first node of a pe stage gets no port: a boundary there would cut nothing off (the stage's
first process would be left with no node; fissure.compile.stages.pieces_for).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fissure.plan.autopipeline import AutopipelineProfile, ThreadProfile
from fissure.program.graph import StreamGraph


@dataclass(frozen=True)
class PieceMeasurement:
    """One piece's counts over a window (from a ProfileTally's `pieces` entry)."""

    piece_id: str
    cpu_s: float
    wall_s: float
    node_cpu_s: Mapping[str, float]
    node_records_in: Mapping[str, float]

    @property
    def thread_name(self) -> str:
        return self.piece_id.split("/", 1)[1] if "/" in self.piece_id else self.piece_id


def piece_measurements(pieces: Mapping[str, list]) -> list[PieceMeasurement]:
    """A tally's `pieces` mapping (id -> [cpu_s, wall_s, {node: [records_in, records_out, cpu_s]}])."""
    return [PieceMeasurement(piece_id, float(cpu_s), float(wall_s),
                             {node: float(values[2]) for node, values in nodes.items()},
                             {node: float(values[0]) for node, values in nodes.items()})
            for piece_id, (cpu_s, wall_s, nodes) in sorted(pieces.items())]


def _downstream_in_piece(graph: StreamGraph, node: str, members: set[str]) -> set[str]:
    reached, frontier = {node}, [node]
    while frontier:
        for consumer in graph.consumers(frontier.pop()):
            if consumer in members and consumer not in reached:
                reached.add(consumer)
                frontier.append(consumer)
    return reached


def _fraction(value: float) -> float:
    return min(1.0, max(0.0, value)) if not math.isnan(value) else value


def autopipeline_profile(graph: StreamGraph, measurements: Iterable[PieceMeasurement], *,
                         stage_first_nodes: Iterable[str] = (), beta: float = 0.8,
                         blacklist: Iterable[str] = ()) -> AutopipelineProfile:
    """The optimizer's profile of the measured pieces (those with wall time). `stage_first_nodes`:
    the first node of every pe stage (no port: see the module docstring)."""
    no_port = set(stage_first_nodes)
    threads = []
    for piece in measurements:
        if piece.wall_s <= 0:
            continue
        members = set(piece.node_cpu_s)
        utilization = _fraction(piece.cpu_s / piece.wall_s)
        ports = {}
        for node in sorted(members - no_port):
            downstream_cpu_s = sum(piece.node_cpu_s[name] for name in _downstream_in_piece(graph, node, members))
            ports[node] = min(utilization, _fraction(downstream_cpu_s / piece.wall_s))
        threads.append(ThreadProfile(piece.thread_name, utilization, ports))
    if not threads:
        raise ValueError("no graph PE piece was measured; run some micro-batches with profiling on first")
    return AutopipelineProfile(tuple(threads), beta, frozenset(blacklist))


def profile_json(profile: AutopipelineProfile) -> dict:
    """The PROFILE.json form `python -m fissure autopipeline` reads."""
    return {"beta": profile.beta, "blacklist": sorted(profile.blacklisted_ports),
            "threads": {thread.name: {"utilization": thread.utilization, "ports": dict(thread.port_utilization)}
                        for thread in profile.threads}}


def port_throughput_per_s(measurements: Iterable[PieceMeasurement], wall_s: float) -> dict[str, float]:
    """Records into each operator per second of micro-batch wall time (the control stage's
    throughput of a port); NaN without wall time."""
    totals: dict[str, float] = {}
    for piece in measurements:
        for node, records in piece.node_records_in.items():
            totals[node] = totals.get(node, 0.0) + records
    return {node: records / wall_s if wall_s > 0 else math.nan for node, records in totals.items()}
