"""faste-mm's loaders parse a checkpoint's tokenizer or processor once per process
(faste_mm/model/backbones/preprocessors.py): a later load of the same unchanged files gets the
parsed object; changed, replaced or copied files are parsed afresh; FASTE_MM_PREPROCESSOR_CACHE=off
parses every time."""

from __future__ import annotations

import os
import shutil

import pytest
from transformers import AutoTokenizer

from faste_mm.model.backbones.loading import load_model
from faste_mm.model.backbones.preprocessors import CACHE_ENV, MAX_ENTRIES, clear_preprocessor_cache, load_preprocessor
from faste_mm.model.rerank.loading import load_reranker
from tests.helpers.rerank_fixtures import reranker_dirs  # noqa: F401


@pytest.fixture()
def qwen3_copy(model_dirs, tmp_path):
    """A private copy of the tiny Qwen3 model: these tests change its files."""
    return shutil.copytree(model_dirs["qwen3"], tmp_path / "qwen3")


def test_a_second_load_of_unchanged_files_is_handed_the_parsed_tokenizer(qwen3_copy):
    first = load_model(qwen3_copy, device="cpu").preprocessor
    assert load_model(qwen3_copy, device="cpu").preprocessor is first
    assert load_model(str(qwen3_copy) + "/", device="cpu").preprocessor is first  # the same folder, spelled otherwise
    fresh = AutoTokenizer.from_pretrained(qwen3_copy)  # transformers' own load is untouched: its own object
    assert fresh is not first
    text = "a red bicycle leaning on a wall <|im_end|>"
    assert first(text)["input_ids"] == fresh(text)["input_ids"]


def test_the_reranker_loader_shares_its_processor_too(reranker_dirs):  # noqa: F811
    first = load_reranker(reranker_dirs["qwen3_vl_reranker"], device="cpu").preprocessor
    assert load_reranker(reranker_dirs["qwen3_vl_reranker"], device="cpu").preprocessor is first


@pytest.mark.parametrize("change", ["touched", "rewritten in place, times kept", "replaced by a copy", "file added"])
def test_changed_files_are_parsed_afresh(qwen3_copy, change):
    before = load_model(qwen3_copy, device="cpu").preprocessor
    config = qwen3_copy / "tokenizer_config.json"
    stat = config.stat()
    if change == "touched":
        os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    elif change == "rewritten in place, times kept":  # same size and mtime: only the change time moves
        config.write_bytes(config.read_bytes())
        os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    elif change == "replaced by a copy":
        shutil.copy2(config, qwen3_copy / "replacement")
        os.replace(qwen3_copy / "replacement", config)
    else:
        (qwen3_copy / "added_tokens.json").write_text("{}")
    after = load_model(qwen3_copy, device="cpu").preprocessor
    assert after is not before
    assert load_model(qwen3_copy, device="cpu").preprocessor is after  # and kept again


def test_an_edited_tokenizer_is_what_the_next_load_uses(qwen3_copy):
    """The cache never hands out what the files no longer say: a new chat template is seen."""
    import json

    before = load_model(qwen3_copy, device="cpu").preprocessor
    config = json.loads((qwen3_copy / "tokenizer_config.json").read_text())
    config["model_max_length"] = 1234
    (qwen3_copy / "tokenizer_config.json").write_text(json.dumps(config))
    assert before.model_max_length != 1234
    assert load_model(qwen3_copy, device="cpu").preprocessor.model_max_length == 1234


def test_a_copied_checkpoint_is_parsed_as_its_own(qwen3_copy, tmp_path):
    original = load_model(qwen3_copy, device="cpu").preprocessor
    copy = shutil.copytree(qwen3_copy, tmp_path / "copy")
    assert load_model(copy, device="cpu").preprocessor is not original


def test_the_cache_is_off_with_its_variable_and_forgets_when_cleared(qwen3_copy, monkeypatch):
    kept = load_model(qwen3_copy, device="cpu").preprocessor
    clear_preprocessor_cache()
    assert load_model(qwen3_copy, device="cpu").preprocessor is not kept
    monkeypatch.setenv(CACHE_ENV, "off")
    first = load_model(qwen3_copy, device="cpu").preprocessor
    assert load_model(qwen3_copy, device="cpu").preprocessor is not first


def test_the_least_recently_used_is_forgotten_past_the_bound(model_dirs, tmp_path):
    """A process cycling through many checkpoints keeps at most MAX_ENTRIES parsed (the tiny
    Llama's 400-token tokenizer: cheap to parse)."""
    copies = [shutil.copytree(model_dirs["llama"], tmp_path / f"llama-{i}") for i in range(MAX_ENTRIES + 1)]
    parsed = [load_preprocessor(str(copy), multimodal=False) for copy in copies]
    assert load_preprocessor(str(copies[-1]), multimodal=False) is parsed[-1]
    assert load_preprocessor(str(copies[0]), multimodal=False) is not parsed[0]  # the oldest went
