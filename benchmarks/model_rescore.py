"""The Spark model's accuracy on measurements already taken, under other constants.

A model-accuracy run (benchmarks/model_accuracy.py) keeps, per workload, the profiled operators,
the micro-batches' shape and every plan's measured throughput. This script predicts those plans
again with other Spark model constants (a calibration's medians, a stored calibration, or a JSON
object of constants over the defaults) and scores the predictions the way model_accuracy.py does:
median and worst error, the same once scaled by the sequential plan, and the first-ranked plan
against the best of the other plans measured. Nothing runs on Spark: it tells whether a
calibration would have ranked and predicted the measured plans better than the defaults did,
before the defaults change.

    ./dev python benchmarks/model_rescore.py RUN.json [RUN.json ...] --constants FILE [--constants FILE ...]

FILE: a JSON object of constants (missing ones keep their defaults), or a file with one under
"medians" (benchmarks/calibrate_defaults.py's output), "spark" (a stored calibration) or
"calibration" > "spark" (a `model_accuracy.py --calibrate` run's JSON, which keeps its calibration).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

import method  # noqa: E402
import model_accuracy  # noqa: E402
from fissure.model.spark_model import SparkConstants, SparkWorkload, evaluate_spark  # noqa: E402
from fissure.model.types import Kind, OperatorStats, Plan, RegionPlan  # noqa: E402

REGION = re.compile(r"\[(.*)\](?:x(\d+))?")


def parse_plan(text: str) -> Plan:
    """A plan from its description (`[a,b|c]x2 -> [d]`, fissure.plan.plans.describe_plan)."""
    regions = []
    for part in text.split(" -> "):
        found = REGION.fullmatch(part.strip())
        if found is None:
            raise SystemExit(f"not a plan description: {text!r}")
        pipelines = tuple(tuple(pipeline.split(",")) for pipeline in found.group(1).split("|"))
        regions.append(RegionPlan(pipelines, int(found.group(2) or 1)))
    return Plan(tuple(regions))


def load_constants(path: Path) -> SparkConstants:
    document = json.loads(path.read_text())
    values = document.get("medians") or document.get("spark") or (document.get("calibration") or {}).get("spark") or document
    return SparkConstants().with_values(**{name: float(value) for name, value in values.items()})


def rescored(document: dict, constants: SparkConstants) -> dict:
    """model_accuracy's summary of `document`'s measurements with the Spark model under `constants`."""
    results = copy.deepcopy(document["results"])
    for result in results.values():
        operators = [OperatorStats(item["name"], Kind(item["kind"]), item["cost_us"], item["selectivity"],
                                   ("key",) if item["kind"] == Kind.PARTITIONED.value else None)
                     for item in result["operators"]]
        workload = SparkWorkload(batch_records=max(1, int(result["batch_records"])),
                                 keys_per_batch=result["keys_per_batch"])
        for row in result["rows"]:
            row["spark_per_s"] = evaluate_spark(operators, parse_plan(row["plan"]), document["cores"], constants,
                                                workload).throughput_per_s
        result.pop("confirmation", None)  # a measurement of one model's pick, not of these constants
    return model_accuracy.summary(results)["spark"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="model_accuracy JSON files")
    parser.add_argument("--constants", action="append", type=Path, default=[], help="constants to score (repeatable)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args(argv)
    run = method.Run("model_rescore.py", argv, out=args.out, master=None, timed=False)
    candidates = {"defaults": SparkConstants(), **{path.name: load_constants(path) for path in args.constants}}
    lines = ["# The Spark model's accuracy on earlier measurements, under other constants", "",
             "Each model-accuracy run's measured plans predicted again with each set of constants "
             "(nothing re-measured); scored as benchmarks/model_accuracy.py scores them (the first-ranked "
             "plan against the best of the other plans measured in the run's main block).", "",
             "| run | constants | median error | worst | scaled by the sequential plan: median | "
             "first-ranked over the best other, per workload |", "| --- | --- | --- | --- | --- | --- |"]
    document_out = {"runs": {}}
    for path in args.runs:
        document = json.loads(path.read_text())
        revision = document.get("provenance", {}).get("revision", "?")
        for label, constants in candidates.items():
            scores = rescored(document, constants)
            firsts = ", ".join(f"{name} {item['over_best_other']:.2f}" for name, item in scores["top_ranked"].items())
            lines.append(f"| `{path.name}` ({revision}) | {label} | {100 * scores['median_abs_error']:.1f} % | "
                         f"{100 * scores['worst_abs_error']:.1f} % | {100 * scores['anchored_median_abs_error']:.1f} % "
                         f"| {firsts} |")
            document_out["runs"].setdefault(path.name, {})[label] = scores
    document_out["constants"] = {label: constants.to_dict() for label, constants in candidates.items()}
    run.write_results("model_rescore", "\n".join(lines) + "\n", document_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
