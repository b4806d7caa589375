"""A record's fate on the worker's hot path, below every operator runner: a record an operator
could not process (`DeadLetter`, with the error described and the record as text), and what an
operator that emits records returned, as a list (`normalize_emitted`, `flat_map_emitted`). No pyspark, no pyarrow."""

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


_NOT_RECORDS = (str, bytes, bytearray, memoryview)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def normalize_emitted(emitted: object) -> list:
    """What a stateful update (or a join) returned, as a list of records: an iterable of records,
    one record (a dict), or None. A string, bytes or a non-iterable raises TypeError: iterating
    over it would make one bad record per character."""
    if emitted is None:
        return []
    if isinstance(emitted, Mapping):
        return [emitted]
    if isinstance(emitted, _NOT_RECORDS) or not hasattr(emitted, "__iter__"):
        raise TypeError(f"the function must return a record (a dict), an iterable of records or None, "
                        f"got {type(emitted).__name__} {_shown(emitted)}")
    return list(emitted)


def flat_map_emitted(emitted: object) -> list:
    """What a flat_map returned, as a list of records: an iterable of records, or None for none.
    A dict, a string, bytes or a non-iterable raises TypeError (the input record becomes one
    dead letter): iterating over it would emit its keys or characters as records."""
    if type(emitted) is list:
        return emitted
    if emitted is None:
        return []
    if isinstance(emitted, (Mapping, *_NOT_RECORDS)) or not hasattr(emitted, "__iter__"):
        hint = "; for one record return [record]" if isinstance(emitted, Mapping) else ""
        raise TypeError(f"a flat_map must return an iterable of records (dicts) or None, "
                        f"got {type(emitted).__name__} {_shown(emitted)}{hint}")
    return list(emitted)
