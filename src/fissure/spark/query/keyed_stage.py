"""The function Spark ships to its Python workers for a keyed node: `GraphStateProcessor`, the
transformWithStateInPandas handler of one partitioned or stateful operator, or a join, over
envelopes (fissure.spark.query.compile_graph builds the query around it).

It is the Spark layer's (it implements Spark's StatefulProcessor and reads the task's local
properties through fissure.spark.query.stages) and hands the real work to fissure.runtime.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from fissure.model.types import Kind
from fissure.spark.state.handler import StateVariable, register_state_variables
from fissure.spark.state.requests import BatchedMapState
from fissure.program.nodes import NodeKind
from fissure.program.graph import StreamGraph
from fissure.runtime.records.columns import DEAD_COLUMNS, DEAD_OPERATOR, SEQ, carried_schema
from fissure.runtime.records.carried import assemble, dead_letter_batch, reshape_dead, split_dead
from fissure.runtime.operators.join import LEFT, RIGHT, JoinStep, arrivals_of, joined_batch, run_join_group
from fissure.runtime.records.envelopes import EnvelopeLayout
from fissure.runtime.records.gc_pause import collector_paused
from fissure.runtime.state.key_buckets import SubBucketStore
from fissure.runtime.operators.keyed import StatefulStep, run_group, run_grouped_keys, run_keys
from fissure.runtime.state.codec import StateAccess, StateCodec
from fissure.runtime.state.grouping_keys import BALANCED_KEYS, GroupingKeys
from fissure.runtime.operators.combine import (PARTIAL_KEY, PARTIAL_SCHEMA, CombinePlan, Combiner,
                                               combined_key_function, is_partial_schema, partial_inputs)
from fissure.runtime.operators.packing import (PackSpec, empty_groups, pack, pack_partials, pack_rows, unpack,
                                               unpack_apart)
from fissure.runtime.operators.timed import max_event_time, per_key_step
from fissure.runtime.operators.time_tally import TimeTally
from fissure.runtime.operators.watermark import Deadlines
from fissure.runtime.profiling.profiler import RECORDS_IN, ProfiledKeyFunction, ProfiledUpdate
from fissure.runtime.profiling.report_rows import report_envelope, report_text, reported_counts
from fissure.spark.query.stages import (KEY, PUBLISHED_PROPERTY, SPREAD_PREFIX, WorkerProfiling, fold_envelopes,
                                        task_attempt, task_batch, task_clock, task_combiner, task_property)


def carried_batch_from_pandas(frame: pd.DataFrame, carried_input: pa.Schema) -> pa.RecordBatch:
    """One key's rows as a carried Arrow batch.

    PySpark renames columns that start with "_" on the way in (namedtuple rules): the columns are
    taken by position. Column by column through numpy objects: `RecordBatch.from_pandas` costs
    about 0.8 ms per call, far more than a key's few rows.
    """
    columns = frame.to_numpy(dtype=object).T
    return pa.RecordBatch.from_arrays(
        [pa.array(values, type=field.type, from_pandas=True) for values, field in zip(columns, carried_input)],
        schema=carried_input)


def pandas_frame(batch: pa.RecordBatch) -> pd.DataFrame:
    """A carried batch as pandas, column by column (about half the cost of `to_pandas` on a few
    rows); dates and times through pandas so they keep their time zone."""
    return pd.DataFrame({name: column.to_pandas() if pa.types.is_temporal(column.type)
                         else column.to_numpy(zero_copy_only=False)
                         for name, column in zip(batch.schema.names, batch.columns)}, copy=False)


@dataclass(frozen=True)
class StageTime:
    """What a keyed stage needs of the program's time (fissure.spark.query.time_log): the run's
    TimeTally accumulator (None: nothing reported), whether the node is time-aware and the
    event-time field it reads (None: processing time)."""

    tally: object = None
    time_aware: bool = False
    field: str | None = None


class GraphStateProcessor(StatefulProcessor):
    """transformWithStateInPandas handler of one keyed node over envelopes.

    An operator's input arrives packed (`packed_input`, fissure.runtime.operators.packing): a group's
    envelopes in a few rows of Arrow IPC, not a row per record. A partitioned operator's groups
    are buckets of keys (`bucketed`: crc32 of the key's text mod the checkpoint's bucket count): one call runs
    every key of the bucket in the batch, the keys' states in MapState entries laid out by how
    densely the batches touch them (fissure.runtime.state.key_buckets). Spark's cost per group (a Python
    call, a pandas frame each way, state-server round trips) is paid per bucket instead of per key
    (1,590 us a group calibrated, benchmarks/results/calibrate_defaults.md). An unkeyed operator
    has one group and one ValueState. A join's groups are its key texts, as rows, each pair's
    state a ValueState. Every stored value is sealed by the operator's StateCodec
    (fissure.runtime.state.codec): data by default, signed pickles when the operator asks.
    """

    STATE_NAME = "fissure_state"
    KEYS_STATE_NAME = "fissure_key_buckets"  # a bucket's sub-buckets of keys (fissure.runtime.state.key_buckets)
    # A time-aware operator's bucket: when each of its keys next fires (JSON of Deadlines).
    DEADLINES_STATE_NAME = "fissure_deadlines"

    def __init__(self, graph: StreamGraph, schemas, layout: EnvelopeLayout, node_name: str,
                 forward_inputs: Sequence[str], output_layout: EnvelopeLayout | None = None,
                 profiling: WorkerProfiling | None = None, packed_input: bool = False,
                 pack_for: PackSpec | None = None, stage_position: int = 0, publishes: bool = False,
                 state_access: StateAccess = StateAccess(), time: StageTime = StageTime(),
                 combine: CombinePlan | None = None, fold_for: CombinePlan | None = None,
                 pack_through: bool = False, grouping_keys: GroupingKeys = BALANCED_KEYS) -> None:
        self.graph, self.schemas, self.layout = graph, schemas, layout
        self.grouping_keys = grouping_keys  # the values its buckets' rows carry (fissure.runtime.state.grouping_keys)
        self.combine = combine  # set: the stage before sends partials (fissure.runtime.operators.combine)
        # set: the keyed stage after merges partials; each call here folds its output records for it
        self.fold_for = fold_for if pack_for is not None else None
        self.state_access = state_access
        self.time = time
        self._grouped_task = None  # the task attempt that already sent every group on (see handleInputRows)
        self.stage_position = stage_position
        self.publishes = publishes  # the query's last stage: see GraphRegionFunction
        self.profiling = profiling
        self.packed_input = packed_input  # groups arrive packed (fissure.runtime.operators.packing)
        self.pack_for = pack_for  # set: the output is packed for the keyed stage that follows
        # the output is packed in order for the pe stage that follows in the same Spark stage (pack_rows)
        self.pack_through = pack_through and pack_for is None
        self.output_layout = output_layout or layout
        self.node = graph.node(node_name)
        self.forward_inputs = tuple(forward_inputs)
        self.bucketed = self.node.kind is NodeKind.OPERATOR and self.node.operator.kind is Kind.PARTITIONED
        self.input_schema = pa.schema(list(layout.schema) + [pa.field(KEY, pa.string())])  # unpacked: a join's
        self._payload = 1  # the payload's position in a packed group's frame (after the key)
        self._state = None  # a ValueState, or the MapState of a bucket's sub-buckets of keys
        # A key group holds live rows of the node's inputs only (every other row has a spread
        # key). One input and nothing to forward: the group's columns are the carried batch the
        # operator reads, without extracting its stream's rows.
        self._direct = self.node.kind is not NodeKind.JOIN and not self.forward_inputs
        stream = self.node.inputs[0]
        self._direct_columns = (*layout.columns_of(stream), SEQ, *DEAD_COLUMNS)
        self._direct_schema = carried_schema(schemas[stream])
        self._step = self._stateful_step() if self.node.kind is not NodeKind.JOIN else None
        self._combined_step = self._stateful_step(combined=True) if combine is not None else None

    def state_variables(self) -> tuple[StateVariable, ...]:
        """The state variables this handler registers with Spark (fissure.spark.state.handler)."""
        if self.bucketed:
            keys = StateVariable("map", self.KEYS_STATE_NAME, ("entry int", "value binary"))
            if self.time.time_aware:
                return keys, StateVariable("value", self.DEADLINES_STATE_NAME, ("value binary",))
            return (keys,)
        return (StateVariable("value", self.STATE_NAME, ("value binary",)),)

    def init(self, handle) -> None:
        self.attach(register_state_variables(handle, self.state_variables()))

    def attach(self, states: Mapping[str, object]) -> None:
        """Take the registered state variables (by name) into use."""
        if self.bucketed:
            self._state = states[self.KEYS_STATE_NAME]
            self._batched_state = BatchedMapState(self._state)
            if self.time.time_aware:
                self._deadlines = states[self.DEADLINES_STATE_NAME]
        else:
            self._state = states[self.STATE_NAME]

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: N802 - Spark's name
        partials: list[pa.RecordBatch] = []
        if self.packed_input:  # a few rows, each a part of the group's envelopes (fissure.runtime.operators.packing)
            payloads = [payload for frame in rows for payload in frame.iloc[:, self._payload]]
            spread = key[0] < 0
            if self.combine is not None and not spread:  # partials come apart from envelopes
                batch, partials = unpack_apart(payloads, self.layout.schema, is_partial_schema)
            else:
                batch = unpack(payloads, self.layout.schema)
        else:  # a join's group: its envelopes as rows, the key text last
            frames = list(rows)
            frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
            batch = carried_batch_from_pandas(frame, self.input_schema).select(self.layout.schema.names)
            spread = str(key[0]).startswith(SPREAD_PREFIX)
        # The bucket its rows' value stands for (a join's key is its text; an unkeyed operator's group is 0).
        self._bucket = (self.grouping_keys.bucket_of(int(key[0])) if self.bucketed and not spread
                        else int(key[0]) if self.node.kind is not NodeKind.JOIN else 0)
        update = self._step.fn if self._step is not None else None
        counted = update.live_counts() if not spread and isinstance(update, ProfiledUpdate) else None
        counted_before = list(counted) if counted is not None else None
        if spread:
            result = self.output_layout.conform(batch)  # rows of other nodes: through, no state
        elif self._direct:
            columns = [batch.column(batch.schema.get_field_index(name)) for name in self._direct_columns]
            carried = pa.RecordBatch.from_arrays(columns, schema=self._direct_schema)
            result = self.output_layout.wrap(self._run_operator(carried, partials), self.node.name)
        else:
            parts = [self.output_layout.wrap(self._run(batch), self.node.name)]
            parts += [self.output_layout.conform(self._rows_of(batch, stream)) for stream in self.forward_inputs]
            result = assemble(parts, self.output_layout.schema)
        operators = None
        if counted is not None:
            delta = [now - then for now, then in zip(counted, counted_before)]
            operators = {self.node.name: reported_counts(delta)} if delta[RECORDS_IN] else None
        if operators or self.publishes:
            text = report_text(self.stage_position, task_property(PUBLISHED_PROPERTY) if self.publishes else None,
                               operators)
            result = assemble([result, report_envelope(self.output_layout.schema, text)], self.output_layout.schema)
        outgoing = None  # partials for the keyed stage after
        folded = self._fold(result)
        if folded is not None:
            result, outgoing = folded
        if self.pack_for is not None and self.pack_for.every_group:
            # A time-aware stage follows: every bucket of it runs in the batch (its due keys
            # fire), from the first call of each task here; pack() adds them to calls with rows.
            attempt = task_attempt()
            if attempt != self._grouped_task:
                self._grouped_task = attempt
                if not result.num_rows and outgoing is None:  # partials are packed with every group
                    yield pandas_frame(empty_groups(self.output_layout.schema, self.pack_for))
        if result.num_rows:
            yield pandas_frame(pack(result, self.pack_for) if self.pack_for is not None
                               else pack_rows(result) if self.pack_through else result)
        if outgoing is not None:  # every group once: pack() added them when there were rows
            yield pandas_frame(pack_partials(outgoing, PARTIAL_KEY, self.pack_for if not result.num_rows
                                             else replace(self.pack_for, every_group=False)))

    def _fold(self, result: pa.RecordBatch) -> tuple[pa.RecordBatch, pa.RecordBatch | None] | None:
        """The call's envelopes without the records folded for the keyed stage after (their dead
        letters in their place), and the partials (fissure.runtime.operators.combine; None: no
        partial); None: nothing folded (no such records, or a window's clock that is not this
        batch's: they travel whole)."""
        if self.fold_for is None or not result.num_rows:
            return None
        combiner = task_combiner(self.fold_for)
        if combiner is None:
            return None
        rest = fold_envelopes(combiner, self.output_layout, result)
        if not combiner.records_in:
            return None
        partials = combiner.partials()
        return rest, partials if partials.num_rows else None

    def _rows_of(self, batch: pa.RecordBatch, stream: str) -> pa.RecordBatch:
        """The live envelopes of `stream` (forwarded to a later consumer)."""
        return batch.filter(pc.and_(pc.equal(batch.column(0), pa.scalar(self.layout.route_of(stream), pa.int32())),
                                    batch.column(batch.schema.get_field_index(DEAD_OPERATOR)).is_null()))

    def _run(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The node's carried output from a group's envelopes (the node's input rows among them)."""
        node, schemas = self.node, self.schemas
        if node.kind is not NodeKind.JOIN:
            return self._run_operator(self.layout.extract(batch, node.inputs[0]))
        spec = node.join
        step = JoinStep(node.name, spec.fn, spec.window.time_field, spec.window.size, spec.window.lateness, spec.schema,
                        tuple(spec.key), self.state_access.trust_legacy_pickle)
        arrivals = [arrival for side, stream in ((LEFT, node.inputs[0]), (RIGHT, node.inputs[1]))
                    for arrival in arrivals_of(self.layout.extract(batch, stream), schemas[stream], side)]
        stored = self._state.get()
        result = run_join_group(step, arrivals, stored[0] if stored is not None else None)
        if result.state is not None:
            self._state.update((result.state,))
        return joined_batch(step, result.records, result.seqs, result.dead)

    def _run_operator(self, carried: pa.RecordBatch, partials: Sequence[pa.RecordBatch] = ()) -> pa.RecordBatch:
        """A stateful operator over a group's carried input rows (and a combined operator's
        partials): a bucket's keys or the one state. The cyclic collector waits while the
        group's records and states are dicts (fissure.runtime.records.gc_pause)."""
        with collector_paused():
            return self._run_state(carried, partials)

    def _run_state(self, carried: pa.RecordBatch, partials: Sequence[pa.RecordBatch]) -> pa.RecordBatch:
        codec = self._step.state_codec
        if self.bucketed:
            state = self._batched_state
            keys = SubBucketStore(state.read, state.write, codec, remove=state.remove, entries=state.entries)
            if partials:
                result = self._run_partials(carried, partials, keys)
            elif self._step.per_key:
                result = self._run_per_key(carried, keys)
            else:
                result = run_keys(self._step, carried, keys.load, keys.store, keys.prefetch)
            keys.flush()
            self._report_keys(keys.keys)
            return result
        stored, migrated = self._state.get(), False
        if stored is not None and codec.is_legacy(stored[0]):  # an earlier fissure's pickle: only while migrating
            stored, migrated = (codec.dumps(codec.unpickle_legacy(stored[0]), ""), codec.use_pickle), True
        elif stored is not None:
            stored = codec.unseal(stored[0])
        result = run_group(self._step, carried, stored)
        if result.deleted:
            self._state.clear()
        elif result.state is not None or migrated:
            self._state.update((codec.seal(result.state if result.state is not None else stored[0]),))
        self._report_keys(0 if result.deleted or (stored is None and result.state is None) else 1)
        return result.batch

    def _run_per_key(self, carried: pa.RecordBatch, keys: SubBucketStore) -> pa.RecordBatch:
        """A window, aggregate, deduplication or expiring operator over a bucket's keys: those
        with records in the batch, then those due at the batch's clock (fissure.runtime.operators.keyed)."""
        if not self.time.time_aware:  # an aggregate without expiry: no time
            return run_keys(self._step, carried, keys.load, keys.store, keys.prefetch)
        clock = task_clock()
        time = clock.time_of(self.time.field)
        stored = self._deadlines.get()
        deadlines = Deadlines(json.loads(stored[0]) if stored is not None else None)
        due = deadlines.due(time.current)
        result = run_keys(self._step, carried, keys.load, keys.store, keys.prefetch, time=time, due=due,
                          deadline=deadlines.set)
        if len(deadlines):
            self._deadlines.update((json.dumps(deadlines.deadlines).encode(),))
        elif stored is not None:
            self._deadlines.clear()
        if self.time.field is not None and self.time.tally is not None and carried.num_rows:
            live = carried.filter(carried.column(carried.schema.get_field_index(DEAD_OPERATOR)).is_null())
            largest = max_event_time(live.column(self.time.field).to_pylist()) if live.num_rows else None
            if largest is not None:
                tally = TimeTally()
                tally.saw(clock.batch, largest)
                self.time.tally.add(tally)
        return result

    def _run_partials(self, carried: pa.RecordBatch, partials: Sequence[pa.RecordBatch],
                      keys: SubBucketStore) -> pa.RecordBatch:
        """A combined operator over a bucket's partials (fissure.runtime.operators.combine): merged into its
        keys' states, then the keys due at the batch's clock. Records that came whole (a task
        that could not combine them) are folded here first, under the same clock."""
        step, time, deadlines, stored = self._combined_step, None, None, None
        if self.time.time_aware:
            clock = task_clock()
            time = clock.time_of(self.time.field)
            stored = self._deadlines.get()
            deadlines = Deadlines(json.loads(stored[0]) if stored is not None else None)
        live, upstream_dead = split_dead(carried)
        parts, folded_dead = list(partials), []
        if live.num_rows:
            combiner = Combiner(self.combine, time if self.combine.needs_clock else None)
            folded_dead = combiner.add(live)
            parts.append(combiner.partials())
        merged = pa.Table.from_batches(parts, schema=PARTIAL_SCHEMA).combine_chunks()
        decoded = partial_inputs(merged.to_batches()[0] if merged.num_rows else
                                 pa.RecordBatch.from_pylist([], schema=PARTIAL_SCHEMA), step.state_codec)
        result = run_grouped_keys(step, decoded.grouped, decoded.inputs, decoded.seqs, keys.load, keys.store,
                                  keys.prefetch, time=time, due=deadlines.due(time.current) if deadlines else (),
                                  deadline=deadlines.set if deadlines is not None else None)
        if deadlines is not None:
            if len(deadlines):
                self._deadlines.update((json.dumps(deadlines.deadlines).encode(),))
            elif stored is not None:
                self._deadlines.clear()
        if self.time.field is not None and self.time.tally is not None and decoded.largest is not None:
            tally = TimeTally()
            tally.saw(task_clock().batch, decoded.largest)
            self.time.tally.add(tally)
        output_schema = self._step.output_schema
        return assemble([result, reshape_dead(upstream_dead, output_schema) if upstream_dead is not None else None,
                         dead_letter_batch(folded_dead, output_schema) if folded_dead else None], result.schema)

    def _report_keys(self, count: int) -> None:
        """The keys this call's bucket (or the unkeyed state) holds now: the run's state_keys."""
        batch = task_batch()
        if self.time.tally is None or batch is None:
            return
        tally = TimeTally()
        tally.held(batch, self.node.name, self._bucket, count)
        self.time.tally.add(tally)

    def _stateful_step(self, combined: bool = False) -> StatefulStep:
        node, operator = self.node, self.node.operator
        if operator.per_key:
            wrap = None if self.profiling is None else (lambda function: ProfiledKeyFunction(
                function, operator.name, self.profiling.accumulator, self.profiling.timed_every_records))
            time_field = self.time.field if self.time.time_aware else None
            if combined:
                function = combined_key_function(operator, time_field)
                return StatefulStep(name=operator.name, fn=wrap(function) if wrap is not None else function,
                                    state_factory=dict, input_schema=self.schemas[node.inputs[0]],
                                    output_schema=self.schemas[node.name], key=operator.key, per_key=True)
            return per_key_step(operator, self.schemas[node.inputs[0]], self.schemas[node.name], time_field, wrap)
        fn = operator.fn if self.profiling is None else ProfiledUpdate(
            operator.fn, operator.name, self.profiling.accumulator, self.profiling.timed_every_records)
        access = self.state_access
        codec = StateCodec(operator.name, use_pickle=operator.state_codec == "pickle", key=access.key,
                           trust_legacy_pickle=access.trust_legacy_pickle)
        return StatefulStep(name=operator.name, fn=fn, state_factory=operator.state_factory,
                            input_schema=self.schemas[node.inputs[0]], output_schema=self.schemas[node.name],
                            key=operator.key, order_by=operator.order_by, codec=codec)

    def close(self) -> None:
        pass
