"""The grouping key scheme a checkpoint keeps (fissure.spark.checkpoint.state_layout)."""

from __future__ import annotations

import json

import pytest

from fissure.runtime.state.grouping_keys import BALANCED_KEYS, PLAIN_KEYS, balanced_keys
from fissure.spark.checkpoint.files import LocalStore
from fissure.spark.checkpoint.state_layout import (
    STATE_LAYOUT_RECORD, UnknownStateLayout, checkpoint_grouping_keys, record_grouping_keys,
)


def test_a_new_checkpoint_gets_the_balanced_scheme_with_the_count_asked_and_keeps_both(tmp_path):
    store = LocalStore(str(tmp_path))
    assert checkpoint_grouping_keys(store, fresh=True, new_buckets=8) is balanced_keys(8)
    record_grouping_keys(store, balanced_keys(8))
    assert json.loads(store.read(STATE_LAYOUT_RECORD)) == {"grouping_keys": "balanced-1", "buckets": 8}
    # a later start asks for another count (more cores): the checkpoint's wins
    assert checkpoint_grouping_keys(store, fresh=False, new_buckets=16) is balanced_keys(8)
    assert checkpoint_grouping_keys(store, fresh=True, new_buckets=64) is balanced_keys(8)


def test_a_record_without_a_count_is_the_64_buckets_it_was_written_for(tmp_path):
    store = LocalStore(str(tmp_path))
    store.write(STATE_LAYOUT_RECORD, '{"grouping_keys": "balanced-1"}\n')
    assert checkpoint_grouping_keys(store, fresh=False, new_buckets=8) is BALANCED_KEYS
    record_grouping_keys(store, BALANCED_KEYS)
    assert json.loads(store.read(STATE_LAYOUT_RECORD)) == {"grouping_keys": "balanced-1", "buckets": 64}


def test_a_checkpoint_an_earlier_fissure_ran_on_keeps_the_plain_bucket_numbers(tmp_path):
    store = LocalStore(str(tmp_path))
    assert checkpoint_grouping_keys(store, fresh=False, new_buckets=8) is PLAIN_KEYS
    record_grouping_keys(store, PLAIN_KEYS)
    assert checkpoint_grouping_keys(store, fresh=True, new_buckets=8) is PLAIN_KEYS  # the record wins


@pytest.mark.parametrize("text, message", [('{"grouping_keys": "balanced-9"}', "written by a later fissure"),
                                           ('{"grouping_keys": "balanced-1", "buckets": 128}', "with 128 buckets"),
                                           ('{"grouping_keys": "plain", "buckets": 8}', "written by a later fissure"),
                                           ('{"grouping_keys": "balanced-1", "buckets": "8"}', "written by a later"),
                                           ("not json", "cannot be read"), ('{"other": 1}', "cannot be read"),
                                           ("[1]", "cannot be read")])
def test_an_unknown_or_unreadable_scheme_stops_the_start(tmp_path, text, message):
    store = LocalStore(str(tmp_path))
    store.write(STATE_LAYOUT_RECORD, text)
    with pytest.raises(UnknownStateLayout, match=message):
        checkpoint_grouping_keys(store, fresh=False)
