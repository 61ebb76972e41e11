"""One vocabulary across commands: `--format table|json` for stdout and `--out PATH` for files
on every command (the old `--json` spellings hidden, still accepted, with a warning); one
documented r_max default for documents shared by `embed` and `index`, queries always full; a
`--help` without `<bool>`-style type labels or defaults printed twice."""

from __future__ import annotations

import json
import re

import pytest
import typer
from typer.testing import CliRunner

from faste_mm.cli.app import app
from faste_mm.indexers import Collection

runner = CliRunner()
RESULT_COMMANDS = ("index", "search", "info", "embed", "eval", "bench", "calibrate")


REQUIRED_ARGS = {"index": ["x"], "eval": ["all"]}


@pytest.mark.parametrize("command", RESULT_COMMANDS)
def test_every_command_that_prints_results_takes_format_table_or_json(command):
    result = runner.invoke(app, [command, *REQUIRED_ARGS.get(command, []), "--format", "xml"])
    assert result.exit_code == 2 and "'table'" in result.output and "'json'" in result.output, result.output
    shown = runner.invoke(app, [command, "--help"], env={"COLUMNS": "1000"}).stdout
    assert "--format" in shown and "--json" not in shown  # the old spelling: accepted, never advertised


def test_bench_writes_its_report_with_out_like_embed():
    for command in ("bench", "embed"):
        assert "--out" in runner.invoke(app, [command, "--help"], env={"COLUMNS": "1000"}).stdout


def test_the_old_json_flag_still_works_and_says_what_to_use(model_dirs):
    args = ["embed", "--model", str(model_dirs["qwen3_vl"]), "--device", "cpu", "--text", "hello"]
    old = runner.invoke(app, [*args, "--json"])
    new = runner.invoke(app, [*args, "--format", "json"])
    assert old.exit_code == new.exit_code == 0, old.output
    assert json.loads(old.stdout)["dim"] == json.loads(new.stdout)["dim"]
    assert "--json is deprecated; use --format json" in old.stderr and "deprecated" not in new.stderr


def test_bench_old_json_path_writes_the_file_with_a_warning(model_dirs, tmp_path):
    args = ["bench", "--model", str(model_dirs["qwen3"]), "--inputs", "text:8", "--n", "2", "--r-max", "0",
            "--repeats", "1", "--device", "cpu"]
    old = runner.invoke(app, [*args, "--json", str(tmp_path / "old.json")])
    assert old.exit_code == 0, old.output
    assert "deprecated" in old.stderr and json.loads((tmp_path / "old.json").read_text())["settings"][0]["name"] == "full"
    new = runner.invoke(app, [*args, "--out", str(tmp_path / "new.json"), "--format", "json"])
    assert new.exit_code == 0, new.output
    assert json.loads(new.stdout).keys() == json.loads((tmp_path / "new.json").read_text()).keys()


def test_embed_uses_the_document_default_of_index_and_queries_run_the_full_forward(model_dirs, tmp_path):
    model = str(model_dirs["qwen3_vl"])
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "note.txt").write_text("a note about a red bicycle")
    assert runner.invoke(app, ["index", str(tmp_path / "docs"), "-c", str(tmp_path / "col"), "--model", model,
                               "--device", "cpu"]).exit_code == 0
    with Collection.open(tmp_path / "col") as col:
        index_default = col.manifest.fast_e.r_max
    common = ["embed", "--model", model, "--device", "cpu", "--text", "a red bicycle", "--format", "json"]
    documents = json.loads(runner.invoke(app, common).stdout)["stats"]["fast_e"]
    assert documents["r_max"] == index_default
    queries = json.loads(runner.invoke(app, [*common, "--instruction", "Find the image."]).stdout)["stats"]
    assert queries["fast_e"] is None and queries["prefix_removal"] == 0


@pytest.mark.parametrize("command", [None, "index", "search", "info", "remove", "compact", "rebuild-index", "embed",
                                     "eval", "bench", "calibrate"])
def test_help_shows_plain_type_labels_and_each_default_once(command):
    args = ["--help"] if command is None else [command, "--help"]
    # Wide, so that each option is one line and its help text can be told from typer's notes.
    result = runner.invoke(app, args, env={"COLUMNS": "1000"})
    assert result.exit_code == 0, result.output
    assert not re.search(r"<(bool|str|int|float|path|list\[)", result.stdout), result.stdout
    for line in result.stdout.splitlines():
        text, _, notes = line.partition("[default:")
        if notes:
            assert "default" not in text.lower(), line


def test_bare_faste_mm_shows_help_and_version_prints_the_version():
    from faste_mm import __version__

    bare = runner.invoke(app, [])
    assert "Usage" in bare.output and "index" in bare.output and "calibrate" in bare.output
    assert runner.invoke(app, ["--version"]).stdout.strip() == f"faste-mm {__version__}"
