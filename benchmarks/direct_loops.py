"""The direct loops: each workload of benchmarks/cost.py as one plain Python thread runs it.

McSherry, Isard and Murray ("Scalability! But at what COST?", HotOS 2015) measure a parallel
system against a competent single thread. Here that thread is the loop a user writes without a
framework: open the workload's files in order, iterate their lines, call the example's own
functions directly, keep state in dicts; nothing else (no dispatch on operator kinds, no
isinstance checks). Each loop returns what the program computes, and `*_answer` turns fissure's
output records (or a peer's) into the same form, so tests/benchmarks/test_direct_loops.py can check that a
loop and fissure's `run_local` agree.

Also here: the fissure programs the loops stand for (the examples' functions; the aggregate word
count built on the example's `words`), and the workloads' input files. No Spark.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "examples"))
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

from fissure import Count, Pipeline  # noqa: E402
from fissure.testing import record_files, text_files  # noqa: E402
from logwatch import breakins, cutoff, events, lines, parsed, range_, raw_events, realtime, results  # noqa: E402
from wordcount import count, words  # noqa: E402


def input_files(directory: str | os.PathLike) -> list[str]:
    """The files a Spark file source reads from `directory`, in name order (the order they were
    written in: fissure.testing and the log generator name and time them so)."""
    return sorted(str(path) for path in Path(directory).iterdir()
                  if path.is_file() and not path.name.startswith((".", "_")))


# -- the loops -------------------------------------------------------------------------------------


def logwatch_direct(paths: list[str]) -> list[dict]:
    """LogWatch (examples/logwatch.py): its break-ins, numbered."""
    st_range, st_breakins, st_results = {}, {}, {}
    found = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    record = parsed(lines({"value": line}))
                except ValueError:
                    continue
                if not raw_events(record):
                    continue
                for event in events(record):
                    event = range_(st_range.setdefault(event["host"], {}), event)
                    if cutoff(event):
                        event = realtime(event)
                        breakin = breakins(st_breakins.setdefault(event["user"], {}), event)
                        if breakin is not None:
                            found.append(results(st_results, breakin))
    return found


def wordcount_direct(paths: list[str]) -> dict[str, int]:
    """Word count (examples/wordcount.py lowercases its words): each word's count. The same loop
    stands for both fissure programs: after a word's increment its value is the running count the
    per-occurrence program emits, and at the end the count the aggregate program emits."""
    counts = {}
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                for word in line.lower().split():
                    counts[word] = counts.get(word, 0) + 1
    return counts


def cpu_direct(paths: list[str]) -> list[dict]:
    """The CPU-heavy chain of benchmarks/spark_chain.py: four `busy` maps over JSON records."""
    from spark_chain import busy

    out = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                out.append(busy(busy(busy(busy(json.loads(line))))))
    return out


# -- the programs' answers, from output records -----------------------------------------------------


def logwatch_answer(records) -> list[tuple]:
    return sorted((r["number"], r["user"], r["ts"], r["time"], r["failures"], r["hosts"]) for r in records)


def wordcount_answer(records) -> dict[str, int]:
    """Each word's highest count: its total, from a running count per occurrence or from the
    aggregate's count per micro-batch alike."""
    totals = {}
    for record in records:
        word, number = record["word"], record["count"]
        if number > totals.get(word, 0):
            totals[word] = number
    return totals


def cpu_answer(records) -> list[float]:
    return sorted(record["x"] for record in records)


