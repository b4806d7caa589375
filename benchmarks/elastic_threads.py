"""Benchmark: the in-worker elastic thread level against every static thread count.

Two operators run under `fissure.runtime.elastic.runner.ElasticOperatorRunner`:
- enrichment: each record is enriched by an HTTP call to a local service on 127.0.0.1 (started and
  stopped here, in a child process; a fixed number of requests served at once, the rest queue;
  2 ms per request, then 5 ms from the middle of each run on);
- numpy: a 160 x 160 matrix product per record (BLAS held to one thread; NumPy releases the GIL).

For each operator and service latency: a coarse sweep of every static thread level 1..32 (median
of the period throughputs of a short run, median over two repeats, order alternated), then
`repeats` rounds of [a confirmation block: the sweep's top levels and the levels the elastic runs
settled on so far (at most confirm_settled_levels of them), each measured again for longer; one
elastic run per policy], then `closing_blocks` closing blocks. A closing block measures every
candidate: the sweep's top levels, each policy's median settled level, then the other levels any
elastic run of the phase settled on, most frequent first; at most closing_max_levels (8) levels, so
that the closing blocks stay bounded in time.

Whole blocks move together by about 10 % on this machine (enrichment at 2 ms, in one run: one
block measured every level at 4,312-4,783/s, a later one at 4,589-5,288/s), and a settled level
joins the blocks only once a run has settled on it: medians over different sets of blocks compare
different stretches of time. So levels are compared within the same blocks only: the complete
blocks are those that measured every candidate of the closing blocks (the closing blocks, and any
earlier block that happened to). The sweep's best is the maximum of 32 noisy medians, biased
upward; the confirmed best is the candidate with the highest median over the complete blocks.
Static at settled / confirmed best is the median over the complete blocks of the ratio of the two
levels' rates in the same block, reported with the lowest and highest of these per-block ratios and the number
of complete blocks (a spread wider than 5 % leaves the 5 % question undecided). Each elastic run's
settled throughput (median period throughput over the last quarter of a phase; settled level =
most frequent level there) is divided by the confirmed best level's throughput in the two blocks
around that run (the same stretch of time), and the table reports the median of those ratios. The
target: within 5 % of the best static thread count, and settled again after the latency change.

`--sim-only` runs the policies on seeded synthetic curves instead (no timing, deterministic): the
papers' rules as written against the improved policies, the share of the best level they settle at.

    ./dev python benchmarks/elastic_threads.py             # full run, about 30 minutes, quiet machine
    ./dev python benchmarks/elastic_threads.py --repeats 5 # five elastic runs per policy, 39-40 minutes (measured)
    ./dev python benchmarks/elastic_threads.py --quick     # smoke test, about a minute (numbers mean nothing)
    ./dev python benchmarks/elastic_threads.py --sim-only  # policies on synthetic curves

The closing blocks add about closing_blocks x candidates x confirm_seconds per phase (6 x up to 8 x
4 s, three phases) to the run time, less the one last block they replace: two runs with
--repeats 5 and 3 closing blocks at revision 1fdf8d8 took 35 and 36 minutes on the 2-core machine,
with 6 closing blocks at 3997cc0 40 and 39 minutes (the default's 30 is an estimate).

Results go to --out (default benchmarks/results/; --quick: a temporary folder): elastic_threads.md /
.json and elastic_sim_policies.md / .json (only these with --sim-only), and with --plots a .png of
each; --quick adds a _quick suffix. The method of benchmarks/method.py: one uncounted warm-up run per operator, the
confirmation blocks' order rotated, at least 3 elastic runs per policy unless --quick, the header
of every results file written by method.Run.
"""

from __future__ import annotations

import os

# One BLAS thread per call: the thread level under test is the only parallelism.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import argparse  # noqa: E402
import http.client  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, replace  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402
from pathlib import Path  # noqa: E402

from fissure.cli.elastic_sim_curves import (  # noqa: E402
                                            CurvePhase,
                                            random_workload_spec,
                                            replay_curves,
                                            rise_plateau_fall_curve,
                                            settled_level,
                                            )
from fissure.control.thread_level.config import ElasticityConfig, POLICY_NAMES  # noqa: E402
from fissure.control.thread_level.policies import make_policy  # noqa: E402
from fissure.runtime.elastic.runner import ElasticOperatorRunner, ThreadLevelSample  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import method  # noqa: E402


