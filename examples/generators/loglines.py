"""Linux syslog lines in the formats of the real Loghub sample (examples/data/loghub-linux), at any size.

The real 2,000 lines are the templates, cycled as the paper's LogWatch input cycles its 12-hour
log: each cycle shifts (by the real log's span) the timestamps, renumbers process ids and varies the attacking hosts and
user names of `authentication failure` lines; every `breakin_every` lines a fake break-in is
injected: a burst of failures for one user from one host, then a session opened for that user.

    python examples/generators/loglines.py OUT_DIR --lines 200000 --files 20
"""

from __future__ import annotations

import argparse
import os
import random
import re
from collections.abc import Iterator
from pathlib import Path

REAL_LOG = Path(__file__).resolve().parents[1] / "data" / "loghub-linux" / "Linux_2k.log"  # shipped with the examples
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
HEADER = re.compile(r"^(?P<month>\w{3}) +(?P<day>\d+) (?P<clock>\d\d:\d\d:\d\d) (?P<rest>.*)$")
PID = re.compile(r"\[(\d+)\]")
RHOST = re.compile(r"rhost=(\S+)")
USER = re.compile(r"user=(\S+)")


def real_lines(path: Path = REAL_LOG) -> list[str]:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return [line.rstrip("\n") for line in handle if line.strip()]


def _timestamp_s(line: str) -> int | None:
    match = HEADER.match(line)
    if not match or match["month"] not in MONTHS:
        return None
    hours, minutes, seconds = map(int, match["clock"].split(":"))
    return ((MONTHS.index(match["month"]) * 31 + int(match["day"]) - 1) * 86400 + hours * 3600 + minutes * 60 + seconds)


def _format_time(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    month, day = divmod(days, 31)
    return f"{MONTHS[month % 12]} {day + 1:2d} {rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"


def _retime(line: str, seconds: int) -> str:
    match = HEADER.match(line)
    return f"{_format_time(seconds)} {match['rest']}" if match else line


def breakin(seconds: int, rng: random.Random, failures: int = 10) -> list[str]:
    host = f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}"
    user = rng.choice(["test", "guest", "admin", "oracle", "webmaster"])
    pid = rng.randrange(1000, 30000)
    lines = [f"{_format_time(seconds + i)} combo sshd(pam_unix)[{pid + i}]: authentication failure; logname= uid=0 "
             f"euid=0 tty=NODEVssh ruser= rhost={host}  user={user}" for i in range(failures)]
    lines.append(f"{_format_time(seconds + failures + 1)} combo sshd(pam_unix)[{pid + failures}]: "
                 f"session opened for user {user} by (uid=0)")
    return lines


def generate(lines: int, seed: int = 7, breakin_every: int = 5000, templates: list[str] | None = None) -> Iterator[str]:
    """`lines` syslog lines (plus injected break-ins) in the real log's formats."""
    rng = random.Random(seed)
    templates = templates or real_lines()
    stamps = [ts for ts in map(_timestamp_s, templates) if ts is not None]
    first = last_time = stamps[0]
    cycle_s = max(stamps) - first + 3600
    produced = 0
    cycle = 0
    while produced < lines:
        for line in templates:
            if produced >= lines:
                return
            stamp = _timestamp_s(line)
            if stamp is not None:
                last_time = stamp + cycle * cycle_s
                line = _retime(line, last_time)
            if cycle:
                line = PID.sub(lambda m: f"[{int(m.group(1)) + rng.randrange(1, 500)}]", line)
                if "authentication failure" in line and RHOST.search(line):
                    if rng.random() < 0.3:
                        line = RHOST.sub(f"rhost=61.{cycle % 200}.{rng.randrange(256)}.{rng.randrange(1, 255)}", line)
            yield line
            produced += 1
            if breakin_every and produced % breakin_every == 0:
                for extra in breakin(last_time + 1, rng):
                    yield extra
        cycle += 1


def write_files(directory: str | os.PathLike, lines: int, files: int = 10, seed: int = 7,
                breakin_every: int = 5000) -> list[str]:
    """Write the generated lines into `files` text files (name order = time order); returns their paths."""
    os.makedirs(directory, exist_ok=True)
    all_lines = list(generate(lines, seed, breakin_every))
    return split_into_files(all_lines, directory, files)


def split_into_files(lines: list[str], directory: str | os.PathLike, files: int) -> list[str]:
    """Lines spread over `files` files, oldest first by name and modification time."""
    os.makedirs(directory, exist_ok=True)
    per_file = max(1, -(-len(lines) // max(1, files)))
    paths = []
    for number, start in enumerate(range(0, len(lines), per_file)):
        path = os.path.join(directory, f"log-{number:05d}.txt")
        hidden = os.path.join(directory, f".log-{number:05d}.tmp")
        with open(hidden, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines[start:start + per_file]) + "\n")
        os.utime(hidden, (1_700_000_000 + number, 1_700_000_000 + number))
        os.replace(hidden, path)
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory")
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--breakin-every", type=int, default=5000)
    args = parser.parse_args()
    paths = write_files(args.directory, args.lines, args.files, args.seed, args.breakin_every)
    print(f"wrote {len(paths)} files to {args.directory}")


if __name__ == "__main__":
    main()
