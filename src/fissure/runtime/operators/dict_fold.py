"""A combined operator's records folded from the dicts a fused per-record run emitted (no pyspark here).

The task combines an aggregate's records before the exchange (fissure.runtime.operators.combine).
When the last operator before it is a run of per-record operators (`map`, `filter`, `flat_map`)
in the same process, that run's output is dicts, which would become an Arrow batch
(records_to_batch) only to be folded into partials right after. `RecordFold` takes those dicts
instead and `Combiner.add_records` folds them as they are: no Arrow row per record, only the
partials (one per key per task) become Arrow.

The observable result is the Arrow path's: a record is judged as records_to_batch judges it
(`fitting_records`: not a dict, other fields than the schema's, a value of another type: the same
dead letter of the emitting operator, same reason and sequence number), and the dict folded is one
Arrow would give back unchanged: a plain dict whose values are exactly the Python type its field
converts back to (str for text, int in the field's range for integers, float for float64, bool).
A batch where any fitting record is not such a dict (an int in a float field becomes 3.0, a
float in an integer field 3, text that is not UTF-8 or an integer out of range fails only in
Arrow, a field of another type) is not taken: it goes through Arrow as before, so those records
are judged and folded exactly as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter

import pyarrow as pa

from fissure.program.aggregates import Count, Max, Mean, Min, Sum
from fissure.runtime.operators.combine import Combiner
from fissure.runtime.records.carried import assemble, dead_letter_batch, fitting_records, plain_dicts_of_size
from fissure.runtime.records.envelopes import EnvelopeLayout
from fissure.runtime.records.fate import DeadLetter

# fissure's own aggregates read a record's fields and never keep or change the dict: they fold the
# emitted dict itself; any other aggregate gets a fresh dict per record, as the Arrow path gives it.
_READS_ONLY = (Count, Sum, Min, Max, Mean)


@dataclass(frozen=True)
class _ExactField:
    name: str
    types: frozenset  # the Python types Arrow gives back unchanged for the field
    bits: int | None = None  # an integer field: its width
    signed: bool = True
    text: bool = False  # a text field: its values must encode as UTF-8


def exact_fields(schema: pa.Schema) -> tuple[_ExactField, ...] | None:
    """Per field, the values a dict may hold to be folded as Arrow would give it back; None when
    a field's type has none that round-trip unchanged on this path (lists, timestamps, float32, ...)."""
    fields = []
    for field in schema:
        none = {type(None)} if field.nullable else set()
        kind = field.type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            fields.append(_ExactField(field.name, frozenset({str} | none), text=True))
        elif pa.types.is_integer(kind):
            fields.append(_ExactField(field.name, frozenset({int} | none), kind.bit_width,
                                      pa.types.is_signed_integer(kind)))
        elif pa.types.is_float64(kind):
            fields.append(_ExactField(field.name, frozenset({float} | none)))
        elif pa.types.is_boolean(kind):
            fields.append(_ExactField(field.name, frozenset({bool} | none)))
        else:
            return None
    return tuple(fields)


def round_trips(records: list, fields: Iterable[_ExactField]) -> bool:
    """Whether every record is a plain dict whose values Arrow would give back unchanged: one pass
    per field over its values' types (C-level), plus a range for integers and UTF-8 for text."""
    if not records:
        return True
    if set(map(type, records)) != {dict}:
        return False
    return all(_field_types(list(map(itemgetter(field.name), records)), field) is not None for field in fields)


def _field_types(values: list, field: _ExactField) -> set | None:
    """The Python types of one field's values when Arrow gives every value back unchanged; None
    when one would change (or fail)."""
    types = set(map(type, values))
    if not types <= field.types:
        return None
    present = values if type(None) not in types else [value for value in values if value is not None]
    if not present:
        return types
    if field.bits is not None:
        low, high = (-(1 << (field.bits - 1)), (1 << (field.bits - 1)) - 1) if field.signed \
            else (0, (1 << field.bits) - 1)
        if min(present) < low or max(present) > high:
            return None
    elif field.text:
        joined = "".join(present)
        if not joined.isascii():
            try:
                joined.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: Arrow refuses it, the record is a dead letter there
                return None
    return types


