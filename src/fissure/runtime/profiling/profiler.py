"""The in-worker profiler: exact counts, sampled timings, shipped to the driver with each task.

Channel: a Spark accumulator. Every profiled Python function Spark ships (a pe stage's function,
fissure.runtime.profiling.pieces.ProfiledGraphRegion; a stateful operator's update) holds the query's accumulator; in a task it attaches one live
`ProfileTally` to it and the hot path mutates plain lists in that tally. PySpark sends every
accumulator's value back with the task's result and merges it into the driver's copy before the
task counts as done, so the driver reads a micro-batch's statistics right after the batch's
`foreachBatch` action: no extra Spark job, no extra column or row through the stages, nothing
lost on empty outputs, and only successful tasks count (Spark drops failed attempts' updates).
(Spark's own progress reports get a copy of the operators' counts through report rows instead:
fissure.runtime.profiling.report_rows, fissure.spark.query.observed_metrics.)

Forked PE children: a PE pipeline other than the first runs in a child process forked by the
worker, whose memory is a copy. Fused stages therefore keep their counters in an anonymous
*shared* memory map, allocated in the worker before the PE forks (`ProfiledGraphRegion` binds
every stage first) and registered per stage id, so later tasks' fresh copies of a stage find the
same counters; at the end of each call `ProfiledGraphRegion` adds what changed since the last
report to the task's tally. The children have finished every batch of the call by then (the PE's end-of-call
marker came back), so the counts are complete.

Cost: counting is per Arrow batch (len of lists), never per record, for fused operators; timing
is two clock reads (wall, thread CPU) per operator per *timed* batch (every `timed_every`-th);
stateful operators, called per record, count per record and time every `timed_every`-th record.
No pyspark import here: the accumulator is duck-typed (`add`).
"""

from __future__ import annotations

import mmap
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from fissure.profile.records import OperatorCounts, PipelineCounts, RegionCallCounts
from fissure.runtime.records.fate import normalize_emitted

# Field order of the mutable per-operator and per-pipeline tallies (hot path: plain lists).
OPERATOR_FIELDS = ("calls", "records_in", "records_out", "dead_letters", "timed_calls", "timed_records_in",
                   "timed_cpu_s", "timed_wall_s", "key_groups", "partials", "combine_groups")
PIPELINE_FIELDS = ("batches", "records_in", "timed_batches", "timed_records_in", "timed_wall_s",
                   "timed_overhead_wall_s")
(CALLS, RECORDS_IN, RECORDS_OUT, DEAD_LETTERS, TIMED_CALLS, TIMED_RECORDS_IN, TIMED_CPU_S,
 TIMED_WALL_S, KEY_GROUPS, PARTIALS, COMBINE_GROUPS) = range(len(OPERATOR_FIELDS))
(P_BATCHES, P_RECORDS_IN, P_TIMED_BATCHES, P_TIMED_RECORDS_IN, P_TIMED_WALL_S,
 P_TIMED_OVERHEAD_WALL_S) = range(len(PIPELINE_FIELDS))
_INTEGER_OPERATOR_FIELDS = {"calls", "records_in", "records_out", "dead_letters", "timed_calls", "timed_records_in",
                            "key_groups", "partials", "combine_groups"}
_INTEGER_PIPELINE_FIELDS = {"batches", "records_in", "timed_batches", "timed_records_in"}

wall_clock = time.perf_counter
cpu_clock = time.thread_time  # this thread only: Spark's worker may run a reader thread beside it


