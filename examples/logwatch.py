"""LogWatch: the paper's chain over Linux login audits, flagging logins preceded by many failures.

    ./dev example                       # the real Loghub sample, embedded Spark, planner's plan
    ./dev example --lines 200000        # a larger input from the generator (same line formats)
    ./dev example --batch-kb 64         # smaller micro-batches (more of them, each slower per line)
    ./dev example --plan sequential --master spark://127.0.0.1:7077

Chain (the paper's Fig. 17; the file source plays RawLines):
  lines -> parsed -> raw_events -> events -> range (per remote host) -> cutoff -> realtime
        -> breakins (per user) -> results
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fissure  # noqa: E402
from fissure import Pipeline  # noqa: E402
from example_support import example_parser, print_run_summary, run_directory, run_for_people  # noqa: E402
from generators.loglines import generate, real_lines, split_into_files  # noqa: E402

MONTHS = {name: number for number, name in enumerate(
    ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"])}
SYSLOG = re.compile(r"^(?P<month>\w{3}) +(?P<day>\d+) (?P<clock>\d\d:\d\d:\d\d) (?P<machine>\S+) "
                    r"(?P<process>[^:\[]+)(?:\[(?P<pid>\d+)\])?:? ?(?P<message>.*)$")
RHOST = re.compile(r"rhost=(\S+)")
USER = re.compile(r"\buser=(\S+)")
OPENED = re.compile(r"session opened for user (\S+)")
KLOGIN = re.compile(r"Authentication failed from (\d+\.\d+\.\d+\.\d+)")
RANGE_S = 600  # failures from one host within this window count together
CUTOFF_FAILURES = 5  # failures from one host within RANGE_S that make it an attacker
BREAKIN_FAILURES = 5  # attack failures for a user before a login that flag a break-in

PARSED = {"ts": int, "process": str, "message": str}
EVENT = {"ts": int, "host": str, "user": str, "kind": str}
RANGED = {**EVENT, "host_failures": int}
TIMED = {**RANGED, "time": str}
BREAKIN = {"user": str, "ts": int, "time": str, "failures": int, "hosts": str}
RESULT = {**BREAKIN, "number": int}


def lines(record):
    return {"value": record["value"].rstrip()}


def parsed(record):
    match = SYSLOG.match(record["value"])
    if match is None or match["month"] not in MONTHS:
        raise ValueError("not a syslog line")
    hours, minutes, seconds = map(int, match["clock"].split(":"))
    ts = (MONTHS[match["month"]] * 31 + int(match["day"]) - 1) * 86400 + hours * 3600 + minutes * 60 + seconds
    return {"ts": ts, "process": match["process"], "message": match["message"]}


def raw_events(record):
    return record["process"].startswith(("sshd", "login", "klogind", "su"))


def events(record):
    """Failures (with the remote host and user when known) and logins; other lines are dropped."""
    message = record["message"]
    if "authentication failure" in message:
        host, user = RHOST.search(message), USER.search(message)
        return [{"ts": record["ts"], "host": host.group(1) if host else "local",
                 "user": user.group(1) if user else "unknown", "kind": "failure"}]
    klogin = KLOGIN.search(message)
    if klogin:
        return [{"ts": record["ts"], "host": klogin.group(1), "user": "unknown", "kind": "failure"}]
    opened = OPENED.search(message)
    if opened and record["process"].startswith(("sshd", "login")):
        return [{"ts": record["ts"], "host": "local", "user": opened.group(1), "kind": "login"}]
    return []


def range_(state, record):
    """Per remote host: how many failures it made in the last RANGE_S seconds."""
    recent = [ts for ts in state.get("failures", []) if record["ts"] - ts <= RANGE_S]
    if record["kind"] == "failure":
        recent.append(record["ts"])
    state["failures"] = recent
    return {**record, "host_failures": len(recent)}


def cutoff(record):
    return record["kind"] == "login" or record["host_failures"] >= CUTOFF_FAILURES


def realtime(record):
    days, rest = divmod(record["ts"], 86400)
    month, day = divmod(days, 31)
    month_name = next(name for name, number in MONTHS.items() if number == month % 12)
    return {**record, "time": f"{month_name} {day + 1:2d} {rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"}


def breakins(state, record):
    """Per user: a login after at least BREAKIN_FAILURES recent attack failures is a break-in."""
    recent = [(ts, host) for ts, host in state.get("failures", []) if record["ts"] - ts <= RANGE_S]
    if record["kind"] == "failure":
        state["failures"] = recent + [(record["ts"], record["host"])]
        return None
    state["failures"] = []
    if len(recent) < BREAKIN_FAILURES:
        return None
    return {"user": record["user"], "ts": record["ts"], "time": record["time"], "failures": len(recent),
            "hosts": ",".join(sorted({host for _, host in recent}))}


def results(state, record):
    state["count"] = state.get("count", 0) + 1
    return {**record, "number": state["count"]}


def build_pipeline() -> Pipeline:
    """LogWatch with the paper's per-tuple costs (microseconds) and selectivities as planner hints."""
    return (Pipeline("logwatch")
            .map("lines", lines, reads=["value"], cost_us=3.87)
            .map("parsed", parsed, schema=PARSED, cost_us=15.15)
            .filter("raw_events", raw_events, cost_us=9.39, selectivity=0.87)
            .flat_map("events", events, schema=EVENT, cost_us=13.81)
            .partitioned("range", range_, key="host", schema=RANGED, order_by="ts", cost_us=9.04, selectivity=0.2)
            .filter("cutoff", cutoff, cost_us=24.82, selectivity=0.99)
            .map("realtime", realtime, schema=TIMED, cost_us=27.04)
            .partitioned("breakins", breakins, key="user", schema=BREAKIN, order_by="ts", cost_us=17.33,
                         selectivity=0.00027)
            .stateful("results", results, schema=RESULT, order_by="ts", cost_us=493.17))


def prepare_input(directory: str, generated_lines: int, files: int) -> str:
    if generated_lines:
        source_lines = list(generate(generated_lines))
    else:
        # The real sample with two fake break-ins injected, as the paper modified its real data.
        source_lines = list(generate(len(real_lines()), breakin_every=700))
    split_into_files(source_lines, directory, files)
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = example_parser(__doc__, files=5)
    parser.add_argument("--input", help="a directory of log files (default: the real Loghub sample "
                                        "with two injected break-ins)")
    parser.add_argument("--lines", type=int, default=0, help="generate this many lines instead")
    parser.add_argument("--batch-kb", type=int, default=None,
                        help="input read per micro-batch, in KiB (default: fissure chooses it from the Spark model: "
                             "the smallest batch whose fixed cost is at most a tenth of it)")
    parser.add_argument("--output", help="write results here as Parquet (default: print them)")
    args = parser.parse_args(argv)

    directory = run_directory("logwatch")
    inputs = args.input or prepare_input(os.path.join(directory, "input"), args.lines, args.files)
    source = fissure.FileSource(inputs, format="text",
                                max_bytes_per_trigger=args.batch_kb * 1024 if args.batch_kb else None)
    sink = fissure.FileSink(args.output) if args.output else fissure.MemorySink()
    pipeline = build_pipeline()
    report = run_for_people(pipeline, source, sink, args, directory)
    print_run_summary(report, pipeline, directory, what="lines")
    if isinstance(sink, fissure.MemorySink):
        found = sorted(sink.records(), key=lambda record: record["number"])
        print(f"break-ins: {len(found)}")
        for record in found:
            print(f"  #{record['number']} {record['time']} user {record['user']} after {record['failures']} "
                  f"failures from {record['hosts']}")
    else:
        print(f"results written to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
