"""`fissure plan SPEC.json`: the optimizer behind a stable contract (docs/commands.md)."""

from __future__ import annotations

import argparse
import json

from fissure.cli import UsageError
from fissure.model.spec import SpecError, load_spec
from fissure.plan.exhaustive import SearchTooLarge
from fissure.plan.planners import METHODS, PlanResult, plan_chain


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="pick the fusion, pipelining and fission of a chain from its operator statistics",
        description="Plan a chain of operators with the pipelined fission model.",
    )
    parser.add_argument("spec", help="SPEC.json: cores, overheads and the operators in chain order")
    parser.add_argument("--method", choices=METHODS, default="heuristic", help="planner (default: heuristic)")
    parser.add_argument("--cores", type=int, help="override the spec's core count C")
    parser.add_argument("--max-threads", type=int, help="thread budget M (default: 2 x cores)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--model", choices=("paper", "spark"), default="paper",
                        help="throughput model: the paper's (default) or Spark's, with the constants "
                             "`fissure calibrate` stored (documented defaults without them)")
    parser.set_defaults(handler=run)


def result_json(result: PlanResult) -> dict:
    evaluation = result.evaluation
    document = {
        "method": result.plan.method,
        "cores": evaluation.cores,
        "regions": [
            {
                "replicas": region.replicas,
                "kind": region.kind.value,
                "key": list(region.key) if region.key else None,
                "pipelines": [list(pipeline.operators) for pipeline in region.pipelines],
            }
            for region in evaluation.regions
        ],
        "throughput_per_s": result.throughput_per_s,
        "utilization": evaluation.utilization if result.spark is None else result.spark.utilization,
        "threads": evaluation.threads,
        "solve_ms": result.solve_ms,
        "max_threads": result.max_threads,
    }
    if result.spark is not None:
        document["model"] = "spark"
        document["batch_time_s"] = result.spark.batch_time_s
        document["batch_records"] = result.spark.batch_records
    return document


def result_table(result: PlanResult) -> str:
    evaluation = result.evaluation
    rows = [("region", "kind", "key", "replicas", "pipelines (one thread each per replica)")]
    for index, region in enumerate(evaluation.regions, start=1):
        rows.append(
            (
                str(index),
                region.kind.value,
                ",".join(region.key) if region.key else "-",
                str(region.replicas),
                " | ".join(" > ".join(pipeline.operators) for pipeline in region.pipelines),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        f"plan: {result.plan.method} on {evaluation.cores} cores (at most {result.max_threads} threads)"
    ]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths)) + "  " + row[4] for row in rows]
    utilization = evaluation.utilization if result.spark is None else result.spark.utilization
    lines.append(
        f"predicted throughput {result.throughput_per_s:,.1f} tuples/s, "
        f"utilization {utilization:.2f} cores, {evaluation.threads} threads, "
        f"solved in {result.solve_ms:.2f} ms"
    )
    if result.spark is not None:
        lines.append(f"Spark model: micro-batches of {result.spark.batch_records:,} records take "
                     f"{result.spark.batch_time_s:.3f} s ({result.spark.fixed_s:.3f} s fixed), "
                     f"{len(result.spark.stages)} Spark stages")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(args.spec, cores=args.cores)
    except SpecError as error:
        raise UsageError(str(error)) from None
    if args.max_threads is not None and args.max_threads < 1:
        raise UsageError(f"--max-threads must be >= 1, got {args.max_threads}")
    spark = None
    if args.model == "spark":
        from fissure.plan.stored_calibration import stored_spark_model

        spark, _ = stored_spark_model()
    try:
        result = plan_chain(spec.operators, spec.machine, args.method, args.max_threads, spark=spark)
    except SearchTooLarge as error:
        raise UsageError(str(error)) from None
    print(json.dumps(result_json(result)) if args.json else result_table(result))
    return 0
