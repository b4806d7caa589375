"""The adaptive loop on Spark: scenarios (a), (b) and (c), and what each kind of switch costs.

Not a simulation: a real streaming query on the local Spark session (local[N], N = --cores), fed
files of generated records (one file per micro-batch), re-planned by the AdaptiveController
through the Spark realizer.

- (a) reach-best: start sequential on a chain of two CPU-heavy maps and a keyed count. Every
  static candidate plan runs alone on the same input (the median throughput of its last 5
  batches, the same window as the adaptive run's), and the adaptive run starts from the sequential plan: all of them in one block
  of --repeats repeats, the order rotated each repeat, after a warm-up run. Reported:
  plan changes, the plan it ends on, and the median throughput of its last batches against the
  best static plan's (the bound: within 10 % of it in at most 3 plan changes).
- (b) cost-change: the map `parse` burns as many microseconds per record as the record's
  `cost_us` field says; the generated files quadruple that field from file --change-at on (a
  data-dependent cost, as when the input's mix changes). Every static candidate plan runs alone
  on post-change input (the new best static plan), and the adaptive run starts from the
  sequential plan on the whole input: one block, as in (a). Reported: when the loop re-opened, the re-plans after the
  change until the plan in force measured within 10 % of the new best static plan (the bound:
  at most 3), the plan it ends on, and the timeline with the new best as a reference line.
- (c) bad-injection: the adaptive run starts on a cheap chain's best plan and is made to try a
  plan with two exchanges and a repartitioned keyed region at batch --inject-at. Reported: how
  many batches later it was rolled back, and whether the loop tried it again (it must not).
- switch costs: a scripted run switches a keyed pipeline in-PE (another pipeline cut), by a
  restart (replicas of the stateless prefix) and by a restart with a state repartition (replicas
  of the keyed region), back and forth, --repeats times each. Per switch: stop, repartition,
  start-to-first-batch and total seconds (SwitchRecord); for in-PE switches, which cost the
  driver nothing, the extra seconds of the first batch under the new cut over the median of the
  batches before it.

Every adaptive run plans with the Spark model corrected by its own measurements
(fissure.control.model_correction); the decisions' reasons say when the correction changed the
ranking, and the report lists the factors it learned.

Writes under --out (default benchmarks/results/; --quick: suffix _quick, in a temporary folder):
adaptive_spark.md and .json, with the header of benchmarks/method.py; the .json holds each
scenario's timeline under "timeline", which --plots also draws as adaptive_spark_<scenario>.png.
A shared, noisy machine gives no figures: run it on a quiet one; --quick (small inputs, one
repeat) is an end-to-end check only.

    ./dev python benchmarks/adaptive_spark.py            # the measurement, 3 repeats (quiet machine!)
    ./dev python benchmarks/adaptive_spark.py --quick    # a few minutes, not figures
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import method

import fissure
from fissure import Pipeline
from fissure.control.adaptive.config import AdaptiveConfig
from fissure.control.driver import ReferenceLine, Timeline, plot_timeline
from fissure.control.plan_change import SwitchKind, plan_fingerprint
from fissure.model.types import Plan, RegionPlan
from fissure.spark.adaptive.loop import run_adaptive_on_spark
from fissure.spark.adaptive.observations import OperatorProfiles, SparkObservations
from fissure.spark.adaptive.queries import QueryManager
from fissure.spark.adaptive.realizer import SparkPlanRealizer
from fissure.config import RunnerConfig
from fissure.spark.session.create import create_session
from fissure.spark.io.sinks import NoopSink
from fissure.testing import record_files

PLOTS_TO: list[Path | None] = [None]  # the folder --plots draws the timelines into (None: no plots)
WITHIN = 0.9
USERS = 50


@dataclass(frozen=True)
class Size:
    """How big a benchmark run is."""

    files: int  # micro-batches of input per run
    records_per_file: int
    heavy_us: float  # CPU per record of each heavy map
    repeats: int  # switch-cost rounds


QUICK = Size(files=24, records_per_file=400, heavy_us=150.0, repeats=1)
WARM_UP = Size(files=3, records_per_file=200, heavy_us=150.0, repeats=1)
FULL = Size(files=80, records_per_file=2000, heavy_us=150.0, repeats=3)


@dataclass(frozen=True)
class CostChange:
    """Scenario (b)'s input: `parse` costs `before_us` per record up to file `change_at`, then x `factor`."""

    files: int
    change_at: int  # the first file (micro-batch) with the new cost
    records_per_file: int
    before_us: float
    factor: float
    static_files: int  # files of post-change input each static candidate runs on

    @property
    def after_us(self) -> float:
        return self.before_us * self.factor


