"""Per-user sessions: a user's clicks less than 30 s apart form a session; each session is
emitted once it is over, with its clicks and the pages it saw, the last ones at the end of input.

    ./dev python examples/sessions.py [--users 5000] [--plan planner|sequential|FILE]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fissure import Pipeline, Session  # noqa: E402
from example_support import example_parser, run_lines_for_people  # noqa: E402
from generators.clicks import click_lines, generate_clicks  # noqa: E402

GAP_S = 30.0
LATENESS_S = 5.0
CLICK = {"user": str, "page": str, "ts": float}


def parse_click(record):
    click = json.loads(record["value"])
    return {"user": str(click["user"]), "page": str(click["page"]), "ts": float(click["ts"])}


class Visit:
    """A session's clicks and the distinct pages it saw; sessions that a late click joins merge."""

    result_schema = {"clicks": int, "pages": int}

    def create(self):
        return {"clicks": 0, "pages": []}

    def add(self, acc, record):
        pages = acc["pages"] if record["page"] in acc["pages"] else sorted([*acc["pages"], record["page"]])
        return {"clicks": acc["clicks"] + 1, "pages": pages}

    def merge(self, left, right):
        return {"clicks": left["clicks"] + right["clicks"], "pages": sorted(set(left["pages"]) | set(right["pages"]))}

    def result(self, acc):
        return {"clicks": acc["clicks"], "pages": len(acc["pages"])}


def build_pipeline() -> Pipeline:
    return (Pipeline("sessions")
            .map("parse", parse_click, schema=CLICK, reads=["value"])
            .event_time("ts", lateness=LATENESS_S)
            .window("visits", key="user", window=Session(GAP_S), aggregate=Visit()))


def main(argv=None) -> int:
    parser = example_parser(__doc__, files=5)
    parser.add_argument("--users", type=int, default=5_000)
    args = parser.parse_args(argv)
    _, visits = run_lines_for_people(build_pipeline(), click_lines(generate_clicks(args.users)), args, "sessions",
                                     what="clicks")
    users = {visit["user"] for visit in visits}
    print(f"{len(visits):,} sessions of {len(users):,} users; "
          f"{sum(visit['clicks'] for visit in visits):,} clicks in them")
    longest = max(visits, key=lambda visit: (visit["window_end"] - visit["window_start"], visit["user"]))
    print(f"longest: {longest['user']}, {longest['window_end'] - longest['window_start']:.0f} s,"
          f" {longest['clicks']} clicks on {longest['pages']} pages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
