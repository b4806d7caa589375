"""One live processing element per region in a worker process, kept across Spark tasks.

Spark hands every task a freshly unpickled copy of a region's stages; `processing_element_for`
returns the PE (and its running child processes) that the region's id and cut fingerprint name,
building it on first use, and closes a region's PE when the region comes back with another cut.
Idle PEs beyond a small bound are closed, least recently used first.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from fissure.runtime.pe.element import DEFAULT_PIPE_CAPACITY_BYTES, ProcessingElement, Stage, close_live_elements

@dataclass(frozen=True)
class _RegistryEntry:
    cut_fingerprint: str
    options: tuple
    element: ProcessingElement


# Region id -> its live PE, least recently used first. A Spark worker runs the tasks of several
# regions (and, after a re-plan, of regions nobody will call again): idle PEs beyond the bound
# are closed, least recently used first, so forgotten ones cannot pile up processes.
MAX_REGISTERED_ELEMENTS = 8
_REGISTRY: "OrderedDict[str, _RegistryEntry]" = OrderedDict()
_REGISTRY_LOCK = threading.Lock()


def processing_element_for(
    region_id: str,
    cut_fingerprint: str,
    pipelines: Sequence[Sequence[Stage]],
    *,
    max_batches_in_flight: int | None = None,
    pipe_capacity_bytes: int | None = DEFAULT_PIPE_CAPACITY_BYTES,
) -> ProcessingElement:
    """The live PE of `region_id` in this process, built (children forked) on first use.

    `region_id` names the region, stable across plans (e.g. "<query>/<stage number>");
    `cut_fingerprint` names its stages and their cut into pipelines (e.g. a hash of the plan).
    The same pair returns the same PE and its running processes, even though Spark hands every
    task a freshly unpickled copy of the stages (the PE keeps the copy it was built with). A new
    fingerprint for the region closes the old PE's processes and forks new ones.
    """
    options = (max_batches_in_flight, pipe_capacity_bytes)
    with _REGISTRY_LOCK:
        entry = _REGISTRY.get(region_id)
        if entry is not None:
            if (
                entry.cut_fingerprint == cut_fingerprint
                and entry.options == options
                and not entry.element.closed
            ):
                _check_same_shape(entry.element, pipelines, region_id, cut_fingerprint)
                _REGISTRY.move_to_end(region_id)
                return entry.element
            del _REGISTRY[region_id]
            entry.element.close()
        _close_least_recently_used(keep=MAX_REGISTERED_ELEMENTS - 1)
        element = ProcessingElement(
            pipelines,
            name=f"processing element of region {region_id!r}",
            max_batches_in_flight=max_batches_in_flight,
            pipe_capacity_bytes=pipe_capacity_bytes,
        )
        _REGISTRY[region_id] = _RegistryEntry(cut_fingerprint, options, element)
        return element


def processing_element(
    pipelines: Sequence[Sequence[Stage]], fingerprint: str, *, region_id: str | None = None, **options
) -> ProcessingElement:
    """`processing_element_for` with the arguments in the Spark layer's order. Without a
    `region_id` the fingerprint is the region: a new plan then builds a new PE and the old one
    is closed only when it falls out of the registry's bound; pass the region id to replace it
    at once."""
    return processing_element_for(region_id or fingerprint, fingerprint, pipelines, **options)


def run_region(
    region_id: str,
    cut_fingerprint: str,
    pipelines: Sequence[Sequence[Stage]],
    batches: Iterable[pa.RecordBatch],
    **options,
) -> Iterator[pa.RecordBatch]:
    """`processing_element_for(...).process(batches)`: the one call a mapInArrow function makes."""
    return processing_element_for(region_id, cut_fingerprint, pipelines, **options).process(batches)


def _close_least_recently_used(keep: int) -> None:
    for region_id in list(_REGISTRY):
        if len(_REGISTRY) <= keep:
            return
        if not _REGISTRY[region_id].element.busy:
            _REGISTRY.pop(region_id).element.close()


def close_all_processing_elements() -> None:
    """Close every PE this process built (registered or not)."""
    with _REGISTRY_LOCK:
        _REGISTRY.clear()
    close_live_elements()


def _check_same_shape(
    element: ProcessingElement, pipelines: Sequence[Sequence[Stage]], region_id: str, fingerprint: str
) -> None:
    given = tuple(len(stages) for stages in pipelines)
    live = tuple(len(shape.stage_names) for shape in element.pipeline_shapes)
    if given != live:
        raise ValueError(
            f"region {region_id!r}: cut fingerprint {fingerprint!r} was first used for pipelines "
            f"of {list(live)} stages, now for {list(given)}; give every distinct cut its own "
            "fingerprint"
        )


def _forget_inherited_registry() -> None:
    """In a process forked from one that owns PEs: the registry's PEs are not ours."""
    _REGISTRY.clear()


os.register_at_fork(after_in_child=_forget_inherited_registry)
