"""Per-process profile of graph processing elements: what autopipelining needs (no pyspark here).

Each piece (one process of a graph PE) adds, per batch, every node's records and thread-CPU
seconds and its own thread-CPU seconds into counters in an anonymous shared memory map (so a
forked child's counts reach the worker, as for fused stages in fissure.worker.profiling). At the
end of every mapInArrow call `ProfiledGraphRegion` adds what changed, with the call's wall time,
to the task's `GraphProfileTally`, which a Spark accumulator brings to the driver with the task.

From the tally the driver computes, per thread t (a piece of a pe stage under one cut):
mu(t) = its CPU seconds / the wall seconds of the calls it ran in, and, per operator o of the
piece, mu(o, t) = the CPU seconds of o and every node downstream of o inside the piece / the
same wall seconds (fissure.profile.graph_profile).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from fissure.worker.profiling import attach_tally, shared_counters

NODE_FIELDS = ("records_in", "records_out", "cpu_s")
PIECE_FIELDS = ("batches", "cpu_s")


class PieceProfile:
    """The hot-path view of one piece's shared counters: nodes 0..n-1, then the piece."""

    def __init__(self, profile_id: str, nodes: tuple[str, ...]) -> None:
        self.profile_id = profile_id
        self.nodes = nodes
        self.piece_base = len(nodes) * len(NODE_FIELDS)
        self.counters = shared_counters("graph:" + profile_id, self.piece_base + len(PIECE_FIELDS))
        self.values = self.counters.values

    def node(self, index: int, records_in: int, records_out: int, cpu_s: float) -> None:
        base = index * len(NODE_FIELDS)
        self.values[base] += records_in
        self.values[base + 1] += records_out
        self.values[base + 2] += cpu_s

    def piece(self, cpu_s: float) -> None:
        self.values[self.piece_base] += 1
        self.values[self.piece_base + 1] += cpu_s

    def report(self, tally: GraphProfileTally, wall_s: float) -> None:
        now = self.counters.snapshot()
        delta = [current - before for current, before in zip(now, self.counters.reported)]
        self.counters.reported = now
        if not delta[self.piece_base]:
            return
        width = len(NODE_FIELDS)
        nodes = {name: delta[index * width:(index + 1) * width] for index, name in enumerate(self.nodes)}
        tally.add_piece(self.profile_id, delta[self.piece_base + 1], wall_s, nodes)


class GraphProfileTally:
    """The accumulator's value: per piece id, [cpu_s, wall_s, {node: [records_in, records_out, cpu_s]}]."""

    def __init__(self, adopt: bool = False) -> None:
        self.pieces: dict[str, list[Any]] = {}
        self.adopt = adopt

    def add_piece(self, piece: str, cpu_s: float, wall_s: float, nodes: dict[str, Sequence[float]]) -> None:
        target = self.pieces.setdefault(piece, [0.0, 0.0, {}])
        target[0] += cpu_s
        target[1] += wall_s
        for name, values in nodes.items():
            counts = target[2].setdefault(name, [0.0] * len(NODE_FIELDS))
            for index, value in enumerate(values):
                counts[index] += value

    def merge(self, other: GraphProfileTally) -> None:
        for piece, (cpu_s, wall_s, nodes) in other.pieces.items():
            self.add_piece(piece, cpu_s, wall_s, nodes)

    def copy(self) -> GraphProfileTally:
        copied = GraphProfileTally()
        copied.merge(self)
        return copied

    def __getstate__(self):
        return {"pieces": self.pieces}

    def __setstate__(self, state) -> None:
        self.__init__()
        self.pieces = state["pieces"]


class GraphProfileTallyParam:
    """Spark AccumulatorParam (duck-typed) of a `GraphProfileTally`."""

    def zero(self, value: GraphProfileTally) -> GraphProfileTally:
        return GraphProfileTally()

    def addInPlace(self, value: GraphProfileTally, term: GraphProfileTally) -> GraphProfileTally:  # noqa: N802
        if term.adopt:
            term.adopt = False
            term.merge(value)
            return term
        value.merge(term)
        return value


def attach_graph_tally(accumulator) -> GraphProfileTally:
    tally = getattr(accumulator, "_fissure_graph_tally", None)
    if tally is None:
        tally = GraphProfileTally(adopt=True)
        accumulator.add(tally)
        accumulator._fissure_graph_tally = tally
    return tally


class ProfiledGraphRegion:
    """Wraps a graph pe stage's mapInArrow function: binds its counters before the PE forks, times
    the call, and reports at its end: the pieces' node-by-node counts to the task's
    GraphProfileTally (`accumulator`: for the autopipelining optimizer) and the fused operators'
    counts with the call's wall time to its ProfileTally (`stage_accumulator`: the operators'
    statistics every run shows, and the adaptive loop's input)."""

    def __init__(self, function: Callable[[Iterator], Iterator], accumulator=None, stage_accumulator=None,
                 region_id: str = "") -> None:
        self.function = function
        self.accumulator = accumulator
        self.stage_accumulator = stage_accumulator
        self.region_id = region_id

    def __call__(self, batches: Iterator) -> Iterator:
        pieces = self.function.pieces_for_call()
        profiles = [piece.bind_profile() for piece in pieces] if self.accumulator is not None else []
        stages = [unit.stage.bind_profile() for piece in pieces for unit in piece.nodes
                  if unit.stage is not None] if self.stage_accumulator is not None else []
        started_s = time.perf_counter()
        yield from self.function(batches, pieces)
        try:
            wall_s = time.perf_counter() - started_s
            if self.accumulator is not None:
                tally = attach_graph_tally(self.accumulator)
                for profile in profiles:
                    if profile is not None:
                        profile.report(tally, wall_s)
            if self.stage_accumulator is not None:
                stage_tally = attach_tally(self.stage_accumulator)
                stage_tally.add_region_call(self.region_id, wall_s)
                for profile in stages:
                    if profile is not None:
                        profile.report(stage_tally)
        except Exception:  # noqa: BLE001 - profiling must never fail a task
            pass
