"""The adaptive loop's scenarios on the model-driven simulator.

A simulation of the throughput model, not a Spark run and not a timing: every batch's measured
throughput is the model's throughput of the plan in force on the scenario's true operator
statistics, times seeded noise; switches lose the default switch costs; time is a fake clock.
It answers "does the loop decide well when the model is right about the system"; how Spark
behaves while plans switch is for the Spark realizer's benchmarks. Writes, with the results
header of benchmarks/method.py, under --out (default benchmarks/results/; --quick: a temporary
folder):
  adaptive_scenarios.md            the bounds each scenario must meet, over seeds
  adaptive_scenarios.json          every figure behind it, and per scenario the timeline of seed 0
                                   (throughput per batch, decisions, threads) under "timeline"
  adaptive_<scenario>.png          that timeline drawn, with --plots only

    ./dev python benchmarks/adaptive_scenarios.py            # 20 seeds per scenario, under a minute
    ./dev python benchmarks/adaptive_scenarios.py --quick    # 3 seeds, shortened phases
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import method  # noqa: E402
from fissure.control.adaptive.decisions import Action  # noqa: E402
from fissure.control.driver import ReferenceLine, plot_timeline  # noqa: E402
from fissure.control.plan_change import parse_fingerprint  # noqa: E402
from fissure.control.scenarios import CHAIN, MACHINE, SCENARIO_NAMES, ScenarioRun, run_scenario, scenario  # noqa: E402
WITHIN = 0.9  # "within 10 % of the best static plan"


def capacity_at(run: ScenarioRun, fingerprint: str, time_s: float) -> float:
    return run.system.capacity_per_s(parse_fingerprint(fingerprint), time_s)


def best_at(run: ScenarioRun, time_s: float) -> float:
    return run.system.best_static(time_s, method="optimal").evaluation.throughput_per_s


def first_time_within(run: ScenarioRun, since_s: float, until_s: float) -> float | None:
    """Seconds after `since_s` until the plan in force is within 10 % of the best static plan."""
    for entry in run.timeline.batches():
        if since_s <= entry.time_s < until_s and capacity_at(run, entry.plan_after, entry.time_s) >= WITHIN * best_at(run, entry.time_s):
            return entry.time_s - since_s
    return None


def share_of_best(run: ScenarioRun, since_s: float, until_s: float) -> float:
    """Time-weighted mean of (true throughput of the plan in force) / (best static plan's)."""
    batches = run.timeline.batches()
    weighted = total = 0.0
    for previous, entry in zip(batches, batches[1:]):
        if not since_s <= previous.time_s < until_s:
            continue
        span_s = entry.time_s - previous.time_s
        weighted += span_s * capacity_at(run, entry.plan, entry.time_s) / best_at(run, entry.time_s)
        total += span_s
    return weighted / total if total else float("nan")


def measure(run: ScenarioRun) -> dict:
    """The figures of one run that the bounds are checked on."""
    name, end_s = run.scenario.name, run.system.clock()
    final_ratio = capacity_at(run, run.timeline.batches()[-1].plan_after, end_s - 1.0) / best_at(run, end_s - 1.0)
    switches = run.timeline.switches()
    figures = {"seed": run.scenario.simulation.seed, "final_share_of_best": final_ratio,
               "switches": len(switches), "reverts": sum(d.action is Action.REVERT for d in run.decisions),
               "halts": sum(d.action is Action.HALT for d in run.decisions),
               "reopens": sum(d.action is Action.REOPEN for d in run.decisions)}
    if name == "reach-best":
        figures["seconds_to_within_10pct"] = first_time_within(run, 0.0, end_s)
        figures["share_of_best_over_run"] = share_of_best(run, 0.0, end_s)
    elif name == "cost-change":
        change_s = run.scenario.change_s
        figures["replans_after_change"] = sum(entry.time_s >= change_s for entry in switches)
        figures["seconds_to_reopen"] = next((d.now_s - change_s for d in run.decisions
                                             if d.action is Action.REOPEN and d.now_s >= change_s), None)
        figures["seconds_to_within_10pct_after_change"] = first_time_within(run, change_s, end_s)
        figures["share_of_best_after_change"] = share_of_best(run, change_s, end_s)
    elif name == "bad-injection":
        injected = next(d for d in run.decisions if d.reason.startswith("apply: injected"))
        rollback = next(d for d in run.decisions if d.batch_id > injected.batch_id and d.switch is not None)
        later = [d for d in run.decisions if d.batch_id > rollback.batch_id and d.action in (Action.APPLY, Action.RELEASE)]
        config = run.scenario.config
        figures.update(
            rolled_back=rollback.action in (Action.REVERT, Action.HALT),
            batches_to_rollback=rollback.batch_id - injected.batch_id,
            window_batches=config.discard_after_switch + config.evaluation_batches,
            seconds_to_rollback=rollback.now_s - injected.now_s,
            retried=any(d.switch.change.repeats(injected.switch.change) for d in later),
        )
    elif name == "model-mismatch":
        start = run.system.capacity_per_s(run.scenario.initial_plan, end_s - 1.0)
        figures["final_over_start"] = capacity_at(run, run.timeline.batches()[-1].plan_after, end_s - 1.0) / start
        figures["blacklisted_change_retried"] = retried_blacklisted(run)
        correction = run.controller.correction
        figures["learned_replication_factor"] = correction.factor("replication_cost_us") if correction else 1.0
        figures["correction_changed_ranking"] = any("the correction changed the ranking" in d.reason
                                                    for d in run.decisions)
    elif name == "rate-drop":
        drop_s, back_s = run.scenario.change_s, run.scenario.simulation.phases[2].start_s
        batches = run.timeline.batches()
        before = [e for e in batches if e.time_s < drop_s][-1]
        trickle = [e for e in batches if e.time_s < back_s][-1]
        trickle_rate = run.scenario.simulation.phases[1].offered_rate_per_s
        figures.update(
            threads_before_drop=before.threads, threads_on_trickle=trickle.threads, threads_at_end=batches[-1].threads,
            releases=sum(d.action is Action.RELEASE for d in run.decisions),
            trickle_plan_covers_rate=capacity_at(run, trickle.plan_after, back_s - 1.0) >= trickle_rate,
            seconds_to_within_10pct_after_return=first_time_within(run, back_s, end_s),
        )
    return figures


def retried_blacklisted(run: ScenarioRun) -> bool:
    """Whether any switch the loop proposed repeats a change blacklisted before it."""
    blacklisted = []
    for decision in run.decisions:
        if decision.action in (Action.APPLY, Action.RELEASE):
            if any(decision.switch.change.repeats(bad) for bad in blacklisted):
                return True
        if decision.blacklisted is not None:
            blacklisted.append(decision.blacklisted)
        if decision.action is Action.REOPEN and "forgotten" in decision.reason:
            blacklisted.clear()
    return False


def bounds(name: str, runs: list[dict]) -> list[str]:
    """The verdict lines of one scenario: its bounds, met or not."""
    worst_final = min(run["final_share_of_best"] for run in runs)
    if name == "reach-best":
        most = max(run["switches"] for run in runs)
        return [f"within 10 % of the best static plan at the end: worst {worst_final:.3f} ({'yes' if worst_final >= WITHIN else 'NO'})",
                f"plan changes: at most {most} ({'<= 3: yes' if most <= 3 else '> 3: NO'})"]
    if name == "cost-change":
        most = max(run["replans_after_change"] for run in runs)
        return [f"within 10 % of the new best static plan at the end: worst {worst_final:.3f} ({'yes' if worst_final >= WITHIN else 'NO'})",
                f"re-plans after the change: at most {most} ({'<= 3: yes' if most <= 3 else '> 3: NO'})"]
    if name == "bad-injection":
        within = all(run["rolled_back"] and run["batches_to_rollback"] <= run["window_batches"] for run in runs)
        retried = any(run["retried"] for run in runs)
        return [f"rolled back within one evaluation window: {'yes' if within else 'NO'} (at most {max(r['batches_to_rollback'] for r in runs)} batches, window {runs[0]['window_batches']})",
                f"retried later: {'YES' if retried else 'never'}"]
    if name == "model-mismatch":
        worse = min(run["final_over_start"] for run in runs)
        retried = any(run["blacklisted_change_retried"] for run in runs)
        factors = [run["learned_replication_factor"] for run in runs]
        return [f"within 10 % of the best static plan at the end, learning from the measurements: worst"
                f" {worst_final:.3f} ({'yes' if worst_final >= WITHIN else 'NO'})",
                f"never ends below the sequential start: {'yes' if worse >= 1 else 'NO'} (worst {worse:.2f}x of it)",
                f"a blacklisted change retried: {'YES' if retried else 'never'}",
                f"learned exchange (c_p) factor: median {statistics.median(factors):.1f} (truth 20),"
                f" range {min(factors):.1f} .. {max(factors):.1f}"]
    fewer = all(run["threads_on_trickle"] < run["threads_before_drop"] for run in runs)
    covers = all(run["trickle_plan_covers_rate"] for run in runs)
    return [f"fewer threads on the trickle: {'yes' if fewer else 'NO'} "
            f"({statistics.median(r['threads_before_drop'] for r in runs):g} -> {statistics.median(r['threads_on_trickle'] for r in runs):g} median)",
            f"the smaller plan still processes the trickle: {'yes' if covers else 'NO'}",
            f"back within 10 % of the best once the rate returns: worst {worst_final:.3f}"]


def markdown(results: dict) -> str:
    lines = [
        "# The adaptive loop's scenarios on the model simulator",
        "",
        "**A simulation of the throughput model, not a Spark run and not a timing.** Each batch's measured",
        "throughput is the model's throughput of the plan in force on the scenario's true operator statistics,",
        "times seeded noise (3 % per batch, 5 % on operator estimates); switches lose the default switch costs",
        "(in-PE 0.5 s, restart 5 s, restart with state repartition 13 s); the clock is simulated.",
        "",
        "- the machine and its load are irrelevant to the figures: nothing is timed",
        f"- chain: {', '.join(f'{op.name} ({op.kind.value}, {op.cost_us:g} us, s={op.selectivity:g})' for op in CHAIN)};"
        f" model machine: {MACHINE.cores} cores, delta {MACHINE.thread_switch_overhead_us:g} us,"
        f" c_p {MACHINE.replication_cost_us:g} us; {results['seeds']} seeds per scenario",
        "",
    ]
    for name in SCENARIO_NAMES:
        entry = results["scenarios"][name]
        runs = entry["runs"]
        lines += [f"## {entry['title']}", ""]
        lines += [f"- {line}" for line in bounds(name, runs)]
        keys = [key for key in runs[0] if key != "seed"]
        lines += ["", "| figure | median | worst / range |", "|---|---|---|"]
        for key in keys:
            values = [run[key] for run in runs]
            if all(isinstance(v, bool) for v in values):
                lines.append(f"| {key} | {sum(values)} of {len(values)} | |")
                continue
            numbers = [v for v in values if v is not None]
            missing = f" ({len(values) - len(numbers)} never)" if len(numbers) < len(values) else ""
            if not numbers:
                lines.append(f"| {key} | never | |")
                continue
            lines.append(f"| {key} | {statistics.median(numbers):.3g} | {min(numbers):.3g} .. {max(numbers):.3g}{missing} |")
        lines += ["", f"![{name}]({entry['plot']})", ""] if entry.get("plot") else [""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser, repeats=None, plots=True)
    parser.add_argument("--seeds", type=int, help="seeds per scenario (default 20, quick 3)")
    args = parser.parse_args(argv)
    run = method.Run("adaptive_scenarios.py", argv, quick=args.quick, out=args.out, master=None, timed=False)
    seeds = args.seeds or (3 if args.quick else 20)
    stem = "adaptive_scenarios_quick" if args.quick else "adaptive_scenarios"
    prefix = "adaptive_quick_" if args.quick else "adaptive_"
    results = {"seeds": seeds, "simulation": "model-level, no Spark", "scenarios": {}}
    for name in SCENARIO_NAMES:
        runs = []
        for seed in range(seeds):
            simulated = run_scenario(scenario(name, seed, quick=args.quick))
            runs.append(measure(simulated))
            if seed == 0:
                plot = f"{prefix}{name}.png" if args.plots else None
                if plot:
                    phases = simulated.scenario.simulation.phases
                    ends = [phase.start_s for phase in phases[1:]] + [simulated.system.clock()]
                    references = [ReferenceLine("best static plan" if i == 0 else None,
                                                best_at(simulated, phase.start_s), phase.start_s, end)
                                  for i, (phase, end) in enumerate(zip(phases, ends))]
                    plot_timeline(simulated.timeline, run.path(plot), references)
                timeline = simulated.timeline.to_dict()
                title = simulated.scenario.title
        results["scenarios"][name] = {"title": title, "plot": plot, "runs": runs, "timeline": timeline}
        print(f"{name}: " + "; ".join(bounds(name, runs)))
    run.write_results(stem, markdown(results), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
