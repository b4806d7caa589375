"""The processing element: order, backpressure, process reuse and replacement, failures, cleanup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fissure.runtime.pe import registry as pe_registry
from fissure.runtime.pe.element import (
    CHUNKS_PER_PIPELINE,
    MIN_CHUNK_ROWS,
    PipelineProcessDiedError,
    ProcessingElement,
    ProcessingElementError,
    StageFailedError,
    pipelining_chunks,
)
from fissure.runtime.pe.registry import (
    close_all_processing_elements,
    processing_element,
    processing_element_for,
    run_region,
)
from fissure.runtime.pe.stages import PipelineRunner, PipelineShape

POISON = -1  # a value of x that makes the failing stages below fail


# -- stages (module level, like the ones the fused-operator layer hands over) ----------------------


def add_doubled(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("doubled", pc.multiply(batch.column("x"), 2))


def keep_x_not_divisible_by_3(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.filter(pc.not_equal(pc.bit_wise_and(batch.column("x"), 3), 0))


def split_in_halves(batch: pa.RecordBatch) -> list[pa.RecordBatch]:
    middle = batch.num_rows // 2
    return [batch.slice(0, middle), batch.slice(middle)]


def as_labels(batch: pa.RecordBatch):
    labels = pc.binary_join_element_wise("x=", pc.cast(batch.column("x"), pa.string()), "")
    yield pa.record_batch({"label": labels, "doubled": batch.column("doubled")})


def as_table(batch: pa.RecordBatch) -> pa.Table:
    return pa.Table.from_batches([batch])


STAGES = [add_doubled, keep_x_not_divisible_by_3, split_in_halves, as_labels, as_table]
CUTS = {
    1: [STAGES],
    2: [STAGES[:2], STAGES[2:]],
    3: [STAGES[:1], STAGES[1:4], STAGES[4:]],
}


def sequential_reference(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    runner = PipelineRunner(STAGES, PipelineShape(1, 1, tuple(s.__name__ for s in STAGES)))
    return [output for batch in batches if batch.num_rows for output in runner.run(batch)]


def make_batches(sizes: list[int]) -> list[pa.RecordBatch]:
    batches, first = [], 0
    for size in sizes:
        batches.append(pa.record_batch({"x": pa.array(range(first, first + size), pa.int64())}))
        first += size
    return batches


def identity(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


def explode_on_poison(batch: pa.RecordBatch) -> pa.RecordBatch:
    if pc.any(pc.equal(batch.column("x"), POISON)).as_py():
        raise ValueError("poison record reached explode_on_poison")
    return batch


def die_on_poison(batch: pa.RecordBatch) -> pa.RecordBatch:
    if pc.any(pc.equal(batch.column("x"), POISON)).as_py():
        os.kill(os.getpid(), signal.SIGKILL)
    return batch


def return_a_number(batch: pa.RecordBatch):
    return 42


def sleep_a_little(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.002)
    return batch


# -- process inspection without psutil ------------------------------------------------------------


def process_state(pid: int) -> str | None:
    """The /proc state letter of `pid` (R, S, Z, ...), None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            return stat_file.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def is_alive(pid: int) -> bool:
    return process_state(pid) not in (None, "Z", "X")


def children_of_this_process() -> dict[int, str]:
    """pid -> state of every process this one forked (zombies included). Children running another
    program are left out: the JVM of a Spark session an earlier test started is one."""
    children = {}
    own_program = os.readlink("/proc/self/exe")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat_file:
                    fields = stat_file.read().rsplit(")", 1)[1].split()
                program = os.readlink(f"/proc/{entry}/exe") if fields[0] != "Z" else own_program
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            if int(fields[1]) == os.getpid() and program == own_program:
                children[int(entry)] = fields[0]
    return children


