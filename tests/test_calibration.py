"""Label-free theta calibration: the recommendation on synthetic curves (plateau then climb),
per-theta reports against real FastE runs, and the CLI with --save picked up by `index`."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from faste_mm import FastEConfig
from faste_mm.calibration import (
    CalibrationConfig,
    evaluate_thetas,
    load_calibration,
    recommend,
    save_calibration,
    trigger_layer_for,
)
from faste_mm.cli.app import app

L = 24


def _plateau_then_climb(n_batches: int = 4) -> np.ndarray:
    """Alignment rises to 0.60 by layer 8, stays flat to layer 16, then climbs to 0.85."""
    curve = np.concatenate([np.linspace(0.2, 0.6, 9), np.full(8, 0.6), np.linspace(0.62, 0.85, 7)])
    return np.stack([curve + 0.001 * b for b in range(n_batches)])  # [B, L]


def _cosines_falling_with_depth(n_batches: int = 4, items: int = 5) -> dict[int, list[np.ndarray]]:
    """Distortion shrinks with depth: cos 0.90 at layer 8 up to ~0.999 at the last layer."""
    return {l: [np.full(items, 0.90 + 0.099 * (l - 8) / (L - 9)) for _ in range(n_batches)] for l in range(8, L)}


def _flops(n_batches: int = 4):
    return {l: [l for _ in range(n_batches)] for l in range(8, L)}, [L] * n_batches


def test_trigger_layer_is_the_first_crossing_after_warmup_or_the_last_layer():
    curve = np.array([0.9, 0.1, 0.5, 0.7, 0.8])
    assert trigger_layer_for(curve, 0.6, warmup=1) == 3  # layer 0 is before warm-up
    assert trigger_layer_for(curve, 0.95, warmup=1) == 4  # never reached: fallback
    assert trigger_layer_for(curve, 0.0, warmup=9) == 4  # warm-up past the depth


def test_plateau_then_climb_a_naive_threshold_triggers_too_early_and_is_not_recommended():
    curves, cosines = _plateau_then_climb(), _cosines_falling_with_depth()
    flops, flops_full = _flops()
    config = CalibrationConfig(target=0.99, p5_floor=0.97)
    thetas = [0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.9]
    reports = {r.theta: r for r in evaluate_thetas(curves, cosines, flops, flops_full, thetas, 8, config)}
    assert reports[0.6].trigger_layers == {8: 4}  # on the plateau: fires at the warm-up layer
    assert not reports[0.6].meets_target and reports[0.6].mean_cos == pytest.approx(0.90)
    assert reports[0.9].trigger_layers == {23: 4}  # never reached: last-layer fallback
    # cos >= 0.99 first at layer 22 (0.90 + 0.099 * 14/15 = 0.9924; layer 21: 0.9858), where the
    # climb has reached 0.812; theta 0.75 fires at layer 20 (0.773) and misses the target.
    chosen = recommend(list(reports.values()))
    assert chosen == 0.8 and reports[0.8].trigger_layers == {22: 4} and not reports[0.75].meets_target
    assert reports[0.8].flops_reduction == pytest.approx(1 - reports[0.8].mean_trigger_layer / L)
    assert reports[0.8].flops_reduction > reports[0.9].flops_reduction  # the most savings that pass


def test_recommendation_needs_every_larger_theta_to_pass():
    curves, cosines = _plateau_then_climb(), _cosines_falling_with_depth()
    flops, flops_full = _flops()
    config = CalibrationConfig(target=0.99)
    reports = evaluate_thetas(curves, cosines, flops, flops_full, [0.6, 0.7, 0.8, 0.9], 8, config)
    lucky = [r if r.theta != 0.7 else type(r)(**{**{f: getattr(r, f) for f in r.__dataclass_fields__}, "meets_target": True}) for r in reports]
    broken = [r if r.theta != 0.8 else type(r)(**{**{f: getattr(r, f) for f in r.__dataclass_fields__}, "meets_target": False}) for r in lucky]
    assert recommend(broken) == 0.9  # 0.7 passed alone, but 0.8 above it fails
    assert recommend([r for r in reports if r.theta < 0.7]) is None


def test_reports_match_real_faste_runs_at_each_theta(vl_embedder, mixed_items):
    calibration = vl_embedder.calibrate(mixed_items, r_max=0.5, target=0.999, warmup_layer=2)
    assert sorted(calibration.distortion) == [2, 3, 4, 5]
    full = vl_embedder.encode_documents(mixed_items).embeddings
    for report in calibration.thetas[:: max(1, len(calibration.thetas) // 3)]:
        res = vl_embedder.encode_documents(mixed_items, fast_e=FastEConfig(r_max=0.5, warmup_layer=2, threshold=report.theta))
        cos = np.sum(full * res.embeddings, axis=1)
        assert report.mean_cos == pytest.approx(float(cos.mean()), abs=1e-5)
        assert report.trigger_layers == {res.stats.batches[0].trigger_layer: 1}
        assert report.flops_reduction == pytest.approx(res.stats.flops_reduction)
    assert calibration.threshold == recommend(calibration.thetas)


def test_saved_calibration_is_keyed_by_model_and_a_mismatch_is_ignored_with_a_message(vl_embedder, mixed_items, tmp_path, caplog):
    calibration = vl_embedder.calibrate(mixed_items[:3], r_max=0.5, target=0.9, warmup_layer=2)
    path = save_calibration(calibration, tmp_path / "calibrations.json")
    assert load_calibration(calibration.model_id, None, path).threshold == calibration.threshold
    with caplog.at_level(logging.INFO):
        assert load_calibration("/some/other/model", None, path) is None
    assert "other models" in caplog.text and calibration.model_id in caplog.text


def test_cli_calibrate_saves_and_index_uses_it_unless_threshold_is_given(model_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    docs = tmp_path / "docs"
    docs.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (48 + 16 * i, 80, 3), dtype=np.uint8)).save(docs / f"{i}.png")
    (docs / "note.txt").write_text("a note about a red bicycle leaning on a wall")
    model = str(model_dirs["qwen3_vl"])
    runner = CliRunner()
    common = ["--model", model, "--device", "cpu"]
    runner.invoke(app, ["index", str(docs), "-c", str(tmp_path / "old"), *common, "--format", "json"])
    result = runner.invoke(app, ["calibrate", str(docs), *common, "--warmup-layer", "2", "--target", "0.9",
                                 "--save", "-c", str(tmp_path / "old"), "--out", str(tmp_path / "report"), "--json"])
    assert result.exit_code == 0, result.output
    calibration = json.loads(result.stdout)
    theta = calibration["threshold"]
    assert theta is not None and calibration["sample_size"] == 5
    assert (tmp_path / "report" / "calibration.json").exists() and (tmp_path / "report" / "calibration.png").stat().st_size > 0

    def settings(name):
        info = runner.invoke(app, ["info", "-c", str(tmp_path / name), "--format", "json"])
        return json.loads(info.stdout)["settings"]["fast_e"]

    assert settings("old")["threshold"] == theta and "calibrated" in settings("old")["threshold_source"]
    assert runner.invoke(app, ["index", str(docs), "-c", str(tmp_path / "new"), *common]).exit_code == 0
    assert settings("new")["threshold"] == theta and settings("new")["warmup_layer"] == 8  # l_w from the backbone
    assert runner.invoke(app, ["index", str(docs), "-c", str(tmp_path / "explicit"), *common, "--threshold", "0.33"]).exit_code == 0
    assert settings("explicit")["threshold"] == 0.33 and settings("explicit")["threshold_source"] == "given (--threshold)"


def test_calibrating_a_collection_of_another_model_is_refused(model_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"{i}.txt").write_text(f"document number {i} about pages " * (i + 1))
    runner = CliRunner()
    qwen3 = ["--model", str(model_dirs["qwen3"]), "--device", "cpu"]
    assert runner.invoke(app, ["index", str(docs), "-c", str(tmp_path / "col"), "--model", str(model_dirs["qwen3_vl"]), "--device", "cpu"]).exit_code == 0
    result = runner.invoke(app, ["calibrate", str(docs), *qwen3, "--warmup-layer", "1", "--target", "0.5", "--save", "-c", str(tmp_path / "col"), "--out", str(tmp_path / "r")])
    assert result.exit_code == 1 and "calibrate with --model" in " ".join(result.output.split())


def test_labelled_mmeb_data_adds_recall_retention_per_theta(model_dirs, tmp_path, monkeypatch):
    from tests.eval_fixtures import write_mmeb

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    data = write_mmeb(tmp_path / "mmeb")
    args = ["calibrate", "--data", str(data), "--task", "nights", "--model", str(model_dirs["qwen3_vl"]), "--device", "cpu"]
    result = CliRunner().invoke(app, [*args, "--warmup-layer", "2", "--r-max", "0.7", "--out", str(tmp_path / "r"), "--json"])
    assert result.exit_code == 0, result.output
    reports = json.loads(result.stdout)["thetas"]
    assert reports and all(set(r["recall_retention"]) == {"recall@1", "recall@10"} for r in reports)
    # The highest theta falls back to the last layer, the closest to the full forward.
    assert reports[-1]["trigger_layers"] == {"5": 1}
