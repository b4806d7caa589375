"""One method for every benchmark: how variants are measured, compared, ranked and written down.

Measuring (timed benchmarks):
- a warm-up run first, not counted (the session's first queries start the JVM's code paths and
  Spark's Python workers);
- the variants a ratio compares are measured in one block: every repeat runs every variant, in an
  order rotated by one place each repeat (or shuffled with a recorded seed), so that no variant
  always runs first, or always right after another;
- at least three repeats, reported as medians; fewer only with an explicit `--quick`, which marks
  the results as not to be quoted.

Comparing:
- a ratio's denominator never contains its numerator: "the planner's plan over the best of the
  other plans", not "over the best of all plans" (which cannot exceed 1);
- both sides of a ratio come from the same block.

Ranking (a model's first-ranked plan among measured ones): predicted values within a relative
tolerance (`TIE_TOLERANCE`) of the highest are ties; a tie goes to the simpler plan: fewer
threads, then fewer regions, then fewer pipelines, then the plan's text in alphabetical order.
Never the order of a file, never a measured result.

Writing: `Run.write_results(name, markdown, data)` puts the command line (which regenerates the
file), the machine, the date, the exact revision with its dirty flag and the load before and
after, and other processes' share of the CPU while the run ran, into both the .md and the .json;
a run during which other processes used more than OTHERS_BUSY_SHARE of the machine's CPU says
"busy machine: not a result to quote" (the load average is no judge of that: it counts the
run's own processes), a `--quick` run "quick mode: not a result to quote".

What "other processes" covers: every process not the run's, those whose environment cannot be
read (another user's) included, and the hypervisor's steal time (/proc/stat: CPU time the
virtual machine was ready to run but another guest had the core), which no process list shows.
A fixed calibration loop (pure Python, `calibration_s`) is timed before and after the run, each
time in a fresh Python process (`calibration_in_fresh_process`), after the script has ended its
Spark session and that session's JVM (`end_spark`): a machine whose speed moved by more than
SPEED_TOLERANCE between the two (a slower morning, a throttled host) gives figures that are
"machine speed moved: not a result to quote".

No fissure import here: a script may load it before choosing which checkout of fissure to load.
The pure parts (ordering, medians, ratios, the tie rule, the busy verdict) are tested in
tests/benchmarks/test_benchmark_method.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Hashable, Iterable, Iterator, Sequence

from provenance import load, machine, now, revision

REPOSITORY = Path(__file__).resolve().parents[1]
RESULTS = REPOSITORY / "benchmarks" / "results"
MIN_REPEATS = 3
TIE_TOLERANCE = 0.01  # predicted values within 1 % of the highest are ties
BUSY = "busy machine: not a result to quote"
QUICK = "quick mode: not a result to quote"
SPEED_MOVED = "machine speed moved: not a result to quote"
SPEED_UNKNOWN = "machine speed not measured after the run: not a result to quote"
SPEED_TOLERANCE = 0.10  # the calibration loop's time may move this much between before and after


class MethodError(ValueError):
    """A measurement or a comparison the method does not allow."""


# -- ordering -------------------------------------------------------------------------------------


def rotated(items: Sequence, repeat: int) -> list:
    """`items` rotated left by `repeat` places: over len(items) repeats every item runs in every
    position once."""
    items = list(items)
    if not items:
        return []
    shift = repeat % len(items)
    return items[shift:] + items[:shift]


def shuffled(items: Sequence, seed: int, repeat: int) -> list:
    """`items` in an order drawn from (seed, repeat): reproducible from the recorded seed."""
    items = list(items)
    random.Random(f"{seed}/{repeat}").shuffle(items)
    return items


def run_order(items: Sequence, repeat: int, seed: int | None = None) -> list:
    """The order of repeat `repeat`: rotated, or shuffled when a seed is given."""
    return rotated(items, repeat) if seed is None else shuffled(items, seed, repeat)


# -- repeats and medians --------------------------------------------------------------------------


def check_repeats(repeats: int, quick: bool = False) -> int:
    """`repeats`, if the method allows it: at least MIN_REPEATS unless the run is a quick one."""
    if repeats < 1:
        raise MethodError("at least one repeat")
    if repeats < MIN_REPEATS and not quick:
        raise MethodError(f"{repeats} repeat(s): medians need at least {MIN_REPEATS}; "
                          "--quick runs fewer and marks the results as not to be quoted")
    return repeats


def median(values: Iterable[float]) -> float:
    values = [value for value in values if value is not None]
    if not values:
        raise MethodError("a median of no values")
    return statistics.median(values)


# -- ratios ---------------------------------------------------------------------------------------


def ratio(values: dict[str, float], numerator: str, denominator: str) -> float:
    """values[numerator] / values[denominator], two different variants."""
    if numerator == denominator:
        raise MethodError(f"{numerator!r} over itself")
    bottom = values[denominator]
    if not bottom:
        raise MethodError(f"{denominator!r} is {bottom!r}")
    return values[numerator] / bottom


def best_of(values: dict[str, float], among: Iterable[str]) -> tuple[str, float]:
    """The label with the highest value among `among`; equal values go to the first label in sorted
    order (a deterministic rule, not the order of the dictionary)."""
    among = sorted(set(among))
    if not among:
        raise MethodError("the best of nothing")
    label = min(among, key=lambda item: (-values[item], item))
    return label, values[label]


def over_best_of_others(values: dict[str, float], numerator: str,
                        among: Iterable[str] | None = None) -> tuple[float, str]:
    """values[numerator] / the best of the other labels (of `among`, default every other label),
    and that best label. Refuses a set of others that contains the numerator."""
    others = [label for label in values if label != numerator] if among is None else list(among)
    if numerator in others:
        raise MethodError(f"the denominator's set contains the numerator {numerator!r}: "
                          "compare with the best of the others")
    label, best = best_of(values, others)
    if not best:
        raise MethodError(f"the best of the others, {label!r}, is {best!r}")
    return values[numerator] / best, label


def paired_ratio(runs: dict[str, list[float]], numerator: str, denominator: str) -> float:
    """The median over the repeats of numerator / denominator within each repeat (runs measured
    in the same block, a repeat's runs minutes apart: the machine's drift cancels)."""
    if numerator == denominator:
        raise MethodError(f"{numerator!r} over itself")
    tops, bottoms = runs[numerator], runs[denominator]
    if len(tops) != len(bottoms):
        raise MethodError(f"{numerator!r} and {denominator!r} were not measured in the same repeats")
    return median(top / bottom for top, bottom in zip(tops, bottoms) if bottom)


# -- the tie rule ---------------------------------------------------------------------------------


def ties(predicted: dict[Hashable, float], tolerance: float = TIE_TOLERANCE) -> list:
    """The keys whose predicted value is within `tolerance` (relative) of the highest."""
    if not predicted:
        raise MethodError("no candidates")
    top = max(predicted.values())
    return [key for key, value in predicted.items() if value >= top * (1 - tolerance)]


def first_ranked(predicted: dict[Hashable, float], simplicity: Callable[[Hashable], tuple],
                 tolerance: float = TIE_TOLERANCE):
    """The candidate a model ranks first: the highest prediction, a tie (within `tolerance`) going
    to the candidate with the smallest `simplicity` key. Measured results play no part."""
    return min(ties(predicted, tolerance), key=simplicity)


def plan_simplicity(threads: int, regions: int, pipelines: int, text: str) -> tuple:
    """The tie rule's order of plans: fewer threads, fewer regions, fewer pipelines, then the text."""
    return (threads, regions, pipelines, text)


