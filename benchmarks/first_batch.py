"""The LogWatch example's first micro-batch, Spark's own start excluded, and where its time goes.

Each run is a fresh process (a new JVM and new Python workers, as `./dev example` starts): it
creates fissure's session, then runs the example's program on the real Loghub sample (2,022
lines, one batch) under one plan. A StreamingQueryListener reads Spark's `durationMs` of the
query's batch 0: `triggerExecution` is the first batch (the session's start is not in it),
`queryPlanning` the planning, which for every transformWithStateInPandas operator starts a
driver-side Python process to learn its state schema, `addBatch` the batch's jobs, which start
the Python workers. Plans alternate, in an order rotated each round; medians over rounds.

    ./dev python benchmarks/first_batch.py             # 3 rounds (about 2 minutes)
    ./dev python benchmarks/first_batch.py --rounds 1  # a smoke test, not a result
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

from provenance import load, load_note, machine, now, revision  # noqa: E402

PLANS = ("sequential", "planner")
PARTS = ("triggerExecution", "queryPlanning", "addBatch", "walCommit", "commitOffsets", "latestOffset")

ONE_RUN = """
import json, sys, tempfile, time
sys.path.insert(0, {examples!r})
import fissure, logwatch
from pyspark.sql.streaming import StreamingQueryListener
from fissure.spark.session import create_session

durations = {{}}

class FirstBatch(StreamingQueryListener):
    def onQueryStarted(self, event): pass
    def onQueryIdle(self, event): pass
    def onQueryTerminated(self, event): pass
    def onQueryProgress(self, event):
        if event.progress.batchId == 0:
            durations.update(event.progress.durationMs)

work = tempfile.mkdtemp()
config = fissure.RunnerConfig(spark_log=work + "/spark.log")
spark = create_session(config)
spark.streams.addListener(FirstBatch())
source = fissure.FileSource(logwatch.prepare_input(work + "/in", 0, 1), format="text")
report = fissure.run(logwatch.build_pipeline(), source, fissure.MemorySink(), plan={plan!r},
                     checkpoint=work + "/checkpoint", config=config, spark=spark, progress=False)
deadline = time.time() + 30  # the listener bus delivers progress events asynchronously
while not durations and time.time() < deadline:
    time.sleep(0.2)
log = open(work + "/spark.log", encoding="utf-8", errors="replace").read()
print(json.dumps({{"durations_ms": durations, "batches": report.batches,
                   "state_schema_workers": log.count("Starting Streaming TransformWithStateInPandas")}}))
"""


def one_run(plan: str) -> dict:
    script = ONE_RUN.format(examples=str(REPOSITORY / "examples"), plan=plan)
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    if finished.returncode != 0:
        raise SystemExit(f"run of {plan} failed:\n{finished.stderr[-3000:]}")
    return json.loads(finished.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(REPOSITORY / "benchmarks" / "results"))
    options = parser.parse_args(argv)
    load_before, started = load(), now()
    runs: dict[str, list[dict]] = {plan: [] for plan in PLANS}
    for round_index in range(options.rounds):
        order = PLANS[round_index % len(PLANS):] + PLANS[:round_index % len(PLANS)]
        for plan in order:
            result = one_run(plan)
            runs[plan].append(result)
            print(f"round {round_index + 1} {plan}: {json.dumps(result['durations_ms'])}", file=sys.stderr)
    load_after = load()
    medians = {plan: {part: statistics.median(run["durations_ms"].get(part, 0) for run in runs[plan])
                      for part in PARTS} for plan in PLANS}
    command = "./dev python benchmarks/first_batch.py" + (f" --rounds {options.rounds}" if options.rounds != 3 else "")
    lines = [
        "# The LogWatch example's first micro-batch, Spark's own start excluded",
        "",
        f"Command: `{command}`  ",
        f"Date: {started}  ",
        f"Machine: {machine()}  ",
        f"Revision: {revision(REPOSITORY)}  ",
        f"Load average before / after: {load_before} / {load_after}{load_note(load_before)}",
        "",
        "Each run a fresh process (new JVM, new Python workers) on the Loghub sample (2,022 lines, one batch); "
        f"Spark's `durationMs` of batch 0 in ms, medians over {options.rounds} rounds, plans alternating in a "
        "rotated order. `state schema workers`: driver-side Python processes transformWithStateInPandas started "
        "while planning (one per stateful operator).",
        "",
        "| plan | first batch | queryPlanning | addBatch | walCommit | commitOffsets | latestOffset | state schema workers |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for plan in PLANS:
        parts = medians[plan]
        workers = statistics.median(run["state_schema_workers"] for run in runs[plan])
        lines.append(f"| {plan} | {parts['triggerExecution']:,.0f} | {parts['queryPlanning']:,.0f} | "
                     f"{parts['addBatch']:,.0f} | {parts['walCommit']:,.0f} | {parts['commitOffsets']:,.0f} | "
                     f"{parts['latestOffset']:,.0f} | {workers:.0f} |")
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "first_batch.md").write_text("\n".join(lines) + "\n")
    (out / "first_batch.json").write_text(json.dumps({
        "command": command, "date": started, "machine": machine(), "revision": revision(REPOSITORY),
        "load_before": load_before, "load_after": load_after, "runs": runs, "medians_ms": medians}, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
