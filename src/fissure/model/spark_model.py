"""A throughput model of what Spark really does with a fissure plan (pure: no I/O, no Spark).

The paper's model (fissure.model.throughput) prices a plan as if every pipeline ran at the same
time as every other. On Spark a micro-batch is a job whose stages (cut at every exchange) run one
after the other, each on the task slots; inside a stage, a task drives its Python nodes one after
the other, and a PE node's processes come on top of the task slots. So, per micro-batch of B
source records:

    batch time = batch_fixed_s + stateful operators x state_operator_batch_s
               + sum over the batch's Spark stages of
                     stage_fixed_s + waves x (task_fixed_s + Python nodes x python_node_fixed_s)
                     + max(path, shared)
    path       = critical work / E + waves x state stores x state_partition_fixed_s
    shared     = (total work + P x state stores x (state_partition_fixed_s + state_partition_jvm_s))
                 x a / C / E
    throughput = B / batch time

Stage work, in record-microseconds for the whole batch (records entering each step known from the
selectivities): the operators' costs c(o); io_record_us per source record (reading, and the sink's
share); python_record_us per record moved between the JVM and a Python worker, each way;
conversion_record_us per record converted between Arrow and Python dicts, each way;
boundary_record_us (the paper's delta) per record crossing a PE process boundary, paid by the
sender and by the receiver (the last pipeline's results travel back to the worker too);
exchange_record_us per record through a shuffle, half written upstream and half read
downstream; in a stateful node, state_record_us per record (pandas, sorting, state
(de)serialization), state_key_us per key a micro-batch holds and state_group_us per Spark group
(a partitioned operator's keys in min(keys, buckets) buckets, the count a new checkpoint gets on
the cores, fissure.model.state_buckets; one for an unkeyed one).

Effective parallelism of a stage of P tasks on C slots whose records split f ways (f = P for
round-robin; for keys, min(P, max_scale) and how the micro-batch's key groups hash into P
partitions, `bucket_balance`; 1 for an unkeyed stateful operator): tasks run in waves = ceil(P / C),
so E = min(f, P / waves). The slowest task's path (critical work: per task, the sum over nodes of
a PE node's slowest process and of the other nodes' work) or the stage's CPU (total work: all
processes) shared by the cores with a = min(P, C, f) tasks at once, whichever is longer: the PE's
processes share the cores with the other tasks' (eq. 13's C / U cap, per stage). Every state
partition loads and commits its store each micro-batch, an empty one too: CPU on the task's
thread (on its path) and on JVM threads beside it (in the shared CPU only).

The stages come from fissure.model.spark_stages, which mirrors the compiler
(fissure.spark.query.compile_graph). The constants are measured by `fissure calibrate`
(fissure.model.calibration) and stored where the planner finds them; the defaults below are what
was measured on the project's 2-core machine (docs/processing-element.md, docs/profiling.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from fissure.model.throughput import validate_plan
from fissure.model.spark_stages import NodeShape, StageShape, bucket_balance, spark_stages
from fissure.model.state_buckets import check_bucket_count, new_checkpoint_buckets
from fissure.model.types import Kind, OperatorStats, Plan

# Keys a partitioned operator is assumed to see per micro-batch when the workload does not say.
DEFAULT_KEYS_PER_BATCH = 1000.0


@dataclass(frozen=True)
class SparkConstants:
    """The Spark model's machine constants. Seconds per batch, stage or task; microseconds per record."""

    # Defaults: the medians of three `fissure calibrate` runs on the 2-core development VM
    # (`./dev python benchmarks/calibrate_defaults.py`, benchmarks/results/calibrate_defaults.md at 0faec71;
    # local[*] = 2 slots, PySpark 4.3, RocksDB state store, keyed state in buckets and sub-buckets of
    # keys, the packed exchange), rounded; a calibration on the deployment replaces them.
    batch_fixed_s: float = 0.23  # per micro-batch: planning, offset and commit logs, the sink call
    stage_fixed_s: float = 0.016  # per Spark stage: scheduling, shuffle bookkeeping
    task_fixed_s: float = 0.005  # per wave of tasks: launch (not fitted: confounded with stage_fixed_s)
    python_node_fixed_s: float = 0.032  # per Python node (PE, state handler, numbering) and wave: worker hand-over
    state_operator_batch_s: float = 0.026  # per stateful operator and micro-batch, outside its stages (driver)
    state_partition_fixed_s: float = 0.069  # per stateful node and task: store load and commit on the task's thread
    state_partition_jvm_s: float = 0.0  # per stateful node and state partition: CPU of JVM threads beside the task
    io_record_us: float = 3.0  # per source record: reading it, and the sink's share
    python_record_us: float = 0.0  # per record moved between the JVM and a Python worker, each way
    conversion_record_us: float = 1.9  # per record converted between Arrow and Python dicts, each way
    # per record through a shuffle exchange (write plus read): measured here at 0.3-0.6 µs for small rows; the three fits
    # put it at 0 (their exchanges are small), and the adaptive correction's factors need a base above 0
    exchange_record_us: float = 0.5
    boundary_record_us: float = 0.79  # delta: per record crossing a PE process boundary, each side
    # per record through a stateful node beyond its function: the packed exchange hands the state
    # handler a few Arrow rows per bucket (it was 4.3 µs before it)
    state_record_us: float = 0.66
    # per key per micro-batch in a stateful node: its state decoded and encoded, and its share of
    # its sub-bucket's state-server requests (380 µs a key when every key was a request of its own,
    # 79 µs in sub-buckets before the state codec and 8 buckets of keys)
    state_key_us: float = 2.6
    # per Spark group per micro-batch in a stateful node: a bucket of a partitioned operator's keys,
    # or an unkeyed operator's one group (a Python call, a pandas frame each way)
    state_group_us: float = 1720.0

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"Spark model constant {item.name} must be a finite number >= 0, got {value!r}")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(item.name for item in fields(cls))

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> SparkConstants:
        unknown = set(values) - set(cls.names())
        if unknown:
            raise ValueError(f"unknown Spark model constants {sorted(unknown)}; known: {', '.join(cls.names())}")
        return cls(**{name: float(value) for name, value in values.items()})

    def with_values(self, **values: float) -> SparkConstants:
        return replace(self, **values)


