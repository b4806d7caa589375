"""Benchmark of issue 6: the in-worker elastic thread level against every static thread count.

Two operators run under `fissure.worker.scheduler.ElasticOperatorRunner`:
- enrichment: each record is enriched by an HTTP call to a local service on 127.0.0.1 (started and
  stopped here, in a child process; a fixed number of requests served at once, the rest queue;
  2 ms per request, then 5 ms from the middle of each run on);
- numpy: a 160 x 160 matrix product per record (BLAS held to one thread; NumPy releases the GIL).

For each operator and service latency: throughput at every static thread level 1..32 (median of
the period throughputs of a run, median over the repeats), then elastic runs (trust-trend and
elastic-operator policies, repeats) whose settled level (most frequent level over the last quarter
of a phase) and settled throughput (median over that quarter) are compared, by ratio inside the
same run, with the best static level. The goal: within 5 % of the best static thread count, and
settled again after the latency change.

`--sim-only` runs the policies on seeded synthetic curves instead (no timing, deterministic): the
papers' rules as written against the improved policies, the share of the best level they settle at.

    ./dev python benchmarks/elastic_threads.py             # full run, about 20 minutes, quiet machine
    ./dev python benchmarks/elastic_threads.py --quick     # smoke test, seconds (numbers mean nothing)
    ./dev python benchmarks/elastic_threads.py --sim-only  # policies on synthetic curves

Results go to benchmarks/results/ (or --out): elastic_threads.md / .json / .png, or
elastic_sim_policies.md / .json / .png for --sim-only; --quick adds a _quick suffix.
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
import platform  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, replace  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402
from pathlib import Path  # noqa: E402

from fissure.control.elasticity import (  # noqa: E402
    POLICY_NAMES,
    CurvePhase,
    ElasticityConfig,
    make_policy,
    random_workload_spec,
    replay_curves,
    settled_level,
)
from fissure.worker.scheduler import ElasticOperatorRunner, ThreadLevelSample  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Settings:
    max_threads: int = 32
    static_levels: tuple[int, ...] = tuple(range(1, 33))
    static_seconds: float = 1.5
    repeats: int = 3
    period_s: float = 0.5
    periods_per_phase: int = 90
    service_latency_ms: float = 2.0
    changed_latency_ms: float = 5.0  # from the middle of each elastic run on
    service_concurrency: int = 16
    matrix_size: int = 160
    sim_specs: int = 300

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
    rates: dict[int, list[float]] = {level: [] for level in settings.static_levels}
    for repeat in range(settings.repeats):
        # Alternate the order between repeats, so that a slow drift of the machine averages out.
        order = settings.static_levels if repeat % 2 == 0 else tuple(reversed(settings.static_levels))
        for level in order:
            rates[level].append(run_static(operator, level, settings.static_seconds, settings))
        log(f"  static repeat {repeat + 1}: " + " ".join(f"{level}:{rates[level][-1]:.0f}" for level in order))
    return rates


def compare(static: dict[int, list[float]], elastic: list[PhaseSummary]) -> dict:
    medians = {level: statistics.median(values) for level, values in static.items()}
    best_level = max(medians, key=medians.get)
    best = medians[best_level]
    settled = [summary.settled_level for summary in elastic]
    throughput = [summary.settled_throughput_per_s for summary in elastic]
    median_settled = int(statistics.median_low(settled))
    return {
        "static_median_per_s": medians,
        "best_static_level": best_level,
        "best_static_per_s": best,
        "elastic_settled_levels": settled,
        "elastic_settled_per_s": throughput,
        "elastic_over_best_static": statistics.median(throughput) / best,
        "static_at_settled_over_best": medians.get(median_settled, float("nan")) / best,
        "within_5_percent": statistics.median(throughput) / best >= 0.95,
    }


def benchmark(settings: Settings, log) -> dict:
    results: dict = {"operators": {}}
    lifetime_s = 4 * 3600  # the service stops by itself even if this script is killed
    service = EnrichmentService(settings.service_latency_ms, settings.service_concurrency, lifetime_s)
    try:
        client = EnrichmentClient(service.port)
        static_by_latency = {}
        for latency in settings.latencies_ms:
            service.set_latency_ms(latency)
            log(f"enrichment, service latency {latency} ms, static levels")
            static_by_latency[latency] = static_sweep(client, settings, log)
        elastic_runs: dict[str, list[list[PhaseSummary]]] = {}
        timelines = {}
        for policy in POLICY_NAMES:
            for repeat in range(settings.repeats):
                service.set_latency_ms(settings.service_latency_ms)
                phases = [
                    Phase(settings.phase_seconds),
                    Phase(settings.phase_seconds, lambda: service.set_latency_ms(settings.changed_latency_ms)),
                ]
                timeline, starts = run_elastic(client, policy, phases, settings, cpu_check=False)
                ends = [*starts[1:], float("inf")]
                summaries = [summarize_phase(timeline, start, end) for start, end in zip(starts, ends)]
                elastic_runs.setdefault(policy, []).append(summaries)
                timelines.setdefault(policy, (timeline, starts[1]))
                log(f"  elastic {policy} repeat {repeat + 1}: settled {[s.settled_level for s in summaries]}")
        results["operators"]["enrichment"] = {
            "phases": [
                {
                    "service_latency_ms": latency,
                    **{
                        policy: compare(static_by_latency[latency], [runs[index] for runs in elastic_runs[policy]])
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
    log("numpy, static levels")
    static = static_sweep(numpy_op, settings, log)
    phase = {}
    for policy in POLICY_NAMES:
        summaries = []
        for _ in range(settings.repeats):
            timeline, starts = run_elastic(numpy_op, policy, [Phase(settings.phase_seconds)], settings, cpu_check=True)
            summaries.append(summarize_phase(timeline, starts[0], float("inf")))
        phase[policy] = compare(static, summaries)
        log(f"  elastic {policy}: settled {[summary.settled_level for summary in summaries]}")
    results["operators"]["numpy"] = {"phases": [phase]}
    return results


# -- the policies on synthetic curves (no timing) -------------------------------------------------------
def simulate_policies(count: int) -> dict:
    variants = {"as written": ElasticityConfig.as_written(), "improved": ElasticityConfig()}
    table = {}
    for policy in POLICY_NAMES:
        for label, config in variants.items():
            shares = []
            for seed in range(count):
                spec = random_workload_spec(seed, phases=3)
                phases = [CurvePhase(phase["periods"], tuple(phase["throughput"])) for phase in spec["phases"]]
                levels = replay_curves(make_policy(policy, config), phases, spec["noise"], seed)
                for phase, phase_levels in zip(phases, levels):
                    rates = phase.throughput_per_s
                    shares.append(rates[settled_level(phase_levels) - 1] / max(rates))
            ordered = sorted(shares)
            table[f"{policy}, {label}"] = {
                "phases": len(shares),
                "below_0.95": sum(share < 0.95 for share in shares),
                "mean_share": statistics.mean(shares),
                "p5_share": ordered[len(ordered) // 20],
                "worst_share": ordered[0],
                "shares": shares,
            }
    return table


# -- output -------------------------------------------------------------------------------------------
def header(title: str, quick: bool) -> list[str]:
    command = "./dev python benchmarks/elastic_threads.py " + " ".join(shlex.quote(arg) for arg in sys.argv[1:])
    lines = [f"# {title}", ""]
    if quick:
        lines += ["**Quick mode: a smoke test of the script, not a measurement.**", ""]
    lines += [
        f"- command: `{command.strip()}`",
        f"- machine: {platform.machine()}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}",
        f"- date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        "",
    ]
    return lines


def markdown_benchmark(results: dict, settings: Settings, quick: bool) -> str:
    lines = header("Elastic thread level against every static thread count", quick)
    lines += [
        f"Settings: {json.dumps(asdict(settings))}",
        "",
        "Settled throughput = median period throughput over the last quarter of a phase; ratios are to the",
        "best static level's median in the same run. The enrichment runs do not apply the CPU check (the",
        "service shares this machine only for the benchmark); the numpy runs do.",
        "",
        "| operator | phase | policy | best static level | best static /s | elastic settled levels | "
        "elastic / best static | static at settled / best | within 5 % |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for operator, entry in results["operators"].items():
        for phase in entry["phases"]:
            label = f"latency {phase['service_latency_ms']} ms" if "service_latency_ms" in phase else "-"
            for policy in POLICY_NAMES:
                row = phase[policy]
                lines.append(
                    f"| {operator} | {label} | {policy} | {row['best_static_level']} | {row['best_static_per_s']:.0f} | "
                    f"{row['elastic_settled_levels']} | {row['elastic_over_best_static']:.3f} | "
                    f"{row['static_at_settled_over_best']:.3f} | {'yes' if row['within_5_percent'] else 'no'} |"
                )
    lines += ["", "Static medians per thread level:", ""]
    for operator, entry in results["operators"].items():
        for phase in entry["phases"]:
            medians = phase[POLICY_NAMES[0]]["static_median_per_s"]
            label = f", latency {phase['service_latency_ms']} ms" if "service_latency_ms" in phase else ""
            lines.append(f"- {operator}{label}: " + ", ".join(f"{level}: {rate:.0f}" for level, rate in medians.items()))
    return "\n".join(lines) + "\n"


def markdown_simulation(table: dict, count: int, quick: bool) -> str:
    lines = header("Thread-level policies on synthetic curves: as written and improved", quick)
    lines += [
        f"{count} seeded specs of 3 phases each (`fissure.control.elasticity.random_workload_spec`: rise-peak-fall",
        "as a smooth bump, a tent or the universal scalability law with the peak anywhere in 1..32, or a plateau",
        "with a sharp or soft knee; 100-140 periods per phase, every phase boundary a change in load, noise 0.02).",
        "Share = throughput at the settled level (most frequent over a phase's last quarter) / the phase's best.",
        "",
        "| policy | phases | share < 0.95 | mean share | 5th percentile | worst |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in table.items():
        lines.append(
            f"| {name} | {row['phases']} | {row['below_0.95']} | {row['mean_share']:.4f} | "
            f"{row['p5_share']:.3f} | {row['worst_share']:.3f} |"
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
        axis.plot(list(medians), list(medians.values()), "o-", color="black", label="static (median)")
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

    figure, axis = plt.subplots(figsize=(7, 4))
    for name, row in table.items():
        shares = sorted(row["shares"])
        axis.plot([index / len(shares) for index in range(len(shares))], shares, label=name)
    axis.axhline(0.95, color="grey", linestyle="--")
    axis.set(xlabel="share of phases (sorted)", ylabel="settled share of best", ylim=(0, 1.02))
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke test: few levels, short runs")
    parser.add_argument("--sim-only", action="store_true", help="only the policies on synthetic curves")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default: benchmarks/results)")
    args = parser.parse_args()
    settings = QUICK if args.quick else Settings()
    suffix = "_quick" if args.quick else ""
    args.out.mkdir(parents=True, exist_ok=True)

    def log(message: str) -> None:
        print(message, flush=True)

    table = simulate_policies(settings.sim_specs)
    (args.out / f"elastic_sim_policies{suffix}.json").write_text(json.dumps(table, indent=1) + "\n")
    (args.out / f"elastic_sim_policies{suffix}.md").write_text(markdown_simulation(table, settings.sim_specs, args.quick))
    plot_simulation(table, args.out / f"elastic_sim_policies{suffix}.png")
    log(markdown_simulation(table, settings.sim_specs, args.quick))
    if args.sim_only:
        return 0
    results = benchmark(settings, log)
    results["settings"] = asdict(settings)
    (args.out / f"elastic_threads{suffix}.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    report = markdown_benchmark(results, settings, args.quick)
    (args.out / f"elastic_threads{suffix}.md").write_text(report)
    plot_benchmark(results, args.out / f"elastic_threads{suffix}.png")
    log(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
