"""The grouping key scheme a checkpoint keeps (fissure.spark.checkpoint.state_layout)."""

from __future__ import annotations

import json

import pytest

from fissure.runtime.state.grouping_keys import BALANCED_KEYS, PLAIN_KEYS
from fissure.spark.checkpoint.files import LocalStore
from fissure.spark.checkpoint.state_layout import (
    STATE_LAYOUT_RECORD, UnknownStateLayout, checkpoint_grouping_keys, record_grouping_keys,
)


def test_a_new_checkpoint_gets_the_balanced_scheme_and_keeps_it(tmp_path):
    store = LocalStore(str(tmp_path))
    assert checkpoint_grouping_keys(store, fresh=True) is BALANCED_KEYS
    record_grouping_keys(store, BALANCED_KEYS)
    assert json.loads(store.read(STATE_LAYOUT_RECORD)) == {"grouping_keys": "balanced-1"}
    assert checkpoint_grouping_keys(store, fresh=False) is BALANCED_KEYS


def test_a_checkpoint_an_earlier_fissure_ran_on_keeps_the_plain_bucket_numbers(tmp_path):
    store = LocalStore(str(tmp_path))
    assert checkpoint_grouping_keys(store, fresh=False) is PLAIN_KEYS
    record_grouping_keys(store, PLAIN_KEYS)
    assert checkpoint_grouping_keys(store, fresh=True) is PLAIN_KEYS  # the record wins


@pytest.mark.parametrize("text, message", [('{"grouping_keys": "balanced-9"}', "written by a later fissure"),
                                           ("not json", "cannot be read"), ('{"other": 1}', "cannot be read")])
def test_an_unknown_or_unreadable_scheme_stops_the_start(tmp_path, text, message):
    store = LocalStore(str(tmp_path))
    store.write(STATE_LAYOUT_RECORD, text)
    with pytest.raises(UnknownStateLayout, match=message):
        checkpoint_grouping_keys(store, fresh=False)
