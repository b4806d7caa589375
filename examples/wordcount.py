"""Word count: split lines into words, count each word, print the top words.

Two programs: by default `aggregate(..., Count())`, one count per word that a micro-batch changed
(on Spark its words are counted per task before the exchange: one partial per word and task
travels, not every occurrence); with --per-occurrence, a `partitioned` running count that emits
every word's count so far at each occurrence.

    ./dev python examples/wordcount.py [--lines 20000] [--per-occurrence] [--plan planner|sequential|FILE]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fissure  # noqa: E402
from fissure import Count, Pipeline  # noqa: E402
from example_support import example_parser, print_run_summary, run_directory, run_for_people  # noqa: E402
from fissure.testing import text_files  # noqa: E402
from generators.words import generate  # noqa: E402


def words(record):
    return [{"word": word.lower()} for word in record["value"].split()]


def count(state, record):
    state["n"] = state.get("n", 0) + 1
    return {"word": record["word"], "count": state["n"]}


def build_pipeline(per_occurrence: bool = False) -> Pipeline:
    """The aggregate word count; `per_occurrence`: the running count per occurrence instead."""
    pipeline = Pipeline("wordcount").flat_map("words", words, schema={"word": str}, reads=["value"], cost_us=3.0,
                                              selectivity=12.0)
    if per_occurrence:
        return pipeline.partitioned("count", count, key="word", schema={"word": str, "count": int}, cost_us=2.0)
    return pipeline.aggregate("count", key="word", aggregate=Count(), cost_us=2.0)


def main(argv=None) -> int:
    parser = example_parser(__doc__, files=4)
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--per-occurrence", action="store_true",
                        help="the running count per occurrence (partitioned) instead of aggregate(Count())")
    args = parser.parse_args(argv)
    directory = run_directory("wordcount")
    lines = generate(args.lines)
    source = text_files(os.path.join(directory, "input"), lines, lines_per_file=-(-len(lines) // args.files),
                        max_files_per_trigger=1)
    sink = fissure.MemorySink()
    pipeline = build_pipeline(args.per_occurrence)
    report = run_for_people(pipeline, source, sink, args, directory)
    print_run_summary(report, pipeline, directory, what="lines")
    totals = {}
    for record in sink.records():
        totals[record["word"]] = max(totals.get(record["word"], 0), record["count"])
    print(f"{sum(totals.values()):,} words, {len(totals)} distinct; the most frequent:")
    for word, total in sorted(totals.items(), key=lambda item: -item[1])[:10]:
        print(f"  {word:12s} {total:8,d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
