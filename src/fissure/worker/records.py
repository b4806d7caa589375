"""A record's fate on the worker's hot path, below every operator runner: a record an operator
could not process (`DeadLetter`, with the error described and the record as text), and what an
operator that emits records returned, as a list (`normalize_emitted`). No pyspark, no pyarrow."""

from __future__ import annotations

import json
import traceback
from collections.abc import Mapping
from dataclasses import dataclass

MAX_DEAD_RECORD_CHARS = 10_000


@dataclass(frozen=True)
class DeadLetter:
    """A record an operator could not process."""

    operator: str
    error: str
    record: str  # the record as JSON (values JSON cannot hold shown by repr)
    seq: int


def describe_error(error: BaseException) -> str:
    """`Type: message` and the innermost frame, enough to find the failing line."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


def record_text(record: object) -> str:
    try:
        text = json.dumps(record, default=repr, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(record)
    return text[:MAX_DEAD_RECORD_CHARS]


def normalize_emitted(emitted: object) -> list:
    """What a flat_map or a stateful update returned, as a list of records."""
    if emitted is None:
        return []
    if isinstance(emitted, Mapping):
        return [emitted]
    return list(emitted)
