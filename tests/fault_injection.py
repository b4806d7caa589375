"""Fault injection: `kill -9` of a driver process at chosen moments, restarts on the same
checkpoint until the input is consumed, and the sink compared with a plain-Python reference.

Used by tests/spark/test_faults.py and benchmarks/reliability.py (which tries more kill points). The
program is a word count: `norm` (stateless) then `count` (per-word running count, keyed state);
as a graph it also sends the normalized words through a filter to a second sink. Plans:
"sequential", "replicated" (the keyed region x2: two state partitions), "planner", and
"adaptive" (starts sequential, and the adaptive loop is made to switch to the replicated plan at
batch 1: a stop, an offline state repartition 1 -> 2 and a restart). Kill moments: "random" (a
seeded delay after the first committed batch), "repartition" (as soon as the checkpoint shows
the state repartition's batch, or its new partition), "switch" (as soon as the adaptive switch
stopped the first query: its abandoned batch), "concurrent" (the first driver follows its input
and never ends; after its first committed batch a second driver is started on the same
checkpoint and must be refused, naming the first; then the first is killed). Every case also
checks that no sink batch directory holds two Parquet files (a batch written by two runs).

Input files (`FILE_FAULTS`): "corrupt-gzip" (a truncated `.gz` file among the good ones: one
driver, which must end by itself with the good files' results exact and one dead letter naming
the file) and "written-in-place" (a following driver, and a new file written in place in two
halves half a second apart while it runs; once a committed batch has read the file the driver is
killed and restarted: the sinks must hold the whole file's results, once).

Worker faults, no driver kill (`WORKER_FAULTS`): "memory-error" (`norm` raises MemoryError once on
each of four records, in four batches) and "crashes" (its Python worker process dies once on each
of them, `os._exit`); the one driver must recover from each by itself (exit 0, no dead letter),
with a restart window shorter than the time between the faults, as in a long run.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

WORDS = 4
FILES = 8
PER_FILE = 12

DRIVER = textwrap.dedent("""
    import os, sys, time
    import fissure
    from fissure import Pipeline, StreamGraph
    from fissure.control.adaptive.config import AdaptiveConfig
    from fissure.spark.io.sinks import FileSink
    from fissure.spark.io.sources import FileSource

    # A script of its own, or run in a test's process on its SparkSession (run_in_process).
    argv, spark = (sys.argv[1:], None) if __name__ == "__main__" else (ARGV, SPARK)
    inputs, sink, checkpoint, plan_name, program = argv[:5]
    follow = "follow" in argv[5:]  # runs until killed
    fault = next((name for name in argv[5:] if name in ("memory-error", "crashes")), None)
    letters = "letters" in argv[5:]  # dead letters to a sink of their own
    FAULT_AT = (5, 30, 55, 80)  # records of four different files, so of four batches

    def norm(record):
        time.sleep(0.005)
        if fault is not None and record["i"] in FAULT_AT:
            marker = os.path.join(os.path.dirname(checkpoint), f"fault-{record['i']}")
            if not os.path.exists(marker):
                open(marker, "w").close()
                if fault == "memory-error":
                    raise MemoryError("injected")
                os._exit(1)
        return {"word": record["word"].lower(), "i": record["i"]}

    def count(state, record):
        state["n"] = state.get("n", 0) + 1
        return {"word": record["word"], "i": record["i"], "n": state["n"]}

    def even(record):
        return record["i"] % 2 == 0

    COUNTED = {"word": str, "i": int, "n": int}
    SEQUENTIAL = {"regions": [{"pipelines": [["norm", "count"]], "replicas": 1}]}
    REPLICATED = {"regions": [{"pipelines": [["norm"]], "replicas": 1}, {"pipelines": [["count"]], "replicas": 2}]}
    if program == "graph":
        graph = StreamGraph("wordcount-graph")
        words = graph.source("words", schema={"word": str, "i": int}).map("norm", norm)
        words.partitioned("count", count, key="word", schema=COUNTED).sink("counts")
        words.filter("even", even).sink("evens")
        SEQUENTIAL = {"regions": [{"pipelines": [["norm", "even", "count"]], "replicas": 1}]}
        REPLICATED = {"regions": [{"pipelines": [["norm", "even"]], "replicas": 1}, {"pipelines": [["count"]], "replicas": 2}]}
        sinks = {"counts": FileSink(sink + "/counts"), "evens": FileSink(sink + "/evens")}
        source = {"words": FileSource(inputs, format="json", schema={"word": str, "i": int}, max_files_per_trigger=1)}
    elif program == "windows":
        from fissure import Count, Tumbling
        def seen(state, record):
            state["n"] = state.get("n", 0) + 1
        graph = StreamGraph("wordcount-windows")
        events = graph.source("words", schema={"word": str, "i": int}).map(
            "norm", lambda r: {"word": r["word"].lower(), "ts": float(r["i"])}, schema={"word": str, "ts": float}
        ).event_time("ts", lateness=2.0)
        events.window("count", key="word", window=Tumbling(10.0), aggregate=Count()).sink("counts")
        events.partitioned("idle", seen, key="word", expire_after=30.0, schema={"word": str, "n": int},
                           on_expire=lambda state, word: {"word": word, "n": state["n"]}).sink("evens")
        SEQUENTIAL = {"regions": [{"pipelines": [["norm", "event_time", "count", "idle"]], "replicas": 1}]}
        REPLICATED = {"regions": [{"pipelines": [["norm", "event_time"]], "replicas": 1},
                                  {"pipelines": [["count"]], "replicas": 2}, {"pipelines": [["idle"]], "replicas": 2}]}
        sinks = {"counts": FileSink(sink + "/counts"), "evens": FileSink(sink + "/evens")}
        source = {"words": FileSource(inputs, format="json", schema={"word": str, "i": int}, max_files_per_trigger=1)}
    else:
        graph = Pipeline("wordcount").map("norm", norm).partitioned("count", count, key="word", schema=COUNTED)
        sinks = FileSink(sink + "/counts")
        source = FileSource(inputs, format="json", schema={"word": str, "i": int}, max_files_per_trigger=1)
    config = fissure.RunnerConfig(master="local[2]", query_restart_window_s=1.0 if fault else 600.0, spark=spark,
                                  available_now=not follow, progress="off",
                                  dead_letters=FileSink(sink + "/dead") if letters else None)
    if plan_name == "adaptive":
        from dataclasses import replace
        from fissure.spark.adaptive.loop import run_adaptive_on_spark
        from fissure.plan.plans import plan_from_json
        hands_off = AdaptiveConfig(profile_batches=2, profile_s=1e9, evaluation_s=1e9, min_operator_samples=1)
        run_adaptive_on_spark(graph, source, sinks, plan=SEQUENTIAL, checkpoint=checkpoint,
                              config=replace(config, adaptation=hands_off), injections={1: plan_from_json(REPLICATED)})
    else:
        plan = {"sequential": SEQUENTIAL, "replicated": REPLICATED}.get(plan_name, plan_name)
        fissure.run(graph, source, sinks, plan=plan, checkpoint=checkpoint, config=config)
    print("done", flush=True)