class ProfileTally:
    """The accumulator's value: per operator, pipeline and region, additive tallies; and per
    piece of a graph PE (fissure.runtime.profiling.pieces), what autopipelining reads:
    `pieces[id] = [cpu_s, wall_s, {node: [records_in, records_out, cpu_s, wall_s]}, calls, idle_core_s,
    arrow_batches]` (idle_core_s: the machine's idle CPU seconds during the calls).

    `adopt` marks a task's fresh live tally: `ProfileTallyParam.addInPlace` then makes it the
    accumulator's value (merging whatever was there into it), so the hot path's later mutations
    are what the task sends back.
    """

    def __init__(self, adopt: bool = False) -> None:
        self.operators: dict[str, list[float]] = {}
        self.pipelines: dict[str, list[Any]] = {}  # values + [operators tuple] at the end
        self.regions: dict[str, list[float]] = {}  # [calls, wall_s]
        self.pieces: dict[str, list[Any]] = {}
        self.adopt = adopt

    # -- hot path -----------------------------------------------------------------------------
    def operator_values(self, operator: str) -> list[float]:
        values = self.operators.get(operator)
        if values is None:
            values = self.operators[operator] = [0] * len(OPERATOR_FIELDS)
        return values

    def add_operator(self, operator: str, values: Sequence[float]) -> None:
        target = self.operator_values(operator)
        for index, value in enumerate(values):
            target[index] += value

    def add_pipeline(self, pipeline: str, operators: tuple[str, ...], values: Sequence[float]) -> None:
        target = self.pipelines.get(pipeline)
        if target is None:
            target = self.pipelines[pipeline] = [0] * len(PIPELINE_FIELDS) + [operators]
        for index, value in enumerate(values):
            target[index] += value

    def add_region_call(self, region: str, wall_s: float) -> None:
        target = self.regions.setdefault(region, [0, 0.0])
        target[0] += 1
        target[1] += wall_s

    def add_piece(self, piece: str, cpu_s: float, wall_s: float, nodes: dict[str, Sequence[float]],
                  calls: int = 1, idle_core_s: float = math.nan, arrow_batches: int = 0) -> None:
        target = self.pieces.setdefault(piece, [0.0, 0.0, {}, 0, 0.0, 0])
        target[0] += cpu_s
        target[1] += wall_s
        target[3] += calls
        target[4] += idle_core_s
        target[5] += arrow_batches
        for name, values in nodes.items():
            counts = target[2].setdefault(name, [0.0] * len(values))
            for index, value in enumerate(values):
                counts[index] += value

    # -- merging and reading ------------------------------------------------------------------
    def merge(self, other: ProfileTally) -> None:
        for name, values in other.operators.items():
            self.add_operator(name, values)
        for name, values in other.pipelines.items():
            self.add_pipeline(name, values[-1], values[:-1])
        for name, (calls, wall_s) in other.regions.items():
            target = self.regions.setdefault(name, [0, 0.0])
            target[0] += calls
            target[1] += wall_s
        for piece, (cpu_s, wall_s, nodes, *counts) in other.pieces.items():
            self.add_piece(piece, cpu_s, wall_s, nodes, *counts)

    def copy(self) -> ProfileTally:
        copied = ProfileTally()
        copied.merge(self)
        return copied

    def minus(self, earlier: ProfileTally) -> ProfileTally:
        """What was added since `earlier` (a copy of this tally taken before)."""
        delta = ProfileTally()
        for name, values in self.operators.items():
            before = earlier.operators.get(name, [0] * len(values))
            delta.add_operator(name, [now - then for now, then in zip(values, before)])
        for name, values in self.pipelines.items():
            before = earlier.pipelines.get(name, [0] * (len(values) - 1))
            delta.add_pipeline(name, values[-1], [now - then for now, then in zip(values[:-1], before)])
        for name, (calls, wall_s) in self.regions.items():
            then_calls, then_wall_s = earlier.regions.get(name, (0, 0.0))
            delta.regions[name] = [calls - then_calls, wall_s - then_wall_s]
        for piece, (cpu_s, wall_s, nodes, *counts) in self.pieces.items():
            then = earlier.pieces.get(piece, [0.0, 0.0, {}, 0, 0.0, 0])
            if cpu_s - then[0] > 0 or wall_s - then[1] > 0:
                delta.add_piece(piece, cpu_s - then[0], wall_s - then[1], {
                    name: [now - before for now, before in zip(values, then[2].get(name, [0.0] * len(values)))]
                    for name, values in nodes.items()}, *(now - before for now, before in zip(counts, then[3:])))
        return delta

    @property
    def empty(self) -> bool:
        return not (self.operators or self.pipelines or self.regions or self.pieces)

    def operator_counts(self) -> tuple[OperatorCounts, ...]:
        return tuple(OperatorCounts(name, **{field: int(value) if field in _INTEGER_OPERATOR_FIELDS else float(value)
                                             for field, value in zip(OPERATOR_FIELDS, values)})
                     for name, values in self.operators.items() if values[RECORDS_IN] or values[CALLS])

    def pipeline_counts(self) -> tuple[PipelineCounts, ...]:
        return tuple(PipelineCounts(name, tuple(values[-1]),
                                    **{field: int(value) if field in _INTEGER_PIPELINE_FIELDS else float(value)
                                       for field, value in zip(PIPELINE_FIELDS, values[:-1])})
                     for name, values in self.pipelines.items() if values[P_BATCHES])

    def region_counts(self) -> tuple[RegionCallCounts, ...]:
        return tuple(RegionCallCounts(name, int(calls), float(wall_s))
                     for name, (calls, wall_s) in self.regions.items() if calls)

    def __getstate__(self):
        return {"operators": self.operators, "pipelines": self.pipelines, "regions": self.regions,
                "pieces": self.pieces}

    def __setstate__(self, state) -> None:
        self.__init__()
        self.operators, self.pipelines, self.regions = state["operators"], state["pipelines"], state["regions"]
        self.pieces = state["pieces"]


