"""Fusion: a list of operators turned into one picklable `RecordBatch -> RecordBatch` stage.

Runs inside a Spark Python worker (or a process the PE forks): no pyspark import, cheap per
record. Consecutive per-record operators run record by record on Python dicts, with one
Arrow -> dicts conversion before them and one dicts -> Arrow conversion after them; a per-batch
operator gets the batch itself. A record an operator raises on (or a record that does not fit the
declared schema: fissure.runtime.records.carried) becomes a dead-letter row carrying the
operator's name, the exception and the record; the rest of the batch goes on.

Per-record operators run step by step over a chunk of the batch's rows (all its records through
the first operator, then the survivors through the next; chunk after chunk), which gives the
same records in the same order as running each record through the chain, and lets the profiler
(fissure.runtime.profiling.profiler) count every operator's records in and out per chunk with
`len`, and time an operator per chunk with two clock reads, instead of per record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from fissure.runtime.profiling.profiler import StageProfile
from fissure.runtime.records.arrow_rows import batch_records, column_values
from fissure.runtime.records.carried import (assemble, conform, dead_letter_batch, live_batch, records_to_batch,
                                             reshape_dead, split_dead)
from fissure.runtime.records.columns import SEQ, carried_schema
from fissure.runtime.records.gc_pause import collector_paused
from fissure.runtime.records.fate import (DeadLetter, flat_map_emitted, mark_idle, mark_running, record_failed,
                                          operator_stopped)


RECORD_ACTIONS = ("map", "filter", "flat_map")
BATCH_ACTIONS = ("map_batches", "filter_batches")

# Input rows a run of per-record steps takes at a time. Over a whole Arrow batch (10,000 rows),
# each step's records are too many for the processor's caches, and every later pass over them
# (the next step, the checks before Arrow, the fold) misses. In process
# (benchmarks/worker_cpu.py, CPU a line): the word count's pe stage (12 words a line) 8.4 us over
# whole batches, 6.3 over chunks of 1,000 lines (6.6 of 300, 6.7 of 2,000); LogWatch's first pe
# stage 4.2 against 3.9 (3.8 of 2,000). On Spark the aggregate word count ran 1.11-1.16x its rate
# over whole batches (docs/profiling.md, "Where records stay columnar").
RECORD_CHUNK_ROWS = 1_000


@dataclass(frozen=True)
class Step:
    """One stateless operator as the worker runs it."""

    name: str
    action: str  # one of RECORD_ACTIONS or BATCH_ACTIONS
    fn: Callable
    output_schema: pa.Schema  # the user's fields after this step
    batch_format: str | None = None  # "arrow" or "pandas", per-batch steps only
    # Per-record steps that wait run on elastic threads: a fissure.runtime.elastic.stage.WaitingOperator
    # (`engaged()`, `run(step, records, seqs, dead)`), which builds on this module.
    waiting: object | None = None

    def __post_init__(self) -> None:
        if self.action not in RECORD_ACTIONS + BATCH_ACTIONS:
            raise ValueError(f"step {self.name!r}: unknown action {self.action!r}")



StepObserver = Callable[[int, int, int, int, float, float], None]


def run_record_steps(steps: Sequence[Step], records: Sequence[dict], seqs: Sequence[int],
                     dead: list[DeadLetter], observe: StepObserver | None = None,
                     timed: bool = False) -> tuple[list, list[int]]:
    """Run per-record steps over `records`; returns the emitted records and their sequence numbers.

    `observe(step index, records in, records out, dead letters, cpu_s, wall_s)` is called once per
    step that received records; the times are measured only when `timed` (else 0).
    """
    current, current_seqs = list(records), list(seqs)
    for index, step in enumerate(steps):
        if not current:
            break
        mark_running(step.name)
        dead_before = len(dead)
        if timed:
            cpu_started_s, wall_started_s = time.thread_time(), time.perf_counter()
        if step.waiting is not None and step.waiting.engaged():  # elastic threads: fissure.runtime.elastic.stage
            following, following_seqs = step.waiting.run(step, current, current_seqs, dead)
        else:
            following, following_seqs = _RECORD_LOOPS[step.action](step, current, current_seqs, dead)
        if observe is not None:
            cpu_s = time.thread_time() - cpu_started_s if timed else 0.0
            wall_s = time.perf_counter() - wall_started_s if timed else 0.0
            observe(index, len(current), len(following), len(dead) - dead_before, cpu_s, wall_s)
        current, current_seqs = following, following_seqs
    mark_idle()
    return current, current_seqs


# One loop per action, each record's call with nothing else to decide around it: on LogWatch's
# first four operators the shared loop (an action test and an ABC isinstance per record) took as
# long as half the operators' own work. A record that raises becomes a dead letter and the loop
# goes on with the next record of the same iterator.


def _map_records(step: Step, records: list, seqs: list[int], dead: list[DeadLetter]) -> tuple[list, list[int]]:
    fn, emitted = step.fn, []
    append = emitted.append
    failed: list[int] = []  # positions of the records that became dead letters
    pending = iter(records)
    while True:
        try:
            for record in pending:
                result = fn(record)
                if type(result) is not dict and not isinstance(result, Mapping):
                    raise TypeError(f"a map must return a dict, got {type(result).__name__}; "
                                    f"use filter to drop records, flat_map to emit several")
                append(result)
            break
        except Exception as error:  # noqa: BLE001 - any user error becomes a dead letter
            position = len(emitted) + len(failed)
            failed.append(position)
            dead.append(record_failed(step.name, error, record, seqs[position]))
        except (SystemExit, KeyboardInterrupt) as error:
            raise operator_stopped(step.name, error) from error
    if not failed:
        return emitted, seqs
    dropped = set(failed)
    return emitted, [seq for position, seq in enumerate(seqs) if position not in dropped]


def _filter_records(step: Step, records: list, seqs: list[int], dead: list[DeadLetter]) -> tuple[list, list[int]]:
    fn, kept, kept_seqs = step.fn, [], []
    pending = zip(records, seqs)
    while True:
        try:
            for record, seq in pending:
                if fn(record):
                    kept.append(record)
                    kept_seqs.append(seq)
            break
        except Exception as error:  # noqa: BLE001
            dead.append(record_failed(step.name, error, record, seq))
        except (SystemExit, KeyboardInterrupt) as error:
            raise operator_stopped(step.name, error) from error
    return kept, kept_seqs


def _flat_map_records(step: Step, records: list, seqs: list[int], dead: list[DeadLetter]) -> tuple[list, list[int]]:
    fn, emitted, emitted_seqs = step.fn, [], []
    pending = zip(records, seqs)
    while True:
        try:
            for record, seq in pending:
                result = fn(record)
                if type(result) is not list:
                    result = flat_map_emitted(result)
                if result:
                    emitted.extend(result)
                    emitted_seqs.extend([seq] * len(result))
            break
        except Exception as error:  # noqa: BLE001
            dead.append(record_failed(step.name, error, record, seq))
        except (SystemExit, KeyboardInterrupt) as error:
            raise operator_stopped(step.name, error) from error
    return emitted, emitted_seqs


_RECORD_LOOPS = {"map": _map_records, "filter": _filter_records, "flat_map": _flat_map_records}


def _as_record_batch(result: object, schema: pa.Schema) -> pa.RecordBatch:
    if isinstance(result, pa.Table):
        result = result.combine_chunks().to_batches()[0] if result.num_rows else pa.RecordBatch.from_pylist([], schema=schema)
    if not isinstance(result, pa.RecordBatch):
        import pandas

        if isinstance(result, pandas.DataFrame):
            result = pa.RecordBatch.from_pandas(result, preserve_index=False)
        else:
            raise TypeError(f"expected a pyarrow RecordBatch or Table or a pandas DataFrame, got {type(result).__name__}")
    missing = [name for name in schema.names if name not in result.schema.names]
    if missing:
        raise TypeError(f"returned batch lacks field(s) {', '.join(missing)} of its schema")
    return conform(result, schema)


def _call_batch_step(step: Step, data: pa.RecordBatch) -> pa.RecordBatch | pa.Array:
    argument = data.to_pandas() if step.batch_format == "pandas" else data
    result = step.fn(argument)
    if step.action == "filter_batches":
        mask = pa.array(result, type=pa.bool_()) if not isinstance(result, pa.Array) else result
        if len(mask) != data.num_rows:
            raise ValueError(f"returned a mask of {len(mask)} values for {data.num_rows} rows")
        return mask.fill_null(False)
    output = _as_record_batch(result, step.output_schema)
    if output.num_rows != data.num_rows:
        raise ValueError(f"returned {output.num_rows} rows for {data.num_rows}; map_batches keeps one row per "
                         f"input row (use a per-record flat_map to emit more or fewer)")
    return output


def run_batch_step(step: Step, data: pa.RecordBatch, seqs: pa.Array | Sequence[int],
                   dead: list[DeadLetter]) -> tuple[pa.RecordBatch, pa.Array | list[int]]:
    """A per-batch step; if it raises on the batch, row by row, so only the bad rows go dead.
    `seqs` as an Arrow column stay one (filtered by the step's mask): a run of per-batch steps
    makes no Python object per record."""
    mark_running(step.name)
    try:
        result = _call_batch_step(step, data)
        mark_idle()
        if step.action == "filter_batches":
            if isinstance(seqs, pa.Array):
                return data.filter(result), seqs.filter(result)
            return data.filter(result), [seq for seq, keep in zip(seqs, result.to_pylist()) if keep]
        return result, seqs
    except Exception:  # noqa: BLE001 - retried row by row below
        pass
    except (SystemExit, KeyboardInterrupt) as error:
        raise operator_stopped(step.name, error) from error
    pieces, kept_seqs = [], []
    for row, seq in enumerate(sequence_numbers(seqs)):
        single = data.slice(row, 1)
        try:
            result = _call_batch_step(step, single)
        except Exception as error:  # noqa: BLE001
            dead.append(record_failed(step.name, error, single.to_pylist()[0], seq))
            continue
        if step.action == "filter_batches":
            if result[0].as_py():
                pieces.append(single)
                kept_seqs.append(seq)
        else:
            pieces.append(result)
            kept_seqs.append(seq)
    schema = data.schema if step.action == "filter_batches" else step.output_schema
    mark_idle()
    return (pa.concat_batches(pieces) if pieces else pa.RecordBatch.from_pylist([], schema=schema)), kept_seqs


def sequence_numbers(seqs: pa.Array | Sequence[int]) -> list[int]:
    """Sequence numbers as the Python list per-record steps take."""
    return column_values(seqs) if isinstance(seqs, pa.Array) else list(seqs)


def _segments(steps: Sequence[Step]) -> list[list[Step]]:
    """Runs of per-record steps, and each per-batch step on its own."""
    segments: list[list[Step]] = []
    for step in steps:
        if step.action in RECORD_ACTIONS and segments and segments[-1][-1].action in RECORD_ACTIONS:
            segments[-1].append(step)
        else:
            segments.append([step])
    return segments


class FusedStage:
    """Stateless operators fused into one `RecordBatch -> RecordBatch` function over carried batches.

    Picklable when the operators' functions are (cloudpickle, as Spark uses, handles lambdas).
    With a `profile_id` the stage counts every operator's records in and out and times every
    `timed_every`-th batch into shared counters (fissure.runtime.profiling.profiler).
    """

    def __init__(self, steps: Sequence[Step], input_schema: pa.Schema, profile_id: str | None = None,
                 timed_every: int = 1, profile_label: str | None = None) -> None:
        if not steps:
            raise ValueError("a fused stage needs at least one step")
        self.steps = tuple(steps)
        self.input_schema = input_schema  # the user's fields arriving at the first step
        self.output_schema = self.steps[-1].output_schema
        self.carried_output_schema = carried_schema(self.output_schema)
        self._segments = _segments(self.steps)
        self._offsets = [sum(len(segment) for segment in self._segments[:k]) for k in range(len(self._segments))]
        self.profile_id = profile_id  # unique per query: names the shared counters in a worker
        self.profile_label = profile_label or profile_id  # names the pipeline in the statistics
        self.timed_every = timed_every
        self._profile = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_profile"] = None  # shared memory stays in the process that mapped it
        return state

    def bind_profile(self):
        """This stage's profile counters in this process (None when the stage is not profiled)."""
        if self.profile_id is not None and self._profile is None:
            self._profile = StageProfile(self.profile_id, self.names, self.timed_every, self.profile_label)
        return self._profile

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(step.name for step in self.steps)

    @property
    def name(self) -> str:
        return ",".join(self.names)

    def __repr__(self) -> str:
        return f"FusedStage({' | '.join(self.names)})"

    @property
    def ends_per_record(self) -> bool:
        """Whether its last operator is per-record: its output is dicts before it is Arrow."""
        return self.steps[-1].action in RECORD_ACTIONS

    def __call__(self, batch: pa.RecordBatch, fold=None) -> pa.RecordBatch:
        """`fold` (a fissure.runtime.operators.dict_fold.RecordFold): offered the last run of
        per-record operators' output as dicts; what it takes is folded, not made Arrow rows.
        The cyclic collector waits while the batch's records are dicts (fissure.runtime.records.gc_pause)."""
        with collector_paused():
            return self._run(batch, fold)

    def _run(self, batch: pa.RecordBatch, fold) -> pa.RecordBatch:
        profile = self._profile if self._profile is not None else self.bind_profile()
        live, upstream_dead = split_dead(batch)
        data = live.select(self.input_schema.names)
        # an Arrow column through per-batch steps, a list from the first per-record step on
        seqs = live.column(live.schema.get_field_index(SEQ))
        dead: list[DeadLetter] = []
        timed = profile is not None and profile.begin_batch(data.num_rows)
        started_s = time.perf_counter() if timed else 0.0
        operators_wall_s = 0.0
        for segment, offset in zip(self._segments, self._offsets):
            if segment[0].action in BATCH_ACTIONS:
                rows_in, dead_before = data.num_rows, len(dead)
                if timed:
                    cpu_started_s, wall_started_s = time.thread_time(), time.perf_counter()
                data, seqs = run_batch_step(segment[0], data, seqs, dead)
                if profile is not None:
                    cpu_s = wall_s = None
                    if timed:
                        cpu_s, wall_s = time.thread_time() - cpu_started_s, time.perf_counter() - wall_started_s
                        operators_wall_s += wall_s
                    profile.operator(offset, rows_in, data.num_rows, len(dead) - dead_before, cpu_s, wall_s)
            else:
                observe = None
                if profile is not None:
                    def observe(index, rows_in, rows_out, dead_count, cpu_s, wall_s, offset=offset):
                        nonlocal operators_wall_s
                        operators_wall_s += wall_s
                        profile.operator(offset + index, rows_in, rows_out, dead_count,
                                         cpu_s if timed else None, wall_s if timed else None)
                data, seqs = self._run_record_segment(segment, data, seqs, dead, observe, timed,
                                                      fold if segment is self._segments[-1] else None)
            if not data.num_rows:
                data = pa.RecordBatch.from_pylist([], schema=self.output_schema)
                break
        output = assemble(
            [live_batch(data, seqs),
             reshape_dead(upstream_dead, self.output_schema) if upstream_dead is not None else None,
             dead_letter_batch(dead, self.output_schema) if dead else None],
            self.carried_output_schema,
        )
        if timed:
            profile.end_batch(time.perf_counter() - started_s, operators_wall_s)
        return output

    def _run_record_segment(self, segment: list[Step], data: pa.RecordBatch, seqs, dead: list[DeadLetter],
                            observe: StepObserver | None, timed: bool, fold) -> tuple[pa.RecordBatch, list[int]]:
        """A run of per-record steps over `data`, `RECORD_CHUNK_ROWS` input rows at a time (a run
        with an operator on elastic threads: all at once); the output as one batch. `fold` (the
        stage's last run only) is offered each chunk's output until it refuses one; from then on
        the chunks become Arrow rows, so the combiner still folds the records in their order."""
        schema, operator = segment[-1].output_schema, segment[-1].name
        # an operator on elastic threads keeps the whole batch: its threads would drain at every chunk
        rows = data.num_rows if any(step.waiting is not None for step in segment) else RECORD_CHUNK_ROWS
        outputs: list[pa.RecordBatch] = []
        output_seqs: list[int] = []
        for start in range(0, data.num_rows, max(1, rows)):
            chunk = data.slice(start, rows) if data.num_rows > rows else data
            records, chunk_seqs = run_record_steps(
                segment, batch_records(chunk), sequence_numbers(seqs[start:start + chunk.num_rows]), dead,
                observe, timed)
            if fold is not None and fold.take(records, chunk_seqs, schema, operator, dead):
                continue
            fold = None
            batch, batch_seqs = records_to_batch(records, chunk_seqs, schema, operator, dead)
            if batch.num_rows:
                outputs.append(batch)
                output_seqs.extend(batch_seqs)
        if not outputs:
            return pa.RecordBatch.from_pylist([], schema=schema), []
        return (outputs[0] if len(outputs) == 1 else pa.concat_batches(outputs)), output_seqs