def open_pipes_and_shared_memory() -> set[tuple[int, str]]:
    """This process's open pipes and shared-memory files (what a PE opens), by fd: other threads of
    a test process (Spark's, in a suite) open and close sockets and files meanwhile."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed since listed
        if target.startswith("pipe:") or target.startswith("/dev/shm"):
            found.add((int(name), target))
    return found


def wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


# -- order and semantics ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def elements_by_pipeline_count():
    elements = {count: ProcessingElement(cut) for count, cut in CUTS.items()}
    yield elements
    for element in elements.values():
        element.close()


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(min_value=0, max_value=300), min_size=0, max_size=25))
def test_output_equals_sequential_run_in_order_for_every_cut(elements_by_pipeline_count, sizes):
    batches = make_batches(sizes)
    expected = sequential_reference(batches)
    for count, element in elements_by_pipeline_count.items():
        outputs = list(element.process(batches))
        # rows and their order are the contract; batch boundaries are not (a pipelined PE cuts
        # large batches into chunks so its pipelines overlap)
        assert rows_of(outputs) == rows_of(expected), f"{count} pipelines"


def rows_of(batches):
    return [row for batch in batches for row in batch.to_pylist()]


def test_one_large_batch_is_cut_into_chunks_so_pipelines_overlap():
    batch = make_batches([5000])[0]
    chunks = pipelining_chunks(batch, 2)
    assert len(chunks) == CHUNKS_PER_PIPELINE * 2
    assert rows_of(chunks) == batch.to_pylist()
    assert pipelining_chunks(make_batches([MIN_CHUNK_ROWS])[0], 4) == [make_batches([MIN_CHUNK_ROWS])[0]]


def test_empty_batches_are_dropped_and_schema_changes_reach_the_caller():
    with ProcessingElement(CUTS[3]) as element:
        outputs = list(element.process(make_batches([0, 4, 0, 0, 8])))
    assert outputs and all(batch.num_rows for batch in outputs)
    assert outputs[0].schema.names == ["label", "doubled"]
    labels = [label for batch in outputs for label in batch.column("label").to_pylist()]
    assert labels == [f"x={x}" for x in range(12) if x & 3]


def test_process_rejects_inputs_that_are_not_record_batches():
    with ProcessingElement([[identity], [identity]]) as element:
        with pytest.raises(TypeError, match="iterator of pyarrow.RecordBatch"):
            list(element.process([pa.table({"x": [1]})]))


def test_pipelines_are_validated_with_a_message_naming_the_fault():
    with pytest.raises(ValueError, match="pipeline 2 must be a non-empty list"):
        ProcessingElement([[identity], []])
    with pytest.raises(TypeError, match="pipeline 1, stage 2 is a int"):
        ProcessingElement([[identity, 3]])


# -- backpressure -----------------------------------------------------------------------------------


def test_backpressure_bounds_the_batches_in_flight():
    max_in_flight = 2
    pulled = 0

    def counted_input():
        nonlocal pulled
        for batch in make_batches([10] * 40):
            pulled += 1
            yield batch

    with ProcessingElement(
        [[identity], [identity], [sleep_a_little]], max_batches_in_flight=max_in_flight
    ) as element:
        received = 0
        largest_gap = 0
        for _ in element.process(counted_input()):
            received += 1
            largest_gap = max(largest_gap, pulled - received)
        stats = element.last_call_stats
    assert received == 40
    # One batch may sit in the caller (pulled, not yet sent) on top of those in flight.
    assert largest_gap <= max_in_flight + 1
    assert stats.peak_batches_in_flight == max_in_flight
    assert [p.rows_in for p in stats.pipelines] == [400, 400, 400]
    assert stats.pipelines[0].blocked_on_output_s > 0  # the slow last pipeline held pipeline 1


# -- processes across calls -------------------------------------------------------------------------


def test_child_processes_are_reused_across_calls():
    with ProcessingElement([[identity], [identity], [identity]]) as element:
        pids = element.child_pids
        assert len(pids) == 2 and all(is_alive(pid) for pid in pids)
        for _ in range(3):
            assert sum(b.num_rows for b in element.process(make_batches([5, 5]))) == 10
        assert element.child_pids == pids
        assert element.start_count == 1
        assert [s.pid for s in element.last_call_stats.pipelines] == [os.getpid(), *pids]


def test_registry_keeps_one_element_per_region_and_replaces_it_on_a_new_cut():
    try:
        first = processing_element_for("query-1/region-0", "cut-a", [[identity], [identity]])
        old_pids = first.child_pids
        again = processing_element_for("query-1/region-0", "cut-a", [[identity], [identity]])
        assert again is first and again.child_pids == old_pids
        outputs = list(run_region("query-1/region-0", "cut-a", [[identity], [identity]], make_batches([3])))
        assert [b.num_rows for b in outputs] == [3] and first.child_pids == old_pids

        recut = processing_element_for("query-1/region-0", "cut-b", [[identity], [identity], [identity]])
        assert recut is not first and first.closed
        assert not set(recut.child_pids) & set(old_pids)
        assert not any(is_alive(pid) for pid in old_pids)
        assert set(old_pids).isdisjoint(children_of_this_process())  # reaped: no zombies
        assert sum(b.num_rows for b in recut.process(make_batches([4, 4]))) == 8

        with pytest.raises(ValueError, match="give every distinct cut its own fingerprint"):
            processing_element_for("query-1/region-0", "cut-b", [[identity], [identity]])
    finally:
        close_all_processing_elements()
    assert children_of_this_process() == {}


def test_registry_closes_the_least_recently_used_idle_elements_beyond_its_bound(monkeypatch):
    monkeypatch.setattr(pe_registry, "MAX_REGISTERED_ELEMENTS", 2)
    cut = [[identity], [identity]]
    try:
        oldest = processing_element_for("region-a", "plan-1", cut)
        open_call = oldest.process(make_batches([2, 2]))
        next(open_call)  # busy: must survive eviction
        middle = processing_element_for("region-b", "plan-1", cut)
        newest = processing_element_for("region-c", "plan-1", cut)
        assert not oldest.closed and middle.closed and not newest.closed
        assert sum(b.num_rows for b in open_call) == 2
        # The Spark layer's call order; without a region id the fingerprint names the region.
        assert processing_element(cut, "plan-1", region_id="region-c") is newest
        by_fingerprint = processing_element(cut, "query-7/stage-2")
        assert by_fingerprint is not newest and processing_element(cut, "query-7/stage-2") is by_fingerprint
    finally:
        close_all_processing_elements()


class NamedByRepr:
    def __repr__(self) -> str:
        return "FusedStage(parse | keep_errors)"

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        raise RuntimeError("not today")


def test_failure_names_a_callable_object_by_its_repr():
    with ProcessingElement([[identity], [NamedByRepr()]]) as element:
        with pytest.raises(StageFailedError, match=r"stage 1 'FusedStage\(parse \| keep_errors\)'"):
            list(element.process(make_batches([1])))


# -- failures ---------------------------------------------------------------------------------------


def test_stage_raising_in_a_child_names_pipeline_and_stage_and_next_call_works():
    with ProcessingElement([[identity], [identity, explode_on_poison], [identity]]) as element:
        old_pids = element.child_pids
        batches = make_batches([10] * 5) + [pa.record_batch({"x": pa.array([1, POISON, 2])})]
        with pytest.raises(StageFailedError) as failure:
            list(element.process(batches))
        message = str(failure.value)
        assert "pipeline 2 of 3" in message
        assert "stage 2 'explode_on_poison'" in message
        assert "ValueError: poison record reached explode_on_poison" in message
        assert 'in explode_on_poison\n    raise ValueError("poison' in failure.value.report.traceback_text
        assert failure.value.report.pid == old_pids[0]
        assert not any(is_alive(pid) for pid in old_pids)

        assert sum(b.num_rows for b in element.process(make_batches([7]))) == 7
        assert element.start_count == 2 and not set(element.child_pids) & set(old_pids)


def test_stage_raising_in_the_caller_is_reported_as_pipeline_1():
    with ProcessingElement([[explode_on_poison], [identity]]) as element:
        with pytest.raises(StageFailedError, match="pipeline 1 of 2, stage 1 'explode_on_poison'"):
            list(element.process(make_batches([10, 10]) + [pa.record_batch({"x": [POISON]})]))
        assert sum(b.num_rows for b in element.process(make_batches([2]))) == 2


def test_a_stage_returning_something_else_than_batches_fails_with_a_hint():
    with ProcessingElement([[identity], [return_a_number]]) as element:
        with pytest.raises(StageFailedError, match="returned int; a stage must return a pyarrow.RecordBatch"):
            list(element.process(make_batches([3])))


def test_child_killed_mid_call_fails_the_call_visibly_and_next_call_restarts():
    others = children_of_this_process().keys()  # other elements' children, e.g. a worker's kept PEs
    with ProcessingElement([[identity], [identity], [die_on_poison]]) as element:
        victim = element.child_pids[1]
        batches = make_batches([10] * 3) + [pa.record_batch({"x": [POISON]})] + make_batches([10] * 3)
        with pytest.raises(PipelineProcessDiedError) as failure:
            list(element.process(batches))
        assert "pipeline 3 of 3" in str(failure.value) and "SIGKILL" in str(failure.value)
        assert failure.value.pid == victim
        assert element.child_pids == ()
        assert sum(b.num_rows for b in element.process(make_batches([5]))) == 5
        assert children_of_this_process().keys() - others == set(element.child_pids)


def test_child_killed_between_calls_is_replaced_before_the_next_call():
    with ProcessingElement([[identity], [identity]]) as element:
        victim = element.child_pids[0]
        os.kill(victim, signal.SIGKILL)
        assert wait_until(lambda: process_state(victim) == "Z")  # dead, not yet reaped
        assert sum(b.num_rows for b in element.process(make_batches([5, 6]))) == 11
        assert element.start_count == 2


def test_closing_the_output_iterator_early_stops_the_children_and_next_call_works():
    with ProcessingElement([[identity], [identity]]) as element:
        old_pids = element.child_pids
        outputs = element.process(make_batches([5] * 20))
        next(outputs)
        outputs.close()
        assert not any(is_alive(pid) for pid in old_pids)
        assert sum(b.num_rows for b in element.process(make_batches([5]))) == 5


def test_a_second_call_while_one_is_open_is_refused():
    with ProcessingElement([[identity], [identity]]) as element:
        first = element.process(make_batches([5, 5]))
        next(first)
        with pytest.raises(ProcessingElementError, match="already in a call"):
            next(element.process(make_batches([1])))
        assert sum(b.num_rows for b in first) == 5


def test_closing_an_element_during_a_call_fails_that_call_clearly():
    element = ProcessingElement([[identity], [identity]])
    outputs = element.process(make_batches([5] * 20))
    next(outputs)
    element.close()
    with pytest.raises(ProcessingElementError, match="closed during a call"):
        list(outputs)


# -- cleanup ----------------------------------------------------------------------------------------


def test_close_leaves_no_children_no_zombies_and_no_open_fds():
    fds_before = open_pipes_and_shared_memory()
    element = ProcessingElement([[identity], [identity], [identity], [identity]])
    pids = element.child_pids
    assert set(pids) <= children_of_this_process().keys()
    assert open_pipes_and_shared_memory() - fds_before  # the element's own, while it runs
    list(element.process(make_batches([10, 10])))
    element.close()
    assert element.forced_kill_count == 0  # they saw EOF: no stray copy of a pipe's write end
    assert set(pids).isdisjoint(children_of_this_process())
    assert open_pipes_and_shared_memory() - fds_before == set()
    with pytest.raises(ProcessingElementError, match="is closed"):
        list(element.process(make_batches([1])))


def test_closing_an_element_needs_no_kill_while_a_later_one_lives():
    # The later element's child was forked while the first one's pipes were open: if it kept a
    # copy of the first one's feed, the first one's child would never see EOF and need SIGKILL.
    first = ProcessingElement([[identity], [identity], [identity]])
    with ProcessingElement([[identity], [identity]]) as second:
        first.close()
        assert first.forced_kill_count == 0
        assert sum(b.num_rows for b in second.process(make_batches([3]))) == 3
    assert second.forced_kill_count == 0


PARENT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import pyarrow as pa
    from fissure.runtime.pe.registry import processing_element_for

    def identity(batch):
        return batch

    element = processing_element_for("region", "cut", [[identity], [identity], [identity]])
    list(element.process([pa.record_batch({"x": [1, 2, 3]})]))
    print(json.dumps(element.child_pids), flush=True)
    sys.stdin.readline()  # then exit normally, leaving the PE to atexit
    """
)