QUICK_CHANGE = CostChange(files=34, change_at=12, records_per_file=1000, before_us=100.0, factor=4.0, static_files=8)
FULL_CHANGE = CostChange(files=100, change_at=40, records_per_file=2000, before_us=100.0, factor=4.0, static_files=20)


def burn(microseconds: float) -> None:
    end = time.perf_counter() + microseconds / 1e6
    while time.perf_counter() < end:
        pass


def heavy_chain(heavy_us: float) -> Pipeline:
    """parse and enrich burn `heavy_us` each per record; count keeps a running count per user."""
    def parse(record):
        burn(heavy_us)
        return {"user": record["user"], "i": record["i"]}

    def enrich(record):
        burn(heavy_us)
        return {"user": record["user"], "i": record["i"] * 2}

    def count(state, record):
        state["n"] = state.get("n", 0) + 1
        return {"user": record["user"], "i": record["i"], "n": state["n"]}

    return (Pipeline("adaptive-bench").map("parse", parse, cost_us=heavy_us).map("enrich", enrich, cost_us=heavy_us)
            .partitioned("count", count, key="user", schema={"user": str, "i": int, "n": int}, cost_us=5.0))


def data_cost_chain(declared_us: float) -> Pipeline:
    """parse burns the record's own `cost_us` (its cost follows the data), enrich a little, count
    keeps a running count per user; the same operator names as `heavy_chain`."""
    def parse(record):
        burn(record["cost_us"])
        return {"user": record["user"], "i": record["i"]}

    def enrich(record):
        burn(10.0)
        return {"user": record["user"], "i": record["i"] * 2}

    def count(state, record):
        state["n"] = state.get("n", 0) + 1
        return {"user": record["user"], "i": record["i"], "n": state["n"]}

    return (Pipeline("adaptive-cost-change").map("parse", parse, cost_us=declared_us)
            .map("enrich", enrich, cost_us=10.0)
            .partitioned("count", count, key="user", schema={"user": str, "i": int, "n": int}, cost_us=5.0))


def plan(*regions) -> Plan:
    return Plan(tuple(RegionPlan(tuple(tuple(p) for p in pipelines), replicas) for pipelines, replicas in regions))


SEQUENTIAL = plan(([["parse", "enrich", "count"]], 1))
STATIC_CANDIDATES = {
    "sequential": SEQUENTIAL,
    "pipelined": plan(([["parse"], ["enrich", "count"]], 1)),
    "stateless x2": plan(([["parse", "enrich"]], 2), ([["count"]], 1)),
    "all x2": plan(([["parse", "enrich", "count"]], 2)),
}
BAD = plan(([["parse"], ["enrich"]], 2), ([["count"]], 2))


def inputs(directory: Path, size: Size):
    records = [{"user": f"u{i % USERS}", "i": i} for i in range(size.files * size.records_per_file)]
    return record_files(directory, records, {"user": str, "i": int}, records_per_file=size.records_per_file,
                        max_files_per_trigger=1)


