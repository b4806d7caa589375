"""The LogWatch example's first micro-batch, Spark's own start excluded, and where its time goes.

Each run is a fresh process (a new JVM and new Python workers, as `./dev example` starts): it
creates fissure's session, then runs the example's program on the real Loghub sample (2,022
lines, one batch) under one plan. A StreamingQueryListener reads Spark's `durationMs` of the
query's batch 0: `triggerExecution` is the first batch (the session's start is not in it),
`queryPlanning` the planning, which for every transformWithStateInPandas operator starts a
driver-side Python process to learn its state schema, `addBatch` the batch's jobs, which start
the Python workers. Plans in an order rotated each repeat after one uncounted run (benchmarks/method.py); medians.

    ./dev python benchmarks/first_batch.py           # 3 repeats (about 2 minutes)
    ./dev python benchmarks/first_batch.py --quick   # one repeat: a check, not a result
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

import method  # noqa: E402

PLANS = ("sequential", "planner")
PARTS = ("triggerExecution", "queryPlanning", "addBatch", "walCommit", "commitOffsets", "latestOffset")

ONE_RUN = """
import dataclasses, json, sys, tempfile, time
sys.path.insert(0, {examples!r})
import fissure, logwatch
from pyspark.sql.streaming import StreamingQueryListener
from fissure.spark.session.create import create_session

durations = {{}}

class FirstBatch(StreamingQueryListener):
    def onQueryStarted(self, event): pass
    def onQueryIdle(self, event): pass
    def onQueryTerminated(self, event): pass
    def onQueryProgress(self, event):
        if event.progress.batchId == 0:
            durations.update(event.progress.durationMs)

work = tempfile.mkdtemp(dir={scratch!r})
config = fissure.RunnerConfig(spark_log=work + "/spark.log")
spark = create_session(config)
spark.streams.addListener(FirstBatch())
source = fissure.FileSource(logwatch.prepare_input(work + "/in", 0, 1), format="text")
report = fissure.run(logwatch.build_pipeline(), source, fissure.MemorySink(), plan={plan!r},
                     checkpoint=work + "/checkpoint", config=dataclasses.replace(config, spark=spark, progress="off"))
deadline = time.time() + 30  # the listener bus delivers progress events asynchronously
while not durations and time.time() < deadline:
    time.sleep(0.2)
log = open(work + "/spark.log", encoding="utf-8", errors="replace").read()
print(json.dumps({{"durations_ms": durations, "batches": report.batches,
                   "state_schema_workers": log.count("Starting Streaming TransformWithStateInPandas")}}))
"""


def one_run(plan: str, scratch: Path) -> dict:
    script = ONE_RUN.format(examples=str(REPOSITORY / "examples"), plan=plan, scratch=str(scratch))
    return method.run_point_process(script, f"run of {plan}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser)
    options = parser.parse_args(argv)
    run = method.Run("first_batch.py", argv, quick=options.quick, out=options.out)
    repeats = 1 if options.quick else options.repeats
    with method.scratch_folder("first_batch.py") as scratch:  # each run's input, checkpoint and Spark's log
        block = method.measure_block(
            {plan: (lambda plan=plan: one_run(plan, scratch)) for plan in PLANS}, repeats, quick=options.quick,
            warm_up=lambda: one_run("sequential", scratch), warm_up_label="one sequential run, not counted",
            value=lambda result: result["durations_ms"].get("triggerExecution", 0),
            log=lambda line: print(line, file=sys.stderr, flush=True))
    medians = {plan: {part: statistics.median(result["durations_ms"].get(part, 0) for result in block.details[plan])
                      for part in PARTS} for plan in PLANS}
    lines = [
        "# The LogWatch example's first micro-batch, Spark's own start excluded",
        "",
        "Each run a fresh process (new JVM, new Python workers) on the Loghub sample (2,022 lines, one batch); "
        f"Spark's `durationMs` of batch 0 in ms, medians over {repeats} repeats, plans in an order rotated each "
        "repeat after one uncounted run. `state schema workers`: driver-side Python processes "
        "transformWithStateInPandas started while planning (one per stateful operator).",
        "",
        "| plan | first batch | queryPlanning | addBatch | walCommit | commitOffsets | latestOffset | state schema workers |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for plan in PLANS:
        parts = medians[plan]
        workers = statistics.median(result["state_schema_workers"] for result in block.details[plan])
        lines.append(f"| {plan} | {parts['triggerExecution']:,.0f} | {parts['queryPlanning']:,.0f} | "
                     f"{parts['addBatch']:,.0f} | {parts['walCommit']:,.0f} | {parts['commitOffsets']:,.0f} | "
                     f"{parts['latestOffset']:,.0f} | {workers:.0f} |")
    run.write_results("first_batch", "\n".join(lines), {"block": block.to_dict(), "medians_ms": medians})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