""")


def words(first: int, last: int) -> list[dict]:
    return [{"word": f"W{i % WORDS}" if i % 3 else f"w{i % WORDS}", "i": i} for i in range(first, last)]


def words_input(directory: Path, files: int = FILES, per_file: int = PER_FILE) -> list[dict]:
    """The input files (one per micro-batch) and their records."""
    directory.mkdir(parents=True, exist_ok=True)
    records = words(0, files * per_file)
    for number in range(files):
        chunk = records[number * per_file:(number + 1) * per_file]
        temporary = directory / f".part-{number:04d}.json.tmp"
        temporary.write_text("".join(json.dumps(record) + "\n" for record in chunk))
        os.utime(temporary, (1_700_000_000 + number, 1_700_000_000 + number))
        temporary.rename(directory / f"part-{number:04d}.json")
    return records


def reference(records: list[dict]) -> tuple[list[dict], list[int]]:
    """The program in plain Python: every count record, and the `i` of every even record."""
    counts, out = {}, []
    for record in records:
        word = record["word"].lower()
        counts[word] = counts.get(word, 0) + 1
        out.append({"word": word, "i": record["i"], "n": counts[word]})
    return out, [record["i"] for record in records if record["i"] % 2 == 0]


def window_reference(records: list[dict]) -> tuple[list[tuple], list[tuple]]:
    """The "windows" program in plain Python (its input comes in event-time order: nothing is
    late): the count per word and 10 s window, and each word's expiry record (its count)."""
    windows, seen = {}, {}
    for record in records:
        word, start = record["word"].lower(), float(record["i"] // 10 * 10)
        windows[(word, start)] = windows.get((word, start), 0) + 1
        seen[word] = seen.get(word, 0) + 1
    return (sorted((word, start, start + 10.0, n) for (word, start), n in windows.items()),
            sorted(seen.items()))


def time_batch_uncommitted(checkpoint: Path, what: str) -> bool:
    """A batch whose clock fires windows (`what` "window-emission": its watermark passed the first
    window's end, 10) or expiries ("expiry": the end of input, where every word's state expires)
    is in the checkpoint's time log without a commit: the driver is emitting them."""
    clocks = checkpoint / "fissure-time"
    if not clocks.is_dir():
        return False
    for name in os.listdir(clocks):
        if name.isdigit() and not (checkpoint / "commits" / str(int(name))).exists():
            try:
                clock = json.loads((clocks / name).read_text())
            except (OSError, ValueError):
                continue
            event = clock.get("event")
            if clock.get("end_of_input") if what == "expiry" else (event and event[1] >= 10.0):
                return True
    return False


def read_sink(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    if not path.is_dir():
        return []
    rows = pq.read_table(path).to_pylist()
    return [{key: value for key, value in row.items() if key != "batch_id"} for row in rows]


def batches_written_twice(path: Path) -> list[str]:
    """Sink batch directories holding the Parquet files of more than one write. A write names every
    file it makes `part-NNNNN-<its job's uuid>-c000...parquet` (one file per partition of the batch's
    frame), and an overwrite replaces the whole directory: files of two uuids were written by two runs."""
    if not path.is_dir():
        return []
    twice = []
    for entry in sorted(path.iterdir()):
        if entry.is_dir():
            writes = {"-".join(file.name.split("-")[2:7]) for file in entry.glob("part-*.parquet")}
            if len(writes) > 1:
                twice.append(entry.name)
    return twice


def committed_batches(path: Path) -> int:
    if not path.is_dir():
        return 0
    return sum((path / entry / "_SUCCESS").exists() for entry in os.listdir(path))


def repartition_started(checkpoint: Path) -> bool:
    """The state repartition has begun: its batch is in the offset log (the new partition count),
    or the new partition's state directory exists."""
    if (checkpoint / "state" / "0" / "1").is_dir():
        return True
    offsets = checkpoint / "offsets"
    if not offsets.is_dir():
        return False
    for name in os.listdir(offsets):
        if name.isdigit():
            try:
                lines = (offsets / name).read_text().splitlines()
                if len(lines) > 1 and json.loads(lines[1]).get("conf", {}).get("spark.sql.shuffle.partitions") == "2":
                    return True
            except (OSError, ValueError):
                continue
    return False


def switch_started(checkpoint: Path, sink: Path) -> bool:
    """The adaptive switch has stopped the first query: batch 1 committed and batch 2 logged
    without a commit (the abandoned batch), or the repartition already begun."""
    return (committed_batches(sink) >= 2 and (checkpoint / "offsets" / "2").exists()
            and not (checkpoint / "commits" / "2").exists()) or repartition_started(checkpoint)


WORKER_FAULTS = ("memory-error", "crashes")
FAULT_AT = (5, 30, 55, 80)
FILE_FAULTS = ("corrupt-gzip", "written-in-place")
# "concurrent" and "written-in-place" on one following driver: refused to a second driver, then
# a file written in place, then killed once a batch read it (tests/test_faults.py).
CONCURRENT_IN_PLACE = "concurrent+written-in-place"


def file_committed(checkpoint: Path, name: str) -> bool:
    """A committed batch read the input file `name` (by the checkpoint's source log)."""
    for log_file in checkpoint.glob("sources/*/[0-9]*"):  # not the hidden .crc files
        try:
            lines = log_file.read_text().splitlines()[1:]
        except (OSError, ValueError):
            continue
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and str(entry.get("path", "")).endswith("/" + name) \
                    and (checkpoint / "commits" / str(entry.get("batchId"))).exists():
                return True
    return False


@dataclass(frozen=True)
class KillOutcome:
    plan: str
    program: str
    moment: str
    seed: int
    killed: bool  # the kill point was reached while the driver ran
    restarts: int  # drivers started after the kill until the input was consumed
    passed: bool
    detail: str = ""


def second_driver_refused(program: str, holder: subprocess.Popen, second) -> list[str]:
    """Start a second driver on the running driver's checkpoint (`second()`: its exit code and
    error output): it must fail, refused by the checkpoint's lock with the running driver named,
    and leave the first running; the problems found (none: refused so)."""
    code, error = second()
    problems = []
    if code == 0:
        problems.append("a second driver ran on the checkpoint of a running one")
    else:
        name = "wordcount-graph" if program == "graph" else "wordcount"
        named = ("CheckpointLocked", f"'{name}'", f"pid {holder.pid}", f"host {socket.gethostname()}", "started ")
        if not all(part in error for part in named):
            problems.append(f"the second driver failed, but not refused naming the first ({', '.join(named)}): "
                            f"{error[-300:]}")
    if holder.poll() is not None:
        problems.append(f"the running driver ended ({holder.returncode}) when the second one started")
    return problems


def run_in_process(spark, script: Path, argv: list[str], log: Path) -> tuple[int, str]:
    """The driver script run to its end in this process on `spark`, as a restart (the same program
    on the same checkpoint, without a JVM to start): 0 and "", or 1 and the traceback (also
    appended to `log`)."""
    namespace = {"__name__": "fault_injection_driver", "ARGV": argv, "SPARK": spark}
    try:
        exec(compile(script.read_text(), str(script), "exec"), namespace)  # noqa: S102 - our own driver
    except Exception:
        error = traceback.format_exc()
        with open(log, "a", encoding="utf-8") as out:
            out.write(error)
        return 1, error
    return 0, ""


def run_case(work: Path, plan: str, program: str, moment: str, seed: int, *, max_delay_s: float = 6.0,
             timeout_s: float = 300.0, python: str = sys.executable, files: int = FILES, per_file: int = PER_FILE,
             spark=None) -> KillOutcome:
    """One kill point: start a driver, SIGKILL it at the moment, restart until the input is
    consumed (each restart runs to its end), compare the sinks with the reference. `files` input
    files of `per_file` records, one a batch. With `spark` (a SparkSession), the drivers that are
    not killed (the restarts, a second driver on a running one's checkpoint, the one driver of a
    corrupt file) run in this process on it; the killed ones are always processes of their own."""
    work.mkdir(parents=True, exist_ok=True)
    script = work / "driver.py"
    script.write_text(DRIVER)
    records = words_input(work / "in", files, per_file)
    sink, checkpoint = work / "out", work / "ckpt"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def arguments(*extra) -> list[str]:
        return [str(work / "in"), str(sink), str(checkpoint), plan, program, *extra]

    def driver(*extra):
        return subprocess.Popen([python, str(script), *arguments(*extra)], stdout=subprocess.DEVNULL,
                                stderr=open(work / "driver.log", "ab"), env=env)

    def driver_to_end(*extra) -> tuple[int | None, str]:
        """A driver that must end by itself: its exit code (None: not within timeout_s) and error output."""
        if spark is not None:
            return run_in_process(spark, script, arguments(*extra), work / "driver.log")
        process = subprocess.Popen([python, str(script), *arguments(*extra)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True, env=env)
        try:
            error = process.communicate(timeout=timeout_s)[1]
            code = process.returncode
        except subprocess.TimeoutExpired:
            process.kill()
            code, error = None, process.communicate()[1]
        with open(work / "driver.log", "a", encoding="utf-8") as log:
            log.write(error)
        return code, error

    delay = random.Random(seed).uniform(0.0, max_delay_s)
    if moment in WORKER_FAULTS:
        return worker_fault_case(work, plan, program, moment, seed, records, driver, timeout_s)
    if moment in FILE_FAULTS or moment == CONCURRENT_IN_PLACE:
        return file_fault_case(work, plan, program, moment, seed, records, driver, driver_to_end, timeout_s, per_file)
    first, killed = driver(*(["follow"] if moment == "concurrent" else [])), False
    deadline = time.monotonic() + timeout_s
    problems = []
    try:
        reached_at = None
        while first.poll() is None and time.monotonic() < deadline:
            if moment == "concurrent":
                hit = committed_batches(sink / "counts") >= 1
                if hit:
                    problems += second_driver_refused(program, first, lambda: driver_to_end())
            elif moment == "random":
                if reached_at is None and committed_batches(sink / "counts") >= 1:
                    reached_at = time.monotonic()
                hit = reached_at is not None and time.monotonic() - reached_at >= delay
            elif moment in ("window-emission", "expiry"):
                hit = time_batch_uncommitted(checkpoint, moment)
            elif moment == "repartition":
                hit = repartition_started(checkpoint)
            else:
                hit = switch_started(checkpoint, sink / "counts")
            if hit:
                os.kill(first.pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.01)
    finally:
        if first.poll() is None and not killed:
            first.kill()
        first.wait()
    restarts, code = restart_until_done(driver_to_end)
    if code != 0:
        problems.append(f"the restarted driver exited with {code}")
    problems += sink_problems(sink, program, records)
    return KillOutcome(plan, program, moment, seed, killed, restarts, not problems, "; ".join(problems))


def restart_until_done(driver_to_end, attempts: int = 3) -> tuple[int, int | None]:
    """Drivers started one after the other until one ends with 0: how many, and the last exit code."""
    restarts, code = 0, None
    while restarts < attempts and code != 0:
        restarts += 1
        code, _ = driver_to_end()
    return restarts, code


def exit_code_within(process: subprocess.Popen, timeout_s: float) -> int | None:
    """The process's exit code, or None when it did not end within `timeout_s` (it is killed)."""
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None


def worker_fault_case(work: Path, plan: str, program: str, moment: str, seed: int, records: list[dict], driver,
                      timeout_s: float) -> KillOutcome:
    """One driver with a fault injected in its workers at four records: it must end by itself
    (exit 0) with the sinks exact; `killed` says the faults happened."""
    code = exit_code_within(driver(moment), timeout_s)
    injected = all((work / f"fault-{i}").exists() for i in FAULT_AT)
    problems = [] if code == 0 else [f"the driver exited with {code}"]
    problems += sink_problems(work / "out", program, records)
    return KillOutcome(plan, program, moment, seed, injected, 0, not problems, "; ".join(problems))


def file_fault_case(work: Path, plan: str, program: str, moment: str, seed: int, records: list[dict], driver,
                    driver_to_end, timeout_s: float, per_file: int = PER_FILE) -> KillOutcome:
    """A corrupt gzip among the good files, or a file written in place while a driver follows the
    directory (the module docstring); `killed` says the fault happened while a driver ran. With
    `moment` CONCURRENT_IN_PLACE, the following driver is first also refused to a second driver
    ("concurrent"), before the file is written in place."""
    import gzip

    sink, checkpoint = work / "out", work / "ckpt"
    problems: list[str] = []
    if moment == "corrupt-gzip":
        bad = work / "in" / "part-0003-cut.json.gz"
        whole = gzip.compress("".join(json.dumps({"word": "lost", "i": 10_000 + n}) + "\n" for n in range(200)).encode())
        bad.write_bytes(whole[: len(whole) // 2])
        os.utime(bad, (1_700_000_003, 1_700_000_003))
        code, _ = driver_to_end("letters")
        reached, restarts = True, 0
        if code != 0:
            problems.append(f"the driver exited with {code}")
        letters = read_sink(sink / "dead")
        if len(letters) != 1 or bad.name not in str(letters[0].get("error")):
            problems.append(f"{len(letters)} dead letter(s), not one naming {bad.name}: {letters[:2]}")
    else:
        added = words(len(records), len(records) + per_file)
        lines = [json.dumps(record) + "\n" for record in added]
        target = work / "in" / "part-in-place.json"
        first, reached = driver("follow"), False
        deadline = time.monotonic() + timeout_s
        try:
            while first.poll() is None and time.monotonic() < deadline and committed_batches(sink / "counts") < 1:
                time.sleep(0.05)
            if moment == CONCURRENT_IN_PLACE and first.poll() is None:
                problems += second_driver_refused(program, first, lambda: driver_to_end())
            if first.poll() is None:
                with open(target, "w", encoding="utf-8") as out:
                    out.write("".join(lines[: len(lines) // 2]))
                    out.flush()
                    time.sleep(0.5)  # the driver lists the directory meanwhile (a settle time of 1 s)
                    out.write("".join(lines[len(lines) // 2:]))
                reached = first.poll() is None
            while first.poll() is None and time.monotonic() < deadline and not file_committed(checkpoint, target.name):
                time.sleep(0.1)
        finally:
            if first.poll() is None:
                first.kill()
            first.wait()
        records = records + added
        restarts, code = restart_until_done(driver_to_end)
        if code != 0:
            problems.append(f"the restarted driver exited with {code}")
    problems += sink_problems(sink, program, records)
    return KillOutcome(plan, program, moment, seed, reached, restarts, not problems, "; ".join(problems))


def sink_problems(sink: Path, program: str, records: list[dict]) -> list[str]:
    """How the sinks differ from the plain-Python reference, and batches written by two runs."""
    problems = []
    expected_counts, expected_evens = reference(records)
    counts = read_sink(sink / "counts")
    if program == "windows":
        windows, expired = window_reference(records)
        got = sorted((r["word"], r["window_start"], r["window_end"], r["count"]) for r in counts)
        if got != windows:
            problems.append(f"windows differ: {len(got)} rows for {len(windows)} windows ({got[:3]} ...)")
        if sorted((r["word"], r["n"]) for r in read_sink(sink / "evens")) != expired:
            problems.append("the expiry records differ")
    elif sorted((r["word"], r["i"], r["n"]) for r in counts) != sorted((r["word"], r["i"], r["n"]) for r in expected_counts):
        seen = sorted(r["i"] for r in counts)
        problems.append(f"counts differ: {len(counts)} rows for {len(expected_counts)} inputs"
                        f" ({len(seen) - len(set(seen))} duplicated)")
    if program == "graph" and sorted(r["i"] for r in read_sink(sink / "evens")) != expected_evens:
        problems.append("the evens sink differs")
    for name in ("counts", "evens"):
        twice = batches_written_twice(sink / name)
        if twice:
            problems.append(f"{name}: {', '.join(twice)} written by two runs")
    return problems
