"""A record's fate on the worker's hot path, below every operator runner: a record an operator
could not process (`DeadLetter`, with the error described and the record as text), and what an
operator that emits records returned, as a list (`normalize_emitted`, `flat_map_emitted`). No pyspark, no pyarrow."""

from __future__ import annotations

import json
import os
import sysconfig
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass

import fissure
from fissure.lifecycle.failures import RESOURCE_ERRNOS
# A record rejected by fissure's own rules is the program model's verdict (no event time, ...).
from fissure.program.operators import RecordRejected, shown_value  # noqa: F401 - worker code takes them from here

MAX_DEAD_RECORD_CHARS = 10_000


@dataclass(frozen=True)
class DeadLetter:
    """A record an operator could not process."""

    operator: str
    error: str
    record: str  # the record as JSON (values JSON cannot hold shown by repr)
    seq: int


# Where code that is not the user's lives: the standard library, installed packages, fissure itself.
_NOT_USER_DIRS = tuple(os.path.normcase(os.path.realpath(path)) + os.sep for path in dict.fromkeys(
    sysconfig.get_paths()[name] for name in ("stdlib", "platstdlib", "purelib", "platlib")))
_FISSURE_DIR = os.path.normcase(os.path.realpath(os.path.dirname(os.path.abspath(fissure.__file__)))) + os.sep
_PACKAGE_DIR_NAMES = ("site-packages", "dist-packages")


def is_user_frame(filename: str) -> bool:
    """Whether a traceback frame's file is the user's code: not the standard library, not an
    installed package (site-packages), not fissure itself, not a frozen or generated module."""
    if not filename or filename.startswith("<"):
        return False
    path = os.path.normcase(os.path.realpath(filename))
    if path.startswith(_FISSURE_DIR) or path.startswith(_NOT_USER_DIRS):
        return False
    return not any(part in _PACKAGE_DIR_NAMES for part in path.split(os.sep))


def describe_error(error: BaseException) -> str:
    """`Type: message` and the user's line: the innermost frame of the user's code (not the
    standard library, installed packages or fissure), so that an operator calling json.loads is
    pointed at its own call, not at json/decoder.py; where the error was raised deeper, that frame
    follows as `raised in`. Without a user frame, the innermost frame. A RecordRejected is its
    message alone."""
    if isinstance(error, RecordRejected):
        return str(error)
    frames = traceback.extract_tb(error.__traceback__)
    text = f"{type(error).__name__}: {error}"
    if not frames:
        return text
    innermost = frames[-1]
    user = next((frame for frame in reversed(frames) if is_user_frame(frame.filename)), None)
    if user is None or user is innermost:
        return f"{text} (at {innermost.filename}:{innermost.lineno} in {innermost.name})"
    return (f"{text} (at {user.filename}:{user.lineno} in {user.name}; raised in "
            f"{os.path.basename(innermost.filename)}:{innermost.lineno} in {innermost.name})")


class ResourceExhausted(RuntimeError):
    """An operator ran out of memory or of another resource of the machine (MemoryError; an
    OSError of ENOMEM, ENOSPC, EDQUOT, EMFILE, ENFILE or ENOBUFS) while processing a record: no
    record's fault, so never its dead letter. The task fails and `fissure.run` starts the query
    again on its checkpoint (fissure.lifecycle.failures reads this message back: keep its form)."""


