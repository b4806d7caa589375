"""What the in-worker profiler counts, as named, additive records (stdlib only: workers import it).

Per micro-batch the driver receives, summed over the batch's tasks and Arrow batches:
- `OperatorCounts` per operator: records in and out (exact), dead letters, and the CPU and wall
  time of the *timed* part of its input (a sample of Arrow batches, or of records for stateful
  operators), with the records that part held, so cost per record = time / timed records;
- `PipelineCounts` per PE pipeline (one fused stage in one process): its timed wall time outside
  the operators (Arrow <-> Python records conversion, dead-letter handling);
- `RegionCallCounts` per compiled PE stage: the wall time of its calls (Spark tasks), the
  denominator of the pipelines' utilization.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar

class _Additive:
    """Field-wise addition and dict conversion of a counts record named by its `_label` field."""

    _label = ""

    def __add__(self, other):
        label = self._label
        if type(other) is not type(self) or getattr(self, label) != getattr(other, label):
            raise ValueError(f"cannot add counts of {getattr(self, label)!r} and {getattr(other, label, other)!r}")
        return replace(self, **{item.name: getattr(self, item.name) + getattr(other, item.name)
                                for item in fields(self) if item.name not in (label, "operators")})

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        if "operators" in values:
            values["operators"] = list(values["operators"])
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]):
        known = {item.name for item in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
        arguments = dict(values)
        if "operators" in arguments:
            arguments["operators"] = tuple(arguments["operators"])
        return cls(**arguments)


@dataclass(frozen=True)
class OperatorCounts(_Additive):
    """One operator's tallies over part of a micro-batch (add two parts with `+`)."""

    _label: ClassVar[str] = "operator"
    operator: str
    calls: int = 0  # Arrow batches (fused operators) or key groups (stateful) with >= 1 record
    records_in: int = 0
    records_out: int = 0
    dead_letters: int = 0
    timed_calls: int = 0
    timed_records_in: int = 0
    timed_cpu_s: float = 0.0  # thread CPU time of the timed calls
    timed_wall_s: float = 0.0
    key_groups: int = 0  # stateful operators: key groups (one per key, task and micro-batch)
    # combined operators (fissure.runtime.operators.combine): the partials the keyed stage merged
    # (one per key, window and folding task) and the distinct keys and windows they were of
    partials: int = 0
    combine_groups: int = 0


@dataclass(frozen=True)
class PipelineCounts(_Additive):
    """One PE pipeline's (fused stage's) tallies over part of a micro-batch."""

    _label: ClassVar[str] = "pipeline"
    pipeline: str  # "<region stage id>/<pipeline number>"
    operators: tuple[str, ...] = ()
    batches: int = 0
    records_in: int = 0
    timed_batches: int = 0
    timed_records_in: int = 0
    timed_wall_s: float = 0.0  # the whole fused stage, timed batches only
    timed_overhead_wall_s: float = 0.0  # the part of it outside the operators


@dataclass(frozen=True)
class RegionCallCounts(_Additive):
    """One compiled PE stage's calls (one per Spark task) over part of a micro-batch."""

    _label: ClassVar[str] = "region"
    region: str  # the stage id its pipelines' ids start with
    calls: int = 0
    wall_s: float = 0.0  # first input pulled to the last output taken, summed over calls
