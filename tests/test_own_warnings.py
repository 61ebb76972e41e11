"""faste-mm's own code warns about nothing on the paths every command takes: a deprecation from
our call into transformers (e.g. `create_causal_mask(past_key_values=...)`, removed in 5.40)
printed a source line on every index, search, serve and plan."""

from __future__ import annotations

import warnings
from pathlib import Path

from faste_mm import FastEConfig
from tests.helpers.rerank_fixtures import reranker_dirs, text_reranker, vl_reranker  # noqa: F401 (fixtures)

_ROOT = Path(__file__).resolve().parents[1]


def test_embedding_documents_and_queries_warns_from_none_of_our_lines(vl_embedder, text_embedders, vl_reranker,
                                                                     text_reranker, mixed_items):
    """Every decoder family (the sliding-window masks of mistral too) and both rerankers."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vl_embedder.encode_documents(mixed_items, fast_e=FastEConfig(r_max=0.5, warmup_layer=1))
        vl_embedder.encode_queries(mixed_items[:2])
        for embedder in text_embedders.values():
            embedder.encode_documents(["a note about bears " * 8, "short"], fast_e=FastEConfig(r_max=0.5, warmup_layer=1))
        for reranker in (vl_reranker, text_reranker):
            reranker.rerank("a bear", ["bears in the woods", "a red car"])
    ours = [f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}" for w in caught
            if _ROOT in Path(w.filename).resolve().parents]
    assert ours == []
