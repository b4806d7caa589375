"""Whether a checkpoint's offset and commit logs are whole (pure; the listing is
fissure.spark.checkpoint.guard's).

Spark writes batch N's offsets (`offsets/N`) before it runs N and `commits/N` after; it deletes
both logs' oldest entries together (it keeps the last 100), so the entries left are a run of
consecutive batch ids. A file missing inside that run, or a committed batch without its offsets
entry, means a file was deleted or lost. Spark then stops with a message that points elsewhere:
measured on 4.3, a deleted newest offsets file gives `CONCURRENT_STREAM_LOG_UPDATE ... Multiple
streaming jobs detected`, a deleted middle one `batch N doesn't exist`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LogFinding:
    """Offsets-log files that should be there and are not."""

    missing: tuple[str, ...]  # paths under the checkpoint, e.g. "offsets/5"
    reason: str


def _ids(batches: Sequence[int]) -> str:
    return ", ".join(str(batch) for batch in batches)


def missing_log_files(offsets: Sequence[int], commits: Sequence[int]) -> LogFinding | None:
    """The offsets-log files missing from a checkpoint whose logs hold these batch ids (None: whole)."""
    offsets, commits = sorted(set(offsets)), sorted(set(commits))
    if not offsets and not commits:
        return None
    present = set(offsets)
    first = offsets[0] if offsets else min(commits)
    inside = [batch for batch in range(first, offsets[-1] + 1) if batch not in present] if offsets else []
    committed = [batch for batch in commits if batch >= first and batch not in present and batch not in inside]
    if not inside and not committed:
        return None
    parts = []
    if inside:
        parts.append(f"the offsets log has no entry for batch {_ids(inside)} between batches {first} and {offsets[-1]}")
    if committed:
        parts.append(f"the commit log records batch {_ids(committed)} as committed but the offsets log has no entry "
                     f"for {'it' if len(committed) == 1 else 'them'}")
    missing = tuple(f"offsets/{batch}" for batch in sorted(inside + committed))
    return LogFinding(missing, "; ".join(parts))
