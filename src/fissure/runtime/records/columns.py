"""fissure's own columns, carried next to the user's fields between Spark stages.

Every stage's output is the operator's declared fields, then `_fissure_seq` (the record's
position in the source: source partition << 40 | row in that partition, within a micro-batch;
records an operator emits inherit the sequence number of the record they came from), then the
three dead-letter columns, null on live rows. A dead-letter row has null user fields.
"""

from __future__ import annotations

import pyarrow as pa

SEQ = "_fissure_seq"
DEAD_OPERATOR = "_fissure_dead_operator"
DEAD_ERROR = "_fissure_dead_error"
DEAD_RECORD = "_fissure_dead_record"
DEAD_COLUMNS = (DEAD_OPERATOR, DEAD_ERROR, DEAD_RECORD)
INTERNAL_COLUMNS = (SEQ, *DEAD_COLUMNS)

SEQ_PARTITION_SHIFT = 40  # room for 2**40 rows per source partition and micro-batch
SOURCE_SHIFT = 56  # a graph's sequence numbers: source index << SOURCE_SHIFT | position in the source

INTERNAL_FIELDS = (
    pa.field(SEQ, pa.int64()),
    pa.field(DEAD_OPERATOR, pa.string()),
    pa.field(DEAD_ERROR, pa.string()),
    pa.field(DEAD_RECORD, pa.string()),
)


def carried_schema(data_schema: pa.Schema) -> pa.Schema:
    """The schema a stage emits: the user's fields, then fissure's own columns."""
    return pa.schema(list(data_schema) + list(INTERNAL_FIELDS))

# A column of a source's frame only, never carried: the raw line of a record the source's reader
# could not read (Spark's `columnNameOfCorruptRecord` for JSON and CSV files). Its rows become dead
# letters of the source (fissure.runtime.records.source_rows).
CORRUPT_RECORD = "_fissure_corrupt_record"
