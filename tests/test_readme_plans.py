"""The `fissure plan` examples of README.md and docs/*.md print what the text shows.

Every indented block that starts with `$ ./dev python -m fissure plan ...` is run through the CLI
in process, and its output compared line by line with the lines under the command, the planning
time ("solved in X ms") masked."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from fissure.cli import main

REPOSITORY = Path(__file__).resolve().parents[1]
PROMPT = "$ ./dev python -m fissure plan "
TIMING = re.compile(r"solved in [0-9.,]+ ms")


def examples(path: Path) -> list[tuple[str, list[str]]]:
    """(command arguments, expected lines) of every plan example block in the file."""
    found = []
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines):
        stripped = line.strip()
        if not stripped.startswith(PROMPT):
            continue
        indent = line[: len(line) - len(line.lstrip())]
        expected = []
        for following in lines[number + 1:]:
            if not following.startswith(indent) or not following.strip() or following.strip().startswith("$ "):
                break
            expected.append(following[len(indent):].rstrip())
        found.append((stripped[len("$ ./dev python -m fissure "):], expected))
    return found


def documents() -> list[Path]:
    return [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md"))]


CASES = [(path.relative_to(REPOSITORY).as_posix(), command, expected)
         for path in documents() for command, expected in examples(path)]


def masked(lines: list[str]) -> list[str]:
    return [TIMING.sub("solved in X ms", line.rstrip()) for line in lines]


def test_the_readme_has_plan_examples():
    assert sum(name == "README.md" for name, _, _ in CASES) >= 3


@pytest.mark.parametrize(("document", "command", "expected"), CASES,
                         ids=[f"{name}: {command}" for name, command, _ in CASES])
def test_plan_example_prints_what_the_text_shows(document, command, expected, capsys, monkeypatch):
    monkeypatch.chdir(REPOSITORY)
    assert expected, f"{document}: no output under `{command}`"
    assert main(shlex.split(command)) == 0
    printed = capsys.readouterr().out.splitlines()
    while printed and not printed[-1].strip():
        printed.pop()
    assert masked(printed) == masked(expected), f"{document}: `{command}` prints something else"
