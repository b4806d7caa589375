"""Which keyed operators are combined before their exchange (pure decisions, no worker code):
the policy of fissure.runtime.operators.combine, whose docstring tells the rules and why."""

from __future__ import annotations

import enum
import typing
from dataclasses import dataclass

from fissure.program.aggregates import Aggregate, FunctionAggregate
from fissure.program.eventtime import AggregateRole, WindowRole


@dataclass(frozen=True)
class CombineDecision:
    """Whether an operator's records are combined before its exchange, and why (or why not)."""

    combine: bool
    reason: str


class FoldSite(enum.Enum):
    """What runs right before the operator's keyed stage, and so would fold its records."""

    PE_STAGE = "a stateless stage's task"  # its share of the batch, with the batch's clock
    SOURCE = "the source's envelopes"  # its share of the batch, made without the batch's clock
    KEYED_STAGE = "the keyed stage before"  # per call of that stage (a bucket of its keys), with the batch's clock


def combinable_aggregate(aggregate: typing.Any) -> CombineDecision:
    """Whether `aggregate` can be folded in parts and merged (see the module docstring)."""
    if isinstance(aggregate, FunctionAggregate):
        return CombineDecision(False, f"{aggregate!r} keeps the window's records for its function: nothing to combine")
    if getattr(aggregate, "combinable", True) is False:
        return CombineDecision(False, f"{aggregate!r} sets combinable = False")
    merge = getattr(type(aggregate), "merge", None)
    if merge is None or merge is Aggregate.merge:
        return CombineDecision(False, f"{aggregate!r} does not implement merge")
    return CombineDecision(True, f"{aggregate!r} merges accumulators")


def combine_decision(operator: typing.Any, sole_reader: bool,
                     site: FoldSite = FoldSite.PE_STAGE) -> CombineDecision:
    """Whether the keyed `operator` is combined before its exchange; `sole_reader`: its input
    stream has no other reader (operator or sink); `site`: what runs before its keyed stage."""
    role = operator.time
    if isinstance(role, AggregateRole):
        if role.expire_after is not None:
            return CombineDecision(False, "expire_after judges a record against the key's stored state")
    elif isinstance(role, WindowRole):
        if role.window.merging:
            return CombineDecision(False, "a session's lateness depends on the key's stored sessions")
        if site is FoldSite.SOURCE:
            return CombineDecision(False, "the source's envelopes are made without the batch's clock, so a window's "
                                          "lateness is judged in its own keyed stage")
    else:
        return CombineDecision(False, "not an aggregate or a window")
    if not sole_reader:
        return CombineDecision(False, "its input stream is read elsewhere too: the records travel anyway")
    decision = combinable_aggregate(role.aggregate)
    if not decision.combine:
        return decision
    judged = ", judging lateness with the batch's clock as the window's stage does" if isinstance(
        role, WindowRole) else ""
    return CombineDecision(True, f"{site.value} folds its records into partials{judged}; {decision.reason}")
