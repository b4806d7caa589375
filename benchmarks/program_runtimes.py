"""The two ways fissure compiles a program, on the same chains and plans, against a plain loop.

A chain compiles to carried batches (fissure.spark.compile); any other graph to envelopes
(fissure.spark.compile_graph). This benchmark runs the same chain both ways (the envelope path
through `StreamGraph.from_pipeline`, presented as a graph that is no chain), under its sequential plan and the planner's plan, and reports:
- first, the plain loop: one Python process calling the same functions record by record (the
  single thread of McSherry, Isard and Murray, "Scalability! But at what COST?", HotOS 2015);
- each variant's steady rate (records over the summed durations of the micro-batches after the
  first) and its ratio to the plain loop;
- envelope / carried per plan: the ratio of the two paths in the same repeat, median over repeats.

Method: one uncounted warm-up run of each path, then --repeats rounds; each round runs every
variant once, in an order rotated by one each round; medians over rounds. The load average is
recorded before and after; a run whose load before exceeds the cores says so in its report.

    ./dev python benchmarks/program_runtimes.py               # LogWatch and the CPU chain, 3 rounds
    ./dev python benchmarks/program_runtimes.py --quick       # tiny inputs, one round: a smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "examples"))
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

from fissure import Pipeline, StreamGraph  # noqa: E402
from fissure.graph import Action  # noqa: E402
from fissure.model.types import Kind  # noqa: E402
from fissure.spark.plans import describe_plan, planner_plan, sequential_plan  # noqa: E402
from provenance import load, load_note, machine, now, revision  # noqa: E402
from spark_chain import cpu_pipeline, cpu_source, logwatch_source, measure_fissure  # noqa: E402


def plain_loop_rate(pipeline: Pipeline, records: list[dict]) -> float:
    """Records per second of one process running the operators' functions record by record."""
    states: dict[str, dict] = {operator.name: {} for operator in pipeline.operators}
    started = time.perf_counter()
    for record in records:
        current = [record]
        for operator in pipeline.operators:
            following = []
            for item in current:
                if operator.action is Action.MAP:
                    following.append(operator.fn(item))
                elif operator.action is Action.FILTER:
                    if operator.fn(item):
                        following.append(item)
                elif operator.action is Action.FLAT_MAP:
                    following.extend(operator.fn(item) or ())
                else:
                    key = tuple(item[field] for field in operator.key) if operator.kind is Kind.PARTITIONED else ()
                    state = states[operator.name].get(key)
                    if state is None:
                        state = states[operator.name][key] = operator.state_factory()
                    emitted = operator.fn(state, item)
                    following.extend([emitted] if isinstance(emitted, dict) else (emitted or ()))
            current = following
    return len(records) / (time.perf_counter() - started)


def workloads(args, work: str):
    from generators.loglines import generate
    from logwatch import build_pipeline

    lines = list(generate(args.lines))
    logwatch = build_pipeline()
    yield "logwatch", logwatch, logwatch_source(Path(work) / "logwatch", args.lines, args.files), \
        [{"value": line} for line in lines]
    cpu = cpu_pipeline(4)
    rows = [{"x": float(i % 997) + 0.5} for i in range(args.records)]
    yield "cpu", cpu, cpu_source(Path(work) / "cpu", args.records, args.files), rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=60000)
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--files", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.lines, args.records, args.files, args.repeats = 6000, 2000, 3, 1
    from fissure.spark.config import RunnerConfig
    from fissure.spark.session import create_session

    load_before = load()
    spark = create_session(RunnerConfig(master="local[2]"))
    work = tempfile.mkdtemp(prefix="fissure-program-runtimes-")
    document = {"command": " ".join(["./dev python benchmarks/program_runtimes.py", *(argv or sys.argv[1:])]),
                "date": now(), "machine": machine(), "revision": revision(REPOSITORY), "load_before": load_before,
                "workloads": {}}
    for name, pipeline, source, records in workloads(args, work):
        plain = statistics.median(plain_loop_rate(pipeline, records) for _ in range(3))
        graph = StreamGraph.from_pipeline(pipeline)
        plans = {"sequential": sequential_plan(pipeline), "planner": planner_plan(pipeline, 2)}
        variants = [(plan_name, path) for plan_name in plans for path in ("carried", "envelope")]
        programs = {"carried": pipeline, "envelope": _forced_envelopes(graph)}
        sources = {"carried": source, "envelope": {"source": source}}
        for path in ("carried", "envelope"):  # warm-up, not counted
            measure_fissure(spark, programs[path], sources[path], plans["sequential"], tempfile.mkdtemp(dir=work))
        rates: dict[str, list[float]] = {f"{plan_name}/{path}": [] for plan_name, path in variants}
        for round_number in range(args.repeats):
            order = variants[round_number % len(variants):] + variants[:round_number % len(variants)]
            for plan_name, path in order:
                rate = measure_fissure(spark, programs[path], sources[path], plans[plan_name], tempfile.mkdtemp(dir=work))
                rates[f"{plan_name}/{path}"].append(rate)
                print(f"{name} round {round_number + 1} {plan_name} {path}: {rate:,.0f} records/s", flush=True)
        document["workloads"][name] = {
            "plain_loop_per_s": plain,
            "plans": {plan_name: describe_plan(plan, pipeline) for plan_name, plan in plans.items()},
            "rates": rates,
            "median_per_s": {key: statistics.median(values) for key, values in rates.items()},
            "envelope_over_carried": {
                plan_name: statistics.median(envelope / carried for envelope, carried in
                                             zip(rates[f"{plan_name}/envelope"], rates[f"{plan_name}/carried"]))
                for plan_name in plans},
        }
    document["load_after"] = load()
    out = REPOSITORY / "benchmarks" / "results"
    if args.quick:
        out = Path(tempfile.mkdtemp(prefix="fissure-program-runtimes-results-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "program_runtimes.json").write_text(json.dumps(document, indent=2))
    (out / "program_runtimes.md").write_text(report(document))
    print(report(document))
    return 0


class _ForcedEnvelopes(StreamGraph):
    """A chain-shaped graph that does not present itself as a chain, so the Runner compiles it to
    envelopes as any other graph."""

    def as_chain(self):
        return None


def _forced_envelopes(graph: StreamGraph) -> StreamGraph:
    forced = _ForcedEnvelopes(graph.name)
    forced._nodes = dict(graph._nodes)
    return forced


def report(document: dict) -> str:
    lines = ["# Chains compiled two ways: carried batches and graph envelopes", "",
             f"Command: `{document['command']}`  ", f"Date: {document['date']}  ",
             f"Machine: {document['machine']}  ", f"Revision: {document['revision']}  ",
             f"Load average before / after: {document['load_before']} / {document['load_after']}"
             + load_note(document["load_before"]), ""]
    for name, figures in document["workloads"].items():
        plain = figures["plain_loop_per_s"]
        lines += [f"## {name}", "", f"Plain loop (one process, same functions): {plain:,.0f} records/s", "",
                  "| plan | path | median records/s | x plain loop |", "| --- | --- | --- | --- |"]
        for key, value in figures["median_per_s"].items():
            plan_name, path = key.split("/")
            lines.append(f"| {plan_name} `{figures['plans'][plan_name]}` | {path} | {value:,.0f} | {value / plain:.3f} |")
        lines += ["", "Envelope / carried, median of the paired ratios: " + ", ".join(
            f"{plan_name} {ratio:.2f}" for plan_name, ratio in figures["envelope_over_carried"].items()), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