@pytest.mark.parametrize("how_the_parent_ends", ["killed", "exits"])
def test_children_die_with_their_parent(how_the_parent_ends):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        child_pids = json.loads(parent.stdout.readline())
        assert len(child_pids) == 2 and all(is_alive(pid) for pid in child_pids)
        if how_the_parent_ends == "killed":
            parent.send_signal(signal.SIGKILL)
        else:
            parent.stdin.write("exit\n")
            parent.stdin.flush()
        assert parent.wait(timeout=30) == (-signal.SIGKILL if how_the_parent_ends == "killed" else 0)
        assert wait_until(lambda: not any(is_alive(pid) for pid in child_pids))
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


# -- fork safety ------------------------------------------------------------------------------------


def sum_with_arrow_threads(batch: pa.RecordBatch) -> pa.RecordBatch:
    total = pc.sum(pc.multiply(batch.column("x"), 3)).as_py()
    return pa.record_batch({"x": batch.column("x"), "total": pa.array([total] * batch.num_rows)})


def report_memory_pool(batch: pa.RecordBatch) -> pa.RecordBatch:
    backend = pa.default_memory_pool().backend_name
    return pa.record_batch({"pool": [backend], "arrow_threads": [pa.cpu_count()]})


def test_children_allocate_with_a_fork_safe_pool_and_one_arrow_thread():
    with ProcessingElement([[identity], [report_memory_pool]]) as element:
        (output,) = list(element.process(make_batches([3])))
    assert output.column("pool")[0].as_py() in ("jemalloc", "system")
    assert output.column("arrow_threads")[0].as_py() == 1


@pytest.mark.timeout(120)
def test_forking_while_another_thread_uses_arrow_does_not_hang_the_children():
    stop = threading.Event()
    big = pa.chunked_array([pa.array(range(200_000))] * 8)

    def busy_arrow_thread():
        while not stop.is_set():
            pc.sum(pc.multiply(big, 2))

    thread = threading.Thread(target=busy_arrow_thread, daemon=True)
    thread.start()
    try:
        for _ in range(5):
            with ProcessingElement([[identity], [sum_with_arrow_threads]]) as element:
                outputs = list(element.process(make_batches([100, 100])))
            assert [b.column("total")[0].as_py() for b in outputs] == [14850, 44850]
    finally:
        stop.set()
        thread.join()


def test_the_chunk_count_is_what_the_chunking_makes():
    from fissure.runtime.pe.element import pipelining_chunk_count, pipelining_chunks

    for rows in (1, 127, 128, 129, 1000, 2500, 10_000):
        batch = pa.RecordBatch.from_pydict({"x": list(range(rows))})
        for pipelines in (1, 2, 3):
            assert pipelining_chunk_count(rows, pipelines) == len(pipelining_chunks(batch, pipelines))
