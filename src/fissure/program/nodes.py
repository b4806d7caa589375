"""The nodes of a program's graph: a source, an operator, a union, a join or a sink, with the
names of the nodes it reads (fissure.program.graph builds them)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import pyarrow as pa

from fissure.model.types import Kind
from fissure.program.joins import JoinSpec
from fissure.program.operators import Operator


class NodeKind(str, Enum):
    SOURCE = "source"
    OPERATOR = "operator"
    UNION = "union"
    JOIN = "join"
    SINK = "sink"


@dataclass(frozen=True)
class Node:
    """A source, an operator, a union, a join or a sink, and the names of the nodes it reads."""

    name: str
    kind: NodeKind
    inputs: tuple[str, ...] = ()
    operator: Operator | None = None  # NodeKind.OPERATOR
    join: JoinSpec | None = None  # NodeKind.JOIN
    schema: pa.Schema | None = None  # NodeKind.SOURCE: the declared schema, if any

    @property
    def keyed(self) -> bool:
        """Runs behind a hash exchange with state: a partitioned or stateful operator, or a join."""
        return self.kind is NodeKind.JOIN or (self.operator is not None and self.operator.kind is not Kind.STATELESS)

    @property
    def stateless(self) -> bool:
        return self.kind is NodeKind.UNION or (self.kind is NodeKind.OPERATOR and not self.keyed)

    @property
    def state_kind(self) -> Kind:
        """The paper's k(o) of an operator, union (stateless) or join (partitioned on its key)."""
        if self.kind is NodeKind.JOIN:
            return Kind.PARTITIONED
        return self.operator.kind if self.operator is not None else Kind.STATELESS

    @property
    def key(self) -> tuple[str, ...] | None:
        if self.join is not None:
            return self.join.key
        return self.operator.key if self.operator is not None else None

    def describe(self) -> str:
        if self.operator is not None:
            return f"operator {self.operator.describe()}"
        if self.join is not None:
            return f"join {self.name!r} ({self.join.callable_name} key={','.join(self.join.key)})"
        return f"{self.kind.value} {self.name!r}"