@dataclass(frozen=True)
class SparkWorkload:
    """What the micro-batches look like: their size, their source partitions, keys per batch."""

    batch_records: int = 10_000
    source_partitions: int = 1
    # distinct keys per micro-batch, per stateful operator (default: DEFAULT_KEYS_PER_BATCH for a
    # partitioned operator, one for an unkeyed one; never more than the records it gets)
    keys_per_batch: Mapping[str, float] = field(default_factory=dict)
    # per combined operator, the keys per micro-batch that, drawn uniformly (combined_partials),
    # give the partials its profile counted at the folds of the plan then in force
    # (uniform_combine_keys); default: its keys_per_batch
    combine_keys_per_batch: Mapping[str, float] = field(default_factory=dict)
    # per combined operator, the distinct keys (and windows) its partials held, as counted: any
    # plan's folds make at least one partial of each
    combine_groups_per_batch: Mapping[str, float] = field(default_factory=dict)
    default_state_partitions: int = 1  # state partitions of a plan without a replicated keyed region
    # the source's scan splits a micro-batch over the cores (a file source: fissure.spark.io.scan_split),
    # so a replicated first region runs on its tasks (fissure.model.spark_stages)
    scan_spreads: bool = True
    # buckets of a partitioned operator's keys (None: a new checkpoint's on the cores evaluated)
    state_buckets: int | None = None

    def __post_init__(self) -> None:
        if self.batch_records < 1 or self.source_partitions < 1 or self.default_state_partitions < 1:
            raise ValueError("batch_records, source_partitions and default_state_partitions must be >= 1")
        if self.state_buckets is not None:
            check_bucket_count(self.state_buckets)