def is_resource_error(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from, is the machine running out of a resource."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, MemoryError) or isinstance(error, OSError) and error.errno in RESOURCE_ERRNOS:
            return True
        seen.add(id(error))
        error = error.__cause__
    return False


def record_failed(operator: str, error: BaseException, record: object, seq: int) -> DeadLetter:
    """The dead letter of a record `operator` raised `error` on; raises ResourceExhausted, naming
    the operator, the error and the record, when the error is the machine's (`is_resource_error`)."""
    if is_resource_error(error):
        raise ResourceExhausted(f"operator {operator!r} ran out of resources ({_one_line(describe_error(error))}) on "
                                f"record {_one_line(record_text(record))}; not the record's fault: the task fails and the query starts again "
                                f"on its checkpoint") from error
    return DeadLetter(operator, describe_error(error), record_text(record), seq)


def _one_line(text: str) -> str:
    return text.replace("\n", "\\n").replace("\r", "\\r")


class OperatorFailedError(RuntimeError):
    """An operator failed in a way that is no record's fault and ends the run, named in the message:
    it raised SystemExit or KeyboardInterrupt (an operator may not end its worker process), its
    state_factory raised, or its state holds what its state codec cannot store
    (fissure.runtime.state.codec)."""


def operator_stopped(operator: str, error: BaseException) -> OperatorFailedError:
    return OperatorFailedError(f"operator {operator!r} raised {describe_error(error)}; an operator may not end its"
                               f" worker process (raise an Exception to make the record a dead letter)")


# The directory where each Python worker process notes the operator it runs (`beat`), for the
# driver's watchdog (fissure.spark.session.create sets it before Spark's JVM starts its workers).
HEARTBEAT_DIR_VARIABLE = "FISSURE_HEARTBEAT_DIR"


def mark_running(operator: str) -> None:
    """Note which operator starts running in this worker process: in the fault-handler log Spark
    reads when the process dies (`spark.python.worker.faulthandler.enabled`), so that a crash names
    the operator that was running, and in the process's heartbeat file (`beat`), so that the
    driver's watchdog names the operator a stuck batch is in. Once per operator and Arrow batch."""
    beat(operator)
    directory = os.environ.get("PYTHON_FAULTHANDLER_DIR")
    if not directory:
        return
    path = os.path.join(directory, str(os.getpid()))
    if not os.path.exists(path):  # only the log Spark opened for this process (removed after the task)
        return
    try:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"fissure: operator {operator!r} was running\n")
    except OSError:
        pass


def mark_idle() -> None:
    """Note that this worker process runs no operator any more (its heartbeat file)."""
    beat(None)


# A heartbeat is written in place, padded with spaces (which JSON allows after the value) to this
# many bytes, so that a shorter note needs no truncation of the file.
HEARTBEAT_BYTES = 256
_heartbeat_file: dict = {}  # "key": (pid, path), "fd", "size": this process's open heartbeat file


def beat(operator: str | None) -> None:
    """Write `{"operator": ..., "since": wall-clock seconds}` to `<heartbeat dir>/<pid>`: one small
    write per operator and Arrow batch (a 10,000-record batch by default), nothing without the
    directory (a session fissure did not create, a cluster's executors).

    The file stays open in the process and each note is one `pwrite` over the last: opening,
    truncating and closing it for each note cost 150 us of CPU a note here, and LogWatch's workers
    write about 300 notes a micro-batch. A process forked from a worker (a PE's pipeline) opens its
    own file, named by its own pid. A reader may catch a note mid-write and skip it
    (fissure.lifecycle.watchdog.read_heartbeat), as before."""
    directory = os.environ.get(HEARTBEAT_DIR_VARIABLE)
    if not directory:
        return
    data = json.dumps({"operator": operator, "since": time.time()}).encode()
    try:
        key = (os.getpid(), os.path.join(directory, str(os.getpid())))
        if _heartbeat_file.get("key") != key:
            _close_heartbeat()
            _heartbeat_file.update(key=key, fd=os.open(key[1], os.O_WRONLY | os.O_CREAT, 0o644), size=0)
        fd = _heartbeat_file["fd"]
        written = os.pwrite(fd, data.ljust(HEARTBEAT_BYTES), 0)
        if written < _heartbeat_file["size"]:  # a longer note before (an operator's long name): cut its tail
            os.ftruncate(fd, written)
        _heartbeat_file["size"] = written
    except OSError:
        _close_heartbeat()


def _close_heartbeat() -> None:
    fd = _heartbeat_file.pop("fd", None)
    _heartbeat_file.clear()
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def record_text(record: object) -> str:
    try:
        text = json.dumps(record, default=repr, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(record)
    return text[:MAX_DEAD_RECORD_CHARS]


_NOT_RECORDS = (str, bytes, bytearray, memoryview)


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
                        f"got {type(emitted).__name__} {shown_value(emitted)}")
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
                        f"got {type(emitted).__name__} {shown_value(emitted)}{hint}")
    return list(emitted)
