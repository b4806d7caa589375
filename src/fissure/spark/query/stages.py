"""The functions Spark ships to its Python workers for a pe stage and a source: a pe stage's
processing element over envelopes, a source's rows as envelopes, the end-of-input tick; and what
every shipped function reads of its task (the local properties the driver sets per micro-batch).
A keyed node's handler is fissure.spark.query.keyed_stage's; fissure.spark.query.compile_graph
builds the query around them.

They are the Spark layer's (they read the task's partition id and local properties) and hand
the real work to fissure.runtime.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.compute as pc

from fissure.program.graph import StreamGraph
from fissure.runtime.records.columns import DEAD_OPERATOR, SEQ_PARTITION_SHIFT, SOURCE_SHIFT
from fissure.runtime.elastic.stage import WaitingOperator
from fissure.runtime.records.carried import assemble, dead_letter_batch
from fissure.runtime.records.envelopes import EnvelopeLayout
from fissure.compile.stages import GraphStage
from fissure.compile.pieces import StageProfiling, build_pieces
from fissure.profile.graph_profile import RUNS_MARK
from fissure.runtime.operators.combine import PARTIAL_KEY, CombinePlan, Combiner
from fissure.runtime.operators.dict_fold import RecordFold
from fissure.runtime.operators.packing import PACKED_KEY, PackSpec, empty_groups, pack, pack_partials, unpacked
from fissure.runtime.operators.watermark import BatchClock
from fissure.spark.query.time_log import BATCH_CLOCK_PROPERTY
from fissure.runtime.profiling.report_rows import report_envelope, report_text
from fissure.runtime.records.source_rows import LineFormat, carried_source_batch
from fissure.runtime.pe.region import processing_element

KEY = PACKED_KEY  # the grouping column of every keyed stage, packed or not
SPREAD_PREFIX = "~"
KEY_MARK = "="
BOUNDARIES_PROPERTY = "fissure.graph.boundaries"  # JSON {graph name: [operator, ...]}, per micro-batch
# JSON {graph name: how its pieces count}: "nodes" (node by node, unfused: the autopipelining
# optimizer's input), "runs" (per fused run: the loop's cheap screening), "off"; unset: "nodes".
PIECE_COUNTING_PROPERTY = "fissure.graph.piece_counting"
# JSON {plan, decision, ...} the driver publishes for a micro-batch (fissure.spark.query.observed_metrics).
PUBLISHED_PROPERTY = "fissure.published"


@dataclass(frozen=True)
class WorkerProfiling:
    """What compiled stages need to profile themselves (fissure.runtime.profiling.profiler): the run's one
    profile accumulator (a ProfileTally), how much to time, and what to count: every operator
    (`operators`: the statistics a run shows, the adaptive loop's input) and each pe stage's
    pieces node by node (`pieces`: the autopipelining loop's input). `token` keeps one query's
    counters apart from another's in a worker that serves both."""

    accumulator: object
    timed_every_batches: int = 1
    timed_every_records: int = 32
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    operators: bool = True
    pieces: bool = False


def task_property(name: str) -> str | None:
    """A Spark local property as this task sees it (None: unset, or no task here)."""
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        return context.getLocalProperty(name) if context is not None else None
    except Exception:  # noqa: BLE001 - unreadable: as if unset
        return None


def task_clock() -> BatchClock:
    """The clock the driver set for this task's micro-batch (fissure.spark.query.time_log)."""
    text = task_property(BATCH_CLOCK_PROPERTY)
    if not text:
        raise RuntimeError("fissure: a time-aware operator ran without its micro-batch's clock (the Spark local "
                           f"property {BATCH_CLOCK_PROPERTY!r} is unset); run the program with fissure.run or Runner")
    return BatchClock.from_json(text)


def task_batch() -> int | None:
    """This task's micro-batch id (Spark's own local property), None when unknown."""
    text = task_property("streaming.sql.batchId")
    return int(text) if text and text.lstrip("-").isdigit() else None


def task_attempt() -> int | None:
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        return context.taskAttemptId() if context is not None else None
    except Exception:  # noqa: BLE001
        return None


def task_boundaries(graph_name: str) -> list[str] | None:
    """The boundaries the driver set for this task's micro-batch (None: unset)."""
    try:
        text = task_property(BOUNDARIES_PROPERTY)
        return json.loads(text).get(graph_name) if text else None
    except Exception:  # noqa: BLE001 - unreadable: run the compiled boundaries
        return None


def task_piece_counting(graph_name: str) -> str:
    """How this task's graph pieces count themselves (PIECE_COUNTING_PROPERTY; "nodes" when unset)."""
    try:
        text = task_property(PIECE_COUNTING_PROPERTY)
        counting = json.loads(text).get(graph_name, "nodes") if text else "nodes"
    except Exception:  # noqa: BLE001 - unreadable: as the query was compiled
        return "nodes"
    return counting if counting in ("nodes", "runs", "off") else "nodes"


def task_combiner(plan: CombinePlan) -> Combiner | None:
    """A combiner of `plan`'s records for this task (fissure.runtime.operators.combine). A window's
    needs its batch's watermarks: read from the batch's clock when the clock is this batch's;
    otherwise None, the records travel whole and the window's keyed stage judges them."""
    if not plan.needs_clock:
        return Combiner(plan)
    text = task_property(BATCH_CLOCK_PROPERTY)
    clock = BatchClock.from_json(text) if text else None
    if clock is None or clock.batch != task_batch():
        return None
    return Combiner(plan, clock.time_of(plan.time_field))


def fold_envelopes(combiner: Combiner, layout: EnvelopeLayout, batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch`'s envelopes without the combined operator's live input rows, which go into
    `combiner` (fissure.runtime.operators.combine); the dead letters it makes of them (late, failed, no key)
    take their place."""
    plan = combiner.plan
    mine = pc.and_(pc.equal(batch.column(0), pa.scalar(layout.route_of(plan.stream), pa.int32())),
                   batch.column(batch.schema.get_field_index(DEAD_OPERATOR)).is_null())
    if not pc.any(mine).as_py():
        return batch
    dead = combiner.add(layout.extract(batch, plan.stream))
    rest = batch.filter(pc.invert(mine))
    if not dead:
        return rest
    return assemble([rest, layout.wrap_dead(dead_letter_batch(dead, plan.input_schema), plan.name)], layout.schema)


class GraphRegionFunction:
    """A pe stage's mapInArrow function: its pieces in one processing element."""

    def __init__(self, graph: StreamGraph, schemas, layout: EnvelopeLayout, stages, stage: GraphStage,
                 boundaries: Iterable[str], profile_prefix: str | None, query_token: str,
                 waiting: Mapping[str, WaitingOperator] | None = None,
                 output_layout: EnvelopeLayout | None = None, source_envelopes=None,
                 stage_profiling: StageProfiling | None = None, pack_for: PackSpec | None = None,
                 publishes: bool = False, combine: CombinePlan | None = None,
                 packed_input: pa.Schema | None = None) -> None:
        self.graph, self.schemas, self.layout, self.stages, self.stage = graph, schemas, layout, stages, stage
        # set: the input comes packed in order (pack_rows) by the keyed stage before, envelopes of this schema
        self.packed_input = packed_input
        # set: the keyed stage after folds partials (fissure.runtime.operators.combine); made here per task call
        self.combine = combine if pack_for is not None else None
        # The query's last stage carries the driver's published text into the report rows: its
        # tasks read their own batch's local properties, while (measured on Spark 4.3) a
        # mapInArrow before the query's round-robin repartition read the previous batch's.
        self.publishes = publishes
        self.pack_for = pack_for  # set: the output is packed for the keyed stage that follows
        self.source_envelopes = source_envelopes  # set: the input is the source's rows, not envelopes
        self.stage_profiling = stage_profiling
        self.output_layout = output_layout or layout  # `layout`: the pieces', with the streams made here
        self.waiting = dict(waiting or {})
        # The worker keeps a PE's processes per region id: one query's pieces never serve another.
        self.region_id = f"graph/{graph.name}/{query_token}/{stage.label}"
        self.boundaries = tuple(sorted(set(boundaries) & set(stage.nodes)))
        self.profile_prefix = profile_prefix
        self._pieces: dict[tuple[str, ...], list] = {}

    def pieces_for_call(self) -> list:
        requested = task_boundaries(self.graph.name)
        boundaries = self.boundaries if requested is None else tuple(sorted(set(requested) & set(self.stage.nodes)))
        counting = task_piece_counting(self.graph.name) if self.profile_prefix is not None else "off"
        pieces = self._pieces.get((boundaries, counting))
        if pieces is None:
            prefix = {"off": None, "runs": f"{self.profile_prefix}{RUNS_MARK}"}.get(counting, self.profile_prefix)
            pieces = self._pieces[boundaries, counting] = build_pieces(
                self.graph, self.schemas, self.layout, self.stages, self.stage, boundaries, prefix, self.waiting,
                self.stage_profiling, by_node=counting == "nodes")
        return pieces

    def __call__(self, batches: Iterator[pa.RecordBatch], pieces=None, report: bool = True) -> Iterator[pa.RecordBatch]:
        """The stage's envelopes; with `report`, then its report row (fissure.runtime.profiling.report_rows)
        when it has one (ProfiledGraphRegion asks for it itself, with the call's counts)."""
        pieces = pieces if pieces is not None else self.pieces_for_call()
        if self.source_envelopes is not None:
            batches = self.source_envelopes(batches)
        if self.packed_input is not None:
            batches = unpacked(batches, self.packed_input)
        packed_any = False
        combiner = self.combiner()
        # the combined operator's records folded from the dicts of the run that emits them
        # (fissure.runtime.operators.dict_fold); otherwise from the element's Arrow output below
        record_fold = RecordFold.of(combiner, pieces)
        if record_fold is not None:
            outputs = record_fold.outputs(pieces[0], batches, self.output_layout)
        else:
            outputs = processing_element([[piece] for piece in pieces], self.region_id).process(batches)
        for batch in outputs:
            if batch.num_rows:
                batch = self.output_layout.conform(batch)
                if combiner is not None:
                    batch = self.fold(combiner, batch)
                    if not batch.num_rows:
                        continue
                yield batch if self.pack_for is None else pack(batch, self.packing(packed_any))
                packed_any = True
        if combiner is not None:
            partials = combiner.partials()
            if partials.num_rows:
                yield pack_partials(partials, PARTIAL_KEY, self.packing(packed_any))
                packed_any = True
        if report:
            row = self.report_batch(None)
            if row is not None:
                packed_any = True
                yield row
        if not packed_any and self.pack_for is not None and self.pack_for.every_group:
            yield empty_groups(self.output_layout.schema, self.pack_for)

    def packing(self, packed_before: bool) -> PackSpec:
        """How this call's next output is packed: every group of a time-aware stage after rides
        the call's first packed output only, not each of them."""
        return replace(self.pack_for, every_group=False) if packed_before else self.pack_for

    def combiner(self) -> Combiner | None:
        """This call's combiner of the keyed operator after the stage (None: not combined)."""
        return task_combiner(self.combine) if self.combine is not None else None

    def fold(self, combiner: Combiner, batch: pa.RecordBatch) -> pa.RecordBatch:
        return fold_envelopes(combiner, self.output_layout, batch)

    def report_batch(self, operators: Mapping[str, Sequence[float]] | None) -> pa.RecordBatch | None:
        """This task's report row: the operators' counts of the call, the published text in the
        last stage; None when there is neither."""
        if not operators and not self.publishes:
            return None
        text = report_text(self.stage.position, task_property(PUBLISHED_PROPERTY) if self.publishes else None,
                           operators)
        envelope = report_envelope(self.output_layout.schema, text)
        return envelope if self.pack_for is None else pack(envelope, self.pack_for)


class SourceEnvelopeFunction:
    """mapInArrow function turning a source's rows into envelopes routed to the source, with
    sequence numbers `source index << 56 | task partition << 40 | row in the partition`; a row
    the source could not read (text that is not UTF-8, a malformed JSON or CSV line) becomes a
    dead letter of the source (fissure.runtime.records.source_rows)."""

    def __init__(self, name: str, index: int, layout: EnvelopeLayout, source_schema: pa.Schema,
                 pack_for: PackSpec | None = None, line_format: LineFormat | None = None,
                 combine: CombinePlan | None = None) -> None:
        self.name, self.index, self.layout, self.source_schema = name, index, layout, source_schema
        self.pack_for = pack_for  # set: the envelopes are packed for the keyed stage that follows
        # set: that stage's aggregate reads this source; its records are folded here (no clock: no window)
        self.combine = combine if pack_for is not None and combine is not None and not combine.needs_clock else None
        self.line_format = line_format  # the source's JSON or CSV lines: what is wrong with an unreadable one

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        first_seq = (self.index << SOURCE_SHIFT) + (TaskContext.get().partitionId() << SEQ_PARTITION_SHIFT)
        packed_any = False
        combiner = Combiner(self.combine) if self.combine is not None else None
        for batch in batches:
            carried = carried_source_batch(batch, self.source_schema, first_seq, self.name, self.line_format)
            first_seq += batch.num_rows
            envelopes = self.layout.wrap(carried, self.name)
            if combiner is not None:
                envelopes = fold_envelopes(combiner, self.layout, envelopes)
                if not envelopes.num_rows:
                    continue
            packed_any = packed_any or envelopes.num_rows > 0
            yield envelopes if self.pack_for is None else pack(envelopes, self.pack_for)
        if combiner is not None:
            partials = combiner.partials()
            if partials.num_rows:
                packed_any = True
                yield pack_partials(partials, PARTIAL_KEY, self.pack_for)
        if not packed_any and self.pack_for is not None and self.pack_for.every_group:
            yield empty_groups(self.layout.schema, self.pack_for)


class TickEnvelopeFunction:
    """mapInArrow function of the end-of-input control source (fissure.spark.query.time_log): one
    report envelope per task that read a marker line, with no operator's counts. Every stage
    passes it on (fissure.runtime.profiling.report_rows), so each keyed stage is called at least once and
    sends every bucket of a time-aware stage after it on; no sink reads it, it is no dead letter."""

    def __init__(self, layout: EnvelopeLayout, pack_for: PackSpec | None = None) -> None:
        self.layout, self.pack_for = layout, pack_for

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        if sum(batch.num_rows for batch in batches):
            envelope = report_envelope(self.layout.schema, report_text(-1, None, None))
            yield envelope if self.pack_for is None else pack(envelope, self.pack_for)


