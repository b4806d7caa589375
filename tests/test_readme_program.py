"""README.md's first program runs as written and prints what the README shows.

Every fenced ```python block of README.md, in order, makes one program; it runs in a new process
with this interpreter (the venv's, as `./dev python failures.py` runs it) from an empty directory,
and its standard output must be the ```text block that follows the last python block, line for
line. The program starts Spark, so this is a slow Spark test."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block, in order."""
    return [(match[1], match[2]) for match in FENCE.finditer(text)]


def program_and_output(text: str) -> tuple[str, list[str]]:
    """The python blocks joined, and the lines of the text block after the last of them."""
    blocks = fenced_blocks(text)
    python = [number for number, (language, _) in enumerate(blocks) if language == "python"]
    assert python, "README.md has no ```python block"
    shown = [body for language, body in blocks[python[-1] + 1:] if language == "text"]
    assert shown, "README.md shows no ```text output after its program"
    return "\n".join(blocks[number][1] for number in python), shown[0].splitlines()


def test_the_readme_shows_one_program_and_its_output():
    program, output = program_and_output((REPOSITORY / "README.md").read_text())
    assert "import fissure" in program
    assert output and all(line.strip() for line in output)


@pytest.mark.spark
@pytest.mark.slow
def test_the_readme_program_prints_what_the_readme_shows(tmp_path):
    program, expected = program_and_output((REPOSITORY / "README.md").read_text())
    script = tmp_path / "failures.py"
    script.write_text(program)
    environment = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    finished = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment, capture_output=True,
                              text=True, timeout=500)
    assert finished.returncode == 0, finished.stdout[-2000:] + finished.stderr[-3000:]
    assert finished.stdout.splitlines() == expected, finished.stdout