class ProfileTallyParam:
    """Spark AccumulatorParam (duck-typed) of a `ProfileTally`."""

    def zero(self, value: ProfileTally) -> ProfileTally:
        return ProfileTally()

    def addInPlace(self, value: ProfileTally, term: ProfileTally) -> ProfileTally:  # noqa: N802 - Spark's name
        if term.adopt:  # a task's live tally becomes the value; what was there is folded in
            term.adopt = False
            term.merge(value)
            return term
        value.merge(term)
        return value


def attach_tally(accumulator) -> ProfileTally:
    """The live tally of this task for `accumulator` (made and attached on first use)."""
    tally = getattr(accumulator, "_fissure_tally", None)
    if tally is None:
        tally = ProfileTally(adopt=True)
        accumulator.add(tally)
        accumulator._fissure_tally = tally
    return tally


# -- shared counters of fused stages ----------------------------------------------------------


class SharedCounters:
    """float64 counters in an anonymous shared memory map: visible across fork()."""

    def __init__(self, count: int) -> None:
        self._map = mmap.mmap(-1, max(1, count) * 8)  # MAP_SHARED | MAP_ANONYMOUS
        self.values = memoryview(self._map).cast("d")
        self.reported = [0.0] * count  # what the last report covered (read in the worker only)

    def snapshot(self) -> list[float]:
        return self.values.tolist()


MAX_REGISTERED_STAGES = 256
_REGISTRY: OrderedDict[str, SharedCounters] = OrderedDict()


def shared_counters(stage_id: str, count: int) -> SharedCounters:
    """The counters of the fused stage `stage_id` in this worker (allocated on first use)."""
    counters = _REGISTRY.get(stage_id)
    if counters is None or len(counters.reported) != count:
        counters = _REGISTRY[stage_id] = SharedCounters(count)
        while len(_REGISTRY) > MAX_REGISTERED_STAGES:
            _REGISTRY.popitem(last=False)
    else:
        _REGISTRY.move_to_end(stage_id)
    return counters


class StageProfile:
    """The hot-path view of one fused stage's shared counters: operators 0..n-1, then the pipeline."""

    def __init__(self, stage_id: str, operators: tuple[str, ...], timed_every: int, label: str | None = None) -> None:
        self.stage_id = stage_id
        self.label = label or stage_id
        self.operators = operators
        self.timed_every = timed_every
        width = len(OPERATOR_FIELDS)
        self.pipeline_base = len(operators) * width
        self.counters = shared_counters(stage_id, self.pipeline_base + len(PIPELINE_FIELDS))
        self.values = self.counters.values

    def begin_batch(self, records_in: int) -> bool:
        """Count a batch entering the stage; True when this one is to be timed."""
        values, base = self.values, self.pipeline_base
        values[base + P_BATCHES] += 1
        values[base + P_RECORDS_IN] += records_in
        if int(values[base + P_BATCHES]) % self.timed_every:
            return False
        values[base + P_TIMED_BATCHES] += 1
        values[base + P_TIMED_RECORDS_IN] += records_in
        return True

    def end_batch(self, wall_s: float, operators_wall_s: float) -> None:
        values, base = self.values, self.pipeline_base
        values[base + P_TIMED_WALL_S] += wall_s
        values[base + P_TIMED_OVERHEAD_WALL_S] += max(0.0, wall_s - operators_wall_s)

    def operator(self, index: int, records_in: int, records_out: int, dead_letters: int,
                 cpu_s: float | None = None, wall_s: float | None = None) -> None:
        """Count one call of operator `index`; with `cpu_s` and `wall_s`, a timed one."""
        if not records_in:
            return
        base = index * len(OPERATOR_FIELDS)
        values = self.values
        values[base + CALLS] += 1
        values[base + RECORDS_IN] += records_in
        values[base + RECORDS_OUT] += records_out
        values[base + DEAD_LETTERS] += dead_letters
        if cpu_s is not None and wall_s is not None:
            values[base + TIMED_CALLS] += 1
            values[base + TIMED_RECORDS_IN] += records_in
            values[base + TIMED_CPU_S] += cpu_s
            values[base + TIMED_WALL_S] += wall_s

    def report(self, tally: ProfileTally) -> None:
        """Add what changed since the last report to `tally` (in the worker, after a call)."""
        now = self.counters.snapshot()
        delta = [current - before for current, before in zip(now, self.counters.reported)]
        self.counters.reported = now
        width = len(OPERATOR_FIELDS)
        for index, name in enumerate(self.operators):
            values = delta[index * width:(index + 1) * width]
            if values[CALLS]:
                tally.add_operator(name, values)
        pipeline = delta[self.pipeline_base:]
        if pipeline[P_BATCHES]:
            tally.add_pipeline(self.label, self.operators, pipeline)


