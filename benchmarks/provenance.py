"""Where a benchmark's figures come from: the revision (and whether the tree had uncommitted
changes), the machine, the date and the load; benchmarks/method.py writes them into every results
file.
No fissure import here: a script may run it before choosing which checkout of fissure to load."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path


def revision(tree: Path, ref: str = "HEAD") -> str:
    """`abc1234`, or `abc1234 (dirty)` when tracked files differ from the commit. Results files
    do not count: a benchmark run after another in one session finds the first one's results
    written, and measures the same code."""
    head = subprocess.run(["git", "rev-parse", "--short", ref], cwd=tree, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                            ":(exclude)benchmarks/results"], cwd=tree, capture_output=True, text=True).stdout.strip()
    return head + (" (dirty)" if dirty else "")


def machine(master: str | None = "local[2]") -> str:
    """The host, its architecture and cores, and the Spark master (None: the script runs no Spark)."""
    return f"{platform.node()} {platform.machine()} ({os.cpu_count()} cores)" + (f", Spark {master}" if master else "")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def load() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


