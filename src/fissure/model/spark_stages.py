"""The Spark stages of one micro-batch under a plan, as the compiler builds them
(fissure.spark.query.compile_graph: exchanges and Spark stages of each region), and how a keyed
stage's work really splits over its partitions (`hash_balance`, `bucket_balance`). The Spark model
(fissure.model.spark_model) prices these stages; tests/model/test_spark_model.py checks `spark_stages`
against the compiler. Pure: no I/O, no Spark.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fissure.model.types import BALANCED_PARTITIONS_UP_TO, Kind, OperatorStats, Plan


@dataclass(frozen=True)
class NodeShape:
    """One Python node of a Spark stage: a PE (its pipelines' operator indexes), a stateful
    operator, or the numbering-only node that adds sequence numbers."""

    kind: str  # "pe", "state" or "sequence"
    pipelines: tuple[tuple[int, ...], ...]  # operator indexes per process; one for "state"; none for "sequence"
    entry: int  # index of the operator whose input the node gets (len(operators): the chain's output)


@dataclass(frozen=True)
class StageShape:
    """One Spark stage of the micro-batch's job."""

    exchange: str  # how its input arrives: "source", "round-robin", "hash" or "single"
    partitions: int  # tasks
    split: float  # how many ways its records really split (<= partitions)
    entry: int  # index of the operator whose input the stage starts with
    nodes: tuple[NodeShape, ...]
    key_operator: int | None = None  # a "hash" stage: the partitioned operator whose key it hashes


def _segments(operators: Sequence[OperatorStats], pipelines: Sequence[Sequence[int]]) -> list[tuple[str, Any]]:
    """A region cut at its stateful operators, as fissure.spark.query.compile_graph cuts it."""
    segments: list[tuple[str, Any]] = []
    pending: list[tuple[int, ...]] = []
    for pipeline in pipelines:
        part: list[int] = []
        for index in pipeline:
            if operators[index].kind is Kind.STATELESS:
                part.append(index)
                continue
            if part:
                pending.append(tuple(part))
                part = []
            if pending:
                segments.append(("pe", tuple(pending)))
                pending = []
            segments.append(("state", index))
        if part:
            pending.append(tuple(part))
    if pending:
        segments.append(("pe", tuple(pending)))
    return segments


@functools.lru_cache(maxsize=256)
def expected_max_standard_normal(count: int) -> float:
    """E[max of `count` independent standard normal variables] (0 for one), by quadrature."""
    if count <= 1:
        return 0.0
    step, total = 0.01, 0.0
    for k in range(-1000, 1001):  # x in [-10, 10]: the density beyond is below double precision
        x = k * step
        cdf = 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
        total += x * count * math.exp(-x * x / 2.0) / math.sqrt(2.0 * math.pi) * cdf ** (count - 1) * step
    return total


def hash_balance(keys: float, partitions: int) -> float:
    """How many ways `keys` key groups hashed into `partitions` really split the work: keys over the
    expected size of the largest partition (records spread evenly over the keys).

    The largest of the multinomial counts is about keys/P + e_P sqrt(keys/P), with e_P the expected
    largest of P standard normals (exact for P = 2 in the limit: keys/2 + E|X - keys/2|). 32 keys in
    2 partitions split 1.75 ways, 4 keys 1.43 ways; 1,000 keys 1.95 ways."""
    if partitions <= 1 or keys <= 1:
        return 1.0
    mean = keys / partitions
    largest = min(keys, max(1.0, mean + expected_max_standard_normal(partitions) * math.sqrt(mean)))
    return max(1.0, min(float(partitions), keys / largest))


def bucket_balance(keys: float, partitions: int, buckets: int) -> float:
    """How many ways a partitioned operator's keyed stage splits over `partitions`: its keys fall
    into `buckets` buckets at random, and up to BALANCED_PARTITIONS_UP_TO partitions the buckets'
    grouping key values split evenly (fissure.runtime.state.grouping_keys), so the keys split as if
    hashed straight into the partitions, at most as finely as whole buckets do (64 buckets over 3
    partitions: 22 in the fullest, 2.91 ways; 8 over 3: 2.67 ways; never more ways than buckets).
    Beyond, the buckets too land at random. A checkpoint an earlier fissure made keeps 64 plain
    bucket numbers, which split 27 / 37 over 2: the model does not know a run's checkpoint and
    prices new ones."""
    if partitions <= 1:
        return 1.0
    if partitions <= BALANCED_PARTITIONS_UP_TO:
        return min(hash_balance(keys, partitions), buckets / math.ceil(buckets / partitions))
    return hash_balance(min(keys, buckets), partitions)


def spark_stages(operators: Sequence[OperatorStats], plan: Plan, source_partitions: int = 1,
                 default_state_partitions: int = 1, scan_spreads: bool = False) -> tuple[StageShape, ...]:
    """The Spark stages of one micro-batch under `plan`, as fissure.spark.query.compile_graph builds them.
    `scan_spreads`: the source's scan splits a micro-batch over the cores (a file source), so a
    replicated first region's stateless head runs on the scan's tasks, as many ways as its
    replicas, with no numbering node and no round-robin exchange."""
    index = {operator.name: i for i, operator in enumerate(operators)}
    has_state = any(operator.kind is not Kind.STATELESS for operator in operators)
    keyed = [region.replicas for region in plan.regions
             if any(operators[index[name]].kind is Kind.PARTITIONED for name in region.operators)]
    state_partitions = max(keyed, default=default_state_partitions)
    stages: list[StageShape] = []
    current: dict[str, Any] = {"exchange": "source", "partitions": source_partitions, "split": source_partitions,
                               "entry": 0, "nodes": [], "key_operator": None}
    partitions: int | None = None  # the compiler's: None while the frame keeps the source's partitioning
    carried = False

    def new_stage(exchange: str, count: int, split: float, entry: int, key_operator: int | None = None) -> None:
        nonlocal current
        stages.append(StageShape(current["exchange"], current["partitions"], current["split"], current["entry"],
                                 tuple(current["nodes"]), current["key_operator"]))
        current = {"exchange": exchange, "partitions": count, "split": split, "entry": entry, "nodes": [],
                   "key_operator": key_operator}

    def sequence_node(entry: int) -> None:
        nonlocal carried
        current["nodes"].append(NodeShape("sequence", (), entry))
        carried = True

    for region in plan.regions:
        members = [index[name] for name in region.operators]
        pipelines = [tuple(index[name] for name in pipeline) for pipeline in region.pipelines]
        segments = _segments(operators, pipelines)
        replicas = region.replicas
        if segments[0][0] == "pe" and scan_spreads and replicas > 1 and not stages and not current["nodes"]:
            current["partitions"] = current["split"] = replicas  # the scan's tasks spread it
            partitions = replicas
        elif segments[0][0] == "pe" and not (replicas == 1 and partitions in (None, 1)):
            if not carried and has_state:
                sequence_node(members[0])
            # Round-robin whatever the region holds: its stateless prefix runs spread evenly, and
            # a keyed operator's own exchange hashes on the key after it.
            new_stage("round-robin", replicas, replicas, members[0])
            partitions = replicas
        for kind, content in segments:
            if kind == "pe":
                current["nodes"].append(NodeShape("pe", content, content[0][0]))
                carried = True
                continue
            operator = operators[content]
            if not carried:
                sequence_node(content)
            if operator.kind is Kind.PARTITIONED:
                bound = operator.max_scale if operator.max_scale is not None else math.inf
                new_stage("hash", state_partitions, min(state_partitions, bound), content, content)
            else:
                new_stage("single", state_partitions, 1, content)
            current["nodes"].append(NodeShape("state", ((content,),), content))
            partitions = state_partitions
    if not carried:
        sequence_node(len(operators))
    new_stage("", 0, 0, 0)  # closes the last stage
    return tuple(stages)
