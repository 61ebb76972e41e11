"""What a person reads at any terminal width: --help in full (no "…", every env name and every
`faste-mm[extra]` intact) at 80 columns and on a wide terminal; messages naming an extra keep it."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from faste_mm.cli.app import app

runner = CliRunner()
_GROUP = typer.main.get_command(app)
COMMANDS = sorted(_GROUP.commands)
EXTRA_RE = re.compile(r"faste-mm\[[a-z]+\]")


@pytest.mark.parametrize("columns", ["80", "200"])
@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_is_shown_in_full_with_env_names_and_extras_at_any_width(command, columns):
    args = ["--help"] if command is None else [command, "--help"]
    result = runner.invoke(app, args, env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    shown = result.stdout
    assert "…" not in shown, shown
    params = _GROUP.params if command is None else _GROUP.commands[command].params
    for param in params:
        for name in ([param.envvar] if isinstance(param.envvar, str) else param.envvar or []):
            if not param.hidden:
                assert name in shown, (name, shown)
        for extra in EXTRA_RE.findall(getattr(param, "help", None) or ""):
            assert extra in re.sub(r"\s*[│|]\s*", "", shown.replace("\n", "")), (extra, shown)


def test_the_ray_help_names_its_extra():
    for columns in ("80", "200"):
        shown = runner.invoke(app, ["index", "--help"], env={"COLUMNS": columns}).stdout
        assert "faste-mm[ray]" in shown, shown


def test_the_root_help_lists_each_command_by_its_first_sentence_filled_to_the_width():
    # The command table once showed each docstring's first paragraph with its hard line breaks:
    # rows wrapped early ("a search page at / (the" / "default collection ...") at 80 columns.
    shown = runner.invoke(app, ["--help"], env={"COLUMNS": "80"}).stdout
    rows = [line.strip("│ ").rstrip() for line in shown.splitlines() if line.startswith("│")]
    table = rows[[i for i, row in enumerate(rows) if row.startswith("index ")][0]:]
    inner = max(len(line) for line in shown.splitlines()) - 4
    for row, following in zip(table, table[1:]):
        name, _, text = following.partition(" ")
        if name in _GROUP.commands:
            continue  # the next command's row
        assert len(row) + 1 + len(following.split()[0]) > inner - 15, (row, following)
    assert "index [OPTIONS] PATHS...\n" in runner.invoke(app, ["index", "--help"]).stdout