@dataclass(frozen=True)
class SparkStageFigures:
    shape: StageShape
    records_in: float
    work_us: float  # all processes, the whole batch
    critical_us: float  # per task, summed over its nodes' slowest processes, the whole batch
    effective_parallelism: float
    time_s: float


@dataclass(frozen=True)
class SparkEvaluation:
    """The Spark model's verdict on a plan."""

    plan: Plan
    stages: tuple[SparkStageFigures, ...]
    batch_records: int
    batch_time_s: float
    fixed_s: float  # the part of the batch time that does not grow with the records
    throughput_per_s: float
    utilization: float  # cores busy on average over the batch
    cores: int

    @property
    def threads(self) -> int:
        return self.plan.threads


def _keys_per_batch(operator: OperatorStats, workload: SparkWorkload, records_in: float) -> float:
    keys = workload.keys_per_batch.get(operator.name)
    if keys is None:
        keys = DEFAULT_KEYS_PER_BATCH if operator.kind is Kind.PARTITIONED else 1.0
    return min(keys, records_in)


class _Chain:
    """Records entering each operator and prefix sums of their selectivity-weighted costs."""

    def __init__(self, operators: Sequence[OperatorStats], batch_records: int) -> None:
        self.records = [float(batch_records)]  # records[i]: entering operator i; records[n]: the output
        self.weighted = [0.0]  # weighted[i]: cost of operators < i, for the whole batch (us)
        for operator in operators:
            self.weighted.append(self.weighted[-1] + self.records[-1] * operator.cost_us)
            self.records.append(self.records[-1] * operator.selectivity)

    def work(self, first: int, end: int) -> float:
        return self.weighted[end] - self.weighted[first]


def combined_partials(records: float, keys: float, tasks: float) -> float:
    """The partials a combine before an exchange sends (fissure.runtime.operators.combine): per task, the
    distinct keys among its share of the records, with the batch's `keys` drawn uniformly
    (occupancy: keys x (1 - e^(-records per task / keys))), never more than the records. Skewed
    keys (Zipf word counts) repeat more, so they give fewer partials than this."""
    if records <= 0 or keys <= 0:
        return 0.0
    tasks = max(1, tasks)
    distinct = keys * -math.expm1(-(records / tasks) / keys)
    return min(records, tasks * distinct)


def combine_selectivity(operator: OperatorStats, workload: SparkWorkload, records_in: float, tasks: float) -> float:
    """Partials out per record in of `operator`'s combine (1.0: not combined), over the keys the
    run's partials imply (combine_keys_per_batch), else its keys per batch; never fewer than the
    distinct keys and windows the run counted (combine_groups_per_batch)."""
    if not operator.combined or records_in <= 0:
        return 1.0
    keys = workload.combine_keys_per_batch.get(operator.name)
    keys = min(keys, records_in) if keys is not None else _keys_per_batch(operator, workload, records_in)
    groups = min(workload.combine_groups_per_batch.get(operator.name, 0.0), records_in)
    return max(groups, combined_partials(records_in, keys, tasks)) / records_in


def uniform_combine_keys(records: float, partials: float, folds: float) -> float | None:
    """The keys that, drawn uniformly, make `folds` folds of `records` records give `partials`
    partials (combined_partials solved for its keys); None when the partials are the records
    (nothing combined: every record its own key).

    Why not the distinct keys and windows the partials hold: their records are skewed. Hot items'
    bids per auction and 10-second window (250,000 bids a batch, 2 folds) held 17,712 groups in
    24,008 partials, where a uniform draw over 17,712 gives 35,393 and one over the 9,933 key
    groups 19,866 (one run of examples/hot_items.py's program, 1,000,000 bids in 20 files, 5 a
    micro-batch). These keys (12,004) give back the 24,008 at 2 folds; at one fold they would give
    12,004, below the 17,712 groups one fold must make, which combine_selectivity takes instead."""
    if records <= 0 or partials <= 0:
        return 0.0
    if partials >= records:
        return None
    low, high = partials / max(1.0, folds), records  # partials at `low` keys <= partials, at `high` > them
    while combined_partials(records, high, folds) < partials:
        high *= 2
    for _ in range(100):
        middle = (low + high) / 2
        if combined_partials(records, middle, folds) < partials:
            low = middle
        else:
            high = middle
        if high - low <= 1e-6 * high:
            break
    return (low + high) / 2


