"""How operator state is stored: plain data in MessagePack by default, pickle only when asked for
and then authenticated (no pyspark here).

Whoever can write a checkpoint must not be able to run code in the job, so the default codec
reads and writes data, never objects: MessagePack (msgpack) with extension types for what it lacks,
and every type restored exactly (a tuple stays a tuple, a set a set, an int key an int key):

    dict (any keys below that are hashable), list, tuple, set, frozenset, str (lone surrogates
    too), bytes, int (any size), float (NaN, inf, -0.0), bool, None, datetime, date, time
    (naive, or aware with a fixed-offset `datetime.timezone`, a `zoneinfo.ZoneInfo` or a pytz zone,
    read back as the zoneinfo zone of its name),
    timedelta, Decimal.

A state holding anything else (an instance of a class of the program) fails at its first write,
with the operator, the type, where it sits in the state and the two fixes. An operator may opt in
to pickle (`state_codec="pickle"`); its stored values are then signed with HMAC-SHA256 under a key
that never lives in the checkpoint (`RunnerConfig.state_key` or FISSURE_STATE_KEY), and a value
whose signature does not match is refused before it is unpickled.

Every value fissure stores in Spark's state store starts with a header, `HEADER_MAGIC`, the codec
and the format version, so a value written by an earlier fissure (a bare pickle, which starts with
0x80) is recognised and refused (`LegacyStateError`) unless the run was started with the explicit
migration setting (`StateAccess.trust_legacy_pickle`, docs/pipeline-api.md).

Cost against pickle (protocol 5), encode + decode, measured in process on a shared 2-core
machine (best of 7 loops; benchmarks/state_codec.py measures it): a word count's {"n": int} and a
dict holding a list of floats about as fast as pickle; a list of 20 (float, str) tuples about 12 us
against pickle's 4 us (a tuple is an array led by a mark that `_list_hook` turns back into a
tuple, two Python calls per tuple); a bucket entry of 1,000 keys about 1.5x. Text is packed as
strict UTF-8 first (a packer with an error handler was 3x slower on a 1,000-key entry), and again
with "surrogatepass" only when it holds a lone surrogate.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import hmac
import pickle
from dataclasses import dataclass
from typing import Any

import msgpack

HEADER_MAGIC = 0xF5  # no pickle starts with it (protocols 2-5 start with 0x80, 0 and 1 with an opcode)
DATA, PICKLE = 1, 2  # codec ids in the header
FORMAT_VERSION = 1
DATA_HEADER = bytes((HEADER_MAGIC, DATA, FORMAT_VERSION))
PICKLE_HEADER = bytes((HEADER_MAGIC, PICKLE, FORMAT_VERSION))
MAC_SIZE = hashlib.sha256().digest_size
STATE_KEY_VARIABLE = "FISSURE_STATE_KEY"
MIGRATION_HINT = ("this checkpoint's state was written by an earlier fissure as pickles, which can run code when "
                  "read: if you trust whoever could write the checkpoint, migrate it once by running the program "
                  "with RunnerConfig(state_migration=\"trust-pickle\") (fissure run --migrate-pickled-state), "
                  "which rewrites the state it reads as data; otherwise start on a new checkpoint")

# extension type codes
_TUPLE, _SET, _FROZENSET, _BIG_INT, _DATETIME, _DATE, _TIME, _TIMEDELTA, _DECIMAL = range(1, 10)
_NO_TZ, _FIXED_TZ, _ZONE_TZ = 0, 1, 2


class StateCodecError(TypeError):
    """A state holds a value the codec cannot store (the message names it and where it sits)."""


class StateIntegrityError(ValueError):
    """A stored state value is not one fissure wrote: bad header, bad signature or bad encoding."""


class LegacyStateError(StateIntegrityError):
    """A stored value written by an earlier fissure (a bare pickle): refused unless migrating."""


class _Unsupported(Exception):
    def __init__(self, value: Any) -> None:
        super().__init__(type(value).__qualname__)
        self.value = value


def _tz_of(value) -> Any:
    tz = value.tzinfo
    if tz is None:
        return _NO_TZ
    if type(tz) is datetime.timezone:
        offset, *name = tz.__getinitargs__()
        return [_FIXED_TZ, _timedelta_fields(offset), name[0] if name else None]
    zone_key = getattr(tz, "key", None)
    if type(tz).__module__ == "zoneinfo" and isinstance(zone_key, str):
        return [_ZONE_TZ, zone_key]
    # pytz's zones (pyarrow gives a time-zoned timestamp's values pytz's UTC when pandas brought
    # pytz along): stored by name, read back as the zoneinfo zone of that name (equal datetimes).
    pytz_name = getattr(tz, "zone", None)
    if type(tz).__module__.split(".")[0] == "pytz" and isinstance(pytz_name, str):
        return [_ZONE_TZ, pytz_name]
    raise _Unsupported(tz)


def _tz_from(encoded) -> datetime.tzinfo | None:
    if encoded == _NO_TZ:
        return None
    if encoded[0] == _FIXED_TZ:
        offset = datetime.timedelta(*encoded[1])
        return datetime.timezone(offset) if encoded[2] is None else datetime.timezone(offset, encoded[2])
    if encoded[0] == _ZONE_TZ:
        import zoneinfo

        return zoneinfo.ZoneInfo(encoded[1])
    raise StateIntegrityError(f"unknown time zone form {encoded[0]!r}")


def _timedelta_fields(value: datetime.timedelta) -> list[int]:
    return [value.days, value.seconds, value.microseconds]


class _Packers:
    """One Packer per nesting depth: an extension type's payload is packed while its container is
    still being packed, and a Packer is not re-entrant. `unicode_errors`: None (strict UTF-8, about
    3x faster to pack than with an error handler, measured on a 1,000-key entry) or
    "surrogatepass" (for text holding lone surrogates)."""

    def __init__(self, unicode_errors: str | None = None) -> None:
        self._packers: list[msgpack.Packer] = []
        self._depth = 0
        self._unicode_errors = unicode_errors

    def pack(self, value: Any) -> bytes:
        depth = self._depth
        if depth == len(self._packers):
            self._packers.append(msgpack.Packer(default=self._default, strict_types=True,
                                                unicode_errors=self._unicode_errors, autoreset=True))
        self._depth = depth + 1
        try:
            return self._packers[depth].pack(value)
        finally:
            self._depth = depth

    def _default(self, value: Any) -> msgpack.ExtType:
        kind = type(value)
        if kind is tuple:  # an array led by a mark: packed in place, no nested packing
            return [_TUPLE_EXT, *value]
        if kind is set:
            return [_SET_EXT, *value]
        if kind is frozenset:
            return [_FROZENSET_EXT, *value]
        if kind is int:  # beyond 64 bits
            return msgpack.ExtType(_BIG_INT, value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True))
        if kind is datetime.datetime:
            return msgpack.ExtType(_DATETIME, self.pack(
                [value.year, value.month, value.day, value.hour, value.minute, value.second, value.microsecond,
                 value.fold, _tz_of(value)]))
        if kind is datetime.date:
            return msgpack.ExtType(_DATE, self.pack(value.toordinal()))
        if kind is datetime.time:
            return msgpack.ExtType(_TIME, self.pack(
                [value.hour, value.minute, value.second, value.microsecond, value.fold, _tz_of(value)]))
        if kind is datetime.timedelta:
            return msgpack.ExtType(_TIMEDELTA, self.pack(_timedelta_fields(value)))
        if kind is decimal.Decimal:
            return msgpack.ExtType(_DECIMAL, str(value).encode("ascii"))
        raise _Unsupported(value)


_PACKERS, _SURROGATE_PACKERS = _Packers(), _Packers("surrogatepass")


class _Mark:
    """What a tuple's, set's or frozenset's leading mark decodes to, until its array is made one."""

    __slots__ = ("make",)

    def __init__(self, make) -> None:
        self.make = make


