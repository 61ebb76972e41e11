"""One vocabulary across commands: `--format table|json` for stdout and `--out PATH` for files
on every command (the old `--json` spellings are gone); the model, FastE, batching and dtype
options declared once and taken by every command that embeds; one documented r_max default for
documents shared by `embed` and `index`, queries always full; a `--help` without `<bool>`-style
type labels or defaults printed twice."""

from __future__ import annotations

import json
import re

import pytest
import typer
from typer.testing import CliRunner

from faste_mm.cli.app import app
from faste_mm.indexers import Collection
from faste_mm.retrieval.profile import read_profile

runner = CliRunner()
RESULT_COMMANDS = ("index", "search", "info", "embed", "eval", "bench", "calibrate")


REQUIRED_ARGS = {"index": ["x"], "eval": ["all"]}
# `faste-mm bench` is a group of suites, each with its own parser (tests/test_suite_options.py):
# its options are its model suite's, shown by `faste-mm bench model --help`.
HELP_OF = {"bench": ["bench", "model", "--help"]}


@pytest.mark.parametrize("command", RESULT_COMMANDS)
def test_every_command_that_prints_results_takes_format_table_or_json(command):
    result = runner.invoke(app, [command, *REQUIRED_ARGS.get(command, []), "--format", "xml"])
    assert result.exit_code == 2 and "'table'" in result.output and "'json'" in result.output, result.output
    shown = runner.invoke(app, HELP_OF.get(command, [command, "--help"]), env={"COLUMNS": "1000"}).stdout
    assert "--format" in shown and "--json" not in shown


def test_bench_writes_its_report_with_out_like_embed():
    for command in ("bench", "embed"):
        assert "--out" in runner.invoke(app, HELP_OF.get(command, [command, "--help"]), env={"COLUMNS": "1000"}).stdout


@pytest.mark.parametrize("command", ["embed", "bench", "eval", "calibrate"])
def test_the_old_json_flag_is_gone(command):
    result = runner.invoke(app, [command, *REQUIRED_ARGS.get(command, []), "--json"])
    refused = "unrecognized arguments" if command == "bench" else "No such option"  # argparse's words there
    assert result.exit_code == 2 and refused in result.output and "--json" in result.output


EMBEDDING_COMMANDS = ("index", "embed", "eval", "calibrate", "serve")  # bench: tests/test_suite_options.py
SHARED_OPTIONS = {"--model": "FASTE_MM_MODEL", "--r-max": "FASTE_MM_R_MAX", "--warmup-layer": "FASTE_MM_WARMUP_LAYER",
                  "--threshold": "FASTE_MM_THRESHOLD", "--trigger-layer": "FASTE_MM_TRIGGER_LAYER",
                  "--batch-tokens": "FASTE_MM_BATCH_TOKENS", "--unpadded": "FASTE_MM_UNPADDED",
                  "--device": "FASTE_MM_DEVICE", "--dtype": "FASTE_MM_DTYPE", "--debug": "FASTE_MM_DEBUG"}


@pytest.mark.parametrize("command", EMBEDDING_COMMANDS)
def test_every_command_that_embeds_takes_the_same_model_fast_e_and_batching_options(command):
    group = typer.main.get_command(app)
    params = {opt: p for p in group.commands[command].params if p.param_type_name == "option" for opt in p.opts}
    for flag, env in SHARED_OPTIONS.items():
        assert flag in params, f"{command} lacks {flag}"
        assert params[flag].envvar == env, f"{command} {flag} reads {params[flag].envvar}"
        reference = {p.opts[0]: p for p in group.commands["embed"].params if p.param_type_name == "option"}[flag]
        assert params[flag].help == reference.help, f"{command} {flag}: declared twice"
    assert "--fixed-layer" not in params


def test_plan_sweeps_with_the_same_fast_e_options_as_every_embedding_command():
    group = typer.main.get_command(app)
    options = lambda command: {opt: p for p in group.commands[command].params  # noqa: E731
                               if p.param_type_name == "option" for opt in p.opts}
    plan, embed = options("plan"), options("embed")
    for flag in ("--model", "--r-max", "--warmup-layer", "--threshold", "--trigger-layer", "--batch-tokens"):
        assert flag in plan, f"plan lacks {flag}"
        assert (plan[flag].envvar, plan[flag].help) == (embed[flag].envvar, embed[flag].help), f"plan {flag}"


def test_fast_e_flags_reach_the_library_config_in_cli_words():
    result = runner.invoke(app, ["embed", "--text", "x", "--r-max", "1.5", "--device", "cpu"])
    assert result.exit_code == 1 and "--r-max must be in [0, 1)" in result.output, result.output
    sweep = runner.invoke(app, ["embed", "--text", "x", "--r-max", "0.3,0.5"])
    assert sweep.exit_code == 1 and "one ratio" in sweep.output


def test_embed_uses_the_document_default_of_index_and_queries_run_the_full_forward(model_dirs, tmp_path):
    model = str(model_dirs["qwen3_vl"])
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "note.txt").write_text("a note about a red bicycle")
    assert runner.invoke(app, ["index", str(tmp_path / "docs"), "-c", str(tmp_path / "col"), "--model", model,
                               "--device", "cpu"]).exit_code == 0
    index_default = read_profile(tmp_path / "col").r_max
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
