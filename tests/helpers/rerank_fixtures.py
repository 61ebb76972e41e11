"""Tiny random-weight rerankers (Qwen3-VL with its LM head, Qwen3 text), built once per run."""

from __future__ import annotations

import pytest

from faste_mm import BatchingConfig
from faste_mm.model.rerank.reranker import Reranker
from tests.helpers.tiny_models import TinyModels

ONE_BATCH = BatchingConfig(batch_tokens=1 << 20)


@pytest.fixture(scope="session")
def reranker_dirs(tmp_path_factory):
    return TinyModels(tmp_path_factory.getbasetemp(), ("qwen3_vl_reranker", "qwen3_reranker"))


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
