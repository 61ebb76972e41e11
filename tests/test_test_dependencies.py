"""The README's test command on a fresh machine installs everything the tests import: every
third-party module a test file imports (or asks `pytest.importorskip` for) belongs to a
distribution that pyproject.toml's dependencies or its `test` extra names."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml with Python 3.11's tomllib")

ROOT = Path(__file__).resolve().parent.parent
FIRST_PARTY = {"faste_mm", "tests", "conftest"}


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    return _normalized(re.match(r"[A-Za-z0-9._-]+", requirement.strip()).group())


def declared_for_tests() -> set[str]:
    """Distribution names `pip install -e ".[test]"` installs by name (normalized)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return {_requirement_name(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]}


def imported_by(path: Path) -> set[str]:
    """Top-level module names a test file imports, at any depth, or asks importorskip for."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value.split(".")[0])
    return {name for name in names if name not in sys.stdlib_module_names and name not in FIRST_PARTY}


def undeclared_imports(test_files, declared: set[str]) -> dict[str, list[str]]:
    """{module: [test files]} for modules whose distribution `declared` does not name. A module
    not installed here maps to the distribution of its own name."""
    distributions = importlib.metadata.packages_distributions()
    missing: dict[str, list[str]] = {}
    for path in test_files:
        for module in sorted(imported_by(path)):
            names = {_normalized(d) for d in distributions.get(module, [module])}
            if not names & declared:
                missing.setdefault(module, []).append(path.name)
    return missing


def test_every_module_a_test_imports_is_installed_by_the_test_extra():
    missing = undeclared_imports(sorted((ROOT / "tests").glob("*.py")), declared_for_tests())
    assert not missing, (f"tests import modules that `pip install -e .[test]` does not install: {missing}; "
                         f"add their distributions to [project.optional-dependencies] test in pyproject.toml")


def test_the_guard_catches_an_undeclared_import_and_maps_module_names_to_distributions(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text("import numpy\nfrom PIL import Image\nimport pytest\n"
                     "def test_x():\n    import yaml\n    pytest.importorskip('no_such_module_xyz')\n")
    declared = {"numpy", "pillow", "pytest"}
    # PIL is Pillow's module: mapped through the installed distributions, not by its name
    assert undeclared_imports([probe], declared) == {"no_such_module_xyz": ["test_probe.py"],
                                                     "yaml": ["test_probe.py"]}
