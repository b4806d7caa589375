"""The child side of a processing element: what a forked pipeline process does until it exits.

A child reads frames from its input pipe, runs its pipeline's stages on every batch, writes the
results to its output pipe and forwards the markers (group end, call end, failure). It is a
plain blocking loop: the bounded pipes give the backpressure. It exits when its input ends (the
upstream closed it or died), when its output's reader is gone, after it reported a failure, and
when the parent dies (PR_SET_PDEATHSIG on Linux).

Fork-safety: the child is forked from a process that may run other threads (Spark's Python
worker can prefetch input in a reader thread). Only the forking thread lives on in the child,
and any lock another thread held at the fork stays held forever. So the child touches nothing
that such a thread may hold: no logging, no queues, no parent threads; it works on raw fds with
os.read/os.write, everything it needs (libc's prctl, the stage names) is prepared before the
fork, it ends with os._exit (no atexit handlers, no flushing of the parent's stdio buffers), and
it switches Arrow to an allocator that is safe after a fork (pyarrow's default, mimalloc, has no
fork handlers: a lock another thread held inside it would hang the child's first allocation),
and it caps Arrow's thread pools at one thread (Arrow re-creates its pools after a fork; one
thread also keeps each pipeline to the one core the planner counted for it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

import pyarrow as pa

from fissure.runtime.pe.stages import (
    PipelineRunner,
    PipelineShape,
    Stage,
    StageFailure,
    failure_report,
)
from fissure.runtime.pe.wire import (
    FrameKind,
    PendingWrites,
    PipeClosed,
    FrameReader,
    batch_frame_views,
    decode_batch,
    frame_views,
)

EXIT_CLEAN = 0  # input ended, a neighbour went away, or an upstream failure was forwarded
EXIT_STAGE_FAILED = 70  # a stage raised; the failure was reported downstream
EXIT_RUNTIME_FAILED = 71  # the child's own loop failed (reported downstream if it could be)

_PR_SET_PDEATHSIG = 1


def _load_prctl():
    """libc's prctl, loaded in the parent: dlopen after a fork could wait on a lock forever."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


@dataclass(frozen=True)
class ChildPlan:
    """Everything a child needs, fixed before the fork."""

    shape: PipelineShape
    stages: tuple[Stage, ...]
    input_fd: int
    output_fd: int
    fds_to_close: tuple[int, ...]  # every other pipe end of every processing element
    parent_pid: int


def run_child(plan: ChildPlan) -> NoReturn:
    """Entry point right after the fork; never returns."""
    exit_code = EXIT_RUNTIME_FAILED
    try:
        _detach(plan)
        exit_code = _serve(plan)
    except BaseException as error:  # the runtime itself failed: tell the parent if possible
        report = failure_report(plan.shape, 0, "pipeline runtime", error)
        _send_failure(PendingWrites(plan.output_fd), report.to_json_dict())
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(exit_code)


def _detach(plan: ChildPlan) -> None:
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != plan.parent_pid:  # the parent died before prctl took effect
        os._exit(EXIT_CLEAN)
    for fd in plan.fds_to_close:
        try:
            os.close(fd)
        except OSError:
            pass
    # The parent decides about interrupts; a terminal's Ctrl-C reaches the whole process group.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for signal_number in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signal_number, signal.SIG_DFL)
    pa.set_memory_pool(_fork_safe_memory_pool())
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)


def _fork_safe_memory_pool() -> pa.MemoryPool:
    """An Arrow allocator no parent thread can have left locked: pyarrow's default, mimalloc,
    has no fork handlers; jemalloc has them (and is usually first initialized here, in the
    child); the system allocator (glibc) is fork-safe by design."""
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:
        return pa.system_memory_pool()


def _serve(plan: ChildPlan) -> int:
    runner = PipelineRunner(plan.stages, plan.shape)
    counters = runner.counters
    reader = FrameReader(plan.input_fd)
    writer = PendingWrites(plan.output_fd)
    between_calls = True  # idle time between calls is not starvation
    while True:
        waiting_since_s = time.perf_counter()
        try:
            frame = reader.next_frame()
        except PipeClosed:
            return EXIT_CLEAN
        if not between_calls:
            counters.waiting_for_input_s += time.perf_counter() - waiting_since_s
        between_calls = frame.kind is FrameKind.CALL_END
        try:
            if frame.kind is FrameKind.BATCH:
                for output in runner.run(decode_batch(frame.payload)):
                    writer.add(batch_frame_views(output))
            elif frame.kind is FrameKind.GROUP_END:
                writer.add(frame_views(FrameKind.GROUP_END))
                _flush(writer, runner)
            elif frame.kind is FrameKind.CALL_END:
                upstream_stats = json.loads(frame.payload.to_pybytes()) if frame.payload else []
                upstream_stats.append(runner.call_stats().to_json_dict())
                writer.add(frame_views(FrameKind.CALL_END, json.dumps(upstream_stats).encode()))
                _flush(writer, runner)
                counters.reset()
            elif frame.kind is FrameKind.FAILURE:
                writer.add(frame_views(FrameKind.FAILURE, frame.payload))
                writer.write_all()
                return EXIT_CLEAN
        except StageFailure as failure:
            _send_failure(writer, failure.report.to_json_dict())
            return EXIT_STAGE_FAILED
        except PipeClosed:
            return EXIT_CLEAN


def _flush(writer: PendingWrites, runner: PipelineRunner) -> None:
    blocked_since_s = time.perf_counter()
    writer.write_all()
    runner.counters.blocked_on_output_s += time.perf_counter() - blocked_since_s


def _send_failure(writer: PendingWrites, report: dict) -> None:
    writer.add(frame_views(FrameKind.FAILURE, json.dumps(report).encode()))
    try:
        writer.write_all()
    except (PipeClosed, OSError):
        pass


def child_fds_to_close(all_fds: Sequence[int], keep: Sequence[int]) -> tuple[int, ...]:
    kept = set(keep)
    return tuple(fd for fd in all_fds if fd not in kept)