# -- the machine's load ---------------------------------------------------------------------------


# Others' share of the machine's CPU during a run above which the run is busy. A quiet 2-core VM
# shows 1-3 % (the kernel, the guest agent); a test suite or a second benchmark beside it 30 % or more.
OTHERS_BUSY_SHARE = 0.10


def others_share(others_s: float, wall_s: float, cores: int) -> float:
    """The share of the machine's CPU (cores x wall time) that processes other than the run used."""
    if wall_s <= 0 or cores <= 0:
        return 0.0
    return max(0.0, others_s) / (wall_s * cores)


def busy(others: float | None, load_before: Sequence[float], cores: int) -> bool:
    """Whether other work shared the machine: others' CPU share above OTHERS_BUSY_SHARE while the run
    ran, or, where CPU accounting is not available (None), a 1-minute load above the core count
    before it. Not the load after the run: that includes the run's own processes (a Spark
    benchmark raises a 2-core machine's load to 2-3 by itself)."""
    if others is not None:
        return others > OTHERS_BUSY_SHARE
    return load_before[0] > cores


def verdict(others: float | None, load_before: Sequence[float], cores: int, quick: bool,
            steal: float | None = None, speed_moved: float | None = None,
            speed_unknown: str | None = None) -> str | None:
    """What the report says above its figures: None for a result to quote. `others` and `steal`
    add up (both are CPU the run did not get); `speed_moved`: the calibration's `speed_change`;
    `speed_unknown`: why the calibration after the run gave no figure (None: it gave one)."""
    reasons = []
    taken = None if others is None else others + (steal or 0.0)
    if busy(taken, load_before, cores):
        stolen = f", the hypervisor {steal:.0%} of it" if steal else ""
        reasons.append(f"{BUSY} (other processes used {taken:.0%} of the CPU{stolen})" if taken is not None
                       else f"{BUSY} (load average above {cores} cores before the run)")
    if speed_moved is not None and abs(speed_moved) > SPEED_TOLERANCE:
        reasons.append(f"{SPEED_MOVED} (the calibration loop took {speed_moved:+.0%} CPU time after the run against before)")
    if speed_unknown is not None:
        reasons.append(f"{SPEED_UNKNOWN} ({speed_unknown})")
    if quick:
        reasons.append(QUICK)
    return "; ".join(reasons) or None


