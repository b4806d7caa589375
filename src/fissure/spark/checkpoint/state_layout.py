"""The grouping key scheme a checkpoint's keyed state lives under, kept in the checkpoint.

Spark keeps a keyed stage's state by grouping key value, so the values a bucket's rows carry
(fissure.runtime.state.grouping_keys) belong to the checkpoint: `fissure/state_layout.json`
names the scheme, written by the first start. A new checkpoint gets BALANCED_KEYS; one that
already ran without the record was made by an earlier fissure, whose rows carried the plain
bucket numbers, and keeps PLAIN_KEYS. A record naming a scheme this fissure does not know (a later
one's) stops the start: resuming under other values would read no state where state is.

Spark mechanism with no pyspark import: a record in the checkpoint, through its CheckpointStore.
"""

from __future__ import annotations

import json

from fissure.runtime.state.grouping_keys import BALANCED_KEYS, PLAIN_KEYS, SCHEMES, GroupingKeys
from fissure.spark.checkpoint.files import CheckpointStore

STATE_LAYOUT_RECORD = "fissure/state_layout.json"


class UnknownStateLayout(RuntimeError):
    """The checkpoint's state was written under a grouping key scheme this fissure does not know."""


def checkpoint_grouping_keys(store: CheckpointStore, fresh: bool) -> GroupingKeys:
    """The scheme of the checkpoint in `store`: its record's; without one, BALANCED_KEYS for a
    checkpoint no stream ran on (`fresh`), else PLAIN_KEYS (an earlier fissure's)."""
    text = store.read(STATE_LAYOUT_RECORD)
    if text is None:
        return BALANCED_KEYS if fresh else PLAIN_KEYS
    try:
        scheme = json.loads(text)["grouping_keys"]
    except (ValueError, KeyError, TypeError) as error:
        raise UnknownStateLayout(f"checkpoint {store.location}: its record {STATE_LAYOUT_RECORD} cannot be read "
                                 f"({error!r}); restore it from a copy of the checkpoint, or run on a new "
                                 f"checkpoint") from None
    keys = SCHEMES.get(scheme)
    if keys is None:
        raise UnknownStateLayout(f"checkpoint {store.location} holds state under grouping key scheme {scheme!r}, "
                                 f"which this fissure does not know (it knows {', '.join(sorted(SCHEMES))}): it was "
                                 f"written by a later fissure; run that one on it, or run on a new checkpoint")
    return keys


def record_grouping_keys(store: CheckpointStore, keys: GroupingKeys) -> None:
    """Write the scheme into the checkpoint (once: an unchanged record is left as it is)."""
    text = json.dumps({"grouping_keys": keys.scheme}) + "\n"
    if store.read(STATE_LAYOUT_RECORD) != text:
        store.write(STATE_LAYOUT_RECORD, text)
