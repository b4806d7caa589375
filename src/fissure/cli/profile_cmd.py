"""`fissure profile RUN`: the operator statistics of a running or finished run, from its profile log.

    fissure profile CHECKPOINT_DIR                 # the table of the last 20 batches of the latest plan
    fissure profile CHECKPOINT_DIR --follow        # redraw every 2 s while the run goes on
    fissure profile run/fissure/profile.jsonl --window 50 --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from fissure.cli import UsageError


def register(subparsers) -> None:
    parser = subparsers.add_parser("profile", help="show the operator statistics of a running or finished run",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="the run's checkpoint directory, or its profile log (profile.jsonl)")
    parser.add_argument("--window", type=int, default=None, help="micro-batches summarized (default: 20, the latest plan's)")
    parser.add_argument("--cost", choices=("cpu", "wall"), default="cpu", help="cost basis (default: cpu time per record)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--follow", action="store_true", help="redraw while the run goes on (Ctrl-C ends)")
    parser.add_argument("--interval", type=float, default=2.0, help="with --follow: seconds between redraws")
    parser.add_argument("--timeout", type=float, default=None, help="with --follow: stop after this many seconds")
    parser.set_defaults(handler=handle)


def summary_json(summary) -> dict:
    return dataclasses.asdict(summary)


def _summary(path, settings):
    from fissure.profile.log import read_profile_log
    from fissure.profile.window import summarize

    return summarize(read_profile_log(path), settings)


def handle(args) -> int:
    from fissure.profile.log import resolve_profile_log
    from fissure.profile.settings import ProfileSettings
    from fissure.profile.window import render_table

    try:
        path = resolve_profile_log(args.run)
        settings = ProfileSettings(window_batches=args.window or ProfileSettings().window_batches, cost_basis=args.cost)
    except (FileNotFoundError, ValueError) as error:
        raise UsageError(str(error)) from None
    if args.interval <= 0:
        raise UsageError(f"--interval must be > 0 seconds, got {args.interval}")
    summary = _summary(path, settings)
    if args.json:
        print(json.dumps(summary_json(summary)))
        return 0
    if not args.follow:
        print(render_table(summary) if summary.batches else f"{path}: no batch profiled yet")
        return 0
    started, lines = time.monotonic(), 0
    try:
        while True:
            text = render_table(summary) if summary.batches else f"{path}: no batch profiled yet"
            if lines and sys.stdout.isatty():
                print(f"\x1b[{lines}F\x1b[J", end="")
            print(text, flush=True)
            lines = text.count("\n") + 1
            if args.timeout is not None and time.monotonic() - started >= args.timeout:
                return 0
            time.sleep(args.interval)
            summary = _summary(path, settings)
    except KeyboardInterrupt:
        return 0
