"""State that ends: keys of a stream of one-time users, with and without `expire_after`, on Spark.

A keyed count per user (`partitioned`) over 20 micro-batches that each bring only new users
(--users a batch), their event times 10 s a batch apart and up to 10 s out of order, lateness 5 s.
With `expire_after=30` a user's state goes once the watermark passes the user's last event time
+ 30 s (its `on_expire` emits the user's count), so the keys holding state after each batch stay
near the users still live by that rule, computed here in plain Python from the watermark of
the documented rule (the largest event time of the batches before, minus the lateness). Without
it every user ever seen keeps its state and the count grows by --users a batch.

Reported per batch: `state_keys` (fissure's count, summed over stateful operators) for both
programs and the live users of the reference; the bound asked is every batch from the fifth on
within 10 % of the live users with expiry, and growth without it. Keys are counted, not timed,
so the machine's load does not change the figures.

    ./dev python benchmarks/state_bounded.py            # 20 batches of 2,000 new users (a few minutes)
    ./dev python benchmarks/state_bounded.py --quick    # 8 batches of 200
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

import method  # noqa: E402

BATCH_SPAN_S = 10.0
LATENESS_S = 5.0
EXPIRE_AFTER_S = 30.0


def visit_batches(batches: int, users: int, seed: int = 1) -> list[list[dict]]:
    """`batches` micro-batches of `users` new users each, 1-3 clicks a user inside the batch's span."""
    rng = random.Random(seed)
    found = []
    for batch in range(batches):
        records = []
        for number in range(users):
            user = f"b{batch}-u{number}"
            for _ in range(rng.randint(1, 3)):
                records.append({"user": user, "ts": round(batch * BATCH_SPAN_S + rng.uniform(0, BATCH_SPAN_S), 3)})
        rng.shuffle(records)
        found.append(records)
    return found


def live_users_reference(batches: list[list[dict]], expire_after: float, lateness: float) -> list[int]:
    """Per batch, the users holding state after it: seen so far, and not expired by the batch's
    watermark (W_N = the largest event time of the batches before N minus the lateness; a user's
    state goes once W_N passes its last event time + expire_after)."""
    last: dict[str, float] = {}
    largest = None
    live = []
    for batch in batches:
        watermark = float("-inf") if largest is None else largest - lateness
        for record in batch:
            last[record["user"]] = max(last.get(record["user"], float("-inf")), record["ts"])
        for user in [user for user, ts in last.items() if ts + expire_after <= watermark]:
            del last[user]
        live.append(len(last))
        largest = max([record["ts"] for record in batch] + ([largest] if largest is not None else []))
    return live


def program(expire: bool):
    from fissure import Pipeline

    def visits(state, record):
        state["n"] = state.get("n", 0) + 1
        return None

    def on_expire(state, user):
        return {"user": user, "n": state["n"]}

    options = {"expire_after": EXPIRE_AFTER_S, "on_expire": on_expire} if expire else {}
    return (Pipeline("one_time_users" + ("_expiring" if expire else ""))
            .event_time("ts", lateness=LATENESS_S)
            .partitioned("visits", visits, key="user", schema={"user": str, "n": int}, **options))


def run(spark, batches: list[list[dict]], expire: bool, work: Path) -> list[int | None]:
    import fissure
    from fissure.testing import TestingSink, TestingSource

    report = fissure.run(program(expire), TestingSource(batches=batches), TestingSink([]),
                         checkpoint=str(work / ("expiring" if expire else "kept")),
                         config=fissure.RunnerConfig(spark=spark, progress="off"))
    by_batch = {entry.batch_id: entry.state_keys for entry in report.batch_log}
    return [by_batch.get(batch) for batch in range(len(batches))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--users", type=int, default=2_000, help="new users a batch")
    method.add_arguments(parser, repeats=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.users = 8, 200
    run_record = method.Run("state_bounded.py", argv, quick=args.quick, out=args.out, timed=False)
    from fissure.config import RunnerConfig
    from fissure.spark.session.create import create_session

    spark = create_session(RunnerConfig(master="local[2]"))
    batches = visit_batches(args.batches, args.users)
    live = live_users_reference(batches, EXPIRE_AFTER_S, LATENESS_S)
    with tempfile.TemporaryDirectory(prefix="fissure-state-bounded-") as work:
        expiring = run(spark, batches, True, Path(work))
        kept = run(spark, batches, False, Path(work))
    within = [abs(keys - alive) <= 0.10 * alive for keys, alive in zip(expiring, live) if keys is not None][4:]
    rows = ["| batch | live users (reference) | state_keys with expire_after | state_keys without |",
            "| ---: | ---: | ---: | ---: |"]
    rows += [f"| {batch} | {alive:,} | {'-' if a is None else f'{a:,}'} | {'-' if b is None else f'{b:,}'} |"
             for batch, (alive, a, b) in enumerate(zip(live, expiring, kept))]
    flat = bool(within) and all(within)
    grows = kept[-1] is not None and kept[0] is not None and kept[-1] >= 0.9 * args.users * args.batches
    markdown = "\n".join([
        "# State that ends: one-time users with and without expire_after", "",
        f"{args.batches} micro-batches of {args.users:,} new users each (1-3 events a user, event times "
        f"{BATCH_SPAN_S:g} s a batch apart, lateness {LATENESS_S:g} s), a keyed count per user on Spark "
        f"local[2], sequential plan; `expire_after={EXPIRE_AFTER_S:g}` against no expiry. `state_keys` is the "
        "run's count after each batch (fissure run --json's field); the live users are the plain-Python "
        "reference of the expiry rule.", "",
        *rows, "",
        f"With expiry, batches 4 on within 10 % of the live users: {flat}. Without, the state grows with "
        f"every user ever seen ({kept[-1]:,} keys after the last batch): {grows}."])
    run_record.write_results("state_bounded" if not args.quick else "state_bounded_quick", markdown,
                             {"live_users": live, "state_keys_expiring": expiring, "state_keys_kept": kept,
                              "flat_within_10_percent": flat, "grows_without_expiry": grows,
                              "batches": args.batches, "users_per_batch": args.users})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
