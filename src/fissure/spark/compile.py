"""Plan compilation: a pipeline and a plan turned into the DataFrame operations of one query.

Per region, in chain order (docs/spark-runner.md has the full picture):
- the region's input is exchanged into its replicas: round-robin `repartition(r)` for a stateless
  region, hash of the key for a partitioned one, one partition for a stateful one. A stateless
  region with one replica keeps its input's partitioning (a one-partition source stays one
  partition: the sequential plan adds no exchange);
- its stateless operators run in a processing element (PE) inside `mapInArrow`: one fused stage
  per pipeline, each pipeline in its own process;
- each stateful operator runs in `groupBy(key).transformWithStateInPandas` with its state in
  Spark's state store (RocksDB): partitioned ones per key, unkeyed ones under one constant key.
Records travel between stages as typed Arrow columns (the declared or passed-through schema),
plus a sequence number and the dead-letter columns (fissure.worker.columns).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from fissure.graph import Operator, Pipeline, PipelineError, output_schemas
from fissure.model.types import Kind, Plan, RegionPlan
from fissure.spark.compile_graph import WorkerProfiling
from fissure.spark.elastic import WorkerThreads
from fissure.spark.live_cut import LiveCut, region_segments
from fissure.spark.plans import check_plan
from fissure.spark.sources import arrow_schema_of, spark_schema_of
from fissure.spark.stages import OperatorStateProcessor, RegionFunction
from fissure.worker.columns import SINGLE_KEY, carried_schema
from fissure.worker.graph_pe import state_partitions_of
from fissure.worker.fused import FusedStage, Step
from fissure.worker.keyed import StatefulStep
from fissure.worker.profiling import ProfiledRegion, ProfiledUpdate


@dataclass(frozen=True)
class CompiledStage:
    """One Spark-side step of the compiled query, for listings, tests and the progress line."""

    region: int  # 1-based region of the plan
    kind: str  # "pe" (mapInArrow), "state" (transformWithStateInPandas) or "sequence" (numbering only)
    pipelines: tuple[tuple[str, ...], ...]  # operator names per PE process; one for a state stage
    exchange: str  # "none", "round-robin", "hash" or "single" before this step
    partitions: int | None  # partitions after the exchange; None: the input's
    key: tuple[str, ...] | None = None

    @property
    def processes(self) -> int:
        return len(self.pipelines) if self.kind == "pe" else 1


@dataclass(frozen=True)
class CompiledQuery:
    frame: DataFrame  # carried output: result fields, sequence number, dead-letter columns
    plan: Plan
    stages: tuple[CompiledStage, ...]
    result_schema: pa.Schema  # the user's fields of the results
    state_partitions: int

    @property
    def max_processes_per_task(self) -> int:
        return max((stage.processes for stage in self.stages), default=1)


def region_kind(operators: list[Operator]) -> Kind:
    kinds = {operator.kind for operator in operators}
    if Kind.PARTITIONED in kinds:
        return Kind.PARTITIONED
    return Kind.STATEFUL if Kind.STATEFUL in kinds else Kind.STATELESS


def _step(operator: Operator, output_schema: pa.Schema, waiting=None) -> Step:
    return Step(name=operator.name, action=operator.action.value, fn=operator.fn, output_schema=output_schema,
                batch_format=operator.batch_format.value if operator.batch_format else None, waiting=waiting)


class _Compiler:
    profiling: WorkerProfiling | None = None  # set by compile_plan
    threads: WorkerThreads = WorkerThreads()  # waiting operators on elastic threads (compile_plan)

    def __init__(self, pipeline: Pipeline, plan: Plan, source: DataFrame, state_partitions: int,
                 resource_profile_for) -> None:
        self.pipeline = pipeline
        self.plan = plan
        self.frame = source
        self.source_schema = arrow_schema_of(source)
        self.schemas = output_schemas(pipeline, self.source_schema)
        self.state_partitions = state_partitions
        self.resource_profile_for = resource_profile_for
        self.has_state = any(operator.kind is not Kind.STATELESS for operator in pipeline.operators)
        self.carried = False  # the frame has fissure's columns (a Python stage ran)
        self.partitions: int | None = None  # None: the source's partitioning
        self.user_schema = self.source_schema  # the user's fields of the frame
        self.stages: list[CompiledStage] = []
        # The PE registry in each Python worker keys its processes by this region id: stable per
        # pipeline, so a new plan's cut replaces the old processes at once instead of leaving
        # them idle (the PE compares the cut fingerprint and re-forks when it changed).
        self.fingerprint = pipeline.name

    def compile(self) -> CompiledQuery:
        for number, region in enumerate(self.plan.regions, start=1):
            self._region(number, region)
        if not self.carried:
            self._sequence_stage(0)
        return CompiledQuery(self.frame, self.plan, tuple(self.stages), self.user_schema, self.state_partitions)

    def _check_fields(self, fields: tuple[str, ...], operator: Operator, what: str) -> None:
        for name in fields:
            if name not in self.user_schema.names:
                raise PipelineError(
                    f"operator {operator.name!r} ({operator.callable_name}) is {what} field {name!r}, which the "
                    f"records entering its region do not have (fields: {', '.join(self.user_schema.names)}); "
                    f"start the region at the operator that adds {name!r} or later")

    def _region(self, number: int, region: RegionPlan) -> None:
        operators = [self.pipeline.operator(name) for name in region.operators]
        kind = region_kind(operators)
        segments = region_segments(region, self.pipeline)
        if segments[0][0] == "pe":
            exchange, partitions, key = self._exchange_before_pe(kind, region, operators)
        else:
            exchange, partitions, key = "none", None, None
        for kind_of_segment, content in segments:
            if kind_of_segment == "pe":
                self._pe_stage(number, content, exchange, partitions, key)
            else:
                self._state_stage(number, content)
            exchange, partitions, key = "none", None, None

    def _exchange_before_pe(self, kind: Kind, region: RegionPlan, operators: list[Operator]):
        """Repartition the frame for a region that starts with stateless operators."""
        if kind is Kind.STATELESS:
            if region.replicas == 1 and self.partitions in (None, 1):
                return "none", None, None
            self._sequence_before_exchange()
            self.frame = self.frame.repartition(region.replicas)
            self.partitions = region.replicas
            return "round-robin", region.replicas, None
        if region.replicas == 1 and self.partitions in (None, 1):
            return "none", None, None  # the state stage's own exchange keys the records
        self._sequence_before_exchange()
        if kind is Kind.PARTITIONED:
            keyed = next(operator for operator in operators if operator.kind is Kind.PARTITIONED)
            if all(name in self.user_schema.names for name in keyed.key):
                self.frame = self.frame.repartition(region.replicas, *keyed.key)
                self.partitions = region.replicas
                return "hash", region.replicas, keyed.key
            # The region's own stateless operators make the key: spread them round-robin; the
            # keyed operator's exchange then hashes on the key.
            self.frame = self.frame.repartition(region.replicas)
            self.partitions = region.replicas
            return "round-robin", region.replicas, None
        self.frame = self.frame.repartition(1)
        self.partitions = 1
        return "single", 1, None

    def _sequence_before_exchange(self) -> None:
        # Sequence numbers must come from the source's order, so before the first exchange.
        if not self.carried and self.has_state:
            self._sequence_stage(0)

    def _sequence_stage(self, region_number: int) -> None:
        function = RegionFunction([], f"{self.fingerprint}/sequence", self.source_schema,
                                  carried_schema(self.user_schema))
        self.frame = self.frame.mapInArrow(function, spark_schema_of(carried_schema(self.user_schema)))
        self.carried = True
        self.stages.append(CompiledStage(region_number, "sequence", (), "none", None))

    def _pe_stage(self, number: int, pipelines: list[list[Operator]], exchange: str,
                  partitions: int | None, key) -> None:
        fused = []
        profiling, region_label = self.profiling, f"s{len(self.stages)}"
        for number_in_region, operators in enumerate(pipelines, start=1):
            steps = [_step(operator, self.schemas[operator.name], self.threads.waiting_for(operator, self.pipeline.name))
                     for operator in operators]
            if profiling is None:
                fused.append([FusedStage(steps, self.user_schema)])
            else:
                fused.append([FusedStage(steps, self.user_schema,
                                         profile_id=f"{profiling.token}/{region_label}/p{number_in_region}",
                                         profile_label=f"{region_label}/p{number_in_region}",
                                         timed_every=profiling.timed_every_batches)])
            self.user_schema = steps[-1].output_schema
        output = carried_schema(self.user_schema)
        function = RegionFunction(fused, f"{self.fingerprint}/{len(self.stages)}",
                                  None if self.carried else self.source_schema, output)
        if profiling is not None:
            function = ProfiledRegion(function, [stage for stages in fused for stage in stages], region_label,
                                      profiling.accumulator)
        function = LiveCut(function)  # runs the cut the driver sets per micro-batch (in-PE switches)
        function = self.threads.wrap(function, fused)  # waiting operators' boards, switches, levels
        profile = self.resource_profile_for(len(pipelines))
        if profile is not None:
            self.frame = self.frame.mapInArrow(function, spark_schema_of(output), profile=profile)
        else:
            self.frame = self.frame.mapInArrow(function, spark_schema_of(output))
        self.carried = True
        names = tuple(tuple(operator.name for operator in operators) for operators in pipelines)
        self.stages.append(CompiledStage(number, "pe", names, exchange, partitions, key))

    def _state_stage(self, number: int, operator: Operator) -> None:
        if not self.carried:
            self._sequence_stage(number)
        carried_input = carried_schema(self.user_schema)
        output_schema = self.schemas[operator.name]
        fn = operator.fn if self.profiling is None else ProfiledUpdate(
            operator.fn, operator.name, self.profiling.accumulator, self.profiling.timed_every_records)
        step = StatefulStep(name=operator.name, fn=fn, state_factory=operator.state_factory,
                            input_schema=self.user_schema, output_schema=output_schema, key=operator.key,
                            order_by=operator.order_by)
        if operator.kind is Kind.PARTITIONED:
            self._check_fields(operator.key, operator, "keyed on")
            grouping = list(operator.key)
            exchange = "hash"
        else:
            self.frame = self.frame.withColumn(SINGLE_KEY, F.lit(0))
            grouping = [SINGLE_KEY]
            exchange = "single"
        output = carried_schema(output_schema)
        self.frame = self.frame.groupBy(*grouping).transformWithStateInPandas(
            OperatorStateProcessor(step, carried_input), spark_schema_of(output), "Append", "None")
        self.user_schema = output_schema
        self.carried = True
        self.partitions = self.state_partitions
        self.stages.append(CompiledStage(number, "state", ((operator.name,),), exchange, self.state_partitions,
                                         operator.key))


def compile_plan(pipeline: Pipeline, plan: Plan, source: DataFrame, *, state_partitions: int | None = None,
                 resource_profile_for=lambda processes: None,
                 profiling: WorkerProfiling | None = None, threads: WorkerThreads | None = None) -> CompiledQuery:
    """The query for `pipeline` under `plan` over the streaming DataFrame `source`.

    `state_partitions` defaults to the plan's largest partitioned-region replica count (1 without);
    `resource_profile_for(processes)` may return a ResourceProfile for a PE of that many processes.
    `profiling`: make every operator count and time itself into its accumulator (None: not profiled).
    `threads`: how waiting operators run on elastic threads and report their levels (None: declared
    ones still do, with the default policy, unreported).
    Raises PipelineError naming the operator and field when the pipeline does not fit the source.
    """
    check_plan(plan, pipeline)
    partitions = state_partitions if state_partitions is not None else state_partitions_of(pipeline, plan)
    compiler = _Compiler(pipeline, plan, source, partitions, resource_profile_for)
    compiler.profiling = profiling
    compiler.threads = threads or WorkerThreads()
    return compiler.compile()
