"""`Retriever.add` identity: different (content, metadata) pairs are different items; the same
pair added again replaces itself; explicit uris choose the identity."""

from __future__ import annotations

import pytest

from faste_mm import BatchingConfig, Embedder
from faste_mm.retrieval.retriever import Retriever

from tests.helpers.inputs import tiny_vl_dir


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> Embedder:
    return Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu",
                                    batching=BatchingConfig(batch_tokens=1 << 16))


def test_the_same_text_with_different_metadata_is_two_items_and_keeps_both(embedder, tmp_path):
    r = Retriever(embedder, collection=tmp_path / "c", r_max=0.0)
    first = r.add(["quarterly report"], metadata=[{"tag": "invoice"}]).ids
    second = r.add(["quarterly report"], metadata=[{"tag": "receipt"}]).ids
    assert first[0] != second[0]
    info = r.info()
    assert (info.n_ok, info.n_deleted) == (2, 0)  # nothing was tombstoned
    hits = r.search("quarterly report", k=5)
    assert sorted(h.metadata["tag"] for h in hits) == ["invoice", "receipt"]
    assert hits[0].score == pytest.approx(hits[1].score, abs=1e-5)  # same content, same vector


def test_re_adding_identical_content_and_metadata_is_idempotent(embedder, tmp_path):
    r = Retriever(embedder, collection=tmp_path / "c", r_max=0.0)
    r.add(["a note", "another note"], metadata=[{"k": 1, "j": [1, 2]}, None])
    r.add(["a note", "another note"], metadata=[{"j": [1, 2], "k": 1}, None])  # key order does not matter
    info = r.info()
    assert info.n_ok == 2
    assert {h.metadata and h.metadata["k"] for h in r.search("a note", k=5)} == {1, None}


def test_explicit_uris_choose_the_identity(embedder, tmp_path):
    r = Retriever(embedder, collection=tmp_path / "c", r_max=0.0)
    r.add(["draft"], metadata=[{"v": 1}], uris=["doc:42"])
    r.add(["final text"], metadata=[{"v": 2}], uris=["doc:42"])  # same uri: the new version replaces it
    hits = r.search("final text", k=5)
    assert [(h.uri, h.metadata["v"]) for h in hits] == [("doc:42", 2)]