_TUPLE_EXT, _SET_EXT, _FROZENSET_EXT = (msgpack.ExtType(code, b"") for code in (_TUPLE, _SET, _FROZENSET))
_MARKS = {_TUPLE: _Mark(tuple), _SET: _Mark(set), _FROZENSET: _Mark(frozenset)}


def _list_hook(items: list) -> Any:
    if items and type(items[0]) is _Mark:
        return items[0].make(items[1:])
    return items


def _ext_hook(code: int, data: bytes) -> Any:
    if code in _MARKS and not data:
        return _MARKS[code]
    if code == _BIG_INT:
        return int.from_bytes(data, "little", signed=True)
    if code == _DATETIME:
        *fields, fold, tz = decode_data(data)
        return datetime.datetime(*fields, tzinfo=_tz_from(tz), fold=fold)
    if code == _DATE:
        return datetime.date.fromordinal(decode_data(data))
    if code == _TIME:
        *fields, fold, tz = decode_data(data)
        return datetime.time(*fields, tzinfo=_tz_from(tz), fold=fold)
    if code == _TIMEDELTA:
        return datetime.timedelta(*decode_data(data))
    if code == _DECIMAL:
        return decimal.Decimal(data.decode("ascii"))
    raise StateIntegrityError(f"unknown extension type {code}")