def plain_columns(records: list, fields: Sequence[_ExactField]) -> dict[str, tuple[list, set]] | None:
    """Each field's values and their Python types, when every record is a plain dict of exactly
    the fields and every value round-trips (`round_trips`): then `fitting_records` has nothing to
    judge either, since a value of its field's exact type always fits. None otherwise. Its passes
    over the records (their types, their lengths, each field's values) are the few a batch needs:
    on the word count each pass over 120,000 dicts costs about 0.1 us a word, the records being
    too many for the processor's caches, so judging and folding share them."""
    if not records or not plain_dicts_of_size(records, len(fields)):
        return None
    columns = {}
    for field in fields:
        try:
            values = list(map(itemgetter(field.name), records))
        except KeyError:  # another field in its place
            return None
        types = _field_types(values, field)
        if types is None:
            return None
        columns[field.name] = (values, types)
    return columns


class RecordFold:
    """A task's fold of one combined operator's input straight from the dicts of the fused run
    that makes its stream (`stream`), for one call of the stage: `take` is offered each batch's
    records; the dead letters the combiner made of them wait in `dead` for the call's output."""

    def __init__(self, combiner: Combiner, fields: tuple[_ExactField, ...]) -> None:
        self.combiner = combiner
        self.stream = combiner.plan.stream
        self.fields = fields
        self.copies = type(combiner.plan.aggregate) not in _READS_ONLY
        self.names = combiner.plan.input_schema.names
        self.dead: list[DeadLetter] = []  # the combiner's, not yet in an output batch
        self.folded = 0  # records folded from dicts
        self.batches_taken = self.batches_refused = 0

    @classmethod
    def of(cls, combiner: Combiner | None, pieces) -> RecordFold | None:
        """A fold for this call, or None (the stage's output goes through Arrow into the
        combiner): one piece only (several run in a chain of processes, and the last one's output
        crosses a process as Arrow), its stream made there by a fused run ending in a per-record
        operator, and a schema whose fields have values that round-trip unchanged."""
        if combiner is None or len(pieces) != 1:
            return None
        stream = combiner.plan.stream
        node = next((node for node in pieces[0].nodes if node.name == stream), None)
        if node is None or node.stage is None or not node.stage.ends_per_record:
            return None
        fields = exact_fields(combiner.plan.input_schema)
        if fields is None or not node.output_schema.equals(combiner.plan.input_schema):
            return None
        return cls(combiner, fields)

    def take(self, records: list, seqs: list[int], schema: pa.Schema, operator: str,
             dead: list[DeadLetter]) -> bool:
        """Fold `records` (the fused run's output, `operator`'s) if every one either becomes the
        dead letter records_to_batch makes of it or round-trips; False: nothing done, the run
        makes its Arrow batch as before."""
        judged: list[DeadLetter] = []
        columns = plain_columns(records, self.fields)
        if columns is not None:  # the good path: every record fits and round-trips, its columns at hand
            fitting, fitting_seqs = records, seqs
        else:
            fitting, fitting_seqs = fitting_records(records, seqs, schema, operator, judged)
            if not round_trips(fitting, self.fields):
                self.batches_refused += 1
                return False
        self.batches_taken += 1
        dead.extend(judged)
        if self.copies:
            names = self.names
            fitting = [{name: record[name] for name in names} for record in fitting]
        key = self.combiner.plan.key
        key_column = columns.get(key[0]) if columns is not None and len(key) == 1 else None
        self.dead.extend(self.combiner.add_records(fitting, fitting_seqs, key_column))
        self.folded += len(fitting)
        return True

    def outputs(self, piece, batches: Iterator[pa.RecordBatch], layout: EnvelopeLayout) -> Iterator[pa.RecordBatch]:
        """The piece's output envelopes for `batches` (as fissure.runtime.pe.region's
        SequentialElement gives them), each followed by the dead letters the combiner made of
        its records, as fold_envelopes places them (in `layout`)."""
        plan = self.combiner.plan
        for batch in batches:
            if not batch.num_rows:
                continue
            output = piece(batch, self)
            if self.dead:
                dead, self.dead = self.dead, []
                output = assemble([layout.conform(output),
                                   layout.wrap_dead(dead_letter_batch(dead, plan.input_schema), plan.name)],
                                  layout.schema)
            if output.num_rows:
                yield output
