"""`faste-mm eval` end to end on generated MMEB fixtures with the tiny model: --json parsed,
results.json / results.md / plot written, tables printed, env vars read, errors exit 1."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from faste_mm.cli.eval import eval_command

from tests.helpers.eval_fixtures import eval_data_dir, eval_model_dir  # noqa: F401  (fixtures)

runner = CliRunner()
app = typer.Typer()
app.command("eval")(eval_command)
app.command("noop")(lambda: None)  # two commands, so "eval" is a subcommand as in faste_mm.cli.app


def _args(model, data, out, *extra):
    return ["eval", "all", "--data", str(data), "--model", str(model), "--device", "cpu", "--out", str(out), *extra]


def test_eval_all_writes_json_markdown_and_plot_and_prints_json(eval_model_dir, eval_data_dir, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, _args(eval_model_dir, eval_data_dir, out, "--r-max", "0,0.5", "--format", "json"))
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload == {**json.loads((out / "results.json").read_text()), "files": payload["files"]}
    assert [task["subset"] for task in payload["tasks"]] == ["MSCOCO_t2i", "DocVQA", "NIGHTS"]
    methods = [(s["method"], s["r_max"]) for s in payload["tasks"][0]["settings"]]
    assert methods[0] == ("full", 0.0) and len(methods) == 1 + 6
    full = payload["summary"][0]
    assert full["method"] == "full" and full["recall@10_retention"] == 1.0
    markdown = (out / "results.md").read_text()
    assert "| Dataset | Retrieval | Full | 50% |" in markdown and "| Avg. retention |  | 100.00% |" in markdown
    assert (out / "retention_speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((out / "cache").rglob("queries.npy"))


def test_eval_prints_the_paper_table_and_reads_options_from_the_environment(eval_model_dir, eval_data_dir, tmp_path):
    env = {
        "FASTE_MM_MODEL": str(eval_model_dir),
        "FASTE_MM_DEVICE": "cpu",
        "FASTE_MM_DATA": str(eval_data_dir),
        "FASTE_MM_R_MAX": "0,0.3",
        "FASTE_MM_METHODS": "faste,downscale",
        "FASTE_MM_LIMIT": "2",
        "FASTE_MM_EVAL_OUT": str(tmp_path / "env-run"),
    }
    result = runner.invoke(app, ["eval", "nights"], env=env)
    assert result.exit_code == 0, result.output
    assert "| NIGHTS | I→I |" in result.stdout and "| Full | 30% |" in result.stdout
    assert "| downscale | 0.30 |" in result.stdout
    saved = json.loads((tmp_path / "env-run" / "results.json").read_text())
    assert saved["tasks"][0]["n_queries"] == 2 and saved["config"]["methods"] == ["faste", "downscale"]


def test_eval_errors_exit_1_with_a_message(eval_model_dir, eval_data_dir, tmp_path):
    missing = runner.invoke(app, _args(eval_model_dir, tmp_path / "nowhere", tmp_path / "o"))
    assert missing.exit_code == 1 and "data directory not found" in missing.output and "Traceback" not in missing.output
    bad_method = runner.invoke(app, _args(eval_model_dir, eval_data_dir, tmp_path / "o", "--methods", "tome"))
    assert bad_method.exit_code == 1 and "block-last" in bad_method.output
    bad_task = runner.invoke(app, ["eval", "flickr", "--data", str(eval_data_dir)])
    assert bad_task.exit_code == 1 and "mscoco, docvqa, nights" in bad_task.output
    assert runner.invoke(app, ["eval", "all", "--no-such-option"]).exit_code == 2
