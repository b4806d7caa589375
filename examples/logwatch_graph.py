"""LogWatch as a stream graph: one parsed stream fans out to break-in detection and per-host stats.

    ./dev python examples/logwatch_graph.py                   # real Loghub sample, autopipelined
    ./dev python examples/logwatch_graph.py --lines 100000    # generated input (same line formats)
    ./dev python examples/logwatch_graph.py --check           # compare each sink with run_local
    ./dev python examples/logwatch_graph.py --boundaries events,failures   # hand-placed, no autopipelining
    ./dev python examples/logwatch_graph.py --boundaries none # unpipelined
    ./dev python examples/logwatch_graph.py --plan planner    # fission planned by the throughput model

Graph (the operators of examples/logwatch.py; the file source plays RawLines):

  lines -> parsed -> raw_events -> events -+-> range (per host) -> cutoff -> realtime -> breakins (per user) -> [breakin_alerts]
                                           +-> failures -> per_host (per host) ----------------------------> [host_alerts]

`events` is computed once and read by both branches. Every `ALERT_EVERY`-th failure of a remote
host within RANGE_S seconds of the previous one raises a per-host alert.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fissure  # noqa: E402
from fissure import StreamGraph  # noqa: E402
from fissure.spark.adaptive.autopipelining import GraphAutopipelineConfig  # noqa: E402
from fissure.plan.plans import describe_plan  # noqa: E402
from fissure.local.executor import LocalGraphRun  # noqa: E402
from generators.loglines import generate, real_lines, split_into_files  # noqa: E402
from logwatch import (  # noqa: E402
                      BREAKIN, EVENT, PARSED, RANGE_S, RANGED, TIMED, breakins, cutoff, events, lines, parsed, range_, raw_events,
                      realtime,
                      )

ALERT_EVERY = 10
HOST_ALERT = {"host": str, "ts": int, "failures": int}


def is_failure(record):
    return record["kind"] == "failure" and record["host"] != "local"


def per_host(state, record):
    """Per remote host: failures in a run without gaps longer than RANGE_S; an alert every ALERT_EVERY."""
    if record["ts"] - state.get("last_ts", record["ts"]) > RANGE_S:
        state["run"] = 0
    state["run"] = state.get("run", 0) + 1
    state["last_ts"] = record["ts"]
    if state["run"] % ALERT_EVERY:
        return None
    return {"host": record["host"], "ts": record["ts"], "failures": state["run"]}


def build_graph() -> StreamGraph:
    g = StreamGraph("logwatch_graph")
    raw = g.source("raw", schema={"value": str})
    event_stream = (raw.map("lines", lines, reads=["value"], cost_us=3.87)
                    .map("parsed", parsed, schema=PARSED, cost_us=15.15)
                    .filter("raw_events", raw_events, cost_us=9.39, selectivity=0.87)
                    .flat_map("events", events, schema=EVENT, cost_us=13.81))
    (event_stream.partitioned("range", range_, key="host", schema=RANGED, order_by="ts")
     .filter("cutoff", cutoff)
     .map("realtime", realtime, schema=TIMED)
     .partitioned("breakins", breakins, key="user", schema=BREAKIN, order_by="ts")
     .sink("breakin_alerts"))
    (event_stream.filter("failures", is_failure)
     .partitioned("per_host", per_host, key="host", schema=HOST_ALERT, order_by="ts")
     .sink("host_alerts"))
    return g


def input_lines(generated: int) -> list[str]:
    if generated:
        return list(generate(generated))
    return list(generate(len(real_lines()), breakin_every=700))


def parse_boundaries(text: str | None) -> list[str] | None:
    if text is None:
        return None
    return [] if text in ("", "none") else [name.strip() for name in text.split(",") if name.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=0, help="generate this many lines (default: the real sample)")
    parser.add_argument("--files", type=int, default=6,
                        help="files the input is written as, one micro-batch each (default 6: enough batches for "
                             "autopipelining's rounds)")
    parser.add_argument("--boundaries", help="comma-separated operators whose input starts a new process, or "
                                             "'none'; given: no autopipelining")
    parser.add_argument("--plan", default="sequential",
                        help="'sequential' (default: no replica), 'planner' (fission and pipelining chosen by the "
                             "throughput model; no autopipelining) or a JSON plan file")
    parser.add_argument("--beta", type=float, default=0.5, help="autopipelining's bottleneck threshold (default 0.5)")
    parser.add_argument("--master", default="local[*]", help="Spark master URL (default: embedded local[*])")
    parser.add_argument("--check", action="store_true", help="compare every sink with the in-process reference run")
    args = parser.parse_args(argv)

    directory = tempfile.mkdtemp(prefix="fissure-logwatch-graph-")
    all_lines = input_lines(args.lines)
    files = split_into_files(all_lines, os.path.join(directory, "input"), args.files)
    graph = build_graph()
    source = fissure.FileSource(os.path.join(directory, "input"), format="text", max_files_per_trigger=1)
    sinks = {name: fissure.MemorySink() for name in graph.sinks}
    boundaries = parse_boundaries(args.boundaries)
    autopipeline = boundaries is None and args.plan == "sequential"
    spark_log = os.path.join(directory, "spark.log")
    print(f"{graph.name}: {len(all_lines):,} lines; starting Spark (its output goes to {spark_log})", file=sys.stderr)
    report = fissure.run(graph, {"raw": source}, sinks, plan=args.plan,
                         checkpoint=os.path.join(directory, "checkpoint"),
                         config=fissure.RunnerConfig(
                             master=args.master, spark_log=spark_log,
                             boundaries=boundaries if boundaries is not None or not autopipeline else (),
                             replanning="autopipeline" if autopipeline else "off",
                             autopipelining=GraphAutopipelineConfig(profile_batches=2, beta=args.beta)))

    print(f"\n{graph.name}: {report.batches} micro-batches in {report.elapsed_s:.1f} s, "
          f"{report.dead_letters} dead letters")
    print(f"plan: {describe_plan(report.plan, graph)}")
    if autopipeline:
        print("autopipelining:")
        for item in report.decisions:
            print(f"  after batch {item.batch_id}: {item.decision.action.value}; boundaries now "
                  f"{', '.join(item.boundaries_after) or 'none'}\n    {item.decision.reason}")
        if not report.decisions:
            print("  no decision: the run ended before a profile window was complete (try --lines 100000)")
    print(f"pipeline boundaries at the end: {', '.join(report.boundaries) or 'none (one process per graph PE)'}")
    found = sorted(sinks["breakin_alerts"].records(), key=lambda record: record["ts"])
    print(f"break-ins: {len(found)}")
    for record in found:
        print(f"  {record['time']} user {record['user']} after {record['failures']} failures from {record['hosts']}")
    alerts = sinks["host_alerts"].records()
    hosts = sorted({record["host"] for record in alerts})
    print(f"host alerts: {len(alerts)} from {len(hosts)} host(s){': ' + ', '.join(hosts[:8]) if hosts else ''}"
          f"{' ...' if len(hosts) > 8 else ''}")
    if args.check:
        # The reference executor, one micro-batch per file as on Spark: a keyed operator takes a
        # batch's records by event time, so the batches must match where input is out of order.
        reference = LocalGraphRun(graph)
        expected = {name: [] for name in graph.sinks}
        for path in files:
            with open(path, encoding="utf-8") as handle:
                batch = reference.run_batch({"raw": [{"value": line} for line in handle.read().splitlines()]})
            for name in graph.sinks:
                expected[name] += batch[name]
        for name in graph.sinks:
            same = sorted(map(json.dumps, expected[name])) == sorted(map(json.dumps, sinks[name].records()))
            print(f"check {name}: {'same as' if same else 'DIFFERENT FROM'} the reference run "
                  f"({len(expected[name])} records)")
            if not same:
                return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
