"""Which keyed operators are combined before their exchange, by what runs before their keyed
stage (fissure.program.combine_policy): pure decisions with their reasons."""

from __future__ import annotations

import pytest

from fissure import Aggregate, Count, Pipeline, Sum, Tumbling
from fissure.program.combine_policy import FoldSite, combine_decision
from fissure.program.windows import Session


def last_operator(program: Pipeline):
    return program.operators[-1]


def timed() -> Pipeline:
    return Pipeline("p").event_time("ts", lateness=2.0)


@pytest.mark.parametrize("site", list(FoldSite))
def test_an_aggregate_is_combined_wherever_its_records_are_folded(site):
    decision = combine_decision(last_operator(Pipeline("p").aggregate("per_region", key="region",
                                                                      aggregate=Count())), True, site)
    assert decision.combine
    assert site.value in decision.reason and "merges accumulators" in decision.reason


def test_a_window_after_a_keyed_stage_is_combined_with_the_batch_clock_but_not_after_the_source():
    window = last_operator(timed().window("per_region", key="region", window=Tumbling(10.0), aggregate=Sum("v")))
    after_keyed = combine_decision(window, True, FoldSite.KEYED_STAGE)
    assert after_keyed.combine and "the keyed stage before" in after_keyed.reason
    assert "lateness with the batch's clock" in after_keyed.reason
    assert combine_decision(window, True, FoldSite.PE_STAGE).combine
    after_source = combine_decision(window, True, FoldSite.SOURCE)
    assert not after_source.combine and "without the batch's clock" in after_source.reason


def test_what_is_never_combined_after_a_keyed_stage_says_why():
    site = FoldSite.KEYED_STAGE
    sessions = last_operator(timed().window("s", key="k", window=Session(5.0), aggregate=Count()))
    assert "sessions" in combine_decision(sessions, True, site).reason
    expiring = last_operator(Pipeline("p").aggregate("a", key="k", aggregate=Count(), expire_after=5.0))
    assert "expire_after" in combine_decision(expiring, True, site).reason
    function = Aggregate.of(lambda records: {"n": len(records)}, schema={"n": int})
    listed = combine_decision(last_operator(Pipeline("p").aggregate("a", key="k", aggregate=function)), True, site)
    assert not listed.combine and "records" in listed.reason
    shared = combine_decision(last_operator(Pipeline("p").aggregate("a", key="k", aggregate=Count())), False, site)
    assert not shared.combine and "read elsewhere" in shared.reason
    keyed = last_operator(Pipeline("p").partitioned("p", lambda state, record: record, key="k"))
    assert combine_decision(keyed, True, site) == combine_decision(keyed, True, FoldSite.PE_STAGE)
    assert not combine_decision(keyed, True, site).combine
