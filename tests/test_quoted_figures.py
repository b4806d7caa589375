"""Every figure the README and docs/benchmarks.md quote stands in the results file they name,
and that file was written from a clean tree; benchmarks/results holds the current results only.

A figure matches a number of its file when both round to the same digits (6.8 quotes 6.77;
14.5 quotes 14.5); a goal ("goal 12 s", "goal: at most 10 %") is a target, not a measurement, and
is not looked for. No Spark, no timing: text against text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
RESULTS = REPOSITORY / "benchmarks" / "results"
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")
FILE = re.compile(r"`([\w.-]+\.md)`")
GOAL = re.compile(r"goal[^;)|]*", re.IGNORECASE)


def tables(text: str) -> list[list[list[str]]]:
    """Every markdown table of a text, as its rows' cells (the header row first, the separator
    row left out)."""
    found, rows = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not set("".join(cells)) <= set("-: "):
                rows.append(cells)
        elif rows:
            found.append(rows)
            rows = []
    return found


def quoted_figures() -> list[tuple[str, str, str]]:
    """(where, the quoting text, the results files it names): every row of every figures table of
    README.md and docs/benchmarks.md (a table whose last column is `file`: the figures stand in the
    column before it, the Results table's "result", the goals table's "current figure"), and the
    sentences of the README's benchmark section (each item of its list apart) that name a results
    file."""
    quotes = []
    for where in ("README.md", "docs/benchmarks.md"):
        for table in tables((REPOSITORY / where).read_text()):
            if table[0][-1] != "file":
                continue
            for cells in table[1:]:
                assert FILE.search(cells[-1]), f"{where}: a figures row names no results file: {cells}"
                quotes.append((where, cells[-2], " ".join(FILE.findall(cells[-1]))))
    readme = (REPOSITORY / "README.md").read_text()
    paragraph = readme[readme.index("## Benchmarks"):]
    paragraph = paragraph[paragraph.index("\n"):paragraph.index("\n## ", 3)]
    for item in re.split(r"\n(?=- )|\n\s*\n", paragraph):  # each list item and each paragraph apart
        prose = " ".join(" ".join(line.removeprefix("- ") for line in item.splitlines()
                                  if not line.startswith("|")).split())
        # a list item's figures stand in the files it names; a paragraph's, sentence by sentence
        units = [prose] if item.lstrip().startswith("- ") else re.split(r"(?<=[.;])\s+(?=[A-Z`])", prose)
        for sentence in units:
            names = FILE.findall(sentence)
            if names:  # a sentence's figures stand in the files it names (one of them)
                quotes.append(("README.md", FILE.sub("", sentence), " ".join(names)))
    return quotes


def figures(text: str) -> list[str]:
    return [match for match in NUMBER.findall(GOAL.sub("", text)) if any(ch.isdigit() for ch in match)]


def decimals(figure: str) -> int:
    return len(figure.split(".")[1]) if "." in figure else 0


def stands_in(figure: str, numbers: list[str]) -> bool:
    value, places = float(figure.replace(",", "")), decimals(figure)
    for number in numbers:
        try:
            candidate = float(number.replace(",", ""))
        except ValueError:
            continue
        if round(candidate, places) == round(value, places) and decimals(number) >= places:
            return True
    return False


QUOTES = quoted_figures()


def test_the_docs_quote_results_files():
    assert len(QUOTES) >= 20  # the table and the README's paragraph were found


@pytest.mark.parametrize("where, text, name", QUOTES, ids=[f"{where}:{name}:{i}" for i, (where, _, name)
                                                             in enumerate(QUOTES)])
def test_a_quoted_figure_stands_in_its_results_file(where, text, name):
    body = ""
    for one in name.split():
        path = RESULTS / one
        assert path.exists(), f"{where} quotes {one}, which benchmarks/results does not hold"
        own = path.read_text()
        revision = re.search(r"^Revision: (.*)$", own, re.MULTILINE)
        assert revision is not None, f"{one} has no Revision line"
        assert "dirty" not in revision.group(1), f"{one} was written from a dirty tree"
        json_path = path.with_suffix(".json")
        body += own + (json_path.read_text() if json_path.exists() else "")
    numbers = NUMBER.findall(body)
    missing = [figure for figure in figures(text) if not stands_in(figure, numbers)]
    assert not missing, f"{where}: {missing} quoted from {name} are not in it: {text!r}"


QUOTED_FILES = sorted({one for _, _, names in QUOTES for one in names.split()})
# Written by a Run(timed=False) (a simulation, heap sizes, keys counted, kills): no calibration loop
# runs around them, so no machine speed is recorded; others' CPU and the steal time are.
UNTIMED = {"adaptive_scenarios.md", "driver_heap.md", "elastic_sim_policies.md", "model_rescore.md",
           "reliability.md", "state_bounded.md"}


def provenance(name: str) -> dict:
    return json.loads((RESULTS / name).with_suffix(".json").read_text())["provenance"]


@pytest.mark.parametrize("name", QUOTED_FILES)
def test_a_quoted_file_says_it_is_a_result_to_quote(name):
    """No figure is quoted from a run marked busy, quick, or of a machine whose speed moved."""
    header = provenance(name)
    assert not header.get("quick"), f"{name} is a --quick run"
    assert not header.get("verdict"), f"{name} says: {header['verdict']}"
    assert "not a result to quote" not in (RESULTS / name).read_text(), f"{name} is marked not a result to quote"


@pytest.mark.parametrize("name", QUOTED_FILES)
def test_a_quoted_file_was_measured_with_the_whole_machine_in_view(name):
    """Its header has the steal time (and so counts unreadable processes as other), and a timed
    run its machine speed before and after, both loops in a fresh process."""
    header = provenance(name)
    assert header.get("steal_share") is not None, f"{name} records no steal time"
    if name not in UNTIMED:
        calibration = header.get("calibration_s") or {}
        assert calibration.get("where") == "a fresh Python process", (
            f"{name} has no machine speed taken in a fresh process before and after the run")
        assert header.get("speed_change") is not None, f"{name} has no machine speed after the run"


def goals_rows() -> list[dict[str, str]]:
    """The rows of docs/benchmarks.md's goals table, by its header's column names."""
    benchmarks = (REPOSITORY / "docs" / "benchmarks.md").read_text()
    section = benchmarks[benchmarks.index("## Goals: met or not"):]
    rows, header = [], None
    for line in section.splitlines():
        if not line.startswith("|"):
            if header:
                break
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("-: "):
            rows.append(dict(zip(header, cells)))
    return rows


GOALS = goals_rows()


def test_the_goals_table_has_a_row_per_goal():
    assert len(GOALS) >= 15
    assert all(row["met"].startswith(("met", "not met")) for row in GOALS)


@pytest.mark.parametrize("row", GOALS, ids=[row["goal"][:40] for row in GOALS])
def test_a_goals_row_names_its_files_revision(row):
    """The revision a row gives is the one its results file was measured at, so that a file
    regenerated without the table following it fails here."""
    name = FILE.search(row["file"]).group(1)
    revision = re.search(r"^Revision: (\S+)", (RESULTS / name).read_text(), re.MULTILINE)
    assert revision is not None, f"{name} has no Revision line"
    assert row["revision"].split()[0].rstrip(",") == revision.group(1), (
        f"the goals table gives {row['revision']!r} for {name}, measured at {revision.group(1)}")


# benchmarks/results keeps each benchmark's current .md and .json; earlier runs stay in git history.
MOST_RESULTS_FILES = 68


def results_files() -> list[Path]:
    return sorted(path for path in RESULTS.rglob("*") if path.is_file())


def referring_text() -> str:
    """What may refer to a results file: the README, docs/ and the benchmark scripts."""
    texts = [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md")),
             *sorted((REPOSITORY / "benchmarks").glob("*.py"))]
    return "\n".join(path.read_text() for path in texts)


def test_the_results_folder_keeps_the_current_results_only():
    files = results_files()
    assert len(files) <= MOST_RESULTS_FILES, (
        f"benchmarks/results holds {len(files)} files (at most {MOST_RESULTS_FILES}): superseded runs leave "
        "the tree (a doc quotes one as the file at a revision), a plot is drawn with --plots and not kept")


def test_every_results_file_is_referred_to_by_a_doc_or_a_script():
    text = referring_text()
    unreferred = []
    for path in results_files():
        name = path.relative_to(RESULTS).as_posix()
        # write_results writes NAME.md and NAME.json together: the .md named stands for both
        if name in text or (path.suffix == ".json" and path.with_suffix(".md").name in text):
            continue
        unreferred.append(name)
    assert not unreferred, f"no doc or script refers to {unreferred}: name them in docs/benchmarks.md, or remove them"


def test_a_results_report_links_only_to_files_beside_it():
    for path in RESULTS.glob("*.md"):
        for target in re.findall(r"\]\(([\w.-]+)\)", path.read_text()):
            assert (RESULTS / target).exists(), f"{path.name} links to {target}, which benchmarks/results does not hold"


def test_the_readme_counts_the_goals_as_the_goals_table_does():
    """The README's count of goals not met follows the table, so that a goal missed is not left
    out of the README when the table changes."""
    readme = " ".join((REPOSITORY / "README.md").read_text().split())
    counted = re.search(r"Of the (\d+) goals the project set itself, (\d+) are not met", readme)
    assert counted is not None, "the README's benchmark paragraph no longer counts the goals"
    not_met = sum(row["met"].startswith("not met") for row in GOALS)
    assert (int(counted.group(1)), int(counted.group(2))) == (len(GOALS), not_met)
