"""The processing element's child processes, seen from the parent: forking the chain of
pipelines 2..k with its pipes, the parent's two ends of that chain, stopping and reaping the
children, and what a child's exit status means.

Forked, never spawned (fissure.runtime.pe.element says why); what a child does once forked is
fissure.runtime.pe.child's.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fissure.runtime.pe.child import (EXIT_CLEAN, EXIT_RUNTIME_FAILED, EXIT_STAGE_FAILED, ChildPlan, child_fds_to_close,
                                     run_child)
from fissure.runtime.pe.stages import PipelineShape, Stage
from fissure.runtime.pe.wire import FrameReader, PendingWrites, make_pipe

_FORK_LOCK = threading.Lock()
# The parent's pipe ends of every live PE. A child closes all of them (and its siblings' ends),
# so that each pipe's write end lives in exactly one process and EOF means "writer gone".
_PARENT_SIDE_FDS: set[int] = set()


@dataclass(frozen=True)
class ChildProcess:
    shape: PipelineShape
    pid: int


class ChildLink:
    """The parent's ends of the pipe chain: feed into pipeline 2, results out of pipeline k."""

    def __init__(self, feed_fd: int, result_fd: int) -> None:
        os.set_blocking(feed_fd, False)
        os.set_blocking(result_fd, False)
        self.feed = PendingWrites(feed_fd)
        self.results = FrameReader(result_fd)

        self._results_poller = select.poll()
        self._results_poller.register(result_fd, select.POLLIN)
        self._both_poller = select.poll()
        self._both_poller.register(result_fd, select.POLLIN)
        self._both_poller.register(feed_fd, select.POLLOUT)

    def wait(self, want_write: bool, timeout_s: float | None = None) -> None:
        """Block until results can be read (or, with want_write, input can be written)."""
        poller = self._both_poller if want_write else self._results_poller
        poller.poll(None if timeout_s is None else max(0, int(timeout_s * 1000)))

    def close(self) -> None:
        for fd in (self.feed.fd, self.results.fd):
            _PARENT_SIDE_FDS.discard(fd)
            try:
                os.close(fd)
            except OSError:
                pass


def fork_children(pipelines: Sequence[Sequence[Stage]], shapes: Sequence[PipelineShape],
                  pipe_capacity_bytes: int | None) -> tuple[tuple[ChildProcess, ...], ChildLink]:
    """Fork pipelines 2..k, each reading from the one before it over a pipe; the children and
    the parent's link to the chain (pipeline 1 runs in the caller)."""
    count = len(pipelines)
    with _FORK_LOCK:
        # pipes[i] carries batches into pipeline i + 2; the last one carries the results back.
        pipes = [make_pipe(pipe_capacity_bytes) for _ in range(count)]
        chain_fds = [fd for pipe in pipes for fd in pipe]
        feed_fd, result_fd = pipes[0][1], pipes[-1][0]
        children = []
        try:
            for index in range(1, count):
                input_fd, output_fd = pipes[index - 1][0], pipes[index][1]
                plan = ChildPlan(
                    shape=shapes[index],
                    stages=pipelines[index],
                    input_fd=input_fd,
                    output_fd=output_fd,
                    fds_to_close=tuple(_PARENT_SIDE_FDS)
                    + child_fds_to_close(chain_fds, keep=(input_fd, output_fd)),
                    parent_pid=os.getpid(),
                )
                pid = os.fork()
                if pid == 0:
                    run_child(plan)
                children.append(ChildProcess(shapes[index], pid))
        except BaseException:
            for fd in chain_fds:
                os.close(fd)
            _kill_and_reap([child.pid for child in children])
            raise
        for fd in chain_fds:
            if fd not in (feed_fd, result_fd):
                os.close(fd)
        _PARENT_SIDE_FDS.update((feed_fd, result_fd))
    return tuple(children), ChildLink(feed_fd, result_fd)


def children_all_alive(children: Sequence[ChildProcess]) -> bool:
    if not children:
        return False
    for child in children:
        try:
            if os.waitpid(child.pid, os.WNOHANG) != (0, 0):
                return False
        except ChildProcessError:
            return False
    return True


def stop_children(children: Sequence[ChildProcess], link: ChildLink | None, grace_s: float,
                  owner_pid: int) -> tuple[set[int], dict[int, int | None]]:
    """Close the pipes, give the children `grace_s` to exit, SIGKILL the rest, reap all.

    Returns the pids killed here and every child's wait status (None: reaped elsewhere). In a
    process other than `owner_pid` (a fork of the owner) the children are not ours to reap."""
    if link is not None:
        link.close()
    if not children or os.getpid() != owner_pid:
        return set(), {}
    exit_statuses: dict[int, int | None] = {}
    deadline_s = time.monotonic() + grace_s
    pause_s = 0.001
    while True:
        for child in children:
            if child.pid not in exit_statuses:
                status = _reap_if_exited(child.pid)
                if status is not _STILL_RUNNING:
                    exit_statuses[child.pid] = status
        running = [child.pid for child in children if child.pid not in exit_statuses]
        if not running or time.monotonic() >= deadline_s:
            break
        time.sleep(pause_s)
        pause_s = min(2 * pause_s, 0.05)
    exit_statuses.update(_kill_and_reap(running))
    return set(running), exit_statuses


_STILL_RUNNING = object()


def _reap_if_exited(pid: int):
    """The wait status of an exited child (reaping it), _STILL_RUNNING, or None if unknown."""
    try:
        reaped_pid, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return _STILL_RUNNING if reaped_pid == 0 else status


def _kill_and_reap(pids: Iterable[int]) -> dict[int, int | None]:
    statuses: dict[int, int | None] = {}
    for pid in pids:
        if pid <= 0:  # os.kill(0 or -n) would signal a whole process group
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            statuses[pid] = os.waitpid(pid, 0)[1]
        except ChildProcessError:
            statuses[pid] = None
    return statuses


def describe_abnormal_exit(wait_status: int | None) -> str | None:
    """How a child ended, in words; None when it ended as a neighbour of a failure should."""
    if wait_status is None:
        return None
    if os.WIFSIGNALED(wait_status):
        number = os.WTERMSIG(wait_status)
        try:
            signal_name = signal.Signals(number).name
        except ValueError:
            signal_name = "unknown signal"
        return f"was killed by signal {number} ({signal_name})"
    exit_code = os.WEXITSTATUS(wait_status)
    if exit_code == EXIT_CLEAN:
        return None
    if exit_code == EXIT_STAGE_FAILED:
        return "exited after a stage raised, but its failure report did not reach the parent"
    if exit_code == EXIT_RUNTIME_FAILED:
        return "failed in its own read-run-write loop (not in a stage)"
    return f"exited with status {exit_code} (a stage may have called os._exit)"
