"""A warm reranker query is proportional to its own work (issue 38, item 15): an image document's part
of every pair (its tail, from `<|vision_start|>` on) is encoded once and kept with its patches' hash,
so a later query over the same files runs no image processor and hashes nothing, and its pairs are
exactly the pairs encoded whole (ids, types, pixels, truncation), so the scores are the same."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from faste_mm import Item
from faste_mm.model.rerank import tower_cache
from faste_mm.model.rerank.pair_format import rerank_serializer_config
from faste_mm.model.rerank.reranker import Reranker

from tests.helpers.processors import processor_with, recording_class
from tests.helpers.rerank_fixtures import ONE_BATCH, reranker_dirs, vl_reranker  # noqa: F401


def _documents(image_dir) -> list[Item]:
    return [Item(image=image_dir / "red.png"),
            Item(image=image_dir / "doc.pdf", page=2, max_pixels=60_000, text="a landscape page with a caption"),
            Item(image=image_dir / "green_rgba.png", text="words " * 400),
            Item(image=Image.new("RGB", (64, 48), (9, 9, 9)), text="in memory: encoded whole")]


@pytest.mark.parametrize("max_length", [8192, 300])  # 300 truncates the long caption
@pytest.mark.parametrize("query", ["text", "newline", "image"])
def test_a_pair_from_kept_tails_equals_the_pair_encoded_whole(vl_reranker, image_dir, max_length, query):
    reranker = Reranker(vl_reranker.loaded, serializer=rerank_serializer_config(max_length), batching=ONE_BATCH)
    asked = {"text": "which page is landscape?", "newline": "ends in spaces and a newline  \n",
             "image": Item(image=image_dir / "gray.jpg", text="like this")}[query]
    prepared = reranker.prepare_query(asked)
    assert prepared.head is not None
    truncated = 0
    for twice in range(2):  # the second time from the kept tails
        for document in _documents(image_dir):
            pair, digests = reranker.serializer.keyed(prepared, document)
            whole = reranker.serializer(prepared, document)
            for name in ("input_ids", "mm_token_type_ids", "pixel_values", "image_grid_thw"):
                assert torch.equal(getattr(pair, name), getattr(whole, name)), (document, name)
            assert (pair.protected, pair.truncated) == (whole.protected, whole.truncated)
            truncated += pair.truncated
            if isinstance(document.image, Image.Image):
                assert digests is None  # no file identity: hashed with the batch, as before
            else:  # the digests the tower cache would compute from the pair's patches
                assert [key[-1] for key in tower_cache.TowerCache().keys(pair)] == list(digests)
    assert reranker.document_tails.hits == 3 and (truncated > 0) == (max_length < 8192)


def test_a_later_query_runs_no_image_processor_and_hashes_nothing(vl_reranker, reranker_dirs, image_dir, tmp_path,
                                                                  monkeypatch):
    photo = tmp_path / "photo.png"
    Image.new("RGB", (120, 80), (10, 200, 30)).save(photo)
    documents = [Item(image=photo, text="green"), *_documents(image_dir)[:3]]
    processed, hashed = [], []
    # the same weights behind an image processor that counts its runs (a subclass of the model's
    # own, loaded from its files): every image the reranker turns into patches passes through it
    processor = vl_reranker.loaded.preprocessor
    counting = recording_class(type(processor.image_processor), lambda *args, **kwargs: processed.append(1))
    image_processor = counting.from_pretrained(str(reranker_dirs["qwen3_vl_reranker"]))
    reranker = Reranker(replace(vl_reranker.loaded, preprocessor=processor_with(processor, image_processor=image_processor)),
                        batching=ONE_BATCH)
    plain = Reranker(vl_reranker.loaded, batching=ONE_BATCH, tower_cache_bytes=0)
    monkeypatch.setattr(tower_cache, "patch_digest", _recording(tower_cache.patch_digest, hashed))

    first = reranker.score("a green photo", documents).scores
    assert len(processed) == 4 and hashed == []  # each file's tail encoded and hashed once, beside its pixels
    second = reranker.score("which page is landscape?", documents).scores
    assert len(processed) == 4 and hashed == []  # the second query: neither again
    np.testing.assert_allclose(first, plain.score("a green photo", documents).scores, atol=1e-6)
    np.testing.assert_allclose(second, plain.score("which page is landscape?", documents).scores, atol=1e-6)

    Image.new("RGB", (96, 160), (200, 10, 10)).save(photo)  # rewritten: its tail is encoded again
    rewritten = reranker.score("a green photo", documents).scores
    np.testing.assert_allclose(rewritten, plain.score("a green photo", documents).scores, atol=1e-6)
    assert abs(rewritten[0] - first[0]) > 1e-6


def _recording(call, seen: list):
    def recorded(*args, **kwargs):
        seen.append(1)
        return call(*args, **kwargs)

    return recorded