@dataclass(frozen=True)
class Settings:
    max_threads: int = 32
    static_levels: tuple[int, ...] = tuple(range(1, 33))
    static_seconds: float = 1.5
    sweep_repeats: int = 2
    confirm_seconds: float = 4.0  # each candidate in each confirmation block
    confirm_top_levels: int = 3  # the sweep's best levels in every confirmation block
    confirm_settled_levels: int = 3  # at most this many elastic settled levels join them
    # After the last elastic run: blocks that measure every candidate. Six, not three: on the 2 ms
    # service's plateau one block's ratio of two levels ranged 0.909-0.988 over three blocks
    # (elastic_threads.md at 1fdf8d8), too wide for the median of three to decide 5 %.
    closing_blocks: int = 6
    closing_max_levels: int = 8  # the closing blocks' candidates, at most
    repeats: int = 3
    period_s: float = 0.5
    periods_per_phase: int = 90
    service_latency_ms: float = 2.0
    changed_latency_ms: float = 5.0  # from the middle of each elastic run on
    service_concurrency: int = 16
    matrix_size: int = 160
    sim_specs: int = 300

    def __post_init__(self) -> None:
        if self.closing_blocks < 1:
            raise ValueError("closing_blocks: at least 1 (the comparison is made over the closing blocks)")
        if self.closing_max_levels < self.confirm_top_levels:
            raise ValueError("closing_max_levels: at least confirm_top_levels")

    @property
    def phase_seconds(self) -> float:
        return self.period_s * self.periods_per_phase

    @property
    def latencies_ms(self) -> tuple[float, ...]:
        return (self.service_latency_ms, self.changed_latency_ms)


QUICK = Settings(
    max_threads=8,
    static_levels=(1, 2, 4, 8),
    static_seconds=0.3,
    sweep_repeats=1,
    confirm_seconds=0.3,
    confirm_top_levels=2,
    confirm_settled_levels=1,
    closing_blocks=1,
    repeats=1,
    period_s=0.1,
    periods_per_phase=12,
    service_concurrency=4,
    matrix_size=64,
    sim_specs=20,
)


# -- the enrichment service: a child process on loopback, bounded in time ---------------------------
def serve_enrichment(port_queue, latency_ms, concurrency: int, lifetime_s: float, parent_pid: int) -> None:
    """Child process: answer GET /enrich?key=K after `latency_ms`, `concurrency` at a time.

    Stops by itself after lifetime_s, or as soon as its parent is gone."""
    slots = threading.BoundedSemaphore(concurrency)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: one connection per client thread
        disable_nagle_algorithm = True  # headers and body leave in two writes: no 40 ms ACK wait

        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            key = self.path.partition("key=")[2]
            with slots:
                time.sleep(latency_ms.value / 1000)
            body = json.dumps({"key": key, "segment": sum(key.encode()) % 7}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args) -> None:  # noqa: A002 - silence the access log
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 256  # the listen() backlog: 32 threads connect at once (default 5)

    server = Server(("127.0.0.1", 0), Handler)
    port_queue.put(server.server_address[1])
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    deadline = time.monotonic() + lifetime_s
    while time.monotonic() < deadline and os.getppid() == parent_pid:
        time.sleep(0.2)
    server.shutdown()


class EnrichmentService:
    """Starts the service process; `latency_ms` can be changed while it runs."""

    def __init__(self, latency_ms: float, concurrency: int, lifetime_s: float) -> None:
        context = multiprocessing.get_context("fork")
        self._latency = context.Value("d", latency_ms)
        ports = context.Queue()
        self._process = context.Process(
            target=serve_enrichment,
            args=(ports, self._latency, concurrency, lifetime_s, os.getpid()),
            daemon=True,
        )
        self._process.start()
        self.port = ports.get(timeout=10)

    def set_latency_ms(self, latency_ms: float) -> None:
        self._latency.value = latency_ms

    def stop(self) -> None:
        self._process.terminate()
        self._process.join(5)


