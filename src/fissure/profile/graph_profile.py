"""Graph PE profiles as the autopipelining optimizer's input (pure: no Spark, no clock).

A thread t is one piece (one process) of a graph pe stage under the cut it ran with; its piece
id is `prefix/stage/cut/pN` (fissure.compile.pieces.build_pieces). From the summed counts of
a window of micro-batches:
- mu(t) = the seconds the piece was occupied / the wall seconds of the mapInArrow calls it ran in:
  its thread-CPU seconds, plus the waiting of every node that waits (fissure.control.cut_forecast:
  declared `waits="io"`, or wall time >= 2 x CPU time beyond the stretch of the operators that
  compute beside it), since a process blocked in a node can do nothing else;
- mu(o, t) = the occupied seconds of operator o and of every node downstream of o inside the
  piece, over the same wall seconds (the paper's "o and everything downstream of it", within t).
On CPU-bound operators both are the CPU shares the paper profiles. `task_timings` gives the same
window as the cut forecast's input (wall and CPU per node, tasks per batch).
The first node of a pe stage gets no port: a boundary there would cut nothing off (the stage's
first process would be left with no node; fissure.compile.stages.pieces_for).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from fissure.control.cut_forecast import NodeTiming, PieceTiming, TaskTiming, compute_stretch
from fissure.plan.autopipeline import AutopipelineProfile, ThreadProfile
from fissure.program.graph import StreamGraph


# Ends the profile prefix of pieces counted per fused run rather than node by node (the loop's
# screening): their counts name a run by its last operator, so the optimizer must not read them.
RUNS_MARK = "~runs"


@dataclass(frozen=True)
class PieceMeasurement:
    """One piece's counts over a window (from a ProfileTally's `pieces` entry)."""

    piece_id: str
    cpu_s: float
    wall_s: float
    node_cpu_s: Mapping[str, float]
    node_records_in: Mapping[str, float]
    node_wall_s: Mapping[str, float] = field(default_factory=dict)  # absent: as its CPU seconds
    calls: float = 0.0  # the mapInArrow calls (tasks) it ran in
    idle_core_s: float = math.nan  # the machine's idle CPU seconds during those calls (NaN: unknown)
    arrow_batches: float = 0.0  # the Arrow batches it ran (0: unknown)

    @property
    def thread_name(self) -> str:
        return self.piece_id.split("/", 1)[1] if "/" in self.piece_id else self.piece_id

    @property
    def operators(self) -> tuple[str, ...]:
        """Every operator the piece runs, from its id (`stage/cut/pN`, the cut's pieces joined by
        "|", a piece's operators by ","; fissure.compile.pieces.build_pieces); counted per fused
        run, its counts name only each run's last one. Its counted nodes when the id has no cut."""
        stage_and_cut, _, number = self.thread_name.rpartition("/")
        pieces = stage_and_cut.rpartition("/")[2].split("|")
        if number[:1] == "p" and number[1:].isdigit() and int(number[1:]) < len(pieces):
            return tuple(pieces[int(number[1:])].split(","))
        return tuple(self.node_cpu_s)

    @property
    def by_runs(self) -> bool:
        """Counted per fused run (the screening), not node by node."""
        return self.piece_id.split("/", 1)[0].endswith(RUNS_MARK)

    def node_timing(self, graph: StreamGraph, node: str, stretch: float = 1.0) -> NodeTiming:
        cpu_s = self.node_cpu_s[node]
        return NodeTiming(cpu_s, self.node_wall_s.get(node, cpu_s), declared_waits(graph, node), stretch)


def declared_waits(graph: StreamGraph, node: str) -> str | None:
    operator = graph.node(node).operator if node in graph.names else None
    waits = operator.hints.waits if operator is not None else None
    return waits.value if waits is not None else None


def window_stretch(graph: StreamGraph, measurements: Iterable[PieceMeasurement]) -> float:
    """How much a machine short of cores stretched the window's computing operators (wall over CPU
    time; fissure.control.cut_forecast.compute_stretch), so that only what waits beyond it counts as waiting."""
    return compute_stretch((piece.node_cpu_s[node], piece.node_wall_s.get(node, piece.node_cpu_s[node]),
                            declared_waits(graph, node), piece.wall_s)
                           for piece in measurements if piece.wall_s > 0 for node in piece.node_cpu_s)


def piece_measurements(pieces: Mapping[str, list]) -> list[PieceMeasurement]:
    """A tally's `pieces` mapping (id -> [cpu_s, wall_s, {node: [records_in, records_out, cpu_s, wall_s]},
    calls, idle_core_s, arrow_batches])."""
    return [PieceMeasurement(piece_id, float(values[0]), float(values[1]),
                             {node: float(counts[2]) for node, counts in values[2].items()},
                             {node: float(counts[0]) for node, counts in values[2].items()},
                             {node: float(counts[3]) for node, counts in values[2].items() if len(counts) > 3},
                             float(values[3]) if len(values) > 3 else 0.0,
                             float(values[4]) if len(values) > 4 else math.nan,
                             float(values[5]) if len(values) > 5 else 0.0)
            for piece_id, values in sorted(pieces.items())]


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
    measurements = list(measurements)
    stretch = window_stretch(graph, measurements)
    threads = []
    for piece in measurements:
        if piece.wall_s <= 0:
            continue
        members = set(piece.node_cpu_s)
        timings = {node: piece.node_timing(graph, node, stretch) for node in members}
        waiting_s = sum(timing.occupied_s - max(timing.cpu_s, 0.0) for timing in timings.values())
        utilization = _fraction((piece.cpu_s + waiting_s) / piece.wall_s)
        ports = {}
        for node in sorted(members - no_port):
            downstream_s = sum(timings[name].occupied_s for name in _downstream_in_piece(graph, node, members))
            ports[node] = min(utilization, _fraction(downstream_s / piece.wall_s))
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


def task_timings(graph: StreamGraph, measurements: Iterable[PieceMeasurement], *, batches: int, cores: int,
                 stage_first_nodes: Iterable[str] = (),
                 chunk_count: Callable[[int, int], int] | None = None,
                 batch_wall_s: float | None = None) -> tuple[TaskTiming, ...]:
    """The cut forecast's input (fissure.control.cut_forecast): the measured pieces grouped by
    stage and cut (`pe0/<cut>`), each piece's nodes timed, and the ports a cut could open in it
    (not a stage's first node: see the module docstring). `batches`: the micro-batches of the window;
    `chunk_count(rows, pipelines)`: the chunks the processing element cuts an Arrow batch of `rows`
    into for that many processes (None: none, a call's Arrow batches are its chunks); `batch_wall_s`:
    the window's micro-batches' summed wall time, of which a stage's calls take their share."""
    no_port = set(stage_first_nodes)
    measurements = list(measurements)
    stretch = window_stretch(graph, measurements)
    groups: dict[str, list[PieceMeasurement]] = {}
    for piece in measurements:
        if piece.wall_s > 0:
            groups.setdefault(piece.thread_name.rsplit("/", 1)[0], []).append(piece)
    tasks = []
    for _, pieces in sorted(groups.items()):
        timed = []
        for piece in pieces:
            members = set(piece.node_cpu_s)
            below = {node: frozenset(_downstream_in_piece(graph, node, members)) for node in sorted(members - no_port)}
            operators = set(piece.operators)
            cuttable = any(consumer in operators and consumer not in no_port
                           for name in operators if name in graph.names for consumer in graph.consumers(name))
            timed.append(PieceTiming(piece.thread_name, piece.thread_name.endswith("/p0"), piece.cpu_s,
                                     {node: piece.node_timing(graph, node, stretch) for node in sorted(members)},
                                     below, cuttable))
        first = next((piece for piece in pieces if piece.thread_name.endswith("/p0")), pieces[0])
        idle_cores = first.idle_core_s / first.wall_s if math.isfinite(first.idle_core_s) else None
        chunks = None
        if first.calls and first.arrow_batches:
            rows = max(first.node_records_in.values(), default=0.0) / first.arrow_batches
            per_batch = chunk_count(max(1, round(rows)), len(pieces) + 1) if chunk_count is not None else 1
            chunks = first.arrow_batches / first.calls * per_batch
        running = min(float(cores), max(1.0, first.calls / max(1, batches)))
        batch_share = min(1.0, first.wall_s / running / batch_wall_s) if batch_wall_s else None
        tasks.append(TaskTiming(tuple(timed), first.wall_s, first.calls / max(1, batches), cores, idle_cores, chunks,
                                batch_share))
    return tuple(tasks)