def hot_items_direct(paths: list[str]) -> dict[float, tuple[int, int]]:
    """Nexmark's hot items (examples/hot_items.py): bids per auction and 10-second window, then
    per window the auction with the most (the lower id on a tie). Over a bounded input the loop
    needs no watermark: it counts everything, then picks."""
    from hot_items import WINDOW_S, parse_bid

    counts: dict[float, dict[int, int]] = {}
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                bid = parse_bid({"value": line})
                per_auction = counts.setdefault((bid["ts"] // WINDOW_S) * WINDOW_S, {})
                per_auction[bid["auction"]] = per_auction.get(bid["auction"], 0) + 1
    hottest = {}
    for start, per_auction in counts.items():
        auction = min(per_auction, key=lambda candidate: (-per_auction[candidate], candidate))
        hottest[start] = (auction, per_auction[auction])
    return hottest


def hot_items_answer(records) -> dict[float, tuple[int, int]]:
    return {record["period"]: (record["auction"], record["bids"]) for record in records}


DIRECT = {"logwatch": (logwatch_direct, logwatch_answer), "wordcount": (wordcount_direct, dict),
          "cpu": (cpu_direct, cpu_answer), "hot-items": (hot_items_direct, dict)}


def direct_answer(family: str, paths: list[str]):
    """The answer of the family's direct loop over `paths`."""
    loop, answer = DIRECT[family]
    return answer(loop(paths))


# -- the fissure programs ---------------------------------------------------------------------------

CPU_OPERATORS = 4  # cpu_direct calls busy four times


def wordcount_running_program() -> Pipeline:
    """Per occurrence: every word emits its running count (examples/wordcount.py's operators)."""
    return (Pipeline("wordcount")
            .flat_map("words", words, schema={"word": str}, reads=["value"], cost_us=3.0, selectivity=12.0)
            .partitioned("count", count, key="word", schema={"word": str, "count": int}, cost_us=2.0))


def wordcount_aggregate_program() -> Pipeline:
    """An aggregate: one count per word that a micro-batch changed (on Spark combined before the
    exchange: each task sends one partial count per word)."""
    return (Pipeline("wordcount_aggregate")
            .flat_map("words", words, schema={"word": str}, reads=["value"], cost_us=3.0, selectivity=12.0)
            .aggregate("count", key="word", aggregate=Count(), cost_us=2.0))


def programs(family: str) -> dict[str, Pipeline]:
    """The fissure programs of a family, by variant ("" the plain one)."""
    if family == "logwatch":
        from logwatch import build_pipeline

        return {"": build_pipeline()}
    if family == "wordcount":
        return {"": wordcount_running_program(), "aggregate": wordcount_aggregate_program()}
    if family == "hot-items":
        from hot_items import build_pipeline

        return {"": build_pipeline()}
    from spark_chain import cpu_pipeline

    return {"": cpu_pipeline(CPU_OPERATORS)}


# -- inputs -----------------------------------------------------------------------------------------


def write_input(family: str, directory: Path, records: int, files: int, files_per_batch: int,
                vocabulary: int | None = None):
    """Write `records` records of the family's input into `files` files under `directory`;
    returns fissure's FileSource over them (`files_per_batch` files a micro-batch)."""
    import fissure

    if family == "logwatch":
        from generators.loglines import generate, split_into_files

        split_into_files(in_time_order(list(generate(records))), directory, files)
        return fissure.FileSource(str(directory), format="text", max_files_per_trigger=files_per_batch)
    if family == "wordcount":
        from generators.words import generate

        text = generate(records, vocabulary_size=vocabulary, fixed_length=True)
        return text_files(str(directory), text, lines_per_file=-(-len(text) // files),
                          max_files_per_trigger=files_per_batch)
    if family == "hot-items":
        from generators.nexmark import bid_lines, generate_bids

        text = bid_lines(generate_bids(records))
        return text_files(str(directory), text, lines_per_file=-(-len(text) // files),
                          max_files_per_trigger=files_per_batch)
    rows = [{"x": float(i % 997) + 0.5} for i in range(records)]
    return record_files(directory, rows, {"x": float}, records_per_file=-(-records // files),
                        max_files_per_trigger=files_per_batch)


def in_time_order(log_lines: list[str]) -> list[str]:
    """The lines sorted by their timestamps, stably (a line without one keeps its place after the
    line before it). The generator's lines are not quite in time order (the real sample is not, and
    an injected break-in runs a few seconds ahead of the lines after it); LogWatch's keyed
    operators take each micro-batch's records in `ts` order, a direct loop takes lines as they
    come: on lines in time order the two compute the same."""
    stamps, last = [], 0
    for line in log_lines:
        try:
            last = parsed({"value": line})["ts"]
        except ValueError:
            pass
        stamps.append(last)
    return [log_lines[index] for index in sorted(range(len(log_lines)), key=stamps.__getitem__)]


def count_records(paths: list[str]) -> int:
    total = 0
    for path in paths:
        with open(path, "rb") as handle:
            total += sum(1 for _ in handle)
    return total
