"""The profile log: one JSON line per micro-batch, written while a run goes on, read by `fissure profile`.

Where: `<checkpoint>/fissure/profile.jsonl` when the run has a checkpoint of its own (Spark
ignores folders it does not know in a checkpoint), or the path the runner is given. A replayed
batch (after a restart) appends a newer line for the same batch id; readers keep the newest.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from fissure.profile.window import BatchProfile

log = logging.getLogger(__name__)

LOG_FOLDER = "fissure"
LOG_NAME = "profile.jsonl"


def profile_log_path(checkpoint: str | os.PathLike) -> Path:
    """Where a run with this checkpoint writes its profile log."""
    return Path(checkpoint) / LOG_FOLDER / LOG_NAME


def resolve_profile_log(path: str | os.PathLike) -> Path:
    """A profile log from a path that names it, or names the run's checkpoint directory."""
    candidate = Path(path)
    if candidate.is_dir():
        inside = profile_log_path(candidate)
        if inside.exists():
            return inside
        raise FileNotFoundError(f"{candidate} is a directory without a profile log ({LOG_FOLDER}/{LOG_NAME}); "
                                f"pass the checkpoint directory of a fissure run, or the log file itself")
    if not candidate.exists():
        raise FileNotFoundError(f"no profile log at {candidate}; a run writes one under its checkpoint "
                                f"({LOG_FOLDER}/{LOG_NAME}) when it is given --checkpoint")
    return candidate


class ProfileLogWriter:
    """Appends batch profiles as JSON lines; safe to call from several threads."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def append(self, batch: BatchProfile) -> None:
        line = json.dumps(batch.to_dict(), separators=(",", ":")) + "\n"
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as handle:
                    handle.write(line)
            except OSError as error:  # a full disk must not stop the stream
                log.warning("profile log %s: cannot write batch %d: %s", self.path, batch.batch_id, error)


def read_profile_log(path: str | os.PathLike) -> list[BatchProfile]:
    """Every batch profile in the log, in file order; a half-written last line (a run writing
    right now) and lines that do not parse are skipped with a log line."""
    batches = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                batches.append(BatchProfile.from_dict(json.loads(line)))
            except (ValueError, KeyError, TypeError) as error:
                log.info("profile log %s line %d skipped: %s", path, number, error)
    return batches
