"""The grouping key scheme and bucket count a checkpoint's keyed state lives under, kept in the checkpoint.

Spark keeps a keyed stage's state by grouping key value, so the buckets a partitioned operator's
keys fall into and the values their rows carry (fissure.runtime.state.grouping_keys) belong to the
checkpoint: `fissure/state_layout.json` names the scheme and the bucket count, written by the
first start. A new checkpoint gets the balanced scheme with the count chosen for the session's
cores (fissure.model.state_buckets), or the one the configuration names. One that already ran
without the record was made by an earlier fissure, whose rows carried the plain numbers of 64
buckets, and keeps them; a record without a count is from the fissure that balanced 64 buckets. A
record naming a scheme or count this fissure does not know (a later one's) stops the start:
resuming under other buckets would read no state where state is.

Spark mechanism with no pyspark import: a record in the checkpoint, through its CheckpointStore.
"""

from __future__ import annotations

import json

from fissure.model.state_buckets import LEGACY_STATE_BUCKETS
from fissure.runtime.state.grouping_keys import PLAIN_KEYS, SCHEMES, GroupingKeys, balanced_keys, scheme_keys
from fissure.spark.checkpoint.files import CheckpointStore

STATE_LAYOUT_RECORD = "fissure/state_layout.json"


class UnknownStateLayout(RuntimeError):
    """The checkpoint's state was written under a grouping key scheme this fissure does not know."""


def checkpoint_grouping_keys(store: CheckpointStore, fresh: bool,
                             new_buckets: int = LEGACY_STATE_BUCKETS) -> GroupingKeys:
    """The scheme of the checkpoint in `store`: its record's; without one, the balanced scheme of
    `new_buckets` buckets for a checkpoint no stream ran on (`fresh`), else PLAIN_KEYS (an earlier
    fissure's)."""
    text = store.read(STATE_LAYOUT_RECORD)
    if text is None:
        return balanced_keys(new_buckets) if fresh else PLAIN_KEYS
    try:
        record = json.loads(text)
        scheme, buckets = record["grouping_keys"], record.get("buckets", LEGACY_STATE_BUCKETS)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise UnknownStateLayout(f"checkpoint {store.location}: its record {STATE_LAYOUT_RECORD} cannot be read "
                                 f"({error!r}); restore it from a copy of the checkpoint, or run on a new "
                                 f"checkpoint") from None
    keys = scheme_keys(scheme, buckets) if isinstance(scheme, str) and type(buckets) is int else None
    if keys is None:
        raise UnknownStateLayout(f"checkpoint {store.location} holds state under grouping key scheme {scheme!r} "
                                 f"with {buckets!r} buckets, which this fissure does not know (it knows "
                                 f"{', '.join(SCHEMES)}, with the bucket counts of fissure.model.state_buckets): "
                                 f"it was written by a later fissure; run that one on it, or run on a new checkpoint")
    return keys


def record_grouping_keys(store: CheckpointStore, keys: GroupingKeys) -> None:
    """Write the scheme and its bucket count into the checkpoint (once: an unchanged record is left as it is)."""
    text = json.dumps({"grouping_keys": keys.scheme, "buckets": keys.buckets}) + "\n"
    if store.read(STATE_LAYOUT_RECORD) != text:
        store.write(STATE_LAYOUT_RECORD, text)
