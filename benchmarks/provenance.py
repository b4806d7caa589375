"""Where a benchmark's figures come from: the revision (and whether the tree had uncommitted
changes), the machine, the date and the load, written the same way by every script that uses it.
No fissure import here: a script may run it before choosing which checkout of fissure to load."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path


def revision(tree: Path, ref: str = "HEAD") -> str:
    """`abc1234`, or `abc1234 (dirty)` when tracked files differ from the commit."""
    head = subprocess.run(["git", "rev-parse", "--short", ref], cwd=tree, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=tree,
                           capture_output=True, text=True).stdout.strip()
    return head + (" (dirty)" if dirty else "")


def machine(master: str = "local[2]") -> str:
    return f"{platform.node()} {platform.machine()} ({os.cpu_count()} cores), Spark {master}"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def load() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def load_note(before: list[float]) -> str:
    """What the report says of the load before the run: a busy machine's figures are not results."""
    return " (busy machine: not a result to quote)" if before[0] > (os.cpu_count() or 1) else ""
