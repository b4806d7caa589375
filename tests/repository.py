"""Where the tests find the repository's files, from whichever folder of tests/ they are in."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPOSITORY = TESTS.parent
DATA = TESTS / "data"
DOCS = REPOSITORY / "docs"
EXAMPLES = REPOSITORY / "examples"
BENCHMARKS = REPOSITORY / "benchmarks"
