"""--min-score across search modes: a cosine with the query, so hybrid search cuts every hit by it,
also one found by its words alone (its stored vector is scored); lexical search computes no
cosine, so a min_score given to it is a clear error on the Python API, the CLI and /search, while
a collection's default min_score leaves lexical searches alone."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from faste_mm.errors import ConfigError
from faste_mm.indexers import Collection, ItemRecord, Manifest
from faste_mm.retrieval.retriever import Retriever

DIM = 8


def _collection(root, min_score: float | None = None) -> np.ndarray:
    """Four items: two whose text says "harbour" (one close to the query vector, one far from it),
    two without the word (one close, one far). Returns the query vector."""
    query = np.eye(DIM, dtype=np.float32)[0]
    far = np.eye(DIM, dtype=np.float32)[1]
    near = (query + 0.2 * far) / np.linalg.norm(query + 0.2 * far)
    x = np.stack([near, far, near * 0.999 + 0.001 * far, far]).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    texts = ["harbour at dawn", "harbour crane", "a field", "a road"]
    with Collection.create(root, Manifest(model_id="m", dim=DIM, settings={"search": {"min_score": min_score}})) as col:
        col.add(x, [ItemRecord(uri=f"/docs/{i}.txt", modality="text", text=t) for i, t in enumerate(texts)])
    return query


def _uris(found, row=0):
    return sorted(found.records[int(i)].uri for i in found.ids[row] if i >= 0)


def test_hybrid_min_score_cuts_word_matches_by_their_cosine_too(tmp_path):
    query = _collection(tmp_path / "c")
    with Collection.open(tmp_path / "c") as col:
        every = col.find(4, queries=query[None], texts=["harbour"], mode="hybrid")
        cut = col.find(4, queries=query[None], texts=["harbour"], mode="hybrid", min_score=0.5)
    assert _uris(every) == ["/docs/0.txt", "/docs/1.txt", "/docs/2.txt", "/docs/3.txt"]
    # "harbour crane" matches the word but its cosine with the query is 0: cut like the far dense hit
    assert _uris(cut) == ["/docs/0.txt", "/docs/2.txt"]


def test_hybrid_hits_carry_their_cosine_beside_the_fused_score(tmp_path):
    from faste_mm.retrieval.querying import hits

    query = _collection(tmp_path / "c")
    with Collection.open(tmp_path / "c") as col:
        stored = dict(zip(col.live_ids(range(4)), col.vectors(np.arange(4))))
        hybrid = hits(col.find(4, queries=query[None], texts=["harbour"], mode="hybrid"))[0]
        dense = hits(col.find(4, queries=query[None], mode="dense"))[0]
    # what min_score cuts on, per hit (the word-only "harbour crane" included), shown beside the RRF score
    assert [h.similarity for h in hybrid] == pytest.approx([float(stored[h.id] @ query) for h in hybrid], abs=1e-6)
    assert {h.uri: round(h.similarity, 3) for h in hybrid}["/docs/1.txt"] == 0.0
    assert all("similarity" in h.to_dict() for h in hybrid)
    assert all(h.similarity is None and "similarity" not in h.to_dict() for h in dense)  # the score is the cosine


def test_lexical_search_refuses_a_min_score_and_ignores_the_collections_default(tmp_path):
    _collection(tmp_path / "c", min_score=0.9)
    retriever = Retriever.for_collection(tmp_path / "c")
    with pytest.raises(ConfigError, match="min_score 0.3: a minimum cosine similarity to the query, which lexical "
                                          "mode does not compute"):
        retriever.search("harbour", mode="lexical", min_score=0.3)
    assert sorted(h.uri for h in retriever.search("harbour", mode="lexical", k=4)) == ["/docs/0.txt", "/docs/1.txt"]


def test_cli_lexical_min_score_is_an_error_naming_it(tmp_path):
    from faste_mm.cli.app import app

    _collection(tmp_path / "c")
    result = CliRunner().invoke(app, ["search", "harbour", "-c", str(tmp_path / "c"), "--mode", "lexical",
                                      "--min-score", "0.3", "--no-server"])
    assert result.exit_code == 2 and not result.stdout, result.output  # a usage error, as a bad --min-score is
    said = " ".join(result.stderr.split())
    assert "--min-score 0.3: a minimum cosine similarity to the query, which lexical mode does not compute" in said
    assert "use --mode hybrid" in said


def test_http_lexical_min_score_is_a_400_naming_it(tmp_path, vl_embedder):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from faste_mm.serving import ServeConfig, ServeEngine, create_app

    _collection(tmp_path / "c")
    engine = ServeEngine(vl_embedder, Retriever.for_collection(tmp_path / "c"), ServeConfig())
    with TestClient(create_app(engine), base_url="http://127.0.0.1:8000") as client:
        bad = client.post("/search", json={"query": "harbour", "mode": "lexical", "min_score": 0.3})
        assert bad.status_code == 400 and "lexical mode does not compute" in bad.text
        good = client.post("/search", json={"query": "harbour", "mode": "lexical"})
        assert good.status_code == 200 and len(good.json()["hits"]) == 2
