"""Word count: split lines into words, count each word (state per word), print the top words.

    ./dev python examples/wordcount.py [--lines 20000] [--plan planner|sequential|FILE]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fissure  # noqa: E402
from fissure import Pipeline  # noqa: E402
from example_support import example_parser, print_run_summary, run_directory, run_for_people  # noqa: E402
from fissure.testing import text_files  # noqa: E402
from generators.words import generate  # noqa: E402


def words(record):
    return [{"word": word.lower()} for word in record["value"].split()]


def count(state, record):
    state["n"] = state.get("n", 0) + 1
    return {"word": record["word"], "count": state["n"]}


def build_pipeline() -> Pipeline:
    return (Pipeline("wordcount")
            .flat_map("words", words, schema={"word": str}, reads=["value"], cost_us=3.0, selectivity=12.0)
            .partitioned("count", count, key="word", schema={"word": str, "count": int}, cost_us=2.0))


def main(argv=None) -> int:
    parser = example_parser(__doc__, files=4)
    parser.add_argument("--lines", type=int, default=20_000)
    args = parser.parse_args(argv)
    directory = run_directory("wordcount")
    lines = generate(args.lines)
    source = text_files(os.path.join(directory, "input"), lines, lines_per_file=-(-len(lines) // args.files),
                        max_files_per_trigger=1)
    sink = fissure.MemorySink()
    pipeline = build_pipeline()
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