class ProfiledUpdate:
    """Wraps a stateful operator's `fn(state, record)`: counts per record (and key groups),
    times every n-th record, and writes into the task's live tally. Behaves like `fn`: the same
    records, the same exceptions. Hot path: a few list increments and type checks per record;
    a timed record adds two thread-CPU clock reads (a system call, about a microsecond here)."""

    def __init__(self, fn: Callable[[Any, dict], Any], operator: str, accumulator, timed_every: int = 32) -> None:
        self.fn = fn
        self.operator = operator
        self.accumulator = accumulator
        self.timed_every = timed_every
        self._values: list[float] | None = None
        self._last_state: Any = None

    def __getstate__(self):
        return {"fn": self.fn, "operator": self.operator, "accumulator": self.accumulator,
                "timed_every": self.timed_every}

    def __setstate__(self, state) -> None:
        self.__init__(**state)

    def live_counts(self) -> list[float]:
        """The operator's counts in this task's live tally (OPERATOR_FIELDS order), as they grow."""
        if self._values is None:
            self._values = attach_tally(self.accumulator).operator_values(self.operator)
        return self._values

    def __call__(self, state: Any, record: dict) -> Any:
        values = self._values
        if values is None:
            values = self.live_counts()
        if state is not self._last_state:
            self._last_state = state
            values[CALLS] += 1
            values[KEY_GROUPS] += 1
        values[RECORDS_IN] += 1
        try:
            if values[RECORDS_IN] % self.timed_every:
                emitted = self.fn(state, record)
            else:
                emitted = self._timed(values, state, record)
        except Exception:
            values[DEAD_LETTERS] += 1
            raise
        if emitted is None:
            return emitted
        kind = type(emitted)
        if kind is dict:
            values[RECORDS_OUT] += 1
            return emitted
        if kind is not list:
            emitted = normalize_emitted(emitted)
        values[RECORDS_OUT] += len(emitted)
        return emitted

    def _timed(self, values: list[float], state: Any, record: dict) -> Any:
        cpu_started_s, wall_started_s = cpu_clock(), wall_clock()
        try:
            return self.fn(state, record)
        finally:
            values[TIMED_WALL_S] += wall_clock() - wall_started_s
            values[TIMED_CPU_S] += cpu_clock() - cpu_started_s
            values[TIMED_CALLS] += 1
            values[TIMED_RECORDS_IN] += 1


class ProfiledKeyFunction(ProfiledUpdate):
    """Wraps a per-key step's `fn(state, records, seqs, time) -> KeyEmitted` (windows,
    aggregates, deduplication, expiry: fissure.runtime.operators.timed): per call, the key's records in, the
    records it emitted and its dead letters (late records, records without event time); every
    `timed_every`-th call is timed. A call for a key due without records counts as a call with
    none in: its output still counts, so selectivity is the operator's output per record in."""

    def __call__(self, state: Any, records: list, seqs: list[int], time: Any) -> Any:
        values = self._values
        if values is None:
            values = self.live_counts()
        values[CALLS] += 1
        values[KEY_GROUPS] += 1
        # a combined operator's partials stand for the records the tasks folded (fissure.runtime.operators.combine)
        if hasattr(self.fn, "records_of"):
            records_in = self.fn.records_of(records)
            values[PARTIALS] += len(records)
            values[COMBINE_GROUPS] += self.fn.groups_of(records)
        else:
            records_in = len(records)
        values[RECORDS_IN] += records_in
        if hasattr(self.fn, "dead_of"):
            values[DEAD_LETTERS] += self.fn.dead_of(records)
        if values[CALLS] % self.timed_every:
            emitted = self.fn(state, records, seqs, time)
        else:
            cpu_started_s, wall_started_s = cpu_clock(), wall_clock()
            try:
                emitted = self.fn(state, records, seqs, time)
            finally:
                values[TIMED_WALL_S] += wall_clock() - wall_started_s
                values[TIMED_CPU_S] += cpu_clock() - cpu_started_s
                values[TIMED_CALLS] += 1
                values[TIMED_RECORDS_IN] += records_in
                if hasattr(self.fn, "fold_cpu_of"):  # the fold in the stage before is part of the work
                    fold_s = self.fn.fold_cpu_of(records)
                    values[TIMED_CPU_S] += fold_s
                    values[TIMED_WALL_S] += fold_s
        values[RECORDS_OUT] += len(emitted.records)
        values[DEAD_LETTERS] += len(emitted.dead)
        return emitted
