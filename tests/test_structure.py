"""The package's structure, read from the source with `ast` (nothing is imported): packages in
layers that import only downwards, no import cycle, pyspark only in the Spark layer, no module
over 500 lines, no folder over 15 modules, a one-line purpose for every package, tests/ folders
that mirror the packages (docs/architecture.md draws the map)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SOURCE / "fissure"

# The layers of fissure, bottom first: a module imports from its own layer and the layers before
# it, never from one after it. A layer is a package (fissure/plan/) or a module (fissure/config.py).
LAYERS = ("model", "program", "plan", "control", "lifecycle", "profile", "runtime", "compile", "local",
          "config", "spark", "testing", "cli", "__main__")

# Inside a layer, its sub-packages in the same way, bottom first; the layer's own modules outside
# them stand above them all.
SUBLAYERS = {
    "runtime": ("records", "profiling", "state", "operators", "elastic", "pe"),
    "spark": ("session", "state", "checkpoint", "io", "query", "adaptive"),
}


MAX_MODULE_LINES = 500
MAX_FOLDER_MODULES = 15


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


@cache
def tree(name: str) -> ast.Module:
    return ast.parse(modules()[name].read_text(), filename=str(modules()[name]))


def imported(name: str) -> Iterator[tuple[str, int]]:
    """Every module `name` imports, at any depth of its code (a function's lazy import too), with
    the line: `from P import x` names the module P.x when there is one, else P."""
    path = modules()[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree(name)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield (full if full in modules() else base), node.lineno


def internal_imports(name: str) -> Iterator[tuple[str, int]]:
    """The fissure modules `name` imports (the package's face, `fissure` itself, left out)."""
    for target, line in imported(name):
        while target not in modules() and "." in target:
            target = target.rpartition(".")[0]
        if target.startswith("fissure.") and target != name:
            yield target, line


def layer_of(name: str) -> str:
    return name.split(".")[1]


def place(name: str) -> tuple[int, int]:
    """(layer, sub-layer) of a module: where it stands, bottom first."""
    layer = layer_of(name)
    parts = name.split(".")
    sublayers = SUBLAYERS.get(layer, ())
    sub = parts[2] if len(parts) > 3 or (len(parts) == 3 and modules()[name].name == "__init__.py") else None
    return LAYERS.index(layer), sublayers.index(sub) if sub in sublayers else len(sublayers)


def test_every_module_stands_in_a_layer():
    placed = {name for name in modules() if name != "fissure" and layer_of(name) in LAYERS}
    assert placed == set(modules()) - {"fissure"}, "modules in no layer of LAYERS"


def test_no_import_runs_back_up():
    """A module imports only its own layer and the layers below it (inside a layer with
    sub-packages, its own sub-package and those below)."""
    back_up = []
    for name in modules():
        if name == "fissure":
            continue
        for target, line in internal_imports(name):
            (layer, sub), (target_layer, target_sub) = place(name), place(target)
            if target_layer > layer or target_layer == layer and target_sub > sub:
                back_up.append(f"{modules()[name].relative_to(SOURCE)}:{line} {name} -> {target}")
    assert back_up == []


def test_no_import_cycle():
    """Tarjan's strongly connected components over every import, lazy ones included."""
    graph = {name: sorted({target for target, _ in internal_imports(name)}) for name in modules()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # iterative: the import graph is deep enough for recursion limits
        work = [(node, iter(graph[node]))]
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        while work:
            current, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(graph[target])))
                    break
                if target in on_stack:
                    low[current] = min(low[current], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[current])
                if low[current] == index[current]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == current:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))

    for name in graph:
        if name not in index:
            visit(name)
    assert cycles == []


def test_pyspark_only_in_the_spark_layer():
    outside = [f"{modules()[name].relative_to(SOURCE)}:{line}" for name in modules()
               if not name.startswith("fissure.spark.") and name != "fissure.spark"
               for target, line in imported(name) if target.split(".")[0] == "pyspark"]
    assert outside == []


def test_no_module_over_500_lines():
    long = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    assert {name: lines for name, lines in long.items() if lines > MAX_MODULE_LINES} == {}


def test_no_folder_over_15_modules():
    folders = {path.parent for path in modules().values()}
    crowded = {str(folder.relative_to(SOURCE)): count for folder in folders
               if (count := sum(1 for child in folder.glob("*.py") if child.name != "__init__.py"))
               > MAX_FOLDER_MODULES}
    assert crowded == {}


def test_the_tests_folders_mirror_the_packages():
    """Every folder of tests/ with tests in it is a package of src/fissure (or the benchmarks')."""
    tests = Path(__file__).resolve().parent
    folders = {path.parent.relative_to(tests) for path in tests.rglob("test_*.py")} - {Path(".")}
    strays = sorted(str(folder) for folder in folders
                    if folder.parts[0] != "benchmarks" and not (PACKAGE / folder / "__init__.py").is_file())
    assert strays == []


@pytest.mark.parametrize("name", sorted(name for name, path in modules().items() if path.name == "__init__.py"))
def test_every_package_says_what_it_holds(name):
    docstring = ast.get_docstring(tree(name))
    assert docstring and docstring.splitlines()[0].strip(), f"{name}: no one-line purpose"


def test_the_rules_can_fail(tmp_path, monkeypatch):
    """The checks above find what they look for: a model module importing the Spark layer and
    pyspark, and a cycle between two modules."""
    package = tmp_path / "fissure"
    for layer in ("model", "spark"):
        (package / layer).mkdir(parents=True)
        (package / layer / "__init__.py").write_text('"""A layer."""\n')
    (package / "__init__.py").write_text('"""The package."""\n')
    (package / "model" / "low.py").write_text("import pyspark\nfrom fissure.spark.high import x\n")
    (package / "spark" / "high.py").write_text("from fissure.model.low import y\nx = 1\n")
    monkeypatch.setitem(globals(), "SOURCE", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGE", package)
    modules.cache_clear()
    tree.cache_clear()
    try:
        with pytest.raises(AssertionError):
            test_no_import_runs_back_up()
        with pytest.raises(AssertionError):
            test_no_import_cycle()
        with pytest.raises(AssertionError):
            test_pyspark_only_in_the_spark_layer()
    finally:
        modules.cache_clear()
        tree.cache_clear()
