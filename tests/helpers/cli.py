"""The CLI as the tests drive it: the real typer app through one runner (`invoke` asserts the exit
code), and a read-only count of a collection's committed items.

`invoke` runs the app in the test's own process (typer's CliRunner), or, with
FASTE_MM_TEST_FRESH=1, as the installed `faste-mm` started afresh (tests/helpers/warm_process.py);
either way the result has `exit_code`, `stdout`, `stderr` and `output`.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from faste_mm.cli.app import app
from tests.helpers.warm_process import is_fresh, run_cli

runner = CliRunner()


@dataclass(frozen=True, slots=True)
class FreshResult:
    """A fresh `faste-mm` run, read as CliRunner's result is."""

    exit_code: int
    stdout: str
    stderr: str
    exception: None = None

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def invoke(*args: str, env: dict | None = None, code: int = 0):
    """`faste-mm ARGS`; `env` adds to (a None value removes from) this process's environment."""
    if is_fresh():
        merged = {**os.environ, **(env or {})}
        done = run_cli([str(a) for a in args], env={key: value for key, value in merged.items() if value is not None})
        result = FreshResult(done.returncode, done.stdout, done.stderr)
    else:
        result = runner.invoke(app, [str(a) for a in args], env=env)
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    return result


def committed_items(col: Path) -> int:
    try:
        db = sqlite3.connect(f"file:{col / 'meta.sqlite'}?mode=ro", uri=True)
    except sqlite3.Error:
        return 0
    try:
        return db.execute("SELECT count(*) FROM items WHERE status = 'ok'").fetchone()[0]
    except sqlite3.Error:  # not created yet
        return 0
    finally:
        db.close()
