"""Whether a cut can pay before it is tried: the model's bound on its gain against the noise a trial must beat.

Autopipelining (fissure.control.autopipeline_control) tries the cuts its optimizer proposes: a
new pipeline boundary for a window of micro-batches, kept only if its port's throughput rose
beyond the run's noise. A trial costs: on the LogWatch graph on Spark local[2] the two trial
cuts, both reverted, ran the run at 0.89 of no cut. This module says beforehand what a cut can
gain at most, from the window's timings of the task it would cut:

- a cut at port o of piece t moves o and what follows it inside t to a new process ("below");
  the rest stays ("above"), with the Spark worker's own Arrow I/O when t is the stage's first
  piece (the first piece runs in the worker's process);
- the processes of a task overlap, so after the cut a task's call takes at least the longest
  busy time of its processes (the two halves of t, every other piece unchanged), and at least
  the CPU the task needs over the cores it has: cores / the tasks that share them (a batch's
  tasks, at most one per core at a time), and, where the worker measured the machine's idle
  time during the calls (Linux), no more than the one core its process holds (computing or
  waiting on it) plus its share of the idle ones. Spark's JVM works for the same task beside the Python worker (it
  reads the input, converts it to Arrow and back, writes the exchange): on the LogWatch graph,
  one task a batch on 2 cores, cuts placed by hand ran at 0.86 of none, the second core
  evidently not free for them. Work that computes does not shrink by
  being split, it only moves; work that waits (sleep, I/O) overlaps with the other side's;
- the two processes overlap only across the chunks a call's rows cross the cut in (the processing
  element cuts each Arrow batch into a few per process): the longer side's time plus the shorter
  side's share of one chunk, at least (with one chunk a call, a cut gains nothing);
- the predicted gain is the call's measured wall time over that bound, minus 1, diluted by the
  stage's share of the micro-batches' wall time (the port's throughput is records per second of
  batch time, and the batch's other stages do not shrink). It is an upper
  bound: moving records between two processes costs too (a cut cost the LogWatch graph about
  7 %), and the Spark worker's I/O is counted as computing.

A node computes for its whole wall time unless it waits: declared `waits="io"`, or its wall time
at least WAIT_RATIO times its CPU time times the stretch of the operators that compute beside it
(fissure.control.thread_level.verdict detects waiting operators with the same ratio). The stretch
is the smallest wall-over-CPU ratio among the window's undeclared operators: a machine short of
cores stretches every operator's wall time alike (on a 2-core machine whose load was 4, parsing
showed 2.5 times more wall than CPU time), a sleep stretches only its own operator. So a program
whose every operator waits must declare it. A node declared `waits="gil-free"` computes (native
code, on a core).

A trial that delivers less than its bound scales every later bound of the run (`delivered`): the
costs the bound leaves out weigh the same on the next cut. `forecast_trial` then compares the
bound with the band the run's noise could give over a trial
(fissure.control.noise): no trial when the bound is within the band, since even the best case
could not be told from noise; otherwise the trial lasts the fewest batches whose band is at most
half the bound, so that a cut delivering half its bound still shows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fissure.control.noise import NoiseEstimate, noise_band
from fissure.control.thread_level.verdict import WAIT_RATIO


@dataclass(frozen=True)
class NodeTiming:
    """One operator of a piece over a window: its thread-CPU and wall seconds, and what it declared."""

    cpu_s: float
    wall_s: float
    waits: str | None = None  # "io" or "gil-free" as declared with `waits=`, None: nothing declared
    stretch: float = 1.0  # wall over CPU time of the operators that compute beside it (the module docstring)

    @property
    def waiting(self) -> bool:
        if self.waits is not None:
            return self.waits == "io"
        return self.wall_s > 0 and self.wall_s >= WAIT_RATIO * max(self.stretch, 1.0) * max(self.cpu_s, 0.0)

    @property
    def compute_s(self) -> float:
        """Seconds it needs a core: its CPU time when it waits, its whole wall time otherwise."""
        return max(self.cpu_s, 0.0) if self.waiting else max(self.wall_s, self.cpu_s, 0.0)

    @property
    def occupied_s(self) -> float:
        """Seconds its process can do nothing else (the optimizer's mu): wall time when it waits, else CPU."""
        return max(self.wall_s, self.cpu_s, 0.0) if self.waiting else max(self.cpu_s, 0.0)


# An operator below this share of its call's wall time has too little CPU time to tell the stretch.
STRETCH_MIN_SHARE = 0.02


def compute_stretch(nodes: Iterable[tuple[float, float, str | None, float]]) -> float:
    """The smallest wall-over-CPU ratio among undeclared operators (cpu_s, wall_s, waits, the wall
    seconds of the calls they ran in) with at least STRETCH_MIN_SHARE of their calls' time in CPU;
    1.0 without any (or below 1)."""
    ratios = [wall_s / cpu_s for cpu_s, wall_s, waits, call_wall_s in nodes
              if waits is None and cpu_s > 0 and cpu_s >= STRETCH_MIN_SHARE * call_wall_s]
    return max(1.0, min(ratios, default=1.0))


@dataclass(frozen=True)
class PieceTiming:
    """One process of a task (a piece of a pe stage under one cut) over a window.

    `cpu_s`: the piece's thread CPU (its nodes and its routing of rows); `below`: per port a cut
    there would open, the nodes it moves to the new process (the port's node and what follows
    it inside the piece)."""

    thread: str
    first: bool
    cpu_s: float
    nodes: Mapping[str, NodeTiming]
    below: Mapping[str, frozenset[str]]
    # whether a new cut could open inside it: one of its operators, not a stage's first node, reads
    # another of them (False: a piece of one operator, for one)
    cuttable: bool = True

    @property
    def routing_s(self) -> float:
        return max(0.0, self.cpu_s - sum(node.cpu_s for node in self.nodes.values()))

    @property
    def work_s(self) -> float:
        return sum(node.wall_s for node in self.nodes.values()) + self.routing_s


@dataclass(frozen=True)
class TaskTiming:
    """The processes of a stage's tasks under one cut over a window: `wall_s` the summed wall
    time of the stage's calls (tasks), `tasks_per_batch` how many calls a micro-batch made,
    `cores` the task slots of the run."""

    pieces: tuple[PieceTiming, ...]
    wall_s: float
    tasks_per_batch: float
    cores: int
    idle_cores: float | None = None  # cores the machine left idle while the tasks ran, on average (None: unknown)
    chunks_per_call: float | None = None  # the chunks a call's rows cross a cut in (None: unknown)
    batch_share: float | None = None  # the stage's share of the micro-batches' wall time (None: unknown)

    def in_batches(self, gain: float) -> float:
        """A gain of the stage's calls as a gain of the micro-batches: the rest of a batch (its
        other stages, Spark's own work) does not shrink."""
        if self.batch_share is None or not 0 < self.batch_share < 1:
            return gain
        return 1.0 / (1.0 - self.batch_share + self.batch_share / (1.0 + gain)) - 1.0

    def batch_text(self) -> str:
        return f"; the stage takes {self.batch_share:.2f} of the batches' time" if self.batch_share is not None else ""

    @property
    def running_tasks(self) -> float:
        """Tasks of the stage that run at once: a batch's, up to one per core."""
        return min(float(self.cores), max(1.0, self.tasks_per_batch))

    @property
    def core_share(self) -> float:
        """Cores a task could compute on: its share of the cores; when the machine's idle time was
        measured, no more than the one core its process holds (computing or waiting on it) plus its
        share of the idle cores (the rest went to what the processes do not see: Spark's JVM,
        other programs)."""
        share = self.cores / self.running_tasks
        if self.idle_cores is None:
            return share
        return min(share, 1.0 + max(self.idle_cores, 0.0) / self.running_tasks)

    def busy_s(self, piece: PieceTiming) -> float:
        """A process's busy time; the first piece's includes the Spark worker's I/O (the rest of the call)."""
        return max(self.wall_s, piece.work_s) if piece.first else piece.work_s

    @property
    def worker_io_s(self) -> float:
        """The Spark worker's own part of the calls (Arrow in and out), counted as computing."""
        return sum(max(0.0, self.wall_s - piece.work_s) for piece in self.pieces if piece.first)

    @property
    def compute_s(self) -> float:
        return self.worker_io_s + sum(sum(node.compute_s for node in piece.nodes.values()) + piece.routing_s
                                      for piece in self.pieces)

    @property
    def cpu_s(self) -> float:
        """As `compute_s`, with every operator's CPU time only (the screening's view)."""
        return self.worker_io_s + sum(piece.cpu_s for piece in self.pieces)


@dataclass(frozen=True)
class CutGain:
    """The most a cut at `port` of `thread` can gain (relative: 0.25 is +25 %) and the figures behind it."""

    port: str
    thread: str
    gain: float
    reason: str


def predict_cut_gain(task: TaskTiming, thread: str, port: str) -> CutGain:
    """The bound of the module docstring for a cut at `port` of the piece named `thread`."""
    piece = next(piece for piece in task.pieces if piece.thread == thread)
    below = piece.below[port]
    below_nodes = [piece.nodes[name] for name in below if name in piece.nodes]
    below_busy_s = sum(node.wall_s for node in below_nodes)
    above_busy_s = task.busy_s(piece) - below_busy_s
    others = [task.busy_s(other) for other in task.pieces if other is not piece]
    cores_bound_s = task.compute_s / task.core_share
    before_s = max([task.wall_s, task.busy_s(piece), *others])
    # two processes overlap only across the chunks a call's rows cross the cut in: the shorter
    # side's share of one chunk is never hidden (with one chunk a call, nothing is)
    fill_s = min(above_busy_s, below_busy_s) / task.chunks_per_call if task.chunks_per_call else 0.0
    after_s = max([max(above_busy_s, below_busy_s) + fill_s, cores_bound_s, *others])
    gain = task.in_batches(max(before_s / after_s - 1.0, 0.0) if after_s > 0 else 0.0)

    def waiting_s(nodes) -> float:
        return sum(node.wall_s - node.compute_s for node in nodes if node.waiting)

    above_waiting_s = waiting_s([node for name, node in piece.nodes.items() if name not in below])
    share = (lambda seconds: seconds / before_s) if before_s > 0 else (lambda seconds: 0.0)
    reason = (f"a cut at {port} gains at most {gain:+.0%}: above it busy {share(above_busy_s):.2f} of the task's"
              f" time (waiting {share(above_waiting_s):.2f}), below it {share(below_busy_s):.2f} (waiting"
              f" {share(waiting_s(below_nodes)):.2f}); {_cores_text(task, share)}{task.batch_text()}")
    return CutGain(port, thread, gain, reason)


def _cores_text(task: TaskTiming, share, cpu_only: bool = False) -> str:
    idle = f", {task.idle_cores:.2f} idle while they ran" if task.idle_cores is not None else ""
    return (f"the task computes for {share(task.cpu_s if cpu_only else task.compute_s):.2f} of its time on one core"
            f" and has {task.core_share:.2g} ({task.tasks_per_batch:.3g} task(s) a batch on {task.cores}"
            f" core(s){idle})")


def task_gain(task: TaskTiming) -> CutGain:
    """The most any cut of the task can gain: the cores bound, and the busy time of every piece no
    new cut can split (the screening's question; totals suffice, so the pieces may be counted per
    fused run). It counts the pieces' CPU time only: inside a fused run it cannot tell an operator
    that waits from one a busy machine stretched, and a window profiled node by node, which can,
    costs less than a trial. A piece of one operator keeps its whole busy time, waiting included,
    whatever is cut elsewhere: after the waiting lookup got its own process, the cores bound alone
    read +41 to +45 % and sent two batches back to node-by-node profiling that found nothing."""
    name = task.pieces[0].thread.rsplit("/", 1)[0] if task.pieces else "?"
    before_s = max([task.wall_s, *(task.busy_s(piece) for piece in task.pieces)])
    whole = max((piece for piece in task.pieces if not piece.cuttable), key=task.busy_s, default=None)
    whole_s = task.busy_s(whole) if whole is not None else 0.0
    after_s = max(task.cpu_s / task.core_share, whole_s)
    gain = task.in_batches(max(before_s / after_s - 1.0, 0.0) if after_s > 0 else math.inf)
    share = (lambda seconds: seconds / before_s) if before_s > 0 else (lambda seconds: 0.0)
    whole_text = (f"; {whole.thread.rsplit('/', 1)[-1]} ({','.join(whole.nodes)}) cannot be cut further and is busy"
                  f" {share(whole_s):.2f} of the time" if whole is not None else "")
    return CutGain("*", name, gain, f"{name}: any cut gains at most {gain:+.0%}: {_cores_text(task, share, True)}"
                                    f"{whole_text}{task.batch_text()}")


def delivered(gain: CutGain | None, share: float) -> CutGain | None:
    """The bound scaled to what this run's trials delivered: `share` is the lowest ratio of a
    trial's measured (1 + gain) to its bound's, at most 1. The bound leaves out a cut's own costs;
    a trial that fell short says how much they weigh on this run."""
    if gain is None or share >= 1.0:
        return gain
    scaled = max((1.0 + gain.gain) * share - 1.0, 0.0)
    return CutGain(gain.port, gain.thread, scaled,
                   f"{gain.reason}; {share:.2f} of that as this run's trials delivered: {scaled:+.0%}")


def best_cut_gain(tasks: tuple[TaskTiming, ...], port: str, threads: tuple[str, ...]) -> CutGain | None:
    """The largest bound over the threads a cut at `port` relieves; None when none of them was timed."""
    gains = [predict_cut_gain(task, piece.thread, port) for task in tasks for piece in task.pieces
             if piece.thread in threads and port in piece.below]
    return max(gains, key=lambda item: item.gain, default=None)


@dataclass(frozen=True)
class TrialForecast:
    """Whether to try a cut at `port`: `trial_batches` the length of its trial, 0 for no trial."""

    port: str
    gain: float | None  # the model's bound, None: not timed
    band: float  # the gain noise could give over the longest trial, at the confidence
    trial_batches: int
    reason: str
    unscaled: float | None = None  # the model's bound before `delivered` scaled it (set by the caller)


def forecast_trial(port: str, gain: CutGain | None, *, batches_before: int, max_trial_batches: int,
                   noise: NoiseEstimate, confidence: float, assumed_sd: float, min_gain: float = 0.0) -> TrialForecast:
    """Try a cut only when its bound `gain` beats the band a trial of `max_trial_batches` must pass
    (at least `min_gain`); the trial lasts the fewest batches whose band is at most half the bound."""
    if batches_before < 1 or max_trial_batches < 1:
        raise ValueError(f"a trial compares at least one batch before and after, got {batches_before} and "
                         f"{max_trial_batches}")
    spread = noise.spread(assumed_sd)

    def band_of(batches: int) -> float:
        return max(noise_band(spread, batches_before, batches, confidence), min_gain)

    band = band_of(max_trial_batches)
    noise_text = (f"the {band:+.1%} band a trial of {max_trial_batches} batch(es) against {batches_before} must pass"
                  f" at {confidence:.0%} confidence ({noise.describe(assumed_sd)})")
    if gain is None:
        return TrialForecast(port, None, band, max_trial_batches,
                             f"{port}: not timed, tried for {max_trial_batches} batch(es)")
    if gain.gain <= band:
        return TrialForecast(port, gain.gain, band, 0, f"{port} not tried: {gain.reason}; within {noise_text}")
    trial = next((batches for batches in range(1, max_trial_batches + 1) if band_of(batches) <= gain.gain / 2),
                 max_trial_batches)
    return TrialForecast(port, gain.gain, band, trial,
                         f"{port} tried for {trial} batch(es): {gain.reason}; beyond {noise_text}")
