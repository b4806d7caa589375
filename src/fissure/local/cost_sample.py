"""Operator costs measured on a sample of the input, in the driver, before a run's first batch.

A run that must choose its micro-batch size before any batch has run (fissure.spark.io.batch_admission)
needs the program's cost per record now; the operators' declared hints are often far off (the
LogWatch example's hints are the pipelined-fission paper's per-tuple costs, about four times what
its Python functions cost on the 2-core machine the benchmarks run on). So the driver runs the
program over the first records of its sources with the reference executor
(fissure.local.executor, the same per-operator code as the Spark workers: Arrow batches, dead
letters, keyed state), in chunks, until a wall-clock budget or the sample runs out, and reads off
each operator's CPU time per input record and its selectivity.

The driver runs the sample in a forked child process (`measure_sample_isolated`): the user's code
may end its process (sys.exit, os._exit, a crash in an extension), loop, or raise
KeyboardInterrupt, which in a Spark worker fails a task and here must not end the driver. Where
the platform has no fork, no sample is taken.

CPU time (not wall time) is the cost, as for the in-worker profiler's default basis: an operator
that waits on I/O gets threads in the workers (the elastic scheduler), so what it waits is not a
cost per record there. An operator that received fewer than `MIN_RECORDS` records in the sample
(after a selective filter, or on a source not sampled) gets no measured estimate, and the caller
keeps its hint.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from fissure.program.operators import OperatorEstimate
from fissure.program.chain import Pipeline
from fissure.program.graph import StreamGraph, as_graph
from fissure.local.executor import LocalGraphRun

MIN_RECORDS = 50  # fewer records into an operator measure its start, not its cost per record
WARM_UP_RECORDS = 200  # records of each source run first and not counted
CHUNK_RECORDS = 2_000  # records of each source per call: a keyed operator sees several per key
DEFAULT_BUDGET_S = 0.5  # wall seconds the driver spends at most (the first batch takes seconds)
CHILD_TIMEOUT_S = 10.0  # a sample's child that has not answered by then is killed (its code hangs)


class SampleFailed(RuntimeError):
    """The program could not be measured on its sample; the message says why."""


@dataclass(frozen=True)
class SampleCosts:
    """Measured estimates per operator name, and what they were measured on."""

    estimates: Mapping[str, OperatorEstimate]
    records: int  # source records run
    seconds: float  # CPU seconds of every operator together

    def describe(self) -> str:
        per_record = 1e6 * self.seconds / self.records if self.records else 0.0
        return (f"operator costs measured on a sample of {self.records:,} records "
                f"({per_record:.1f} us of operator CPU a record)")


def measure_sample(program: Pipeline | StreamGraph, rows: Mapping[str, Sequence[Mapping]],
                   schemas: Mapping[str, pa.Schema] | None = None, *, budget_s: float = DEFAULT_BUDGET_S,
                   cpu_clock: Callable[[], float] = time.thread_time,
                   wall_clock: Callable[[], float] = time.monotonic) -> SampleCosts:
    """Run `program` over `rows` (source name -> records; a source absent gets none) and measure.

    Raises what the program raises on its sample (a schema that does not fit, ...): the caller
    decides whether that matters."""
    graph = as_graph(program)
    run = LocalGraphRun(graph, clock=cpu_clock)  # its first call refuses rows of a source the graph lacks
    sampled = {**{name: [] for name in graph.sources}, **{name: list(records) for name, records in rows.items()}}
    longest = max((len(records) for records in sampled.values()), default=0)
    # One uncounted call first: an operator's first records pay its imports, compiled patterns
    # and caches, which a run pays once, not per record.
    run.run_batch({name: records[:WARM_UP_RECORDS] for name, records in sampled.items()}, schemas)
    run.work.clear()
    deadline = wall_clock() + budget_s
    done = 0
    for start in range(WARM_UP_RECORDS, longest, CHUNK_RECORDS):
        chunk = {name: records[start:start + CHUNK_RECORDS] for name, records in sampled.items()}
        run.run_batch(chunk, schemas)
        done += sum(len(records) for records in chunk.values())
        if wall_clock() >= deadline:
            break
    estimates = {name: OperatorEstimate(cost_us=1e6 * work.seconds / work.records_in,
                                        selectivity=work.records_out / work.records_in)
                 for name, work in run.work.items() if work.records_in >= MIN_RECORDS and name in graph.names}
    return SampleCosts(estimates, done, sum(work.seconds for work in run.work.values()))


def measure_sample_isolated(program: Pipeline | StreamGraph, rows: Mapping[str, Sequence[Mapping]],
                            schemas: Mapping[str, pa.Schema] | None = None, *, budget_s: float = DEFAULT_BUDGET_S,
                            timeout_s: float = CHILD_TIMEOUT_S) -> SampleCosts:
    """`measure_sample` in a forked child; raises SampleFailed with the reason when the child
    raises, ends without an answer or takes longer than `timeout_s`."""
    if not hasattr(os, "fork"):
        raise SampleFailed("this platform cannot fork a process to run the sample in")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, answer, and end without running the parent's exit handlers
        os.close(read_end)
        code = 0
        try:
            answer = ("ok", measure_sample(program, rows, schemas, budget_s=budget_s))
        except BaseException as error:  # noqa: BLE001 - the parent gets every failure as a reason
            answer = ("failed", f"{type(error).__name__}: {error}")
        try:
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(pickle.dumps(answer))
        except BaseException:  # noqa: BLE001 - nothing to tell anyone: the parent sees the exit code
            code = 1
        os._exit(code)
    os.close(write_end)
    try:
        data = _read_all(read_end, timeout_s)
    finally:
        os.close(read_end)
        if _ended(pid) is None:  # still running: hung, or the parent was interrupted
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    if data is None:
        raise SampleFailed(f"the program did not finish its sample in {timeout_s:g} s")
    if not data:
        raise SampleFailed("the program ended its process while it ran on the sample")
    status, value = pickle.loads(data)
    if status != "ok":
        raise SampleFailed(value)
    return value


def _read_all(fd: int, timeout_s: float) -> bytes | None:
    """Everything written to `fd` until its writer closes it, or None after `timeout_s`."""
    deadline, parts = time.monotonic() + timeout_s, []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        part = os.read(fd, 1 << 16)
        if not part:
            return b"".join(parts)
        parts.append(part)


def _ended(pid: int, wait_s: float = 1.0) -> int | None:
    """The child's exit status once it has ended (waiting up to `wait_s`), or None."""
    deadline = time.monotonic() + wait_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)