def _fold_calls(shape: StageShape, operators: Sequence[OperatorStats], chain: _Chain,
                workload: SparkWorkload) -> float:
    """How many folds the stage before a combined operator makes, each giving its own partials: a
    pe stage or the source's envelopes one per task; a keyed stage one per call, that is per
    group of its operator (min(keys, buckets) buckets of a partitioned operator's keys, one
    for an unkeyed one)."""
    last = shape.nodes[-1]
    if last.kind != "state":
        return shape.partitions
    (index,), = last.pipelines
    operator = operators[index]
    if operator.kind is not Kind.PARTITIONED:
        return 1.0
    return min(_keys_per_batch(operator, workload, chain.records[index]), workload.state_buckets)


def _combine_points(shapes: Sequence[StageShape]) -> list[tuple[int, int]]:
    """(stage number, combined operator index) of every keyed stage whose stage before can fold
    for it: where fissure.spark.query.compile_graph combines (after a pe stage, the source's
    envelopes or another keyed stage)."""
    points = []
    for number, shape in enumerate(shapes):
        before = shapes[number - 1] if number else None
        if before is None or not before.nodes or not shape.nodes or shape.nodes[0].kind != "state":
            continue
        (index,), = shape.nodes[0].pipelines
        points.append((number, index))
    return points


def _combined_inputs(shapes: Sequence[StageShape], operators: Sequence[OperatorStats], chain: _Chain,
                     workload: SparkWorkload) -> dict[int, float]:
    """Per combined operator (index): the partials its exchange and keyed stage get."""
    partials = {}
    for number, index in _combine_points(shapes):
        records_in = chain.records[index]
        folds = _fold_calls(shapes[number - 1], operators, chain, workload)
        selectivity = combine_selectivity(operators[index], workload, records_in, folds)
        if selectivity < 1.0:
            partials[index] = records_in * selectivity
    return partials


def combine_folds(operators: Sequence[OperatorStats], plan: Plan, cores: int,
                  workload: SparkWorkload = SparkWorkload()) -> dict[str, float]:
    """Per combined operator of `plan`, the folds that make its partials in a micro-batch: the
    tasks of the pe stage before it, or the calls of the keyed stage before it."""
    workload, chain, shapes = _stages_of(operators, plan, cores, workload)
    return {operators[index].name: _fold_calls(shapes[number - 1], operators, chain, workload)
            for number, index in _combine_points(shapes) if operators[index].combined}


def _stages_of(operators: Sequence[OperatorStats], plan: Plan, cores: int,
               workload: SparkWorkload) -> tuple[SparkWorkload, _Chain, tuple[StageShape, ...]]:
    """The plan checked, the workload with its bucket count (a new checkpoint's on `cores` when
    unset), the records entering each operator and the plan's Spark stages."""
    validate_plan(operators, plan)
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    if workload.state_buckets is None:
        workload = replace(workload, state_buckets=new_checkpoint_buckets(cores))
    chain = _Chain(operators, workload.batch_records)
    return workload, chain, spark_stages(operators, plan, workload.source_partitions, workload.default_state_partitions,
                                         workload.scan_spreads)


