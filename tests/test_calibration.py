"""Label-free theta calibration: the recommendation on synthetic curves (plateau then climb),
per-theta reports and recall retention against real FastE runs, one serialization per document,
the trigger rule shared with FastE, and the CLI (inputs checked before the model loads, the
table shown before a failed --save, --save picked up by `index`, --image-root)."""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from faste_mm import Embedder, FastEConfig, Item
from faste_mm.tools.calibration import (
    CalibrationConfig,
    Labels,
    calibrate,
    evaluate_thetas,
    recommend,
    trigger_layers,
)
from faste_mm.retrieval.calibrations import load_calibration, save_calibration
from faste_mm.cli.app import app
from faste_mm.model.faste import ThresholdTrigger
from faste_mm.datasets.metrics import gold_ranks, score_ranks
from faste_mm.errors import InputError

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


class _CountingSerializer:
    """The embedder's serializer, recording every item it serializes (workers are threads)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, item, instruction):
        with self._lock:
            self.calls.append(item.describe())
        return self.inner(item, instruction)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _counting(embedder: Embedder) -> tuple[Embedder, list[str]]:
    """The same weights and batching, with a serializer that records its calls."""
    counting = _CountingSerializer(embedder.serializer)
    return Embedder(replace(embedder.loaded, serializer=counting), embedder.batching), counting.calls


def _text_docs(root, n: int = 3):
    root.mkdir()
    for i in range(n):
        (root / f"{i}.txt").write_text(f"document number {i} about pages " * (i + 1))
    return root


def test_trigger_layer_is_the_first_crossing_after_warmup_or_the_last_layer():
    curve = np.array([0.9, 0.1, 0.5, 0.7, 0.8])
    assert ThresholdTrigger(0.6, 1, 5).first_layer(curve) == 3  # layer 0 is before warm-up
    assert ThresholdTrigger(0.7, 1, 5).first_layer(curve) == 3  # reaching theta is enough (>=)
    assert ThresholdTrigger(0.95, 1, 5).first_layer(curve) == 4  # never reached: fallback
    assert ThresholdTrigger(0.0, 9, 5).first_layer(curve) == 4  # warm-up past the depth
    assert trigger_layers(np.stack([curve, curve[::-1]]), 0.6, 1) == [3, 1]  # per batch


def test_faste_fires_where_calibration_replays_its_rule(vl_embedder, mixed_items):
    """The policy (online, on hidden states) and the replay over the recorded curve agree,
    including thetas exactly at a recorded alignment, warm-ups past the depth and the fallback."""
    probe = vl_embedder.encode_documents(mixed_items, record_alignment=True)
    curve = np.array([value for _, value in probe.stats.batches[0].alignment])  # [L]
    num_layers = len(curve)
    thetas = sorted({*curve[1:].tolist(), *np.minimum(curve[1:] + 1e-4, 1.0).tolist(), 1.0})  # theta is a cosine
    for warmup in (1, 3, num_layers + 2):
        for theta in thetas:
            res = vl_embedder.encode_documents(mixed_items, fast_e=FastEConfig(r_max=0.5, warmup_layer=warmup, threshold=theta))
            replayed = trigger_layers(curve[None, :], theta, warmup)[0]
            assert res.stats.batches[0].trigger_layer == replayed, (warmup, theta)
    assert trigger_layers(curve[None, :], 1.0, 1)[0] == num_layers - 1  # the fallback was exercised


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
    calibration = calibrate(vl_embedder, mixed_items, CalibrationConfig(fast_e=FastEConfig(r_max=0.5, warmup_layer=2), target=0.999))
    assert sorted(calibration.distortion) == [2, 3, 4, 5]
    full = vl_embedder.encode_documents(mixed_items).embeddings
    for report in calibration.thetas[:: max(1, len(calibration.thetas) // 3)]:
        res = vl_embedder.encode_documents(mixed_items, fast_e=FastEConfig(r_max=0.5, warmup_layer=2, threshold=report.theta))
        cos = np.sum(full * res.embeddings, axis=1)
        assert report.mean_cos == pytest.approx(float(cos.mean()), abs=1e-5)
        assert report.trigger_layers == {res.stats.batches[0].trigger_layer: 1}
        assert report.flops_reduction == pytest.approx(res.stats.flops_reduction)
    assert calibration.threshold == recommend(calibration.thetas)


def test_each_document_is_serialized_once_for_all_passes(vl_embedder, mixed_items):
    embedder, calls = _counting(vl_embedder)
    calibration = calibrate(embedder, mixed_items, CalibrationConfig(fast_e=FastEConfig(r_max=0.5, warmup_layer=2), target=0.999))
    assert sorted(calibration.distortion) == [2, 3, 4, 5]  # the full pass and 4 trigger layers ran
    assert len(calls) == len(mixed_items) and len(set(calls)) == len(mixed_items)


def test_recall_retention_stays_aligned_when_a_candidate_fails(vl_embedder, mixed_items, tmp_path):
    """A failed candidate must not shift the candidate lists onto other candidates' vectors:
    retention equals Recall@k of real Full and FastE runs over the same inputs (the failed one a
    zero row in both, as in `faste-mm eval`)."""
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image")
    candidates = [mixed_items[0], Item(image=broken), *mixed_items[1:]]  # 7 inputs, input 1 fails
    full = vl_embedder.encode_documents(candidates, on_error="skip")
    assert list(np.flatnonzero(~full.ok)) == [1]
    # Each query is its gold's full embedding, so the full forward ranks every gold first. Input 6
    # is a gold: with the rows shifted by the failure it would point past the vectors.
    golds, lists = [0, 3, 6, 2], [(0, 1, 2, 3), (3, 4, 5, 0), (6, 5, 1, 2), (2, 6, 4, 3)]
    labels = Labels(full.embeddings[golds], lists)
    config = CalibrationConfig(fast_e=FastEConfig(r_max=0.7, warmup_layer=2), target=0.999)
    calibration = calibrate(vl_embedder, candidates, config, labels)
    assert calibration.sample_size == 6 and len(calibration.skipped) == 1 and "broken.png" in calibration.skipped[0]
    reference = score_ranks(gold_ranks(labels.query_vectors, full.embeddings, lists))
    assert reference.recall_at_1 == 1.0
    for report in calibration.thetas[:: max(1, len(calibration.thetas) // 3)]:
        fast_e = FastEConfig(r_max=0.7, warmup_layer=2, threshold=report.theta)
        res = vl_embedder.encode_documents(candidates, fast_e=fast_e, on_error="skip")
        got = score_ranks(gold_ranks(labels.query_vectors, res.embeddings, lists))
        expected = {"recall@1": got.recall_at_1 / reference.recall_at_1, "recall@10": got.recall_at_10 / reference.recall_at_10}
        assert report.recall_retention == pytest.approx(expected), report.theta


def test_labels_that_do_not_fit_the_inputs_are_refused_before_any_model_run(vl_embedder, mixed_items, image_dir):
    embedder, calls = _counting(vl_embedder)
    vectors = np.eye(2, embedder.dim, dtype=np.float32)
    config = CalibrationConfig(fast_e=FastEConfig(r_max=0.5, warmup_layer=2))
    with pytest.raises(InputError, match="query 1 lists candidate 6, but there are 6 calibration inputs"):
        calibrate(embedder, mixed_items, config, Labels(vectors, [(0, 1), (2, 6)]))
    with pytest.raises(InputError, match=r"candidate 6 \(.*doc\.pdf.*\) is a PDF of 2 pages"):
        calibrate(embedder, [*mixed_items, image_dir / "doc.pdf"], config, Labels(vectors, [(0, 1), (2, 6)]))
    assert calls == []
    with pytest.raises(InputError, match="2 query vectors but 1 candidate lists"):
        Labels(vectors, [(0,)])


def test_saved_calibration_is_keyed_by_model_and_a_mismatch_is_ignored_with_a_message(vl_embedder, mixed_items, tmp_path, caplog):
    calibration = calibrate(vl_embedder, mixed_items[:3], CalibrationConfig(fast_e=FastEConfig(r_max=0.5, warmup_layer=2), target=0.9))
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
    (docs / "latin1.txt").write_bytes("café crème".encode("latin-1"))  # not UTF-8: skipped, and reported
    model = str(model_dirs["qwen3_vl"])
    runner = CliRunner()
    common = ["--model", model, "--device", "cpu"]
    runner.invoke(app, ["index", str(docs), "-c", str(tmp_path / "old"), *common, "--format", "json"])
    result = runner.invoke(app, ["calibrate", str(docs), *common, "--warmup-layer", "2", "--target", "0.9",
                                 "--save", "-c", str(tmp_path / "old"), "--out", str(tmp_path / "report"), "--format", "json"])
    assert result.exit_code == 0, result.output
    calibration = json.loads(result.stdout)
    theta = calibration["threshold"]
    assert theta is not None and calibration["sample_size"] == 5
    assert len(calibration["skipped"]) == 1 and "latin1.txt" in calibration["skipped"][0]
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
    # refused before the run: no report, nothing saved per user either
    assert not (tmp_path / "r" / "calibration.json").exists() and not (tmp_path / "config").exists()
    missing = runner.invoke(app, ["calibrate", str(docs), *qwen3, "--save", "-c", str(tmp_path / "nope"), "--out", str(tmp_path / "r")])
    assert missing.exit_code == 1 and "not a faste-mm collection" in " ".join(missing.output.split())
    assert not (tmp_path / "r" / "calibration.json").exists()


def test_save_without_a_passing_theta_shows_the_table_then_fails(model_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    docs = _text_docs(tmp_path / "docs")
    args = ["calibrate", str(docs), "--model", str(model_dirs["qwen3"]), "--device", "cpu", "--warmup-layer", "1"]
    # target 1.0: every compressed embedding would have to equal the full one exactly
    result = CliRunner().invoke(app, [*args, "--target", "1.0", "--save", "--out", str(tmp_path / "r")])
    assert result.exit_code == 1, result.output
    shown = " ".join(result.stdout.split())
    assert "calibration of" in shown and "p5 cos" in shown and "no theta reaches the target" in shown
    message = " ".join(result.stderr.split())
    assert "nothing saved: no candidate theta reached mean cos >= 1 with p5 cos >= 1" in message and "Lower --target or --r-max" in message
    output = " ".join(result.output.split())
    assert output.index("no theta reaches the target") < output.index("nothing saved")
    assert (tmp_path / "r" / "calibration.json").exists() and not (tmp_path / "config").exists()


@pytest.mark.parametrize(
    "case", ["missing-path", "too-few-documents", "out-is-a-file", "paths-and-data", "missing-data", "images-elsewhere", "bad-image-root"]
)
def test_inputs_are_checked_before_the_model_loads(case, tmp_path):
    from tests.helpers.eval_fixtures import write_mmeb

    docs = _text_docs(tmp_path / "docs")
    data = write_mmeb(tmp_path / "mmeb", image_dir="pics")  # not where the image root is looked for
    (tmp_path / "taken").write_text("a file, not a folder")
    args, expected = {
        "missing-path": ([str(docs), str(tmp_path / "typo")], ["typo: file or folder not found", "check the path"]),
        "too-few-documents": ([str(docs / "0.txt")], ["1 document(s) found", "at least 2"]),
        "out-is-a-file": ([str(docs), "--out", str(tmp_path / "taken")], ["--out", "a file is in the way"]),
        "paths-and-data": ([str(docs), "--data", str(data), "--task", "nights"], ["give PATHs, or --data DIR with --task"]),
        "missing-data": (["--data", str(tmp_path / "nowhere"), "--task", "nights"], ["nowhere: data directory not found"]),
        "images-elsewhere": (["--data", str(data), "--task", "nights"], ["not found under image root", "pass --image-root DIR"]),
        "bad-image-root": (["--data", str(data), "--task", "nights", "--image-root", str(tmp_path / "nope")], ["--image-root", "nope: folder not found"]),
    }[case]
    # A model that cannot load: had it been loaded first, its error would be the one reported.
    result = CliRunner().invoke(app, ["calibrate", *args, "--model", str(tmp_path / "no-such-model"), "--device", "cpu"])
    message = " ".join(result.stderr.split())
    assert result.exit_code == 1 and all(part in message for part in expected), message
    assert "no-such-model" not in message


def test_a_model_that_cannot_load_is_reported_once_the_inputs_are_valid(tmp_path):
    docs = _text_docs(tmp_path / "docs")
    args = ["calibrate", str(docs), "--model", str(tmp_path / "no-such-model"), "--device", "cpu", "--out", str(tmp_path / "r")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "no-such-model: model not found" in " ".join(result.stderr.split())


def test_labelled_mmeb_data_adds_recall_retention_per_theta(model_dirs, tmp_path, monkeypatch):
    from tests.helpers.eval_fixtures import write_mmeb

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    data = write_mmeb(tmp_path / "mmeb", image_dir="pics")  # images outside the default search: --image-root
    args = ["calibrate", "--data", str(data), "--image-root", str(data / "pics"), "--task", "nights",
            "--model", str(model_dirs["qwen3_vl"]), "--device", "cpu"]
    result = CliRunner().invoke(app, [*args, "--warmup-layer", "2", "--r-max", "0.7", "--out", str(tmp_path / "r"), "--format", "json"])
    assert result.exit_code == 0, result.output
    reports = json.loads(result.stdout)["thetas"]
    assert reports and all(set(r["recall_retention"]) == {"recall@1", "recall@10"} for r in reports)
    # The highest theta falls back to the last layer, the closest to the full forward.
    assert reports[-1]["trigger_layers"] == {"5": 1}