# Set in the environment when a Run is created: every process the run starts inherits it, Spark's
# JVM among them, which its launcher detaches from the benchmark's process tree (its parent is init).
# The run's own process is known by its pid: /proc shows a process's environment as it started.
RUN_TAG = "FISSURE_BENCHMARK_RUN"


def processes_cpu_s(tag: str, own_pid: int) -> dict[int, tuple[float, float]] | None:
    """CPU seconds (utime + stime) and start time (seconds since boot) of every process that is
    not the run's, by pid (Linux /proc; None elsewhere). The run's: `own_pid`, its descendants
    (a forked child shows the environment its parent started with, without the tag) and every
    process with RUN_TAG=`tag` in its environment. Kernel threads count: their environment is
    empty."""
    marker = f"{RUN_TAG}={tag}".encode()
    ticks = os.sysconf("SC_CLK_TCK")
    seen: dict[int, tuple[int, bool, float, float]] = {}  # pid: parent, tagged, CPU s, start s
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                text = stat.read()
        except OSError:  # the process ended
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                tagged = marker in environ.read().split(b"\0")
        except PermissionError:  # another user's process: not the run's, so it counts as other
            tagged = False
        except OSError:  # it ended between the two reads (often one of the run's own)
            continue
        fields = text[text.rfind(")") + 2:].split()
        seen[int(entry)] = (int(fields[1]), tagged, sum(float(value) for value in fields[11:13]) / ticks,
                            float(fields[19]) / ticks)

    def runs_own(pid: int) -> bool:
        for _ in range(64):  # a parent chain is short; the bound guards against a pid cycle in a racy read
            if pid == own_pid or (pid in seen and seen[pid][1]):
                return True
            if pid not in seen or pid <= 1:
                return False
            pid = seen[pid][0]
        return False

    return {pid: (cpu, started) for pid, (_, _, cpu, started) in seen.items() if not runs_own(pid)}


