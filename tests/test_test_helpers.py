"""Tests share helpers through tests/helpers/, never by importing another test module (which runs
that module's imports and fixtures wherever it is imported, and ties two test files together)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def _imported_test_modules(path: Path) -> list[str]:
    """The test modules (`test_*`) that `path` imports, absolutely or relatively, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            names = [base] if base else [alias.name for alias in node.names]
            if node.module and not node.level and not base.startswith("tests"):
                continue
            names += [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [name for name in names if any(part.startswith("test_") for part in name.split("."))]
    return sorted(set(found))


def test_no_test_module_imports_another_test_module():
    wrong = {path.relative_to(TESTS).as_posix(): names for path in sorted(TESTS.rglob("*.py"))
             if (names := _imported_test_modules(path))}
    assert wrong == {}, "move what is shared into tests/helpers/ and import it from there"


def test_shared_modules_live_in_tests_helpers():
    loose = sorted(path.name for path in TESTS.glob("*.py")
                   if not path.name.startswith("test_") and path.name not in ("conftest.py", "__init__.py"))
    assert loose == [], "a module the tests share belongs in tests/helpers/"


def test_the_check_sees_absolute_relative_and_function_level_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from tests.test_video import write_video\n"
                     "def f():\n    from .test_cli_collection import invoke\n"
                     "from . import test_kinds\n"
                     "from tests.helpers.inputs import noise_image\nimport numpy.testing\n")
    assert _imported_test_modules(probe) == [".test_kinds", "test_cli_collection", "test_cli_collection.invoke", "test_kinds",
                                             "tests.test_video", "tests.test_video.write_video"]


def test_a_relayed_command_writes_to_the_callers_pipes_and_exits_with_its_status(tmp_path):
    """tests/helpers/forked_cli.py `CliRelay`: the shim's pipes are the forked command's (stdin
    too: tests/test_mcp_stdio.py's server reads its requests there)."""
    import subprocess

    from tests.helpers.forked_cli import CliRelay

    relay = CliRelay(tmp_path)
    try:
        done = subprocess.run([relay.command, "info", "-c", str(tmp_path / "none")], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 1 and "not a faste-mm collection" in done.stderr, done.stderr
        done = subprocess.run([relay.command, "--help"], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "Usage" in done.stdout, done.stderr
    finally:
        relay.close()
