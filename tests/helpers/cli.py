"""The CLI as the tests drive it: the real typer app through one runner (`invoke` asserts the exit
code), and a read-only count of a collection's committed items."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from typer.testing import CliRunner

from faste_mm.cli.app import app

runner = CliRunner()


def invoke(*args: str, env: dict | None = None, code: int = 0):
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
