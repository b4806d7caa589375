"""Reading a chain specification (the SPEC.json of `fissure plan`) with clear errors."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fissure.model.types import Kind, Machine, OperatorStats

SPEC_FIELDS = {"cores", "thread_switch_overhead", "replication_cost", "operators"}
OPERATOR_FIELDS = {"name", "kind", "key", "cost", "selectivity", "max_scale"}


class SpecError(ValueError):
    """A chain specification that cannot be planned; the message says where and what to change."""


@dataclass(frozen=True)
class ChainSpec:
    operators: tuple[OperatorStats, ...]
    machine: Machine


def _number(value: Any, where: str, minimum: float, allow_equal: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpecError(f"{where} must be a finite number, got {value!r}")
    if value < minimum or (not allow_equal and value == minimum):
        relation = ">=" if allow_equal else ">"
        raise SpecError(f"{where} must be {relation} {minimum:g}, got {value!r}")
    return float(value)


def parse_operator(raw: Any, index: int) -> OperatorStats:
    where = f"operators[{index}]"
    if not isinstance(raw, dict):
        raise SpecError(f"{where} must be an object with name, kind, cost and selectivity")
    unknown = set(raw) - OPERATOR_FIELDS
    if unknown:
        raise SpecError(f"{where} has unknown fields {sorted(unknown)}; allowed: {sorted(OPERATOR_FIELDS)}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise SpecError(f"{where}.name must be a non-empty string")
    where = f"operator {name!r}"
    kinds = [kind.value for kind in Kind]
    if raw.get("kind") not in kinds:
        raise SpecError(f"{where}: kind must be one of {kinds}, got {raw.get('kind')!r}")
    kind = Kind(raw["kind"])
    for required in ("cost", "selectivity"):
        if required not in raw:
            raise SpecError(f"{where} has no {required}")
    key = raw.get("key")
    if kind is Kind.PARTITIONED:
        if not isinstance(key, list) or not key or not all(isinstance(f, str) and f for f in key):
            raise SpecError(f"{where} is partitioned: give its key as a non-empty list of field names")
        key = tuple(key)
    elif key not in (None, []):
        raise SpecError(f"{where} is {kind.value}: only partitioned operators take a key")
    else:
        key = None
    max_scale = raw.get("max_scale")
    if max_scale is not None:
        max_scale = _number(max_scale, f"{where}: max_scale", 1.0)
    return OperatorStats(
        name=name,
        kind=kind,
        cost_us=_number(raw["cost"], f"{where}: cost", 0.0),
        selectivity=_number(raw["selectivity"], f"{where}: selectivity", 0.0),
        key=key,
        max_scale=max_scale,
    )


def parse_spec(raw: Any, cores: int | None = None) -> ChainSpec:
    """Validate a decoded SPEC.json; `cores` overrides the spec's."""
    if not isinstance(raw, dict):
        raise SpecError("the spec must be a JSON object with an 'operators' list")
    unknown = set(raw) - SPEC_FIELDS
    if unknown:
        raise SpecError(f"unknown fields {sorted(unknown)}; allowed: {sorted(SPEC_FIELDS)}")
    operators_raw = raw.get("operators")
    if not isinstance(operators_raw, list) or not operators_raw:
        raise SpecError("'operators' must be a non-empty list")
    operators = tuple(parse_operator(item, i) for i, item in enumerate(operators_raw))
    seen: set[str] = set()
    for operator in operators:
        if operator.name in seen:
            raise SpecError(f"operator name {operator.name!r} appears twice; names must be unique")
        seen.add(operator.name)
    if sum(operator.cost_us for operator in operators) <= 0:
        raise SpecError("every operator costs 0: give the costs in microseconds per tuple")
    if cores is None:
        if "cores" not in raw:
            raise SpecError("no core count: set 'cores' in the spec or pass --cores")
        cores_value = raw["cores"]
    else:
        cores_value = cores
    if isinstance(cores_value, bool) or not isinstance(cores_value, int) or cores_value < 1:
        raise SpecError(f"cores must be a whole number >= 1, got {cores_value!r}")
    machine = Machine(
        cores=cores_value,
        thread_switch_overhead_us=_number(raw.get("thread_switch_overhead", 1.0), "thread_switch_overhead", 0.0),
        replication_cost_us=_number(raw.get("replication_cost", 50.0), "replication_cost", 0.0),
    )
    return ChainSpec(operators, machine)


def load_spec(path: str | Path, cores: int | None = None) -> ChainSpec:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise SpecError(f"cannot read {path}: {error.strerror or error}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise SpecError(f"{path} is not valid JSON: {error}") from None
    return parse_spec(raw, cores)
