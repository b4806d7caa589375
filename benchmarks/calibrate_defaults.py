"""The source of the Spark model's default constants: three `fissure calibrate` runs, their medians.

`fissure.model.spark_model.SparkConstants` ships defaults so that the planner ranks Spark plans
sensibly before a user calibrates their own deployment. They are the medians of three
calibrations of this machine, run one after another with nothing else running; this script runs
them (`fissure calibrate --dry-run --json`, each a fresh process), writes each run's constants and
fit, the medians, and how far each constant's runs spread.

    ./dev python benchmarks/calibrate_defaults.py            # 3 calibrations (about 10 minutes)
    ./dev python benchmarks/calibrate_defaults.py --quick    # calibrate --quick once: a check
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

import method  # noqa: E402

FIT_LINE = re.compile(r"fit over (\d+) micro-batches, R\^2 ([\d.]+), median \|error\| ([\d.]+)%")


def calibrate(quick: bool) -> dict:
    command = [sys.executable, "-m", "fissure", "calibrate", "--dry-run", "--json"] + (["--quick"] if quick else [])
    finished = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if finished.returncode != 0:
        raise SystemExit(f"fissure calibrate failed:\n{finished.stderr[-3000:]}")
    document = json.loads(finished.stdout.strip().splitlines()[-1])
    fit = FIT_LINE.search(finished.stderr)
    return {"document": document, "batches": int(fit.group(1)) if fit else None,
            "r2": float(fit.group(2)) if fit else None, "median_error_pct": float(fit.group(3)) if fit else None}


def spark_constants(document: dict) -> dict[str, float]:
    """The fitted Spark constants of a calibration document (the key they sit under may vary)."""
    for value in document.values():
        if isinstance(value, dict) and "batch_fixed_s" in value:
            return value
    if "batch_fixed_s" in document:
        return document
    raise SystemExit(f"no Spark constants in the calibration document: {sorted(document)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser)
    options = parser.parse_args(argv)
    run = method.Run("calibrate_defaults.py", argv, quick=options.quick, out=options.out, master="local[*]")
    repeats = method.check_repeats(1 if options.quick else options.repeats, options.quick)
    runs = []
    for index in range(repeats):
        print(f"calibration {index + 1}/{repeats}", file=sys.stderr, flush=True)
        runs.append(calibrate(options.quick))
    constants = [spark_constants(result["document"]) for result in runs]
    names = list(constants[0])
    medians = {name: method.median(float(values[name]) for values in constants) for name in names}
    lines = ["# fissure calibrate, run one after another: the source of the Spark model's defaults", "",
             f"{repeats} runs of `fissure calibrate --dry-run --json` (each a fresh process, local[*]). The defaults in "
             "`fissure.model.spark_model.SparkConstants` are these medians, rounded.", "",
             "| constant | " + " | ".join(f"run {index + 1}" for index in range(repeats)) + " | median |",
             "| --- | " + " | ".join("---:" for _ in range(repeats)) + " | ---: |"]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(f"{float(values[name]):.4g}" for values in constants)
                     + f" | {medians[name]:.4g} |")
    lines += ["", "| fit | " + " | ".join(f"run {index + 1}" for index in range(repeats)) + " |",
              "| --- | " + " | ".join("---:" for _ in range(repeats)) + " |",
              "| micro-batches | " + " | ".join(str(result["batches"]) for result in runs) + " |",
              "| R^2 | " + " | ".join(f"{result['r2']}" for result in runs) + " |",
              "| median batch error % | " + " | ".join(f"{result['median_error_pct']}" for result in runs) + " |"]
    run.write_results("calibrate_defaults", "\n".join(lines), {"runs": runs, "medians": medians})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