def encode_data(value: Any) -> bytes:
    """`value` as MessagePack (no header); StateCodecError when it holds a type the codec lacks."""
    try:
        try:
            return _PACKERS.pack(value)
        except UnicodeEncodeError:  # a lone surrogate (a key text can hold one): the slower packer
            return _SURROGATE_PACKERS.pack(value)
    except _Unsupported as unsupported:
        where = _path_of(value, unsupported.value)
        raise StateCodecError(f"{type(unsupported.value).__module__}.{type(unsupported.value).__qualname__}"
                              f"{f' at {where}' if where else ''}") from None


def decode_data(data: bytes) -> Any:
    """The value `encode_data` made; StateIntegrityError for bytes it did not make."""
    try:
        try:
            return msgpack.unpackb(data, ext_hook=_ext_hook, list_hook=_list_hook, strict_map_key=False,
                                   use_list=True, raw=False)
        except UnicodeDecodeError:  # text with a lone surrogate (written with "surrogatepass")
            return msgpack.unpackb(data, ext_hook=_ext_hook, list_hook=_list_hook, strict_map_key=False,
                                   unicode_errors="surrogatepass", use_list=True, raw=False)
    except StateIntegrityError:
        raise
    except Exception as error:  # noqa: BLE001 - any malformed input
        raise StateIntegrityError(f"not a state fissure wrote ({type(error).__name__}: {error})") from None


def _path_of(root: Any, target: Any, path: str = "state") -> str | None:
    """Where `target` sits in `root` (`state['a'][3]`), for the error message; None: not found."""
    if root is target:
        return path
    if type(root) is dict:
        for key, item in root.items():
            if key is target:
                return f"{path} (a key)"
            found = _path_of(item, target, f"{path}[{key!r}]")
            if found:
                return found
    elif type(root) in (list, tuple):
        for index, item in enumerate(root):
            found = _path_of(item, target, f"{path}[{index}]")
            if found:
                return found
    elif type(root) in (set, frozenset):
        for item in root:
            if item is target:
                return f"an element of {path}"
    elif type(root) in (datetime.datetime, datetime.time) and root.tzinfo is target:
        return f"{path}.tzinfo"
    return None


@dataclass(frozen=True)
class StateAccess:
    """What a run's workers may do with stored state: the key pickled state is signed with (None:
    no operator may use pickle), and whether a value an earlier fissure pickled may be read once,
    during an explicit migration."""

    key: bytes | None = None
    trust_legacy_pickle: bool = False

    def __repr__(self) -> str:  # never print the key
        return f"StateAccess(key={'set' if self.key else None}, trust_legacy_pickle={self.trust_legacy_pickle})"


def state_key_from(value: str | bytes | None) -> bytes | None:
    """A key setting as bytes (a str is taken as UTF-8 text); None or empty: no key."""
    if value is None or value == "" or value == b"":
        return None
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