def _node_work(node: NodeShape, chain: _Chain, operators: Sequence[OperatorStats], constants: SparkConstants,
               workload: SparkWorkload, combined: Mapping[int, float] | None = None) -> tuple[float, float]:
    """(critical, total) record-microseconds of one node over the whole batch; `combined`: the
    partials a combined operator's keyed stage gets instead of its records."""
    records = chain.records
    if node.kind == "sequence":
        work = 2 * constants.python_record_us * records[node.entry]
        return work, work
    if node.kind == "state":
        (index,), = node.pipelines
        operator = operators[index]
        records_in, records_out = records[index], records[index + 1]
        keys = _keys_per_batch(operator, workload, records_in)
        groups = min(keys, workload.state_buckets) if operator.kind is Kind.PARTITIONED else 1.0
        arriving = (combined or {}).get(index, records_in)
        # combined: the fold's add ran in the stage before; here merge, about one add per partial
        operator_work = chain.work(index, index + 1) * arriving / records_in if records_in else 0.0
        work = (operator_work + constants.state_record_us * arriving
                + constants.state_key_us * keys + constants.state_group_us * groups
                + (constants.python_record_us + constants.conversion_record_us) * (arriving + records_out))
        return work, work
    delta = constants.boundary_record_us
    count = len(node.pipelines)
    node_in, node_out = records[node.pipelines[0][0]], records[node.pipelines[-1][-1] + 1]
    works = []
    for position, pipeline in enumerate(node.pipelines):
        first, end = pipeline[0], pipeline[-1] + 1
        work = chain.work(first, end) + constants.conversion_record_us * (records[first] + records[end])
        if position > 0:
            work += delta * records[first]  # receives from the previous process
        if position < count - 1 or count > 1:
            work += delta * records[end]  # sends to the next process (the last: back to the worker)
        works.append(work)
    works[0] += constants.python_record_us * (node_in + node_out)  # the worker talks to the JVM
    if count > 1:
        works[0] += delta * node_out  # and receives the last pipeline's results
    return max(works), sum(works)


def evaluate_spark(operators: Sequence[OperatorStats], plan: Plan, cores: int,
                   constants: SparkConstants = SparkConstants(),
                   workload: SparkWorkload = SparkWorkload()) -> SparkEvaluation:
    """Predicted micro-batch time and throughput of `plan` for the chain `operators` on `cores` task slots."""
    workload, chain, shapes = _stages_of(operators, plan, cores, workload)
    critical = [0.0] * len(shapes)
    total = [0.0] * len(shapes)
    combined = _combined_inputs(shapes, operators, chain, workload)
    for number, shape in enumerate(shapes):
        records_in = chain.records[shape.entry]
        if shape.nodes and shape.nodes[0].kind == "state" and shape.nodes[0].pipelines[0][0] in combined:
            index = shape.nodes[0].pipelines[0][0]
            # the stage before folds the records: the operator's add and a conversion per record
            fold_us = chain.work(index, index + 1) + constants.conversion_record_us * records_in
            critical[number - 1] += fold_us
            total[number - 1] += fold_us
            records_in = combined[index]
        if shape.exchange == "source":
            entry_us = constants.io_record_us * workload.batch_records
        else:
            entry_us = constants.exchange_record_us / 2 * records_in
            critical[number - 1] += constants.exchange_record_us / 2 * records_in  # the upstream writes
            total[number - 1] += constants.exchange_record_us / 2 * records_in
        critical[number] += entry_us
        total[number] += entry_us
        for node in shape.nodes:
            node_critical, node_total = _node_work(node, chain, operators, constants, workload, combined)
            critical[number] += node_critical
            total[number] += node_total
    figures = []
    stateful_operators = sum(1 for operator in operators if operator.kind is not Kind.STATELESS)
    fixed_s = constants.batch_fixed_s + stateful_operators * constants.state_operator_batch_s
    variable_s = 0.0
    for number, shape in enumerate(shapes):
        waves = math.ceil(shape.partitions / cores)
        split = max(1.0, min(shape.split, shape.partitions))
        if shape.key_operator is not None:
            keys = _keys_per_batch(operators[shape.key_operator], workload, chain.records[shape.key_operator])
            # Spark hashes the key's bucket's value, not the key (bucket_balance).
            split = min(split, bucket_balance(keys, shape.partitions, workload.state_buckets))
        parallelism = min(split, shape.partitions / waves)
        at_once = min(shape.partitions, cores, split)
        stores = sum(1 for node in shape.nodes if node.kind == "state")
        # A state store's load and commit is CPU work: on the task's thread (state_partition_fixed_s,
        # once per task of each wave) and on JVM threads beside it (state_partition_jvm_s), paid by
        # every partition, an empty one too.
        store_task_us = 1e6 * stores * constants.state_partition_fixed_s
        store_cpu_us = shape.partitions * (store_task_us + 1e6 * stores * constants.state_partition_jvm_s)
        # The slowest task's path, or the stage's CPU work shared by the cores; the stores' part of
        # the path does not grow with the records (reported with the fixed costs).
        store_path_us = waves * store_task_us
        path_us = critical[number] / parallelism + store_path_us
        shared_us = (total[number] + store_cpu_us) * at_once / cores / parallelism
        stage_fixed_s = constants.stage_fixed_s + waves * (constants.task_fixed_s
                                                           + len(shape.nodes) * constants.python_node_fixed_s)
        stage_variable_s = max(path_us, shared_us) / 1e6
        fixed_s += stage_fixed_s + store_path_us / 1e6
        variable_s += stage_variable_s - store_path_us / 1e6
        figures.append(SparkStageFigures(shape, combined.get(shape.entry, chain.records[shape.entry]), total[number],
                                         critical[number],
                                         parallelism, stage_fixed_s + stage_variable_s))
    batch_time_s = fixed_s + variable_s
    return SparkEvaluation(
        plan=plan, stages=tuple(figures), batch_records=workload.batch_records, batch_time_s=batch_time_s,
        fixed_s=fixed_s, throughput_per_s=workload.batch_records / batch_time_s,
        utilization=sum(total) / 1e6 / batch_time_s, cores=cores,
    )


