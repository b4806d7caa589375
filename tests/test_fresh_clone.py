"""`git clone`, then `./dev example`: the main example runs from a fresh clone with nothing beside it.

The clone is of this checkout's HEAD commit, not a copy of its working tree: a newcomer (and CI)
gets what is committed, and a copy would bring along untracked and ignored files (a data file
never added, a `.venv`) that hide the very failure this test is for. Uncommitted changes are
therefore not tested here. The clone goes into an empty temporary directory, so nothing beside
it (no sibling folder) can be read.

What it proves: the committed tree holds everything `./dev example` needs besides the Python
packages (the example, its generators, the Loghub sample under examples/data, fissure's source);
`./dev`'s setup and example command work from the clone; fissure is imported from the clone's
`src/` in the driver; and LogWatch finds the sample's 2 break-ins, the ones the clone's README.md
shows.

What it does not prove: that `./dev` installs the pinned dependencies from PyPI. To spare a
minutes-long `pip install`, the clone's `.venv` is a real virtual environment (`python -m venv`,
as `./dev` makes one) whose packages are this interpreter's, listed in a .pth file after the
clone's `src/` (as an editable install lists it), with the stamp file `./dev` checks, so `./dev`
skips the install. Java is this machine's.
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPOSITORY = Path(__file__).resolve().parents[1]
INSTALLED_STAMP = ".fissure-installed"  # the file ./dev checks before it installs anything
BREAKIN = re.compile(r"^\s+#\d+ \w{3} +\d+ \d\d:\d\d:\d\d user \S+ after \d+ failures from \S+$")


def git(*arguments: str, cwd: Path) -> str:
    done = subprocess.run(["git", *arguments], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"git {' '.join(arguments)}: {done.stderr}"
    return done.stdout.strip()


def clone_head(target: Path) -> None:
    """A clone of this checkout's HEAD commit (its objects shared, its files checked out anew)."""
    if shutil.which("git") is None or not (REPOSITORY / ".git").exists():
        pytest.skip("needs git and a git checkout of the project")
    head = git("rev-parse", "HEAD", cwd=REPOSITORY)
    git("clone", "--quiet", "--shared", "--no-checkout", str(REPOSITORY), str(target), cwd=target.parent)
    git("checkout", "--quiet", "--detach", head, cwd=target)


def borrow_packages(clone: Path) -> None:
    """The clone's .venv: a new virtual environment that finds the clone's src/ and this
    interpreter's installed packages, marked as set up so that ./dev installs nothing."""
    venv = clone / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    # Lines of a .pth are added to sys.path as they are; .pth files inside those directories are
    # not read, so this checkout's own editable install of fissure stays out of the clone's path.
    paths = [str(clone / "src"), *site.getsitepackages()]
    Path(purelib, "fissure-borrowed-packages.pth").write_text("\n".join(paths) + "\n")
    (venv / INSTALLED_STAMP).touch()  # after the checkout: not older than the clone's pyproject.toml


def run_dev(clone: Path, *arguments: str, timeout_s: float) -> subprocess.CompletedProcess:
    environment = {name: value for name, value in os.environ.items()
                   if name not in {"PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV"}}
    return subprocess.run([str(clone / "dev"), *arguments], cwd=clone, env=environment, capture_output=True,
                          text=True, timeout=timeout_s)


def test_dev_example_runs_from_a_fresh_clone(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    clone = empty / "fissure"
    clone_head(clone)
    borrow_packages(clone)
    assert [path.name for path in empty.iterdir()] == ["fissure"]  # nothing beside the clone

    imported = run_dev(clone, "python", "-c", "import fissure; print(fissure.__file__)", timeout_s=120)
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert "[dev] installing" not in imported.stderr, "./dev reinstalled the packages: the stamp did not hold"
    assert Path(imported.stdout.strip()) == clone / "src" / "fissure" / "__init__.py"

    example = run_dev(clone, "example", timeout_s=500)
    assert example.returncode == 0, example.stdout[-2000:] + example.stderr[-3000:]
    assert "break-ins: 2" in example.stdout.splitlines(), example.stdout
    found = [line.strip() for line in example.stdout.splitlines() if BREAKIN.match(line)]
    assert len(found) == 2, example.stdout
    shown = [line.strip() for line in (clone / "README.md").read_text().splitlines() if BREAKIN.match(line)]
    assert found == shown, "the README shows other break-ins than ./dev example finds"