@dataclass(frozen=True)
class StateCodec:
    """One operator's codec: how its state objects become bytes (`dumps`/`loads`, no header) and
    how what fissure stores is framed (`seal`/`unseal`: the header, and the signature under
    pickle). Containers fissure builds around states (a bucket's keys) are always data."""

    operator: str
    use_pickle: bool = False
    key: bytes | None = None
    trust_legacy_pickle: bool = False

    def __post_init__(self) -> None:
        if self.use_pickle and not self.key:
            raise ValueError(missing_key_message(self.operator))

    def __repr__(self) -> str:
        return f"StateCodec({self.operator!r}, pickle={self.use_pickle})"

    def dumps(self, state: Any, where: str) -> bytes:
        if self.use_pickle:
            try:
                return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as error:
                raise StateCodecError(f"operator {self.operator!r}: the state{' ' + where if where else ''} cannot be pickled "
                                      f"({type(error).__name__}: {error}); keep values pickle can store") from error
        try:
            return encode_data(state)
        except StateCodecError as error:
            raise StateCodecError(unsupported_state_message(self.operator, where, str(error))) from None

    def loads(self, body: bytes, pickled: bool) -> Any:
        """A state from its body; `pickled` as `unseal` (or `unseal_legacy`) said, never the caller's guess."""
        return pickle.loads(body) if pickled else decode_data(body)

    def seal(self, body: bytes) -> bytes:
        """`body` as stored: the header, then (pickle) its HMAC-SHA256, then the body."""
        if not self.use_pickle:
            return DATA_HEADER + body
        return PICKLE_HEADER + hmac.new(self.key, PICKLE_HEADER + body, hashlib.sha256).digest() + body

    def unseal(self, stored: bytes) -> tuple[bytes, bool]:
        """(body, pickled) of a stored value, after checking its header, and its signature when it is
        pickled: `pickled` is True only for a body signed with this run's key."""
        header = stored[:3]
        if header == DATA_HEADER:
            return stored[3:], False  # data: safe to read under either codec
        if header == PICKLE_HEADER:
            if not self.use_pickle:
                raise StateIntegrityError(
                    f"operator {self.operator!r}: its stored state is pickled, and the operator does not declare "
                    f"state_codec=\"pickle\"; refused without unpickling it (declare it again, with the same "
                    f"state key, or start on a new checkpoint)")
            mac, body = stored[3:3 + MAC_SIZE], stored[3 + MAC_SIZE:]
            expected = hmac.new(self.key, PICKLE_HEADER + body, hashlib.sha256).digest()
            if not hmac.compare_digest(mac, expected):
                raise StateIntegrityError(
                    f"operator {self.operator!r}: a stored pickled state's signature does not match the state key, "
                    f"so this program did not write it with this key (another key, or a changed checkpoint); "
                    f"refused without unpickling it")
            return body, True
        if stored[:1] == bytes((HEADER_MAGIC,)):
            raise StateIntegrityError(f"operator {self.operator!r}: a stored state has format {stored[1:3].hex()}, "
                                      f"which this fissure does not know (written by a newer fissure?)")
        raise LegacyStateError(f"operator {self.operator!r}: {MIGRATION_HINT}")

    @staticmethod
    def is_legacy(stored: bytes) -> bool:
        """Written by an earlier fissure: a bare pickle, without the header."""
        return stored[:1] != bytes((HEADER_MAGIC,))

    def unpickle_legacy(self, stored: bytes) -> Any:
        """A value an earlier fissure pickled, unpickled: only while migrating (trusted explicitly)."""
        if not self.trust_legacy_pickle:
            raise LegacyStateError(f"operator {self.operator!r}: {MIGRATION_HINT}")
        return pickle.loads(stored)


def missing_key_message(operator: str) -> str:
    return (f"operator {operator!r} keeps its state with pickle (state_codec=\"pickle\"), which needs a state key "
            f"to sign it: set RunnerConfig(state_key=...) or the environment variable {STATE_KEY_VARIABLE} (keep "
            f"the key outside the checkpoint), or keep the state plain data and drop state_codec=\"pickle\"")


def unsupported_state_message(operator: str, where: str, detail: str) -> str:
    return (f"operator {operator!r}: the state{' ' + where if where else ''} holds a {detail}; keep the state "
            f"plain data, or declare state_codec=\"pickle\" with a state key (RunnerConfig(state_key=...) or "
            f"{STATE_KEY_VARIABLE}). fissure stores state as data, not objects, so that a checkpoint cannot carry "
            f"code: dict, list, tuple, set, frozenset, str, bytes, int, float, bool, None, datetime, date, time, "
            f"timedelta, Decimal")
