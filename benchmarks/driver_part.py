"""The driver's part of a micro-batch by the batch's position in its query.

A micro-batch's time is its Spark stages (the computing job's stages, submission to completion,
from the monitoring REST API: fissure.spark.session.stage_log) plus the rest: planning, offset and commit
logs, the sink's job, the gaps between stages. The Spark model prices the rest as
batch_fixed_s + stateful operators x state_operator_batch_s, fitted by `fissure calibrate` over
queries of 13 micro-batches; the model-accuracy benchmark measures queries of 4 (the first left
out). This script runs each of that benchmark's workloads under its sequential plan in queries of
--files micro-batches of the same size as there, and reports per position in the query the
median over the repeats of the rest and of the stages: whether a query's first micro-batches
carry a longer driver part than its later ones. Then the stateless workload's query again and
again in the same session (--session-queries, 4 micro-batches each, as in the model-accuracy
benchmark): whether the driver's part grows with the queries a session has run (the adaptive
loop restarts the query at every plan change).

Results: driver_part.md/.json under --out (default benchmarks/results/).

    ./dev python benchmarks/driver_part.py [--files 10] [--repeats 3] [--session-queries 40]
    ./dev python benchmarks/driver_part.py --quick   # 3 batches, one repeat, 2 session queries: a check
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fissure  # noqa: E402
from fissure.plan.plans import sequential_plan  # noqa: E402
from fissure.spark.session.stage_log import STAGE_LOG_CONF, StageLog  # noqa: E402

import model_accuracy  # noqa: E402
import method  # noqa: E402
from model_accuracy import logwatch_source, mixed_pipeline, stateless_pipeline, synthetic_source  # noqa: E402


def run_query(spark, log: StageLog, pipeline, source, work: Path) -> dict[int, tuple[float, float]]:
    """Per micro-batch of one run of the sequential plan: (rest, stages) in seconds."""
    runner = fissure.Runner(pipeline, source, fissure.NoopSink(), plan=sequential_plan(pipeline),
                            config=fissure.RunnerConfig(spark=spark, progress="off"),
                            checkpoint=tempfile.mkdtemp(dir=work))
    runner.start(available_now=True)
    try:
        runner.await_termination()
    finally:
        runner.stop()
    stages = log.batches(str(runner.query.runId))
    out = {}
    for progress in runner.query.recentProgress:
        batch = int(progress["batchId"])
        if batch in stages and progress["numInputRows"]:
            in_stages = sum(stages[batch].stage_s)
            out[batch] = (progress["durationMs"]["triggerExecution"] / 1e3 - in_stages, in_stages)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser)
    parser.add_argument("--files", type=int, default=10, help="micro-batches per query")
    parser.add_argument("--session-queries", type=int, default=40)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    if args.quick:
        args.files, args.repeats, args.session_queries = 3, 1, 2
    method.check_repeats(args.repeats, args.quick)
    run = method.Run("driver_part.py", argv, quick=args.quick, out=args.out, master=args.master)
    model_accuracy.LOOPS_PER_US = model_accuracy.busy_loops_per_us()
    document = {"master": args.master, "quick": args.quick}
    from fissure.spark.session.create import create_session
    from logwatch import build_pipeline as logwatch_pipeline

    with method.scratch_folder("driver_part.py") as work:
        spark = create_session(fissure.RunnerConfig(master=args.master, spark_conf=STAGE_LOG_CONF))
        try:
            log = StageLog(spark)
            # the model-accuracy benchmark's micro-batch sizes: 20,000 records and 30,000 lines in 4 files
            workloads = {
                "stateless": (stateless_pipeline(),
                              synthetic_source(work / "stateless", 5_000 * args.files, args.files)),
                "mixed": (mixed_pipeline(), synthetic_source(work / "mixed", 5_000 * args.files, args.files)),
                "logwatch": (logwatch_pipeline(), logwatch_source(work / "logs", 7_500 * args.files, args.files)),
            }
            runs: dict[str, list[dict[int, tuple[float, float]]]] = {name: [] for name in workloads}
            warm_pipeline = stateless_pipeline()  # starts the Python workers: not counted
            run_query(spark, log, warm_pipeline, synthetic_source(work / "warm-up", 2_000, 2), work)
            for repeat in range(args.repeats):  # the workloads' order rotated each repeat
                for name in method.run_order(list(workloads), repeat):
                    pipeline, source = workloads[name]
                    print(f"repeat {repeat + 1}/{args.repeats}: {name}", flush=True)
                    runs[name].append(run_query(spark, log, pipeline, source, work))
            pipeline, short_source = stateless_pipeline(), synthetic_source(work / "short", 20_000, 4)
            session = []
            for number in range(args.session_queries):
                print(f"session query {number + 1}/{args.session_queries}", flush=True)
                batches = run_query(spark, log, pipeline, short_source, work)
                steady = [value for batch, value in batches.items() if batch > 0]
                session.append({"query": number,
                                "rest_s": statistics.median(rest for rest, _ in steady),
                                "stages_s": statistics.median(in_stages for _, in_stages in steady)})
        finally:
            method.end_spark(spark)
    results = {}
    for name, per_run in runs.items():
        positions = sorted(set().union(*per_run))
        results[name] = [{"batch": batch,
                          "rest_s": statistics.median(run[batch][0] for run in per_run if batch in run),
                          "stages_s": statistics.median(run[batch][1] for run in per_run if batch in run)}
                         for batch in positions]
    document["results"] = results
    document["session"] = session
    run.write_results("driver_part_quick" if args.quick else "driver_part", report(document), document)
    return 0


def report(document: dict) -> str:
    lines = ["# The driver's part of a micro-batch by its position in the query", "",
             "One uncounted warm-up query first; the workloads' order rotated each repeat.", "",
             "Each workload's sequential plan, one query per repeat; per micro-batch (0: the first, which "
             "the benchmarks leave out) the median over the repeats of the rest of the batch outside its "
             "stages and of the time in its stages, in ms. The model-accuracy benchmark measures batches "
             "1-3; `fissure calibrate` fits batches 1-12.", ""]
    names = list(document["results"])
    lines += ["| batch | " + " | ".join(f"{name}: rest, stages" for name in names) + " |",
              "| --- |" + " --- |" * len(names)]
    for position in range(max(len(rows) for rows in document["results"].values())):
        cells = []
        for name in names:
            rows = document["results"][name]
            cells.append(f"{1e3 * rows[position]['rest_s']:.0f}, {1e3 * rows[position]['stages_s']:.0f}"
                         if position < len(rows) else "-")
        lines.append(f"| {position} | " + " | ".join(cells) + " |")
    lines.append("")
    for name in names:
        rows = [row for row in document["results"][name] if row["batch"] > 0]
        early = [row["rest_s"] for row in rows if row["batch"] <= 3]
        late = [row["rest_s"] for row in rows if row["batch"] > 3]
        if early and late:
            lines.append(f"- {name}: rest {1e3 * statistics.median(early):.0f} ms over batches 1-3, "
                         f"{1e3 * statistics.median(late):.0f} ms over batches 4-{rows[-1]['batch']}.")
    session = document.get("session") or []
    if session:
        lines += ["", f"The stateless workload's sequential plan, {len(session)} more queries of 4 micro-batches in the "
                      "same session (after the queries above): per query, the median over its batches 1-3 of the rest "
                      "and of the stages, in ms, for every fifth query and the last.", "",
                  "| query | rest | stages |", "| --- | --- | --- |"]
        for item in session:
            if item["query"] % 5 == 0 or item["query"] == len(session) - 1:
                lines.append(f"| {item['query']} | {1e3 * item['rest_s']:.0f} | {1e3 * item['stages_s']:.0f} |")
        quarter = max(1, len(session) // 4)
        lines += ["", f"- rest: median {1e3 * statistics.median(i['rest_s'] for i in session[1:quarter + 1]):.0f} ms "
                      f"over queries 1-{quarter}, {1e3 * statistics.median(i['rest_s'] for i in session[-quarter:]):.0f} "
                      f"ms over the last {quarter}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