def steal_and_total_s(text: str | None = None) -> tuple[float, float] | None:
    """The machine's steal time and total CPU time so far, in seconds (the "cpu" line of
    /proc/stat: user nice system idle iowait irq softirq steal ...), None where it is not there."""
    try:
        if text is None:
            with open("/proc/stat", encoding="ascii") as stat:
                text = stat.readline()
        fields = text.split()
        if not fields or fields[0] != "cpu" or len(fields) < 9:
            return None
        ticks = [float(value) for value in fields[1:9]]
    except (OSError, ValueError):
        return None
    hertz = os.sysconf("SC_CLK_TCK")
    return ticks[7] / hertz, sum(ticks) / hertz


def steal_share(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    """The share of the machine's CPU time that the hypervisor gave other guests between two readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return max(0.0, after[0] - before[0]) / (after[1] - before[1])


CALIBRATION_ITERATIONS = 300_000


def calibration_s(repeats: int = 15, iterations: int = CALIBRATION_ITERATIONS, pause_s: float = 0.2,
                  clock: Callable[[], float] = time.thread_time, sleep: Callable[[float], None] = time.sleep) -> float:
    """CPU seconds a fixed pure-Python loop takes on its thread (about 0.015 s), the best of
    `repeats`: the machine's speed for one core, as a benchmark's own code sees it. CPU time, not
    wall time: sharing the cores is what the others' share measures; this is the core's own
    speed (a slower host, a throttled clock), which a wall-clock loop confused with a run's JVM
    still ending beside it (after-loops 9-15 % slower on a quiet machine). Its CPU time grows
    too while the other core works (the two share caches): the loops are spread `pause_s` apart
    over about three seconds, so that the best of them falls after a run's processes ended."""
    best = float("inf")
    for repeat in range(repeats):
        if repeat:
            sleep(pause_s)
        started = clock()
        total = 0
        for index in range(iterations):
            total += index * index % 7
        best = min(best, clock() - started)
    return best


# The calibration loop in a process of its own: argv 1 is the folder this module is in, 2 and 3 the
# repeats and the pause between them.
CALIBRATION_PROGRAM = ("import sys; sys.path.insert(0, sys.argv[1]); import method; "
                       "print(repr(method.calibration_s(int(sys.argv[2]), pause_s=float(sys.argv[3]))))")


def calibration_in_fresh_process(run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
                                 timeout_s: float = 120.0, repeats: int = 15, pause_s: float = 0.2) -> float:
    """`calibration_s` in a new Python process (this interpreter): the machine's speed, not the
    benchmark process's. In the benchmark's own process the loop after a run shared it with what
    the run left: a heap of its results, py4j's and the runner's threads, a Spark session (cost.py's
    after-loop ran 10 % slower in two runs while its direct loop, timed before and after the
    others in each round, ran at the same speed). A new process brings none of them, before the
    run or after it."""
    command = [sys.executable, "-c", CALIBRATION_PROGRAM, str(Path(__file__).resolve().parent), str(repeats),
               repr(pause_s)]
    try:
        finished = run(command, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise MethodError(f"the calibration process did not finish: {error}") from error
    if finished.returncode != 0:
        last_lines = (finished.stderr or "").strip().splitlines()[-3:]
        raise MethodError(f"the calibration process failed (exit {finished.returncode}): {' / '.join(last_lines)}")
    try:
        return float(finished.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as error:
        raise MethodError(f"the calibration process printed no time: {finished.stdout!r}") from error


def end_spark(spark, timeout_s: float = 120.0) -> None:
    """Stop the Spark session `spark` and end the JVM behind it, waiting until that JVM has
    exited, so that the calibration after the run finds no JVM of the run's still working on the
    other core (a stopped session leaves its JVM running until the Python process ends: its
    collector, its compiler threads, a class archive written at exit). PySpark's gateway JVM exits
    when its standard input closes. No pyspark import: what the session holds, by name."""
    context_class = type(spark.sparkContext)
    gateway = getattr(context_class, "_gateway", None)
    spark.stop()
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    try:
        gateway.shutdown()  # py4j's connections and its callback server
    except Exception as error:  # noqa: BLE001 - the JVM is ended below all the same
        print(f"py4j's gateway did not shut down cleanly: {error}", file=sys.stderr)
    context_class._gateway = None
    context_class._jvm = None
    if process is None:
        return
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"Spark's JVM (pid {process.pid}) still runs {timeout_s:g} s after its input closed", file=sys.stderr)


@contextlib.contextmanager
def scratch_folder(script: str) -> Iterator[Path]:
    """A temporary folder for a benchmark's generated inputs and checkpoints (fissure-<script's
    stem>-...), removed when the block ends, on an error too: runs that kept theirs left 100-300 MB
    each in the temporary folder. A script that holds a Spark session ends it inside the block,
    before the folder goes (Spark may still hold files in it)."""
    folder = Path(tempfile.mkdtemp(prefix=f"fissure-{Path(script).stem}-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def speed_change(before_s: float | None, after_s: float | None) -> float | None:
    """How much slower (+) or faster (-) the calibration loop ran after the run than before it."""
    if not before_s or not after_s:
        return None
    return after_s / before_s - 1


def seconds_since_boot() -> float:
    with open("/proc/uptime", encoding="ascii") as uptime:
        return float(uptime.read().split()[0])


class OthersCpu:
    """CPU seconds of the processes that are not the run's, sampled every `interval_s`: the run's
    own are its process and every process carrying its tag (Spark's JVM, its Python workers and
    their children, however short-lived). A process that started during the run counts from 0,
    one that was running from its first sample; one that starts and ends between two samples is
    missed (a competing workload is long-lived: a test session, another benchmark, a build)."""

    def __init__(self, tag: str, own_pid: int, interval_s: float = 1.0) -> None:
        self.tag, self.own_pid, self.interval_s = tag, own_pid, interval_s
        self.base: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.finished = 0.0  # processes whose pid a later process took
        self.available = processes_cpu_s(tag, own_pid) is not None
        self._started = seconds_since_boot() if self.available else 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, daemon=True)
        if self.available:
            self.sample()
            self._thread.start()

    def sample(self) -> None:
        for pid, (seconds, started) in (processes_cpu_s(self.tag, self.own_pid) or {}).items():
            if pid in self.last and seconds < self.last[pid]:  # the pid was reused: keep what the first used
                self.finished += self.last[pid] - self.base[pid]
                del self.base[pid]
            if pid not in self.base:
                self.base[pid] = 0.0 if started >= self._started else seconds
            self.last[pid] = seconds

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def seconds(self) -> float | None:
        if not self.available:
            return None
        self.sample()
        return self.finished + sum(self.last[pid] - self.base[pid] for pid in self.last)


# -- measuring ------------------------------------------------------------------------------------


@dataclass
class Block:
    """Variants measured together: `runs[label]` in repeat order, `orders` the order of each repeat."""

    runs: dict[str, list[float]] = field(default_factory=dict)
    orders: list[list[str]] = field(default_factory=list)
    details: dict[str, list] = field(default_factory=dict)
    seed: int | None = None
    warm_up: str | None = None

    def medians(self) -> dict[str, float]:
        return {label: median(values) for label, values in self.runs.items()}

    def ratio(self, numerator: str, denominator: str) -> float:
        return ratio(self.medians(), numerator, denominator)

    def paired_ratio(self, numerator: str, denominator: str) -> float:
        return paired_ratio(self.runs, numerator, denominator)

    def over_best_of_others(self, numerator: str, among: Iterable[str] | None = None) -> tuple[float, str]:
        return over_best_of_others(self.medians(), numerator, among)

    def to_dict(self) -> dict:
        return {"runs": self.runs, "medians": self.medians(), "orders": self.orders, "seed": self.seed,
                "warm_up": self.warm_up}


def measure_block(variants: dict[str, Callable[[], object]], repeats: int, *, quick: bool = False,
                  warm_up: Callable[[], object] | None = None, warm_up_label: str = "one run, not counted",
                  seed: int | None = None, value: Callable[[object], float] = lambda result: result,
                  log: Callable[[str], None] | None = None) -> Block:
    """Run `warm_up` once (not counted), then `repeats` repeats of every variant, in the order
    `run_order` gives. A variant returns its result; `value(result)` is the figure kept in
    `runs`, the result itself in `details`."""
    check_repeats(repeats, quick)
    block = Block(runs={label: [] for label in variants}, details={label: [] for label in variants}, seed=seed)
    if warm_up is not None:
        warm_up()
        block.warm_up = warm_up_label
    for repeat in range(repeats):
        order = run_order(list(variants), repeat, seed)
        block.orders.append(order)
        for label in order:
            result = variants[label]()
            block.details[label].append(result)
            block.runs[label].append(value(result))
            if log is not None:
                log(f"repeat {repeat + 1}/{repeats} {label}: {block.runs[label][-1]:,.4g}")
    return block


# -- writing results ------------------------------------------------------------------------------


def run_point_process(script: str, what: str, timeout_s: float = 600) -> dict:
    """Run `script` (a benchmark's point, Python source) in a fresh interpreter; its last stdout
    line is its JSON result. Fails with the process's last error output, naming `what`."""
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout_s)
    if finished.returncode != 0:
        raise SystemExit(f"{what} failed:\n{finished.stderr[-3000:]}")
    return json.loads(finished.stdout.strip().splitlines()[-1])


def run_in_tree(command: Sequence[str], tree: Path, name: str) -> dict:
    """Run `command` (a benchmark's own point process) with fissure imported from `tree` (a
    revision's checkout or worktree), the workers Spark starts too; its last stdout line is its
    JSON result. Fails unless it ran and imported fissure from `tree`; the result's "fissure" is
    then the path inside the tree (no machine path kept)."""
    finished = subprocess.run(list(command), capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(tree) / "src")})
    if finished.returncode != 0:
        print(finished.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"the {name} revision's process failed")
    result = json.loads(finished.stdout.strip().splitlines()[-1])
    expected = str(Path(tree) / "src" / "fissure" / "__init__.py")
    if os.path.realpath(result["fissure"]) != os.path.realpath(expected):
        raise SystemExit(f"the {name} process imported {result['fissure']}, not {expected}")
    result["fissure"] = os.path.relpath(result["fissure"], tree)
    return result


