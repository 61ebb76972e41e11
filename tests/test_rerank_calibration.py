"""Calibration for rerankers: theta replayed from the recorded passes equals running the reranker
at that theta; top-k order agreement; `faste-mm calibrate --rerank` end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from faste_mm.cli.app import app
from faste_mm.errors import ConfigError
from faste_mm.model.faste import FastEConfig
from faste_mm.model.rerank.reranker import Reranker
from faste_mm.tools.rerank_calibration import RerankCalibrationConfig, calibrate_reranker, top_k_agreement

from tests.helpers.rerank_fixtures import reranker_dirs, text_reranker  # noqa: F401  (fixtures)

QUERIES = ["a red bicycle by the river", "the invoice total"]
DOCUMENTS = ["a blue car parked in the street " * 3, "a red bicycle leaning on a fence", "invoice total: 42 euros",
             "the river at dawn, misty and calm " * 2, "a cat asleep"]


def test_top_k_agreement_counts_ranks_kept_in_place():
    full = np.array([0.9, 0.1, 0.5, np.nan, 0.7])
    assert top_k_agreement(full, full, 3) == 1.0
    assert top_k_agreement(full, np.array([0.9, 0.1, 0.7, 0.0, 0.5]), 3) == pytest.approx(1 / 3)
    assert top_k_agreement(full, np.array([0.1, 0.9, 0.5, 0.0, 0.7]), 1) == 0.0


@pytest.mark.parametrize("protect", ["none", "query"])
def test_replayed_theta_equals_running_the_reranker_at_that_theta(text_reranker, protect):
    reranker = Reranker(text_reranker.loaded, protect=protect, batching=text_reranker.batching)
    config = RerankCalibrationConfig(fast_e=FastEConfig(r_max=0.5, warmup_layer=1), top_k=2, target=0.5, max_score_diff=1.0)
    calibration = calibrate_reranker(reranker, [(q, DOCUMENTS) for q in QUERIES], config)
    assert calibration.n_pairs == len(QUERIES) * len(DOCUMENTS) and calibration.protect == protect
    assert len(calibration.thetas) >= 2
    for report in calibration.thetas:
        compressed = Reranker(text_reranker.loaded, fast_e=FastEConfig(r_max=0.5, warmup_layer=1, threshold=report.theta),
                              protect=protect, batching=text_reranker.batching)
        diffs, agreement = [], []
        for query in QUERIES:
            full = text_reranker.score(query, DOCUMENTS).scores
            scores = compressed.score(query, DOCUMENTS).scores
            diffs.append(np.abs(scores - full))
            agreement.append(top_k_agreement(full, scores, 2))
        assert report.mean_score_diff == pytest.approx(float(np.concatenate(diffs).mean()), abs=1e-5)
        assert report.top_k_agreement == pytest.approx(float(np.mean(agreement)))
    assert calibration.threshold is None or any(r.theta == calibration.threshold and r.meets_target for r in calibration.thetas)


def test_a_fixed_trigger_layer_or_r_max_zero_leaves_nothing_to_calibrate():
    with pytest.raises(ConfigError, match="r_max is 0"):
        RerankCalibrationConfig(fast_e=FastEConfig(r_max=0.0))
    with pytest.raises(ConfigError, match="trigger_layer"):
        RerankCalibrationConfig(fast_e=FastEConfig(r_max=0.5, trigger_layer=2))


def test_calibrate_command_takes_a_reranker_and_queries(reranker_dirs, tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, text in enumerate(DOCUMENTS):
        (folder / f"d{i}.txt").write_text(text)
    base = ["calibrate", str(folder), "--rerank", str(reranker_dirs["qwen3_reranker"]), "--device", "cpu",
            "--warmup-layer", "1", "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(app, [*base, "--query", QUERIES[0], "--query", QUERIES[1], "--target", "0.5", "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["n_queries"] == 2 and report["n_pairs"] == 2 * len(DOCUMENTS) and report["thetas"]
    assert json.loads((tmp_path / "out" / "rerank_calibration.json").read_text()) == report
    missing = CliRunner().invoke(app, base)
    assert missing.exit_code != 0 and "--query" in missing.output
    saved = CliRunner().invoke(app, [*base, "--query", "q", "--save"])
    assert saved.exit_code != 0 and "--save" in saved.output


@pytest.mark.parametrize("flag, value", [("--model", "some/embedder"), ("--data", "mmeb"), ("--task", "docvqa"),
                                         ("--image-root", "."), ("-c", "photos")])
def test_calibrate_rerank_refuses_embedding_only_flags_naming_them(reranker_dirs, tmp_path, flag, value):
    (tmp_path / "d.txt").write_text("a document")
    result = CliRunner().invoke(app, ["calibrate", str(tmp_path), "--rerank", str(reranker_dirs["qwen3_reranker"]),
                                      "--query", "q", flag, value, "--out", str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    name = "--collection" if flag == "-c" else flag
    assert name in result.output and "--rerank" in result.output
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_calibrate_rerank_uses_the_rerankers_own_target_default(reranker_dirs, tmp_path, monkeypatch):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, text in enumerate(DOCUMENTS):
        (folder / f"d{i}.txt").write_text(text)
    monkeypatch.setenv("FASTE_MM_IMAGE_ROOT", str(tmp_path))  # set for eval: ignored here, with a warning
    base = ["calibrate", str(folder), "--rerank", str(reranker_dirs["qwen3_reranker"]), "--device", "cpu",
            "--warmup-layer", "1", "--query", QUERIES[0], "--out", str(tmp_path / "out"), "--format", "json"]
    result = CliRunner().invoke(app, base)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["target"] == RerankCalibrationConfig().target
    assert "ignored" in result.stderr and "--image-root" in result.stderr
    given = CliRunner().invoke(app, [*base, "--target", "0.6"])
    assert given.exit_code == 0 and json.loads(given.stdout)["target"] == 0.6
