"""Per-process profile of graph processing elements: what autopipelining needs (no pyspark here).

Each piece (one process of a graph PE) adds, per batch, every node's records, thread-CPU and wall
seconds and its own thread-CPU seconds into counters in an anonymous shared memory map (so a
forked child's counts reach the worker, as for fused stages in fissure.runtime.profiling.profiler). At the
end of every mapInArrow call `ProfiledGraphRegion` adds what changed, with the call's wall time,
to the task's `ProfileTally` (its `pieces`), which the run's one profile accumulator brings to
the driver with the task.

From the tally the driver computes, per thread t (a piece of a pe stage under one cut):
mu(t) = its CPU seconds / the wall seconds of the calls it ran in, and, per operator o of the
piece, mu(o, t) = the CPU seconds of o and every node downstream of o inside the piece / the
same wall seconds (fissure.profile.graph_profile); a node whose wall time is much longer than its CPU
time waits, and counts with its wall time. The calls a piece ran in say how many tasks share the cores.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator

from fissure.runtime.profiling.profiler import ProfileTally, attach_tally, shared_counters
from fissure.runtime.profiling.report_rows import reported_counts

NODE_FIELDS = ("records_in", "records_out", "cpu_s", "wall_s")
PIECE_FIELDS = ("batches", "cpu_s")


class PieceProfile:
    """The hot-path view of one piece's shared counters: nodes 0..n-1, then the piece."""

    def __init__(self, profile_id: str, nodes: tuple[str, ...]) -> None:
        self.profile_id = profile_id
        self.nodes = nodes
        self.piece_base = len(nodes) * len(NODE_FIELDS)
        self.counters = shared_counters("graph:" + profile_id, self.piece_base + len(PIECE_FIELDS))
        self.values = self.counters.values

    def node(self, index: int, records_in: int, records_out: int, cpu_s: float, wall_s: float = 0.0) -> None:
        base = index * len(NODE_FIELDS)
        self.values[base] += records_in
        self.values[base + 1] += records_out
        self.values[base + 2] += cpu_s
        self.values[base + 3] += wall_s

    def piece(self, cpu_s: float) -> None:
        self.values[self.piece_base] += 1
        self.values[self.piece_base + 1] += cpu_s

    def report(self, tally: ProfileTally, wall_s: float, idle_core_s: float = math.nan) -> None:
        now = self.counters.snapshot()
        delta = [current - before for current, before in zip(now, self.counters.reported)]
        self.counters.reported = now
        if not delta[self.piece_base]:
            return
        width = len(NODE_FIELDS)
        nodes = {name: delta[index * width:(index + 1) * width] for index, name in enumerate(self.nodes)}
        tally.add_piece(self.profile_id, delta[self.piece_base + 1], wall_s, nodes, 1, idle_core_s,
                        delta[self.piece_base])


def idle_core_s() -> float | None:
    """The machine's idle CPU seconds so far, summed over its cores (Linux /proc/stat: idle and
    iowait); None where unreadable. Its change over a call says how many cores stood free while
    the task ran, whatever took the others (this run's JVM, its Python workers, other programs)."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            fields = handle.readline().split()
        return (int(fields[4]) + int(fields[5])) / IDLE_TICKS_PER_S
    except (OSError, ValueError, IndexError):
        return None


try:
    IDLE_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
except (AttributeError, ValueError, OSError):
    IDLE_TICKS_PER_S = 100


class ProfiledGraphRegion:
    """Wraps a pe stage's mapInArrow function: binds its counters before the PE forks, times the
    call, and reports at its end into the task's ProfileTally: the fused operators' counts with
    the call's wall time (`operators`: the statistics every run shows, and the adaptive loop's
    input) and the pieces' node-by-node counts (`pieces`: for the autopipelining optimizer)."""

    def __init__(self, function: Callable[[Iterator], Iterator], accumulator, region_id: str = "", *,
                 operators: bool = True, pieces: bool = False) -> None:
        self.function = function
        self.accumulator = accumulator
        self.region_id = region_id
        self.operators = operators
        self.pieces = pieces

    def __call__(self, batches: Iterator) -> Iterator:
        pieces = self.function.pieces_for_call()
        piece_profiles = [piece.bind_profile() for piece in pieces] if self.pieces else []
        stage_profiles = [unit.stage.bind_profile() for piece in pieces for unit in piece.nodes
                          if unit.stage is not None] if self.operators else []
        # A function that emits a report row (GraphRegionFunction) leaves it to this wrapper,
        # which knows the call's counts only once the function is done.
        report_batch = getattr(self.function, "report_batch", None)
        started_s, idle_before_s = time.perf_counter(), idle_core_s() if piece_profiles else None
        yield from (self.function(batches, pieces) if report_batch is None
                    else self.function(batches, pieces, report=False))
        report = None
        try:
            wall_s = time.perf_counter() - started_s
            idle_after_s = idle_core_s() if idle_before_s is not None else None
            idle_s = idle_after_s - idle_before_s if idle_after_s is not None else math.nan  # NaN: unknown
            tally = attach_tally(self.accumulator)
            for profile in piece_profiles:
                if profile is not None:
                    profile.report(tally, wall_s, idle_s)
            operators = None
            if self.operators:
                tally.add_region_call(self.region_id, wall_s)
                call = ProfileTally()  # this call's counts: into the task's tally and the report row
                for profile in stage_profiles:
                    if profile is not None:
                        profile.report(call)
                tally.merge(call)
                operators = {name: reported_counts(values) for name, values in call.operators.items()}
            if report_batch is not None:
                report = report_batch(operators)
        except Exception:  # noqa: BLE001 - profiling must never fail a task
            pass
        if report is not None:
            yield report
