"""Tests share helpers through tests/helpers/, never by importing another test module (which runs
that module's imports and fixtures wherever it is imported, and ties two test files together);
and the one runner of processes, tests/helpers/warm_process.py, behaves as `subprocess` does
(in either mode: FASTE_MM_TEST_FRESH=1 runs this file against real fresh processes)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.file_order import LONGEST_FILES
from tests.helpers.warm_process import installed_cli, run_python

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


def test_the_files_started_first_exist():
    assert [name for name in LONGEST_FILES if not (TESTS / name).is_file()] == [], \
        "a test file named in tests/helpers/file_order.py was renamed or removed: update LONGEST_FILES"


def test_the_check_sees_absolute_relative_and_function_level_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from tests.test_video import write_video\n"
                     "def f():\n    from .test_cli_collection import invoke\n"
                     "from . import test_kinds\n"
                     "from tests.helpers.inputs import noise_image\nimport numpy.testing\n")
    assert _imported_test_modules(probe) == [".test_kinds", "test_cli_collection", "test_cli_collection.invoke", "test_kinds",
                                             "tests.test_video", "tests.test_video.write_video"]


def test_a_command_started_by_another_program_writes_to_its_pipes_and_exits_with_its_status(tmp_path):
    """tests/helpers/warm_process.py `cli_command`: the executable's pipes are the command's (stdin
    too: tests/test_mcp_stdio.py's server reads its requests there), its status is the command's."""
    import subprocess

    from tests.helpers.warm_process import cli_command

    command = cli_command(tmp_path)
    done = subprocess.run([command, "info", "-c", str(tmp_path / "none")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "not a faste-mm collection" in done.stderr, done.stderr
    done = subprocess.run([command, "--help"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Usage" in done.stdout, done.stderr
    done = subprocess.run([command, "--version"], capture_output=True, text=True, timeout=300)
    assert done.stdout == subprocess.run([installed_cli(), "--version"], capture_output=True, text=True,
                                         timeout=300).stdout  # the installed script, started fresh


def test_a_run_reads_nothing_from_stdin():
    done = run_python("import sys; print(repr(sys.stdin.read()))")
    assert (done.returncode, done.stdout) == (0, "''\n")


def test_a_killed_command_reports_the_signal_as_subprocess_does():
    killed = run_python("import os, signal, sys\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)")
    assert (killed.returncode, killed.stdout) == (-9, "before\n")
    failed = run_python("import sys\nraise ValueError(sys.argv[1])", ["named"])
    assert failed.returncode == 1 and "ValueError: named" in failed.stderr


def test_a_started_command_talks_through_its_pipes_and_is_ended_by_its_caller(tmp_path):
    import json
    import select

    from tests.helpers.warm_process import PIPE, start_python

    echo = "import json, sys\nfor line in sys.stdin:\n    print(json.dumps(json.loads(line) * 2), flush=True)"
    process = start_python(echo, stdin=PIPE, cwd=tmp_path)
    try:
        process.stdin.write("21\n")
        process.stdin.flush()
        assert select.select([process.stdout], [], [], 300)[0]  # a failure detector, not a speed assertion
        assert json.loads(process.stdout.readline()) == 42
        assert process.poll() is None
        process.terminate()
        assert process.wait(300) == -15
    finally:
        process.close()