def _linear_terms(times, constants: SparkConstants) -> list[tuple[dict[str, float], float]]:
    """`times(constants)` (a list of seconds) as linear functions of the constants around `constants`."""
    base = times(constants)
    slopes: list[dict[str, float]] = [{} for _ in base]
    for name in SparkConstants.names():
        value = getattr(constants, name)
        step = 1e-3 * max(1.0, value)
        shifted = times(constants.with_values(**{name: value + step}))
        for number, (before, after) in enumerate(zip(base, shifted)):
            slopes[number][name] = (after - before) / step
    return [(terms, time_s - sum(terms[name] * getattr(constants, name) for name in terms))
            for terms, time_s in zip(slopes, base)]


def batch_time_terms(operators: Sequence[OperatorStats], plan: Plan, cores: int, constants: SparkConstants,
                     workload: SparkWorkload) -> tuple[dict[str, float], float]:
    """The batch time as a linear function of the constants around `constants`:
    ({constant: seconds per unit of it}, seconds that no constant scales: the operators' work).

    The model is piecewise linear in its constants (the max of a stage's critical and shared
    work picks a piece), so these slopes are exact unless `constants` sits on a kink."""
    return summed_terms(batch_part_terms(operators, plan, cores, constants, workload))


def batch_part_terms(operators: Sequence[OperatorStats], plan: Plan, cores: int, constants: SparkConstants,
                     workload: SparkWorkload) -> list[tuple[dict[str, float], float]]:
    """The parts of the batch time as linear functions of the constants (as batch_time_terms): each
    Spark stage's time, in order, then the rest of the batch (batch_fixed_s and the stateful
    operators' state_operator_batch_s, outside every stage)."""
    def parts(values: SparkConstants) -> list[float]:
        evaluation = evaluate_spark(operators, plan, cores, values, workload)
        stages = [stage.time_s for stage in evaluation.stages]
        return [*stages, evaluation.batch_time_s - sum(stages)]

    return _linear_terms(parts, constants)


def summed_terms(parts: Sequence[tuple[dict[str, float], float]]) -> tuple[dict[str, float], float]:
    """The sum of linear terms (batch_part_terms' parts: the whole batch's terms)."""
    slopes = {name: sum(terms[name] for terms, _ in parts) for name in SparkConstants.names()}
    return slopes, sum(constant_s for _, constant_s in parts)