def cost_inputs(directory: Path, change: CostChange, files: int, first_cost_file: int = 0):
    """`files` files of `change.records_per_file` records; file f >= change.change_at (counted from
    `first_cost_file`) carries the post-change cost."""
    size = change.records_per_file
    records = [{"user": f"u{i % USERS}", "i": i,
                "cost_us": change.after_us if first_cost_file + i // size >= change.change_at else change.before_us}
               for i in range(files * size)]
    return record_files(directory, records, {"user": str, "i": int, "cost_us": float}, records_per_file=size,
                        max_files_per_trigger=1)


def median_throughput(values: list[float]) -> float | None:
    values = [value for value in values if value]
    return statistics.median(values) if values else None


# The adaptive run and every static plan are measured over the same window: the median
# throughput of their last LAST_BATCHES batches (the adaptive run's under the plan it ends on),
# profiling on for both (the Runner's default), so neither is favoured by the batches it leaves out.
LAST_BATCHES = 5


def static_throughput(spark, pipeline: Pipeline, static_plan: Plan, work: Path, size: Size,
                      source=None) -> float | None:
    """Median throughput of one static plan's last LAST_BATCHES batches, on a fresh query."""
    source = source if source is not None else inputs(work / "in", size)
    runner = fissure.Runner(pipeline, source, NoopSink(), plan=static_plan,
                            checkpoint=str(work / "ckpt"), config=RunnerConfig(spark=spark, progress="off"))
    runner.start(available_now=True)
    runner.await_termination()
    progress = sorted(runner.query.recentProgress, key=lambda update: int(update["batchId"]))
    runner.stop()
    return median_throughput([float(update["processedRowsPerSecond"] or 0.0) for update in progress[1:]
                              if int(update["numInputRows"] or 0) > 0][-LAST_BATCHES:])


def adaptive_config(quick: bool) -> AdaptiveConfig:
    if quick:
        return AdaptiveConfig(profile_batches=3, profile_s=2.0, evaluation_batches=3, evaluation_s=2.0,
                              min_operator_samples=50)
    return AdaptiveConfig()


def adaptive_run(spark, where: Path, quick: bool) -> RunnerConfig:
    """The settings of one adaptive run: its timeline in `where`/run, no progress line."""
    return RunnerConfig(spark=spark, run_dir=str(where / "run"), adaptation=adaptive_config(quick), progress="off")


def fresh(work: Path, counter=[0]) -> Path:
    """A new folder under `work` for one run's input and checkpoint."""
    counter[0] += 1
    return work / f"run-{counter[0]}"


def reach_best(spark, work: Path, size: Size, quick: bool, stem: str, repeats: int) -> dict:
    """Every static candidate and the adaptive run in one block (benchmarks/method.py): a warm-up
    run, then `repeats` repeats, the order rotated each repeat."""
    pipeline = heavy_chain(size.heavy_us)
    variants = {name: (lambda static_plan=static_plan: static_throughput(spark, pipeline, static_plan, fresh(work),
                                                                          size))
                for name, static_plan in STATIC_CANDIDATES.items()}

    def adaptive():
        where = fresh(work)
        report = run_adaptive_on_spark(pipeline, inputs(where / "in", size), NoopSink(),
                                       checkpoint=str(where / "ckpt"), config=adaptive_run(spark, where, quick))
        last = [entry.throughput_per_s for entry in report.timeline.batches()
                if entry.plan == plan_fingerprint(report.plan)][-LAST_BATCHES:]
        return report, median_throughput(last)

    variants["adaptive"] = adaptive
    block = method.measure_block(
        variants, repeats, quick=quick, value=lambda result: (result[1] if isinstance(result, tuple) else result) or 0.0,
        warm_up=lambda: static_throughput(spark, pipeline, SEQUENTIAL, fresh(work), WARM_UP),
        warm_up_label="the sequential plan on a small input", log=lambda line: print(f"  (a) {line}", file=sys.stderr))
    medians = block.medians()
    share, best_name = block.over_best_of_others("adaptive", among=list(STATIC_CANDIDATES))
    report = block.details["adaptive"][0][0]  # the first repeat's run: its timeline and decisions
    best = medians[best_name]
    timeline = timeline_record(report.timeline, stem + "_reach-best",
                               [ReferenceLine(f"best static plan ({best_name})", best)])
    return {
        "block": block.to_dict(),
        "static_throughput_per_s": {name: medians[name] for name in STATIC_CANDIDATES},
        "static_plans": {name: plan_fingerprint(p) for name, p in STATIC_CANDIDATES.items()},
        "best_static": best_name,
        "plan_changes_per_repeat": [sum(1 for switch in run.switches if switch.error is None)
                                    for run, _ in block.details["adaptive"]],
        "final_plan_per_repeat": [plan_fingerprint(run.plan) for run, _ in block.details["adaptive"]],
        "plan_changes": max(sum(1 for switch in run.switches if switch.error is None)
                            for run, _ in block.details["adaptive"]),
        "final_plan": plan_fingerprint(report.plan),
        "final_throughput_per_s": medians["adaptive"],
        "share_of_best": share,
        "within_10_percent": share >= WITHIN,
        "decisions": [f"batch {e.batch_id} {e.action}: {e.reason}" for e in report.timeline.entries
                      if e.action != "observe"],
        "model_correction": report.correction,
        "switches": [asdict(switch) for switch in report.switches],
        "timeline": timeline,
    }


def plan_segments(batches, since_batch: int) -> list[dict]:
    """The adaptive run from `since_batch` on, cut where the plan in force changes: per segment
    its plan, first batch and median throughput (its first batch left out: restart effects)."""
    segments: list[dict] = []
    for entry in batches:
        if entry.batch_id < since_batch:
            continue
        if not segments or segments[-1]["plan"] != entry.plan:
            segments.append({"plan": entry.plan, "first_batch": entry.batch_id, "throughputs": []})
        segments[-1]["throughputs"].append(entry.throughput_per_s)
    for segment in segments:
        values = segment["throughputs"]
        segment["batches"] = len(values)
        segment["median_throughput_per_s"] = median_throughput(values[1:] or values)
    return segments


def settled_throughput(segments: list[dict], final_plan: str) -> float | None:
    """Median throughput of `final_plan` over every segment it was in force (each segment's first
    batch left out: restart effects; a last segment of one batch alone says nothing)."""
    values = [value for segment in segments if segment["plan"] == final_plan for value in segment["throughputs"][1:]]
    return median_throughput(values)


def cost_change(spark, work: Path, change: CostChange, quick: bool, stem: str, repeats: int) -> dict:
    """Every static candidate on post-change input and the adaptive run on the whole input, in one
    block (benchmarks/method.py): a warm-up run, then `repeats` repeats, the order rotated."""
    pipeline = data_cost_chain(change.before_us)

    def static(static_plan):
        where = fresh(work)
        source = cost_inputs(where / "in", change, change.static_files, first_cost_file=change.change_at)
        return static_throughput(spark, pipeline, static_plan, where, QUICK, source=source)

    def adaptive():
        where = fresh(work)
        report = run_adaptive_on_spark(pipeline, cost_inputs(where / "in", change, change.files), NoopSink(),
                                       checkpoint=str(where / "ckpt"), config=adaptive_run(spark, where, quick))
        segments = plan_segments(report.timeline.batches(), change.change_at)
        return report, settled_throughput(segments, plan_fingerprint(report.plan))

    variants = {name: (lambda static_plan=static_plan: static(static_plan))
                for name, static_plan in STATIC_CANDIDATES.items()}
    variants["adaptive"] = adaptive
    block = method.measure_block(
        variants, repeats, quick=quick, value=lambda result: (result[1] if isinstance(result, tuple) else result) or 0.0,
        warm_up=lambda: static_throughput(spark, pipeline, SEQUENTIAL, fresh(work), WARM_UP,
                                          source=cost_inputs(fresh(work) / "in", change, 4)),
        warm_up_label="the sequential plan on a small input", log=lambda line: print(f"  (b) {line}", file=sys.stderr))
    medians = block.medians()
    statics = {name: medians[name] for name in STATIC_CANDIDATES}
    share, best_name = block.over_best_of_others("adaptive", among=list(STATIC_CANDIDATES))
    best = statics[best_name]
    report = block.details["adaptive"][0][0]  # the first repeat's run: its timeline and decisions
    batches = report.timeline.batches()
    change_s = next((entry.time_s for entry in batches if entry.batch_id >= change.change_at), None)
    segments = plan_segments(batches, change.change_at)
    replans, reached = 0, None
    for number, segment in enumerate(segments):
        value = segment["median_throughput_per_s"]
        if value and best and value >= WITHIN * best:
            reached = number
            break
        replans += 1
    entries = [entry for entry in report.timeline.entries if entry.batch_id >= change.change_at]
    reopen = next((entry for entry in entries if entry.action == "reopen"), None)
    for segment in segments:
        del segment["throughputs"]
    references = [ReferenceLine(f"best static plan after the change ({best_name})", best, change_s)]
    timeline = timeline_record(report.timeline, stem + "_cost-change", references)
    return {
        "block": block.to_dict(),
        "change_at_batch": change.change_at,
        "cost_us_before_after": [change.before_us, change.after_us],
        "static_throughput_after_change_per_s": statics,
        "static_plans": {name: plan_fingerprint(p) for name, p in STATIC_CANDIDATES.items()},
        "best_static_after_change": best_name,
        "reopened_at_batch": reopen.batch_id if reopen else None,
        "reopen_reason": reopen.reason if reopen else None,
        "segments_after_change": segments,
        "replans_until_within_10_percent": replans if reached is not None else None,
        "final_plan": plan_fingerprint(report.plan),
        "final_plan_per_repeat": [plan_fingerprint(run.plan) for run, _ in block.details["adaptive"]],
        "final_throughput_per_s": medians["adaptive"],  # median over the repeats of the post-change settled rate
        "share_of_best": share,
        "decisions_after_change": [f"batch {e.batch_id} {e.action}: {e.reason}" for e in entries
                                   if e.action not in ("observe",)],
        "model_correction": report.correction,
        "switches": [asdict(switch) for switch in report.switches],
        "timeline": timeline,
    }


def rollback_window(entries: list[dict], applied_at: int | None, rolled_back_at: int | None) -> dict:
    """What happened between applying the bad plan and rolling it back, from the timeline: the
    batches discarded after the switch, the batches evaluated, and whether the verdict came at the
    end of the first evaluation window (no second window, no keep in between)."""
    if applied_at is None or rolled_back_at is None:
        return {"discarded_batches": None, "evaluated_batches": None, "within_one_window": False}
    between = [entry for entry in entries if applied_at < entry["batch_id"] < rolled_back_at]
    discarded = sum("discarded" in entry["reason"] for entry in between)
    evaluated = sum(entry["reason"].startswith("evaluating") for entry in between)
    other_verdicts = [entry for entry in between if entry["action"] not in ("observe",)]
    return {"discarded_batches": discarded, "evaluated_batches": evaluated,
            "within_one_window": not other_verdicts}


def bad_injection(spark, work: Path, size: Size, quick: bool, stem: str, inject_at: int) -> dict:
    pipeline = heavy_chain(5.0)  # cheap: the exchanges and the extra state stage only cost
    report = run_adaptive_on_spark(pipeline, inputs(work / "bad-in", size), NoopSink(),
                                   checkpoint=str(work / "bad-ckpt"), injections={inject_at: BAD},
                                   config=RunnerConfig(spark=spark, run_dir=str(work / "bad-run"),
                                                       adaptation=adaptive_config(quick), progress="off"))
    entries = report.timeline.entries
    bad = plan_fingerprint(BAD)
    applied = [entry for entry in entries if entry.action == "apply" and entry.plan_after == bad]
    rolled_back = [entry for entry in entries if entry.action in ("revert", "halt") and entry.plan == bad]
    timeline = timeline_record(report.timeline, stem + "_bad-injection")
    window = rollback_window([asdict(entry) for entry in entries], applied[0].batch_id if applied else None,
                             rolled_back[0].batch_id if rolled_back else None)
    return {
        **window,
        "injected_plan": bad,
        "applied_at_batch": applied[0].batch_id if applied else None,
        "rolled_back_at_batch": rolled_back[0].batch_id if rolled_back else None,
        "batches_until_rollback": (rolled_back[0].batch_id - applied[0].batch_id) if applied and rolled_back else None,
        "retried": len(applied) > 1,
        "reasons": [entry.reason for entry in rolled_back],
        "switches": [asdict(switch) for switch in report.switches],
        "timeline": timeline,
    }


SWITCH_ROUND = [  # (target plan, expected kind), from SEQUENTIAL and back to it
    (plan(([["parse"], ["enrich", "count"]], 1)), SwitchKind.IN_PE),
    (SEQUENTIAL, SwitchKind.IN_PE),
    (plan(([["parse", "enrich"]], 2), ([["count"]], 1)), SwitchKind.RESTART),
    (SEQUENTIAL, SwitchKind.RESTART),
    (plan(([["parse", "enrich", "count"]], 2)), SwitchKind.RESTART_WITH_STATE),
    (SEQUENTIAL, SwitchKind.RESTART_WITH_STATE),
]


def switch_costs(spark, work: Path, size: Size, every: int = 3) -> dict:
    """Scripted switches every `every` batches; per switch its record, and for in-PE switches the
    first batch's extra seconds over the median of the batches before it."""
    pipeline = heavy_chain(size.heavy_us / 5)
    script = SWITCH_ROUND * size.repeats
    needed = Size(files=every * (len(script) + 2), records_per_file=size.records_per_file,
                  heavy_us=size.heavy_us, repeats=size.repeats)
    queries = QueryManager(pipeline, inputs(work / "switch-in", needed), NoopSink(), spark=spark,
                           checkpoint=str(work / "switch-ckpt"), dead_letters=None, config=RunnerConfig(),
                           available_now=True, clock=time.monotonic)
    realizer = SparkPlanRealizer(queries)
    observations = SparkObservations(queries, OperatorProfiles(pipeline.operator_stats()), cores=2)
    queries.start(SEQUENTIAL)
    durations: list[tuple[int, float]] = []
    in_pe_extra, pending, since_switch = [], None, 0
    try:
        while (observation := observations.next_batch()) is not None:
            durations.append((observation.batch_id, observation.duration_s))
            since_switch += 1
            if pending is not None and observation.plan_in_force == pending[0]:
                before = [duration for _, duration in durations[-every - 1:-1]]
                in_pe_extra.append(observation.duration_s - statistics.median(before))
                pending = None
            if script and since_switch >= every:
                target, kind = script.pop(0)
                realizer.apply(target, kind)
                if kind is SwitchKind.IN_PE:
                    pending = (plan_fingerprint(target),)
                since_switch = 0
    finally:
        queries.close()
    records = [asdict(switch) for switch in realizer.switches]
    by_kind = {}
    for record in realizer.switches:
        by_kind.setdefault(record.applied_as, []).append(record.total_s)
    return {
        "switches": records,
        "median_total_s": {kind: statistics.median(values) for kind, values in by_kind.items()},
        "in_pe_first_batch_extra_s": in_pe_extra,
        "median_in_pe_first_batch_extra_s": statistics.median(in_pe_extra) if in_pe_extra else None,
    }


def timeline_record(timeline: Timeline, stem: str, references=()) -> dict:
    """The timeline as the results' JSON keeps it; with --plots also drawn as `stem`.png."""
    if PLOTS_TO[0] is not None:
        try:
            plot_timeline(timeline, PLOTS_TO[0] / f"{stem}.png", references)
        except RuntimeError as error:
            print(f"no plot: {error}", file=sys.stderr)
    return timeline.to_dict()


def markdown(document: dict) -> str:
    reach, bad, costs = document["reach_best"], document["bad_injection"], document["switch_costs"]
    change = document["cost_change"]
    lines = [
        "# The adaptive loop on Spark",
        "",
        f"- Spark master local[{document['cores']}]; (a) and (b): every static plan and the adaptive run in one "
        f"block, a warm-up run first, {document['repeats']} repeat(s) in an order rotated each repeat, medians; "
        "the adaptive run's timeline and decisions below are those of its first repeat",
        f"- input: {document['size']['files']} files of {document['size']['records_per_file']:,} records"
        f" (one per micro-batch); (b): {document['cost_change_input']['files']} files of"
        f" {document['cost_change_input']['records_per_file']:,} records",
        "",
    ]
    if reach is not None:
        lines += ["## (a) start sequential, reach the best static plan", "",
                  "| static plan | | records/s |", "| --- | --- | ---: |"]
        for name, value in reach["static_throughput_per_s"].items():
            lines.append(f"| {name} | `{reach['static_plans'][name]}` | {value or 0:,.0f} |")
        share = reach["share_of_best"]
        lines += ["", f"Adaptive from sequential: plan changes per repeat {reach['plan_changes_per_repeat']}, ends on"
                  f" {', '.join(f'`{plan}`' for plan in reach['final_plan_per_repeat'])}; median"
                  f" {reach['final_throughput_per_s'] or 0:,.0f} records/s over its last batches,"
                  f" {'n/a' if share is None else f'{share:.2f}'} of the best static plan ({reach['best_static']});"
                  f" within 10 %: {reach['within_10_percent']}. Model correction at the end:"
                  f" {reach['model_correction'] or 'none'}.", ""]
        lines += [f"- {decision}" for decision in reach["decisions"]]
        lines += ["", f"![reach-best]({document['stem']}_reach-best.png)", ""] if document.get("plots") else [""]
    if change is not None:
        lines += ["## (b) an operator's data-dependent cost quadruples mid-run", "",
                  f"`parse` costs {change['cost_us_before_after'][0]:g} us per record,"
                  f" {change['cost_us_before_after'][1]:g} from batch {change['change_at_batch']} on.", "",
                  "| static plan on post-change input | | records/s |", "| --- | --- | ---: |"]
        for name, value in change["static_throughput_after_change_per_s"].items():
            lines.append(f"| {name} | `{change['static_plans'][name]}` | {value or 0:,.0f} |")
        share = change["share_of_best"]
        replans = change["replans_until_within_10_percent"]
        lines += ["", f"Re-opened at batch {change['reopened_at_batch']} ({change['reopen_reason']}); re-plans after"
                  f" the change until within 10 % of the new best static plan ({change['best_static_after_change']}):"
                  f" {'never' if replans is None else replans}; ends on `{change['final_plan']}`, which ran at"
                  f" {change['final_throughput_per_s'] or 0:,.0f} records/s after the change (median),"
                  f" {'n/a' if share is None else f'{share:.2f}'} of the new best. Model correction at the end:"
                  f" {change['model_correction'] or 'none'}.", "",
                  "| plan in force after the change | from batch | batches | median records/s |",
                  "| --- | ---: | ---: | ---: |"]
        for segment in change["segments_after_change"]:
            lines.append(f"| `{segment['plan']}` | {segment['first_batch']} | {segment['batches']} |"
                         f" {segment['median_throughput_per_s'] or 0:,.0f} |")
        lines += [""] + [f"- {decision}" for decision in change["decisions_after_change"]]
        lines += ["", f"![cost-change]({document['stem']}_cost-change.png)", ""] if document.get("plots") else [""]
    if bad is not None:
        lines += ["## (c) an injected bad change", "",
                  f"`{bad['injected_plan']}` applied at batch {bad['applied_at_batch']}, rolled back at batch"
                  f" {bad['rolled_back_at_batch']} ({bad['batches_until_rollback']} batches later); tried again:"
                  f" {bad['retried']}.", "",
                  f"Between the two: {bad.get('discarded_batches')} batch discarded after the restart, then"
                  f" {bad.get('evaluated_batches')} batches evaluated, and the verdict at the end of that first"
                  f" evaluation window (at least {AdaptiveConfig().evaluation_batches} batches and"
                  f" {AdaptiveConfig().evaluation_s:g} s): within one window: {bad.get('within_one_window')}.", ""]
        lines += [f"- {reason}" for reason in bad["reasons"]]
        lines.append("")
    if costs is not None:
        lines += ["## What a switch costs", "",
                  "| applied as | before | after | stop s | repartition s | start to first batch s | total s |",
                  "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
        for switch in costs["switches"]:
            lines.append(f"| {switch['applied_as']} | `{switch['plan_before']}` | `{switch['plan_after']}` |"
                         f" {switch['stop_s']:.2f} | {switch['repartition_s']:.2f} | {switch['start_s']:.2f} |"
                         f" {switch['total_s']:.2f} |")
        extra = costs["median_in_pe_first_batch_extra_s"]
        lines += ["", "Median total per kind: " + ", ".join(f"{kind} {value:.2f} s" for kind, value in
                                                            costs["median_total_s"].items()) + ".",
                  f"In-PE switches cost the driver only the time to set the cut; the first batch under the new cut"
                  f" took {'n/a' if extra is None else f'{extra:+.2f} s'} over the median of the batches before it"
                  f" (the PE forks its new processes there).", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser, plots=True)
    parser.add_argument("--cores", type=int, default=2, help="Spark task slots, local[N] (default 2)")
    parser.add_argument("--inject-at", type=int, default=8, help="(c): the batch the bad plan is injected at")
    parser.add_argument("--only", choices=("reach-best", "cost-change", "bad-injection", "switch-costs"),
                        action="append", help="run only these parts (repeatable; default all)")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = 1
    method.check_repeats(args.repeats, args.quick)
    run = method.Run("adaptive_spark.py", argv, quick=args.quick, out=args.out, master=f"local[{args.cores}]")
    PLOTS_TO[0] = run.out if args.plots else None
    size = QUICK if args.quick else FULL
    change = QUICK_CHANGE if args.quick else FULL_CHANGE
    parts = set(args.only or ("reach-best", "cost-change", "bad-injection", "switch-costs"))
    stem = "adaptive_spark_quick" if args.quick else "adaptive_spark"
    run.out.mkdir(parents=True, exist_ok=True)
    spark = create_session(RunnerConfig(master=f"local[{args.cores}]", app_name="fissure-adaptive-bench"))
    with method.scratch_folder("adaptive_spark.py") as work:
        try:
            reach = change_result = bad = costs = None
            if "reach-best" in parts:
                print("(a) reach-best", file=sys.stderr)
                reach = reach_best(spark, work, size, args.quick, stem, args.repeats)
            if "cost-change" in parts:
                print("(b) cost-change", file=sys.stderr)
                change_result = cost_change(spark, work, change, args.quick, stem, args.repeats)
            if "bad-injection" in parts:
                print("(c) bad-injection", file=sys.stderr)
                bad = bad_injection(spark, work, size, args.quick, stem, args.inject_at)
            if "switch-costs" in parts:
                print("switch costs", file=sys.stderr)
                costs = switch_costs(spark, work, size)
        finally:
            method.end_spark(spark)
    document = {
        "cores": args.cores, "quick": args.quick, "repeats": args.repeats, "size": asdict(size), "cost_change_input": asdict(change), "stem": stem, "plots": args.plots, "reach_best": reach,
        "cost_change": change_result, "bad_injection": bad, "switch_costs": costs,
    }
    run.write_results(stem, markdown(document), document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
