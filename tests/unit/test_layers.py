"""The packages import one way: plumbing at the bottom, tools at the top, tests above all.

A module may import its own package and the packages of lower layers, never a higher layer nor
a sibling of its own layer. The scan reads every import statement (module level or not) of the
project's packages, the tools (bench/, and ops/, whose Python tools run as `python -m ops.…`)
and the tests, so a new upward import fails here before it can form a cycle: no service package
imports bench, ops or tests, and bench and ops do not import each other. Within a package, no
modules import one another in a circle either (module by module, function-level imports too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: Bottom to top; packages in one layer are independent of each other.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"plumbing"}),
    frozenset({"contracts"}),
    frozenset({"scorer"}),
    # The simulator is below the service: a replica checks every model on a short simulated
    # stream before it serves (stream/typical_rows.py).
    frozenset({"deadletter", "simulator"}),
    frozenset({"stream", "terminals", "review"}),
    frozenset({"training", "loadgen", "faults", "model_tools"}),
    frozenset({"flywheel"}),
    # Tools that drive the service packages from outside: the benchmarks, and the operations
    # tools (ACLs, the Helm chart's checks, the generated reference pages).
    frozenset({"bench", "ops"}),
    frozenset({"tests"}),
)
LAYER_OF = {package: i for i, layer in enumerate(LAYERS) for package in layer}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & set(LAYER_OF)


def modules() -> list[Path]:
    return sorted(p for package in LAYER_OF for p in (REPO / package).rglob("*.py"))


def test_every_top_level_package_has_a_layer() -> None:
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")}
    assert packages <= set(LAYER_OF), f"give {sorted(packages - set(LAYER_OF))} a layer"
    assert {"bench", "ops", "tests"} <= {p.relative_to(REPO).parts[0] for p in modules()}


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_imports_a_higher_layer_or_a_sibling(path: Path) -> None:
    own = path.relative_to(REPO).parts[0]
    wrong = {
        package
        for package in imported_packages(path)
        if package != own and LAYER_OF[package] >= LAYER_OF[own]
    }
    assert not wrong, f"{path.relative_to(REPO)} imports {sorted(wrong)}, not below {own!r}"


def test_the_scan_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from stream.service import ScoringService\n")
    assert imported_packages(module) == {"stream"}


@pytest.mark.parametrize("tool", ["bench", "ops", "tests"])
def test_the_scan_sees_a_service_module_import_a_tool_or_a_test(tmp_path: Path, tool: str) -> None:
    module = tmp_path / "m.py"
    module.write_text(f"import {tool}.x\n")
    assert imported_packages(module) == {tool}
    assert LAYER_OF[tool] > max(LAYER_OF[p] for p in ("plumbing", "contracts", "stream", "loadgen"))


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The project modules `path` imports, anywhere in it: `from a.b import c` names a.b.c when
    that is a module, else a.b (or the nearest package above it that is one)."""

    def nearest(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(nearest(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                whole = f"{node.module}.{alias.name}"
                found.add(whole if whole in known else nearest(node.module))
    return {name for name in found if name is not None}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def import_graph(paths: list[Path], root: Path = REPO) -> dict[str, set[str]]:
    """Module → the project modules it imports (a package's own __init__ left out: importing a
    submodule runs it, which is no circle of the code's making)."""
    names = {module_name(path, root): path for path in paths}
    return {
        name: {
            other
            for other in imported_modules(path, set(names))
            if other != name and not name.startswith(f"{other}.")
        }
        for name, path in names.items()
    }


def test_no_modules_import_one_another_in_a_circle() -> None:
    found = circles(import_graph([p for p in modules() if p.parts[len(REPO.parts)] != "tests"]))
    assert not found, f"modules that import one another (a circle): {found}"


def test_the_scan_sees_a_circle_through_a_function_level_import(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import thing\n")
    (package / "b.py").write_text("def thing():\n    from pkg import a\n")
    (package / "c.py").write_text("import pkg.a\n")
    paths = sorted(package.glob("*.py"))
    assert circles(import_graph(paths, tmp_path)) == [["pkg.a", "pkg.b"]]


# ── module size ────────────────────────────────────────────────────────────────────────────────

#: The project's bound on a product module (STYLE.md: one module per concept).
MAX_MODULE_LINES = 450
#: The tools and the tests, which the bound does not cover.
NOT_PRODUCT = frozenset({"bench", "ops", "tests"})


def test_no_product_module_is_over_the_bound() -> None:
    over = {
        str(path.relative_to(REPO)): size
        for path in modules()
        if path.relative_to(REPO).parts[0] not in NOT_PRODUCT
        and (size := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not over, f"split these modules (at most {MAX_MODULE_LINES} lines each): {over}"
