"""CLI messages speak CLI, the Python API speaks Python: errors carry their advice for each
(`FasteError.hint` / `cli_hint`), a broken image never tells a terminal to pass on_error, a
missing collection names `faste-mm index`, a mistyped --model path is "not found" (not a
settings mismatch to --reindex), an extreme aspect ratio says what to do, and a warm-up layer
past the model's depth is warned about."""

from __future__ import annotations

import logging

import pytest
from PIL import Image
from typer.testing import CliRunner

from faste_mm import Item
from faste_mm.cli.app import app
from faste_mm.errors import CollectionError, InputError, ModelLoadError
from faste_mm.retrieval.retriever import Retriever

from tests.helpers.inputs import noise_image, tiny_vl_dir

runner = CliRunner()


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(tiny_vl_dir(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def collection(model, tmp_path_factory):
    """A collection of one image, and a folder with a broken image and a 6400 x 10 strip."""
    root = tmp_path_factory.mktemp("msgs")
    (root / "imgs").mkdir()
    noise_image(root / "imgs" / "a.png", (64, 64), 1)
    result = runner.invoke(app, ["index", str(root / "imgs"), "-c", str(root / "col"), "--model", model,
                                 "--device", "cpu"])
    assert result.exit_code == 0, result.output
    (root / "bad").mkdir()
    (root / "bad" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n not a png")
    Image.new("RGB", (6400, 10)).save(root / "bad" / "strip.png")
    return root


def test_a_broken_image_is_skipped_on_the_cli_without_python_advice(model, collection):
    bad = collection / "bad"
    result = runner.invoke(app, ["embed", str(bad / "corrupt.png"), "--text", "ok", "--model", model,
                                 "--device", "cpu"])
    assert result.exit_code == 0 and "corrupt.png" in result.stderr and "fix or remove" in result.stderr
    assert "on_error" not in result.stderr
    searched = runner.invoke(app, ["search", "--image", str(bad / "corrupt.png"), "-c", str(collection / "col")])
    assert searched.exit_code == 1 and "corrupt.png" in searched.stderr
    assert "on_error" not in searched.stderr and "Traceback" not in searched.stderr


def test_the_python_api_keeps_its_own_advice(vl_embedder, collection, tmp_path):
    with pytest.raises(InputError, match="on_error='skip'"):
        vl_embedder.encode([Item(image=collection / "bad" / "corrupt.png")])
    with pytest.raises(CollectionError, match="Collection.create") as missing:
        Retriever(vl_embedder, collection=tmp_path / "nowhere").search("x")
    assert "faste-mm index PATH -c" in missing.value.cli_message() and "Collection.create" not in missing.value.cli_message()


def test_a_missing_collection_says_how_to_create_it_with_the_cli(tmp_path):
    result = runner.invoke(app, ["search", "x", "-c", str(tmp_path / "nowhere")])
    assert result.exit_code == 1
    assert f"faste-mm index PATH -c {tmp_path / 'nowhere'}" in result.stderr and "Collection.create" not in result.stderr


def test_a_mistyped_model_path_on_an_existing_collection_is_not_found_not_a_mismatch(collection, tmp_path):
    result = runner.invoke(app, ["index", str(collection / "imgs"), "-c", str(collection / "col"),
                                 "--model", str(tmp_path / "nonexistent"), "--device", "cpu"])
    assert result.exit_code == 1 and "model not found" in result.stderr and "nonexistent" in result.stderr
    assert "--reindex" not in result.stderr and "different settings" not in result.stderr
    relative = runner.invoke(app, ["index", str(collection / "imgs"), "-c", str(collection / "col"),
                                   "--model", "./nonexistent", "--device", "cpu"])
    assert relative.exit_code == 1 and "model not found" in relative.stderr
    with pytest.raises(ModelLoadError, match="model not found"):
        Retriever.from_pretrained(str(tmp_path / "nonexistent"))


def test_a_vanished_collection_model_is_reported_as_not_found(model, tmp_path):
    import shutil

    moved = shutil.copytree(model, tmp_path / "model")
    (tmp_path / "imgs").mkdir()
    noise_image(tmp_path / "imgs" / "a.png", (64, 64), 2)
    assert runner.invoke(app, ["index", str(tmp_path / "imgs"), "-c", str(tmp_path / "col"), "--model", str(moved),
                               "--device", "cpu"]).exit_code == 0
    shutil.rmtree(moved)
    result = runner.invoke(app, ["search", "x", "-c", str(tmp_path / "col")])
    assert result.exit_code == 1 and "model not found" in result.stderr and str(moved) in result.stderr


def test_an_extreme_aspect_ratio_says_what_to_do(model, collection):
    result = runner.invoke(app, ["embed", str(collection / "bad" / "strip.png"), "--text", "ok", "--model", model,
                                 "--device", "cpu"])
    assert result.exit_code == 0 and "strip.png" in result.stderr
    assert "aspect ratio" in result.stderr and "crop it" in result.stderr


def test_a_warmup_layer_past_the_depth_is_warned_about_once_on_the_cli(vl_embedder, model):
    depth = vl_embedder.backbone.shape.num_layers
    result = runner.invoke(app, ["embed", "--text", "a", "--text", "b", "--model", model, "--device", "cpu",
                                 "--r-max", "0.5", "--warmup-layer", str(depth + 5)])
    assert result.exit_code == 0, result.output
    assert result.stderr.count(f"warm-up layer {depth + 5}") == 1 and f"below {depth}" in result.stderr


def test_the_library_logs_the_warmup_warning_once_per_embedder(vl_embedder, caplog):
    from faste_mm import FastEConfig

    depth = vl_embedder.backbone.shape.num_layers
    fresh = vl_embedder.with_batching(vl_embedder.batching)
    with caplog.at_level(logging.WARNING):
        fresh.encode(["a"], fast_e=FastEConfig(r_max=0.5, warmup_layer=depth - 1))
        assert "warm-up layer" not in caplog.text  # within the depth: no warning
        fresh.encode(["a"], fast_e=FastEConfig(r_max=0.5, warmup_layer=depth))
        fresh.encode(["b"], fast_e=FastEConfig(r_max=0.5, warmup_layer=depth))
    assert caplog.text.count(f"warm-up layer {depth}") == 1
