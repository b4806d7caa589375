"""What a checkpoint's state belongs to: the stateful operators of the program that wrote it
(pure; fissure.spark.checkpoint.guard keeps it in the checkpoint and compares it at each start).

Spark keeps a query's state by the place of its stateful operator in the query (operator 0, 1,
...), not by name, and fissure keeps a partitioned operator's state under the text of its key. So
a resumed program whose stateful operators moved, changed key or changed the form of their state
runs on the wrong state without any error: measured before this record existed, two swapped
keyed operators each went on from the other's state, and a count keyed on another field
restarted at 1 for every key. The record holds, per stateful operator (partitioned, stateful
without key, join) in execution order: its name, kind, place, key fields and their types, the
user's `state_version`, the type of a new state, and for a join its window and the fields of the
records it keeps. Stateless operators, plans (replicas, boundaries) and functions are not in it:
changing them keeps the state valid.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace

import pyarrow as pa

from fissure.model.types import Kind
from fissure.program.graph import StreamGraph
from fissure.program.nodes import NodeKind

FINGERPRINT_FORMAT = 1
NEW_CHECKPOINT = "new checkpoint"
RENAME = "rename"
READS_OLD_STATE = "reads old state"


@dataclass(frozen=True)
class StatefulOperator:
    """One stateful operator as its state depends on it."""

    name: str
    kind: str  # "partitioned", "stateful" (no key) or "join"
    place: int  # 1, 2, ...: its order among the program's stateful operators (Spark's operator id + 1)
    key: tuple[str, ...] = ()
    key_types: tuple[str, ...] = ()  # "" where the input's schema was not known
    state_version: int = 1
    state_type: str = ""  # the type of a new state (partitioned, stateful)
    stored: tuple[tuple[str, str], ...] = ()  # a join's window and the fields of the records it keeps


@dataclass(frozen=True)
class ProgramFingerprint:
    program: str
    operators: tuple[StatefulOperator, ...]

    def to_dict(self) -> dict:
        return {"format": FINGERPRINT_FORMAT, "program": self.program,
                "operators": [asdict(operator) for operator in self.operators]}

    @classmethod
    def from_dict(cls, data: Mapping) -> ProgramFingerprint:
        """ValueError when `data` is not a fingerprint this version of fissure reads."""
        if not isinstance(data, Mapping) or data.get("format") != FINGERPRINT_FORMAT:
            raise ValueError(f"not a program record of format {FINGERPRINT_FORMAT}")
        try:
            operators = tuple(
                StatefulOperator(**{**entry, "key": tuple(entry.get("key", ())),
                                    "key_types": tuple(entry.get("key_types", ())),
                                    "stored": tuple(tuple(pair) for pair in entry.get("stored", ()))})
                for entry in data["operators"])
            return cls(str(data["program"]), operators)
        except (KeyError, TypeError) as error:
            raise ValueError(f"a program record with a malformed operator: {error}") from error


def _type_name(schema: pa.Schema | None, name: str) -> str:
    if schema is None or name not in schema.names:
        return ""
    return str(schema.field(name).type)


def _fields(schema: pa.Schema | None) -> str:
    return "?" if schema is None else ", ".join(f"{item.name}: {item.type}" for item in schema)


def _state_type(factory) -> str:
    """The type of a new state (empty when the factory fails here: its batches will say why)."""
    try:
        return type(factory()).__qualname__
    except Exception:  # noqa: BLE001 - the user's factory; the worker reports its failure
        return ""


def program_fingerprint(graph: StreamGraph, schemas: Mapping[str, pa.Schema | None] | None = None) -> ProgramFingerprint:
    """The stateful operators of `graph` (their input schemas from `schemas`, by stream name, when known)."""
    schemas = schemas or {}
    operators = []
    for name in graph.names:
        node = graph.node(name)
        if not node.keyed:
            continue
        place = len(operators) + 1
        left = schemas.get(node.inputs[0])
        if node.kind is NodeKind.JOIN:
            spec, right = node.join, schemas.get(node.inputs[1])
            window = f"{spec.window.time_field} size {spec.window.size:g} lateness {spec.window.lateness:g}"
            operators.append(StatefulOperator(
                name, "join", place, tuple(spec.key), tuple(_type_name(left, key) for key in spec.key),
                spec.state_version, stored=(("window", window), ("left input", _fields(left)),
                                            ("right input", _fields(right)))))
            continue
        operator = node.operator
        partitioned = operator.kind is Kind.PARTITIONED
        key = tuple(operator.key or ()) if partitioned else ()
        operators.append(StatefulOperator(
            name, "partitioned" if partitioned else "stateful", place, key,
            tuple(_type_name(left, field_name) for field_name in key), operator.state_version,
            _state_type(operator.state_factory)))
    return ProgramFingerprint(graph.name, tuple(operators))


@dataclass(frozen=True)
class StateMigration:
    """Changes the user vouches the stored state survives: operators renamed (old name -> new;
    Spark keeps state by place, so a renamed operator in the same place reads its own state), and
    operators whose `state_version` or state type changed while their new function reads the
    state the old one wrote."""

    renamed: tuple[tuple[str, str], ...] = ()
    reads_old_state: tuple[str, ...] = ()

    @classmethod
    def of(cls, renamed: Mapping[str, str] | None = None, reads_old_state: Iterable[str] = ()) -> StateMigration:
        return cls(tuple(sorted((renamed or {}).items())), tuple(sorted(set(reads_old_state))))

    def to_dict(self) -> dict:
        return {"renamed": dict(self.renamed), "reads_old_state": list(self.reads_old_state)}

    @classmethod
    def from_dict(cls, data: Mapping | None) -> StateMigration | None:
        if not data:
            return None
        return cls.of(data.get("renamed") or {}, data.get("reads_old_state") or ())

    def describe(self) -> str:
        parts = [f"renamed {', '.join(f'{old} -> {new}' for old, new in self.renamed)}"] if self.renamed else []
        if self.reads_old_state:
            parts.append(f"reading their old state: {', '.join(self.reads_old_state)}")
        return "; ".join(parts) or "nothing"


@dataclass(frozen=True)
class ProgramChange:
    """One difference between the recorded program and this one, and the way past it."""

    text: str
    route: str  # NEW_CHECKPOINT, RENAME (fissure.migrate_state renamed=) or READS_OLD_STATE
    operator: str = ""
    previous: str = ""  # RENAME: the name in the checkpoint's record


@dataclass(frozen=True)
class ProgramComparison:
    changes: tuple[ProgramChange, ...] = field(default_factory=tuple)
    reason: str = "the stateful operators match the checkpoint's record"

    @property
    def compatible(self) -> bool:
        return not self.changes


def _migrated(recorded: ProgramFingerprint, current: ProgramFingerprint,
              migration: StateMigration | None) -> tuple[StatefulOperator, ...]:
    if migration is None:
        return recorded.operators
    renamed = dict(migration.renamed)
    now = {operator.name: operator for operator in current.operators}
    operators = []
    for operator in recorded.operators:
        operator = replace(operator, name=renamed.get(operator.name, operator.name))
        if operator.name in migration.reads_old_state and operator.name in now:
            operator = replace(operator, state_version=now[operator.name].state_version,
                               state_type=now[operator.name].state_type)
        operators.append(operator)
    return tuple(operators)


def _field_changes(before: StatefulOperator, after: StatefulOperator) -> list[ProgramChange]:
    name, changes = after.name, []
    what = f"join {name}" if after.kind == "join" else f"operator {name}"
    if before.kind != after.kind:
        changes.append(ProgramChange(f"{what}: kind {before.kind} -> {after.kind}", NEW_CHECKPOINT, name))
    if before.key != after.key:
        changes.append(ProgramChange(
            f"{what}: key {','.join(before.key) or '(none)'} -> {','.join(after.key) or '(none)'} (its state is kept "
            f"per value of the old key: every key would start again from a new state)", NEW_CHECKPOINT, name))
    elif any(old and new and old != new for old, new in zip(before.key_types, after.key_types)):
        changes.append(ProgramChange(
            f"{what}: key types {', '.join(before.key_types)} -> {', '.join(after.key_types)} (a key's text "
            f"changes with its type: its state would not be found)", NEW_CHECKPOINT, name))
    if before.state_version != after.state_version:
        changes.append(ProgramChange(f"{what}: state_version {before.state_version} -> {after.state_version}",
                                     READS_OLD_STATE, name))
    if before.state_type and after.state_type and before.state_type != after.state_type:
        changes.append(ProgramChange(f"{what}: a new state is a {after.state_type}, the stored states are "
                                     f"{before.state_type}s", READS_OLD_STATE, name))
    old_stored, new_stored = dict(before.stored), dict(after.stored)
    for label in dict.fromkeys([*old_stored, *new_stored]):
        if old_stored.get(label) != new_stored.get(label) and "?" not in (old_stored.get(label), new_stored.get(label)):
            changes.append(ProgramChange(f"{what}: {label} ({old_stored.get(label)}) -> ({new_stored.get(label)}) "
                                         f"(its state keeps the records of both inputs by window)", NEW_CHECKPOINT, name))
    return changes


def compare_programs(recorded: ProgramFingerprint, current: ProgramFingerprint,
                     migration: StateMigration | None = None) -> ProgramComparison:
    """What changed between the program that wrote the checkpoint and `current`, after the
    changes `migration` vouches for."""
    before = {operator.name: operator for operator in _migrated(recorded, current, migration)}
    after = {operator.name: operator for operator in current.operators}
    changes: list[ProgramChange] = []
    moved = {name for name in before.keys() & after.keys() if before[name].place != after[name].place}
    for name in sorted(moved, key=lambda item: after[item].place):
        partner = next((other for other in moved if other != name and before[other].place == after[name].place
                        and after[other].place == before[name].place), None)
        if partner is not None and partner < name:
            continue
        if partner is not None:
            changes.append(ProgramChange(
                f"operators {name} and {partner} swapped places (stateful operators {before[name].place} and "
                f"{before[partner].place}): Spark keeps state by place, so each would go on from the other's state",
                NEW_CHECKPOINT, name))
        else:
            changes.append(ProgramChange(
                f"operator {name} moved from stateful place {before[name].place} to {after[name].place}: Spark keeps "
                f"state by place, so it would go on from the state of the operator that was there", NEW_CHECKPOINT, name))
    for name in sorted(before.keys() & after.keys(), key=lambda item: after[item].place):
        changes += _field_changes(before[name], after[name])
    gone = {before[name].place: before[name] for name in before.keys() - after.keys()}
    for name in sorted(after.keys() - before.keys(), key=lambda item: after[item].place):
        operator = after[name]
        previous = gone.pop(operator.place, None)
        if previous is not None and previous.kind == operator.kind:
            changes.append(ProgramChange(
                f"stateful operator {operator.place} renamed {previous.name} -> {name} (or replaced by another "
                f"operator: fissure cannot tell)", RENAME, name, previous.name))
            changes += _field_changes(replace(previous, name=name), operator)
            continue
        if previous is not None:
            gone[operator.place] = previous
        changes.append(ProgramChange(
            f"stateful operator {name} ({operator.kind}) added at place {operator.place}: Spark keeps state by "
            f"place, and the checkpoint has {len(before)} stateful operator(s)", NEW_CHECKPOINT, name))
    for place, operator in sorted(gone.items()):
        changes.append(ProgramChange(
            f"stateful operator {operator.name} ({operator.kind}, place {place}) removed: the state of the "
            f"operators after it would move to other places", NEW_CHECKPOINT, operator.name))
    if not changes:
        return ProgramComparison()
    return ProgramComparison(tuple(changes), f"{len(changes)} change(s) to the stateful operators")


def refusal_text(checkpoint: str, recorded: ProgramFingerprint, comparison: ProgramComparison,
                 migration: StateMigration | None = None) -> str:
    """The message of a start refused because the program changed: what changed, how to go on."""
    lines = [f"checkpoint {checkpoint} holds the state of another form of program {recorded.program!r}; resuming would "
             f"give that state to the wrong operators or keys:"]
    lines += [f"  - {change.text}" for change in comparison.changes]
    if migration is not None:
        lines.append(f"  (after the migration recorded in the checkpoint: {migration.describe()})")
    lines.append("To go on: run on a new checkpoint (the state starts empty; the sources are read from their start)")
    routes = {change.route for change in comparison.changes}
    if routes <= {RENAME, READS_OLD_STATE}:
        renamed = {change.previous: change.operator for change in comparison.changes if change.route == RENAME}
        reads = sorted({change.operator for change in comparison.changes if change.route == READS_OLD_STATE})
        arguments = ([f"renamed={renamed!r}"] if renamed else []) + ([f"reads_old_state={reads!r}"] if reads else [])
        lines.append(f"or, when the stored state fits this program (an operator only renamed; a function that reads "
                     f"the old state's form itself), record that once with fissure.migrate_state({checkpoint!r}, "
                     f"program, {', '.join(arguments)}) and run again")
    else:
        lines.append("(a changed key, kind, window, input fields or order of stateful operators cannot be carried "
                     "over: a new checkpoint it is)")
    lines.append("See docs/pipeline-api.md, 'Changing a stateful program'.")
    return "\n".join(lines)