def command_line(script: str, argv: Sequence[str] | None) -> str:
    arguments = list(sys.argv[1:] if argv is None else argv)
    return " ".join(["./dev python", f"benchmarks/{script}", *(shlex.quote(arg) for arg in arguments)])


def provenance_lines(header: dict) -> list[str]:
    lines = [f"Regenerate: `{header['command']}`  ", f"Date: {header['date']}  ",
             f"Machine: {header['machine']}  ", f"Revision: {header['revision']}  ",
             f"Load average before / after: {header['load_before']} / {header['load_after']}  "]
    if header.get("others_cpu_share") is not None:
        lines.append(f"Other processes' share of the CPU during the run: {header['others_cpu_share']:.1%}  ")
    if header.get("steal_share") is not None:
        lines.append(f"Steal time (CPU the hypervisor gave other guests): {header['steal_share']:.1%}  ")
    if header.get("speed_change") is not None:
        calibration = header["calibration_s"]
        where = f" in {calibration['where']}" if calibration.get("where") else ""
        lines.append(f"Machine speed (a fixed loop{where}, before / after): {calibration['before'] * 1000:.1f} ms /"
                     f" {calibration['after'] * 1000:.1f} ms ({header['speed_change']:+.1%})  ")
    if header.get("verdict"):
        lines.append(f"**{header['verdict'][0].upper()}{header['verdict'][1:]}.**")
    return lines + [""]