class EnrichmentClient:
    """The enrichment operator: one keep-alive connection per thread."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._local = threading.local()

    def __call__(self, record: dict) -> dict:
        for attempt in (1, 2):
            connection = getattr(self._local, "connection", None)
            if connection is None:
                connection = self._local.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            try:
                connection.request("GET", f"/enrich?key={record['key']}")
                answer = json.loads(connection.getresponse().read())
                return {**record, "segment": answer["segment"]}
            except (OSError, http.client.HTTPException):
                connection.close()
                self._local.connection = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def numpy_operator(size: int):
    import numpy as np

    matrices = [np.random.default_rng(seed).standard_normal((size, size)) for seed in range(8)]

    def multiply(record: dict) -> float:
        matrix = matrices[record["id"] % len(matrices)]
        return float(np.trace(matrix @ matrix))

    return multiply


def records(deadline_s: float, on_time=None):
    """Bounded source: records until the deadline (and at most ten million)."""
    for index in range(10_000_000):
        now = time.monotonic()
        if now >= deadline_s:
            return
        if on_time is not None:
            on_time(now)
        yield {"id": index, "key": f"user{index % 1000}"}


# -- runs -------------------------------------------------------------------------------------------
def run_static(operator, level: int, seconds: float, settings: Settings) -> float:
    config = ElasticityConfig(max_threads=settings.max_threads, period_s=settings.period_s)
    runner = ElasticOperatorRunner(operator, static_threads=level, config=config, cpu_usage=lambda: None)
    for _ in runner.run(records(time.monotonic() + seconds)):
        pass
    rates = [sample.throughput_per_s for sample in runner.timeline[1:]] or [
        sample.throughput_per_s for sample in runner.timeline
    ]
    return statistics.median(rates) if rates else float("nan")


@dataclass(frozen=True)
class Phase:
    """A stretch of an elastic run, and what changes at its start (the service's latency)."""

    seconds: float
    at_start: object = None  # a callable, or None


def run_elastic(operator, policy: str, phases: list[Phase], settings: Settings, cpu_check: bool):
    """The elastic run's timeline, and the start time of each phase."""
    config = ElasticityConfig(
        max_threads=settings.max_threads,
        period_s=settings.period_s,
        cpu_usage_limit=0.8 if cpu_check else None,
    )
    runner = ElasticOperatorRunner(operator, policy=policy, config=config)
    starts = []
    start = time.monotonic()
    for phase in phases:
        starts.append(start)
        start += phase.seconds
    next_phase = 0

    def on_time(now: float) -> None:
        nonlocal next_phase
        while next_phase < len(phases) and now >= starts[next_phase]:
            if phases[next_phase].at_start is not None:
                phases[next_phase].at_start()
            next_phase += 1

    for _ in runner.run(records(start, on_time)):
        pass
    return runner.timeline, starts


@dataclass(frozen=True)
class PhaseSummary:
    settled_level: int
    settled_throughput_per_s: float
    periods: int


def summarize_phase(timeline: tuple[ThreadLevelSample, ...], start: float, end: float) -> PhaseSummary:
    samples = [sample for sample in timeline if start < sample.time_s <= end]
    if not samples:
        return PhaseSummary(0, float("nan"), 0)
    tail = samples[-max(1, len(samples) // 4) :]
    return PhaseSummary(
        settled_level=settled_level([sample.level for sample in samples]),
        settled_throughput_per_s=statistics.median(sample.throughput_per_s for sample in tail),
        periods=len(samples),
    )


def static_sweep(operator, settings: Settings, log) -> dict[int, list[float]]:
    """A coarse screen of every level (which levels the confirmation blocks measure), after one
    uncounted warm-up run at the highest level."""
    run_static(operator, max(settings.static_levels), settings.static_seconds, settings)  # warm-up
    rates: dict[int, list[float]] = {level: [] for level in settings.static_levels}
    for repeat in range(settings.sweep_repeats):
        # Alternate the order between repeats, so that a slow drift of the machine averages out.
        order = settings.static_levels if repeat % 2 == 0 else tuple(reversed(settings.static_levels))
        for level in order:
            rates[level].append(run_static(operator, level, settings.static_seconds, settings))
        log(f"  static repeat {repeat + 1}: " + " ".join(f"{level}:{rates[level][-1]:.0f}" for level in order))
    return rates


def confirmation_levels(sweep: dict[int, list[float]], settled: list[int], settings: Settings) -> tuple[int, ...]:
    """The sweep's top levels, and the levels the elastic runs settled on most often so far."""
    medians = {level: statistics.median(values) for level, values in sweep.items()}
    top = sorted(medians, key=medians.get, reverse=True)[: settings.confirm_top_levels]
    frequent = sorted(set(settled), key=lambda level: (-settled.count(level), level))
    extra = [level for level in frequent if level not in top][: settings.confirm_settled_levels]
    return tuple(sorted({*top, *extra}))


def confirmation_block(
    operator, levels: tuple[int, ...], settings: Settings, block: int, log, label: str
) -> dict[int, float]:
    """Each level measured for confirm_seconds; the order rotated each block."""
    order = method.run_order(levels, block)
    rates = {level: run_static(operator, level, settings.confirm_seconds, settings) for level in order}
    log(f"  {label} confirmation block {block + 1}: " + " ".join(f"{level}:{rates[level]:.0f}" for level in order))
    return rates


def closing_levels(sweep: dict[int, list[float]], settled_by_policy: dict[str, list[int]],
                   settings: Settings) -> tuple[int, ...]:
    """The closing blocks' candidates: the sweep's top levels, each policy's median settled level
    (the level its static-at-settled ratio is about), then the other settled levels, most frequent
    first; at most closing_max_levels in all."""
    medians = {level: statistics.median(values) for level, values in sweep.items()}
    chosen = sorted(medians, key=medians.get, reverse=True)[: settings.confirm_top_levels]
    every_settled = [level for levels in settled_by_policy.values() for level in levels]
    policy_medians = [int(statistics.median_low(levels)) for levels in settled_by_policy.values() if levels]
    frequent = sorted(set(every_settled), key=lambda level: (-every_settled.count(level), level))
    for level in [*policy_medians, *frequent]:
        if level not in chosen:
            chosen.append(level)
    return tuple(sorted(chosen[: settings.closing_max_levels]))


def complete_blocks(blocks: list[dict[int, float]]) -> tuple[tuple[int, ...], list[dict[int, float]]]:
    """The levels compared (those of the last block, a closing block) and the blocks that measured
    every one of them: whole blocks move together by about 10 % on this machine, so levels are
    compared only within the same blocks."""
    compared = tuple(sorted(blocks[-1]))
    return compared, [block for block in blocks if all(level in block for level in compared)]


def compare(sweep: dict[int, list[float]], blocks: list[dict[int, float]], elastic: list[PhaseSummary]) -> dict:
    """Confirmed best = the level with the highest median over the complete blocks (those that
    measured every level compared; at least the closing blocks). Static at settled / confirmed
    best = the median over the complete blocks of the ratio of the two levels' rates in the same
    block; its spread (min, max) shows whether 5 % is decidable. Elastic run r sits between
    confirmation blocks r and r + 1: its ratio is to the confirmed best level's mean over those two
    blocks (the same stretch of time); medians over the runs."""
    sweep_medians = {level: statistics.median(values) for level, values in sweep.items()}
    sweep_best = max(sweep_medians, key=sweep_medians.get)
    compared, complete = complete_blocks(blocks)
    confirmed = {level: statistics.median(block[level] for block in complete) for level in compared}
    best_level = max(confirmed, key=confirmed.get)
    ratios = []
    for run, summary in enumerate(elastic):
        around = [block[best_level] for block in blocks[run : run + 2] if best_level in block]
        if around:
            ratios.append(summary.settled_throughput_per_s / statistics.mean(around))
    settled = [summary.settled_level for summary in elastic]
    median_settled = int(statistics.median_low(settled))
    ratio = statistics.median(ratios) if ratios else float("nan")
    # A median settled level left out of the closing blocks (their cap) has no paired ratio.
    paired = [block[median_settled] / block[best_level] for block in complete] if median_settled in compared else []
    return {
        "static_median_per_s": sweep_medians,
        "sweep_best_level": sweep_best,
        "sweep_best_per_s": sweep_medians[sweep_best],
        "confirmation_blocks": blocks,
        "complete_blocks": len(complete),
        "confirmed_median_per_s": confirmed,
        "best_static_level": best_level,
        "best_static_per_s": confirmed[best_level],
        "elastic_settled_levels": settled,
        "elastic_settled_per_s": [summary.settled_throughput_per_s for summary in elastic],
        "elastic_over_best_static_per_run": ratios,
        "elastic_runs_without_best_nearby": len(elastic) - len(ratios),
        "elastic_over_best_static": ratio,
        "elastic_over_sweep_best": statistics.median(summary.settled_throughput_per_s for summary in elastic)
        / sweep_medians[sweep_best],
        "static_at_settled_over_best_per_block": paired,
        "static_at_settled_over_best": statistics.median(paired) if paired else float("nan"),
        "static_at_settled_over_best_min": min(paired) if paired else float("nan"),
        "static_at_settled_over_best_max": max(paired) if paired else float("nan"),
        "within_5_percent": ratio >= 0.95,
    }


def benchmark(settings: Settings, log) -> dict:
    results: dict = {"operators": {}}
    lifetime_s = 4 * 3600  # the service stops by itself even if this script is killed
    service = EnrichmentService(settings.service_latency_ms, settings.service_concurrency, lifetime_s)
    try:
        client = EnrichmentClient(service.port)
        sweeps = {}
        for latency in settings.latencies_ms:
            service.set_latency_ms(latency)
            log(f"enrichment, service latency {latency} ms, coarse static sweep")
            sweeps[latency] = static_sweep(client, settings, log)
        blocks: dict[float, list[dict[int, float]]] = {latency: [] for latency in settings.latencies_ms}
        settled: dict[float, dict[str, list[int]]] = {
            latency: {policy: [] for policy in POLICY_NAMES} for latency in settings.latencies_ms
        }
        elastic_runs: dict[str, list[list[PhaseSummary]]] = {policy: [] for policy in POLICY_NAMES}
        timelines = {}

        def confirm(block: int, closing: bool = False) -> None:
            for latency in settings.latencies_ms:
                service.set_latency_ms(latency)
                if closing:
                    levels = closing_levels(sweeps[latency], settled[latency], settings)
                else:
                    every_settled = [level for levels in settled[latency].values() for level in levels]
                    levels = confirmation_levels(sweeps[latency], every_settled, settings)
                label = f"enrichment {latency} ms{' closing' if closing else ''}"
                blocks[latency].append(confirmation_block(client, levels, settings, block, log, label))

        for repeat in range(settings.repeats):
            confirm(repeat)
            # Alternate which policy runs first, so that neither always follows the static block.
            order = POLICY_NAMES if repeat % 2 == 0 else tuple(reversed(POLICY_NAMES))
            for policy in order:
                service.set_latency_ms(settings.service_latency_ms)
                phases = [
                    Phase(settings.phase_seconds),
                    Phase(settings.phase_seconds, lambda: service.set_latency_ms(settings.changed_latency_ms)),
                ]
                timeline, starts = run_elastic(client, policy, phases, settings, cpu_check=False)
                ends = [*starts[1:], float("inf")]
                summaries = [summarize_phase(timeline, start, end) for start, end in zip(starts, ends)]
                elastic_runs[policy].append(summaries)
                for latency, summary in zip(settings.latencies_ms, summaries):
                    settled[latency][policy].append(summary.settled_level)
                timelines.setdefault(policy, (timeline, starts[1]))
                log(f"  elastic {policy} repeat {repeat + 1}: settled {[s.settled_level for s in summaries]}")
        for closing in range(settings.closing_blocks):
            confirm(settings.repeats + closing, closing=True)
        results["operators"]["enrichment"] = {
            "phases": [
                {
                    "service_latency_ms": latency,
                    **{
                        policy: compare(sweeps[latency], blocks[latency], [runs[index] for runs in elastic_runs[policy]])
                        for policy in POLICY_NAMES
                    },
                }
                for index, latency in enumerate(settings.latencies_ms)
            ]
        }
        results["timelines"] = {
            policy: {"switch_time_s": switch, "samples": [asdict(sample) for sample in timeline]}
            for policy, (timeline, switch) in timelines.items()
        }
    finally:
        service.stop()
    numpy_op = numpy_operator(settings.matrix_size)
    log("numpy, coarse static sweep")
    sweep = static_sweep(numpy_op, settings, log)
    numpy_blocks: list[dict[int, float]] = []
    numpy_runs: dict[str, list[PhaseSummary]] = {policy: [] for policy in POLICY_NAMES}
    for repeat in range(settings.repeats):
        numpy_settled = [summary.settled_level for runs in numpy_runs.values() for summary in runs]
        levels = confirmation_levels(sweep, numpy_settled, settings)
        numpy_blocks.append(confirmation_block(numpy_op, levels, settings, repeat, log, "numpy"))
        order = POLICY_NAMES if repeat % 2 == 0 else tuple(reversed(POLICY_NAMES))
        for policy in order:
            timeline, starts = run_elastic(numpy_op, policy, [Phase(settings.phase_seconds)], settings, cpu_check=True)
            summary = summarize_phase(timeline, starts[0], float("inf"))
            numpy_runs[policy].append(summary)
            log(f"  elastic {policy} repeat {repeat + 1}: settled {summary.settled_level}")
    numpy_settled_by_policy = {
        policy: [summary.settled_level for summary in runs] for policy, runs in numpy_runs.items()
    }
    for closing in range(settings.closing_blocks):
        levels = closing_levels(sweep, numpy_settled_by_policy, settings)
        numpy_blocks.append(confirmation_block(numpy_op, levels, settings, settings.repeats + closing, log,
                                               "numpy closing"))
    results["operators"]["numpy"] = {
        "phases": [{policy: compare(sweep, numpy_blocks, numpy_runs[policy]) for policy in POLICY_NAMES}]
    }
    return results


# -- the policies on synthetic curves (no timing) -------------------------------------------------------
SIM_NOISES = (0.12, 0.02)  # 0.12: the per-period noise measured on this machine (0.5 s periods)


def simulate_policies(count: int) -> dict:
    """Per noise, policy and variant: the settled share of the best (the elastic-sim contract),
    the true mean throughput over each phase's last quarter as a share of the best (what probing
    in the settled quarter costs) and the level changes in that quarter."""
    variants = {
        "as written": ElasticityConfig.as_written(),
        "improved (1-10, whole rescan)": ElasticityConfig(load_change_scan_span=None),
        "improved (1-11)": ElasticityConfig(),
    }
    table = {}
    for noise in SIM_NOISES:
        for policy in POLICY_NAMES:
            for label, config in variants.items():
                shares, tail_shares, tail_moves = [], [], []
                for seed in range(count):
                    spec = random_workload_spec(seed, phases=3, noise=noise)
                    phases = [CurvePhase(phase["periods"], tuple(phase["throughput"])) for phase in spec["phases"]]
                    levels = replay_curves(make_policy(policy, config), phases, noise, seed)
                    for phase, phase_levels in zip(phases, levels):
                        rates = phase.throughput_per_s
                        shares.append(rates[settled_level(phase_levels) - 1] / max(rates))
                        tail = phase_levels[-max(1, len(phase_levels) // 4) :]
                        tail_shares.append(statistics.mean(rates[level - 1] for level in tail) / max(rates))
                        tail_moves.append(sum(before != after for before, after in zip(tail, tail[1:])))
                ordered = sorted(shares)
                table[f"noise {noise}, {policy}, {label}"] = {
                    "noise": noise,
                    "phases": len(shares),
                    "below_0.95": sum(share < 0.95 for share in shares),
                    "mean_share": statistics.mean(shares),
                    "p5_share": ordered[len(ordered) // 20],
                    "worst_share": ordered[0],
                    "mean_last_quarter_share": statistics.mean(tail_shares),
                    "last_quarter_below_0.95": sum(share < 0.95 for share in tail_shares),
                    "mean_last_quarter_moves": statistics.mean(tail_moves),
                    "shares": shares,
                }
    return table


# The benchmark's own shape, as the tests' TestUnderRealisticNoise has it: a rise to a flat top at
# 14-18 threads, then (a change in load) a lower flat top at 20-24; 90 periods each, 12 % noise.
SHAPE_PHASES = (CurvePhase(90, rise_plateau_fall_curve(32, 14, 18, 0.04, 4000.0)),
                CurvePhase(90, rise_plateau_fall_curve(32, 20, 24, 0.03, 2800.0)))
SHAPE_NOISE = 0.12


def simulate_benchmark_shape(seeds: int) -> dict:
    """Per policy, 1-10 (whole rescan) and 1-11: phases settled within 5 % of the best, the true
    rate over each phase's last quarter as a share of the best (mean, worst), and the level
    changes in that quarter (median, mean)."""
    variants = {"1-10, whole rescan": ElasticityConfig(max_threads=32, load_change_scan_span=None),
                "1-11": ElasticityConfig(max_threads=32)}
    rows = {}
    for policy in POLICY_NAMES:
        for label, config in variants.items():
            within, tail_shares, tail_moves = 0, [], []
            for seed in range(seeds):
                levels = replay_curves(make_policy(policy, config), list(SHAPE_PHASES), SHAPE_NOISE, seed)
                for phase, phase_levels in zip(SHAPE_PHASES, levels):
                    rates = phase.throughput_per_s
                    within += rates[settled_level(phase_levels) - 1] >= 0.95 * max(rates)
                    tail = phase_levels[-max(1, len(phase_levels) // 4) :]
                    tail_shares.append(statistics.mean(rates[level - 1] for level in tail) / max(rates))
                    tail_moves.append(sum(before != after for before, after in zip(tail, tail[1:])))
            rows[f"{policy}, {label}"] = {
                "phases": len(tail_shares), "within_5_percent": within,
                "mean_last_quarter_share": statistics.mean(tail_shares), "worst_last_quarter_share": min(tail_shares),
                "median_moves": statistics.median(tail_moves), "mean_moves": statistics.mean(tail_moves),
            }
    return rows


# -- output -------------------------------------------------------------------------------------------
def header(title: str) -> list[str]:
    return [f"# {title}", ""]


def markdown_benchmark(results: dict, settings: Settings, quick: bool) -> str:
    lines = header("Elastic thread level against every static thread count")
    lines += [
        f"Settings: {json.dumps(asdict(settings))}",
        "",
        "Settled throughput = median period throughput over the last quarter of a phase. Sweep best = the",
        "highest of the coarse sweep's medians (the maximum of 32 noisy medians: biased upward). Confirmed",
        "best = the candidate with the highest median over the complete confirmation blocks (the candidates:",
        "the sweep's top levels and the elastic settled levels, measured again for longer in blocks alternated",
        "with the elastic runs; complete blocks: those that measured every candidate, at least the",
        f"{settings.closing_blocks} closing blocks after the last elastic run). elastic / confirmed best = median",
        "over the elastic runs of (settled throughput / the confirmed best level's mean in the two blocks around",
        "the run). static at settled / confirmed best = median over the complete blocks of (rate at the median",
        "settled level / rate at the confirmed best level, in the same block); in brackets the lowest and",
        "highest of these per-block ratios and the number of complete blocks: a spread wider than 5 % means",
        "the 5 % question is not decided by these blocks. The enrichment runs do not apply the CPU check",
        "(the service shares this machine only for the benchmark); the numpy runs do.",
        "",
        "| operator | phase | policy | sweep best level (/s) | confirmed best level (/s) | elastic settled levels | "
        "elastic / confirmed best | elastic / sweep best | static at settled / confirmed best (min-max, blocks) | "
        "within 5 % |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for operator, entry in results["operators"].items():
        for phase in entry["phases"]:
            label = f"latency {phase['service_latency_ms']} ms" if "service_latency_ms" in phase else "-"
            for policy in POLICY_NAMES:
                row = phase[policy]
                lines.append(
                    f"| {operator} | {label} | {policy} | {row['sweep_best_level']} ({row['sweep_best_per_s']:.0f}) | "
                    f"{row['best_static_level']} ({row['best_static_per_s']:.0f}) | "
                    f"{row['elastic_settled_levels']} | {row['elastic_over_best_static']:.3f} | "
                    f"{row['elastic_over_sweep_best']:.3f} | "
                    f"{row['static_at_settled_over_best']:.3f} ({row['static_at_settled_over_best_min']:.3f}-"
                    f"{row['static_at_settled_over_best_max']:.3f}, {row['complete_blocks']}) | "
                    f"{'yes' if row['within_5_percent'] else 'no'} |"
                )
    lines += ["", "Confirmation medians per candidate level (over the complete blocks):", ""]
    for operator, entry in results["operators"].items():
        for phase in entry["phases"]:
            confirmed = phase[POLICY_NAMES[0]]["confirmed_median_per_s"]
            label = f", latency {phase['service_latency_ms']} ms" if "service_latency_ms" in phase else ""
            lines.append(
                f"- {operator}{label}: " + ", ".join(f"{level}: {rate:.0f}" for level, rate in sorted(confirmed.items()))
            )
    lines += ["", "Coarse sweep medians per thread level:", ""]
    for operator, entry in results["operators"].items():
        for phase in entry["phases"]:
            medians = phase[POLICY_NAMES[0]]["static_median_per_s"]
            label = f", latency {phase['service_latency_ms']} ms" if "service_latency_ms" in phase else ""
            lines.append(f"- {operator}{label}: " + ", ".join(f"{level}: {rate:.0f}" for level, rate in medians.items()))
    return "\n".join(lines) + "\n"


def markdown_simulation(table: dict, shape: dict, count: int, quick: bool) -> str:
    lines = header("Thread-level policies on synthetic curves: as written and improved")
    lines += [
        f"{count} seeded specs of 3 phases each (`fissure.cli.elastic_sim_curves.random_workload_spec`: rise-peak-fall",
        "as a smooth bump, a tent or the universal scalability law with the peak anywhere in 1..32, or a plateau",
        "with a sharp or soft knee; 100-140 periods per phase, every phase boundary a change in load), each period's",
        "throughput times (1 + noise x a normal draw): noise 0.12 is what 0.5 s periods show on this machine,",
        "0.02 the earlier, kinder setting. Share = throughput at the settled level (most frequent over a phase's",
        "last quarter) / the phase's best. Last-quarter share = the true mean throughput over the levels in force",
        "in the last quarter / the best (probing included); moves = level changes in the last quarter.",
        "",
        "| noise, policy | phases | share < 0.95 | mean share | 5th percentile | worst | "
        "last-quarter share (< 0.95) | moves in last quarter |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in table.items():
        lines.append(
            f"| {name} | {row['phases']} | {row['below_0.95']} | {row['mean_share']:.4f} | "
            f"{row['p5_share']:.3f} | {row['worst_share']:.3f} | {row['mean_last_quarter_share']:.4f} "
            f"({row['last_quarter_below_0.95']}) | {row['mean_last_quarter_moves']:.1f} |"
        )
    seeds = next(iter(shape.values()))["phases"] // len(SHAPE_PHASES) if shape else 0
    lines += [
        "",
        f"On the benchmark's own shape ({seeds} seeds x 2 phases: a rise to a flat top at 14-18 threads, then a",
        "change in load to a lower flat top at 20-24; 90 periods each, noise 0.12; the tests' TestUnderRealisticNoise):",
        "",
        "| policy, improvements | settled within 5 % | last quarter: mean share (worst) | moves in last quarter: median (mean) |",
        "| --- | --- | --- | --- |",
    ]
    for name, row in shape.items():
        lines.append(
            f"| {name} | {row['within_5_percent']} of {row['phases']} | {row['mean_last_quarter_share']:.3f} "
            f"({row['worst_last_quarter_share']:.3f}) | {row['median_moves']:g} ({row['mean_moves']:.1f}) |"
        )
    return "\n".join(lines) + "\n"


def plot_benchmark(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(operator, phase) for operator, entry in results["operators"].items() for phase in entry["phases"]]
    figure, axes = plt.subplots(1, len(panels) + 1, figsize=(5 * (len(panels) + 1), 4))
    for axis, (operator, phase) in zip(axes, panels):
        medians = phase[POLICY_NAMES[0]]["static_median_per_s"]
        axis.plot(list(medians), list(medians.values()), "o-", color="black", label="static sweep (median)")
        confirmed = phase[POLICY_NAMES[0]]["confirmed_median_per_s"]
        axis.plot(list(confirmed), list(confirmed.values()), "s", color="tab:green", label="static confirmed")
        for policy, color in zip(POLICY_NAMES, ("tab:blue", "tab:orange")):
            axis.axhline(statistics.median(phase[policy]["elastic_settled_per_s"]), color=color, label=f"elastic {policy}")
        label = f", {phase['service_latency_ms']} ms" if "service_latency_ms" in phase else ""
        axis.set(title=f"{operator}{label}", xlabel="threads", ylabel="records / s")
        axis.legend(fontsize=7)
    timeline = results["timelines"][POLICY_NAMES[0]]
    samples = timeline["samples"]
    start = samples[0]["time_s"] - samples[0]["period_s"] if samples else 0
    axis = axes[-1]
    axis.plot([s["time_s"] - start for s in samples], [s["throughput_per_s"] for s in samples], color="tab:blue")
    axis.set(title=f"enrichment, {POLICY_NAMES[0]}", xlabel="seconds", ylabel="records / s")
    axis.axvline(timeline["switch_time_s"] - start, color="grey", linestyle="--")
    levels = axis.twinx()
    levels.step([s["time_s"] - start for s in samples], [s["level"] for s in samples], color="tab:red", where="pre")
    levels.set_ylabel("thread level", color="tab:red")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_simulation(table: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4.5))
    for name, row in table.items():
        shares = sorted(row["shares"])
        axis.plot([index / len(shares) for index in range(len(shares))], shares, label=name)
    axis.axhline(0.95, color="grey", linestyle="--")
    axis.set(xlabel="share of phases (sorted)", ylabel="settled share of best", ylim=(0, 1.02))
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    method.add_arguments(parser, repeats=None, plots=True)
    parser.add_argument("--sim-only", action="store_true", help="only the policies on synthetic curves")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"elastic runs per policy (default {Settings().repeats}; at least {method.MIN_REPEATS} "
                             "unless --quick)")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else Settings()
    if args.repeats is not None:
        settings = replace(settings, repeats=args.repeats)
    method.check_repeats(settings.repeats, args.quick)
    suffix = "_quick" if args.quick else ""
    simulation = method.Run("elastic_threads.py", argv, quick=args.quick, out=args.out, master=None, timed=False)
    measurement = method.Run("elastic_threads.py", argv, quick=args.quick, out=simulation.out, master=None)

    def log(message: str) -> None:
        print(message, flush=True)

    table = simulate_policies(settings.sim_specs)
    shape = simulate_benchmark_shape(2 if args.quick else 20)
    document = {"random_specs": table, "benchmark_shape": shape}
    simulation.write_results(f"elastic_sim_policies{suffix}", markdown_simulation(table, shape, settings.sim_specs,
                                                                                  args.quick), document)
    if args.plots:
        plot_simulation(table, simulation.path(f"elastic_sim_policies{suffix}.png"))
    if args.sim_only:
        return 0
    results = benchmark(settings, log)
    results["settings"] = asdict(settings)
    measurement.write_results(f"elastic_threads{suffix}", markdown_benchmark(results, settings, args.quick), results)
    if args.plots:
        plot_benchmark(results, measurement.path(f"elastic_threads{suffix}.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
