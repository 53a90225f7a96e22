"""The packages import one way: contracts at the bottom, tools at the top, tests above all.

A module may import its own package and the packages of lower layers, never a higher layer nor
a sibling of its own layer. The scan reads every import statement (module level or not) of the
project's packages, the tools (bench/, and ops/, whose Python tools run as `python -m ops.…`)
and the tests, so a new upward import fails here before it can form a cycle: no service package
imports bench, ops or tests, and bench and ops do not import each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: Bottom to top; packages in one layer are independent of each other.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"contracts"}),
    frozenset({"scorer"}),
    # The simulator is below the service: a replica checks every model on a short simulated
    # stream before it serves (stream/typical_rows.py).
    frozenset({"deadletter", "simulator"}),
    frozenset({"stream", "terminals"}),
    frozenset({"training", "loadgen", "faults"}),
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
    assert LAYER_OF[tool] > max(LAYER_OF[p] for p in ("contracts", "stream", "loadgen"))
