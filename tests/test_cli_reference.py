"""docs/cli.md is the CLI reference generated from the typer app: the committed file must equal
what the generator makes from the commands as they are, so an option added, renamed or re-helped
without regenerating turns the suite red (and says the one line that fixes it)."""

from __future__ import annotations

from pathlib import Path

from faste_mm.cli import reference

DOCS_CLI = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def test_committed_cli_reference_equals_the_generated_one():
    generated = reference.render()
    committed = DOCS_CLI.read_text(encoding="utf-8")
    assert committed == generated, (
        "docs/cli.md is out of date with the commands: run "
        "`python -m faste_mm.cli.reference --write docs/cli.md` and commit the result")


def test_reference_names_every_command_and_its_environment_variables():
    from faste_mm.cli.app import app
    import typer

    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="faste-mm")
    text = reference.render()
    for name in root.list_commands(ctx):
        assert f"## `faste-mm {name}`" in text
    assert "`FASTE_MM_R_MAX`" in text and "`--r-max`" in text


def test_generator_refuses_unknown_arguments(capsys):
    assert reference.main(["--bogus"]) == 2
    assert "usage: python -m faste_mm.cli.reference" in capsys.readouterr().err
