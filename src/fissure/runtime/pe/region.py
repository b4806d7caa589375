"""The processing element a compiled region runs in its Spark task, behind one small interface.

`processing_element(pipelines, fingerprint)` returns an object with
`process(iterator of RecordBatch) -> iterator of RecordBatch`. A region of several pipelines gets
the processing element of fissure.runtime.pe.element (pipeline 1 in the calling process, pipelines 2..k in
forked processes kept across micro-batches); a single pipeline runs here, with no process to fork.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa

from fissure.runtime.pe.registry import processing_element_for

Stage = Callable[[pa.RecordBatch], pa.RecordBatch]


class SequentialElement:
    """All pipelines in the calling process, one after the other (the fused baseline)."""

    def __init__(self, pipelines: Sequence[Sequence[Stage]]) -> None:
        self.stages = [stage for pipeline in pipelines for stage in pipeline]

    def process(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for stage in self.stages:
                if not batch.num_rows:
                    break
                batch = stage(batch)
            if batch.num_rows:
                yield batch


def cut_fingerprint(pipelines: Sequence[Sequence[Stage]]) -> str:
    """The region's stages and their cut into pipelines, e.g. `parse,events|range`."""
    return "|".join(",".join(getattr(stage, "name", None) or repr(stage) for stage in pipeline)
                    for pipeline in pipelines)


def processing_element(pipelines: Sequence[Sequence[Stage]], region_id: str):
    """The PE for these pipelines: the real one (kept per region across calls) for several."""
    if len(pipelines) > 1:
        return processing_element_for(region_id, cut_fingerprint(pipelines), [list(p) for p in pipelines])
    return SequentialElement(pipelines)
