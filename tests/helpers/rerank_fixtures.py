"""Tiny random-weight rerankers (Qwen3-VL with its LM head, Qwen3 text), built once per run."""

from __future__ import annotations

import pytest

from faste_mm import BatchingConfig
from faste_mm.model.rerank.reranker import Reranker
from faste_mm.testing import build_tiny_model

ONE_BATCH = BatchingConfig(batch_tokens=1 << 20)


@pytest.fixture(scope="session")
def reranker_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rerankers")
    return {family: build_tiny_model(root / family, family) for family in ("qwen3_vl_reranker", "qwen3_reranker")}


@pytest.fixture(scope="session")
def vl_reranker(reranker_dirs) -> Reranker:
    return Reranker.from_pretrained(str(reranker_dirs["qwen3_vl_reranker"]), device="cpu", batching=ONE_BATCH)


@pytest.fixture(scope="session")
def text_reranker(reranker_dirs) -> Reranker:
    return Reranker.from_pretrained(str(reranker_dirs["qwen3_reranker"]), device="cpu", batching=ONE_BATCH)


@pytest.fixture(scope="session")
def vl_lm(reranker_dirs):
    from transformers import Qwen3VLForConditionalGeneration

    return Qwen3VLForConditionalGeneration.from_pretrained(str(reranker_dirs["qwen3_vl_reranker"])).eval()
