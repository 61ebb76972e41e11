"""`faste-mm embed` drives the real app on generated fixtures; --json is parsed."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from faste_mm.cli.app import app

runner = CliRunner()


def test_embed_json_reports_items_stats_and_writes_the_vectors(model_dirs, image_dir, vl_embedder, tmp_path):
    out = tmp_path / "vectors.npy"
    args = ["embed", "--model", str(model_dirs["qwen3_vl"]), "--device", "cpu", "--text", "a red bicycle"]
    args += [str(image_dir / "red.png"), str(image_dir / "missing.png"), "--trigger-layer", "2", "--r-max", "0.5"]
    result = runner.invoke(app, [*args, "--out", str(out), "--format", "json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert [item["ok"] for item in summary["items"]] == [True, True, False]
    assert "file not found" in summary["failures"][0]["reason"]
    assert summary["stats"]["fast_e"]["r_max"] == 0.5 and summary["stats"]["mean_trigger_layer"] == 2
    from faste_mm import FastEConfig, Item

    expected = vl_embedder.encode(
        ["a red bicycle", Item(image=image_dir / "red.png")], fast_e=FastEConfig(r_max=0.5, trigger_layer=2)
    ).embeddings
    np.testing.assert_allclose(np.load(out)[:2], expected, atol=1e-5)


def test_embed_reads_options_from_environment(model_dirs):
    env = {"FASTE_MM_MODEL": str(model_dirs["qwen3_vl"]), "FASTE_MM_DEVICE": "cpu", "FASTE_MM_R_MAX": "0.7", "FASTE_MM_TRIGGER_LAYER": "1"}
    result = runner.invoke(app, ["embed", "--text", "hello world", "--format", "json"], env=env)
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)["stats"]
    assert stats["fast_e"]["r_max"] == 0.7 and stats["fast_e"]["trigger_layer"] == 1 and stats["mean_trigger_layer"] == 1


def test_embed_out_is_checked_before_the_model_runs_and_names_the_real_file(model_dirs, tmp_path):
    args = ["embed", "--model", str(model_dirs["qwen3_vl"]), "--device", "cpu", "--text", "hello", "--format", "json"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "no" / "such" / "v.npy")])
    assert result.exit_code == 1 and "does not exist" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "vectors")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["embeddings_file"] == str(tmp_path / "vectors.npy")
    assert np.load(tmp_path / "vectors.npy").shape[0] == 1


def test_embed_errors_exit_1_with_a_message_and_usage_errors_exit_2(tmp_path):
    result = runner.invoke(app, ["embed", "--model", str(tmp_path / "absent"), "--text", "x"])
    assert result.exit_code == 1 and "absent" in result.output and "Traceback" not in result.output
    assert runner.invoke(app, ["embed", "--no-such-option"]).exit_code == 2