def with_header(markdown: str, header: dict) -> str:
    """The markdown with the provenance block after its title (or at the top without one)."""
    lines = markdown.rstrip("\n").split("\n")
    if lines and lines[0].startswith("# "):
        body = lines[1:]
        while body and not body[0].strip():
            body = body[1:]
        return "\n".join([lines[0], "", *provenance_lines(header), *body]) + "\n"
    return "\n".join([*provenance_lines(header), *lines]) + "\n"


class Run:
    """One run of a benchmark script: where its results go and what they say about themselves.
    Create it first (it records the load before anything runs)."""

    def __init__(self, script: str, argv: Sequence[str] | None = None, *, quick: bool = False,
                 out: str | Path | None = None, master: str | None = "local[2]", timed: bool = True,
                 tree: Path = REPOSITORY, calibrate: Callable[[], float] = calibration_in_fresh_process) -> None:
        self.script, self.quick, self.timed = script, quick, timed
        self._calibrate = calibrate
        self.command = command_line(script, argv)
        if out is None:  # a quick run is no result: a temporary folder unless --out says otherwise
            out = tempfile.mkdtemp(prefix=f"fissure-{Path(script).stem}-") if quick else RESULTS
        self.out = Path(out)
        self.master = master
        self.revision = revision(tree)  # the revision measured, before anything changes
        self.date = now()
        self.load_before = load()
        self.cores = os.cpu_count() or 1
        os.environ.setdefault(RUN_TAG, f"{os.getpid()}-{time.time_ns()}")
        self._others_cpu = OthersCpu(os.environ[RUN_TAG], os.getpid())
        self._steal_before = steal_and_total_s()
        self.calibration_before_s = calibrate() if timed else None
        self._started = time.monotonic()

    def others_cpu_share(self) -> float | None:
        """Other processes' share of the machine's CPU since this run was created (None off Linux)."""
        others = self._others_cpu.seconds()
        return None if others is None else others_share(others, time.monotonic() - self._started, self.cores)

    def header(self) -> dict:
        load_after = load()
        others = self.others_cpu_share()
        header = {"command": self.command, "date": self.date, "machine": machine(self.master),
                  "revision": self.revision, "load_before": self.load_before, "load_after": load_after,
                  "others_cpu_share": None if others is None else round(others, 3),
                  "cores": self.cores, "quick": self.quick}
        steal = steal_share(self._steal_before, steal_and_total_s())
        header["steal_share"] = None if steal is None else round(steal, 3)
        if self.timed:
            try:
                after_s, unknown = self._calibrate(), None
            except MethodError as error:
                after_s, unknown = None, str(error)
            moved = speed_change(self.calibration_before_s, after_s)
            header["calibration_s"] = {"before": round(self.calibration_before_s, 4),
                                       "after": None if after_s is None else round(after_s, 4),
                                       "where": "a fresh Python process"}
            header["speed_change"] = None if moved is None else round(moved, 3)
            header["verdict"] = verdict(others, self.load_before, self.cores, self.quick, steal, moved, unknown)
        else:
            header["verdict"] = QUICK if self.quick else None
        header["quotable"] = header["verdict"] is None
        return header

    def write_results(self, name: str, markdown: str, data: dict) -> Path:
        """`name`.md and `name`.json under the results folder, both with the provenance header."""
        header = self.header()
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"{name}.json").write_text(json.dumps({"provenance": header, **data}, indent=1, default=str) + "\n")
        text = with_header(markdown, header)
        (self.out / f"{name}.md").write_text(text)
        print(text)
        print(f"written: {self.out / name}.md and .json", file=sys.stderr)
        return self.out / f"{name}.md"

    def path(self, filename: str) -> Path:
        """A further output file (a plot, a timeline) in the results folder."""
        self.out.mkdir(parents=True, exist_ok=True)
        return self.out / filename


def add_arguments(parser, *, repeats: int | None = MIN_REPEATS, quick: bool = True, plots: bool = False) -> None:
    """The options every benchmark shares: --out, and --repeats / --quick / --plots where they apply."""
    parser.add_argument("--out", type=Path, default=None,
                        help="results folder (default benchmarks/results; with --quick a temporary folder)")
    if plots:
        parser.add_argument("--plots", action="store_true",
                            help="also draw the figures as PNG files beside the results (the .json holds every "
                                 "figure they show; the repository keeps no plots)")
    if quick:
        parser.add_argument("--quick", action="store_true",
                            help="small inputs, fewer repeats: a check of the script, not a result to quote")
    if repeats is not None:
        parser.add_argument("--repeats", type=int, default=repeats,
                            help=f"repeats per variant, medians (at least {MIN_REPEATS} unless --quick)")
