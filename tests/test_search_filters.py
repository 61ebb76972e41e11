"""Filtered search (metadata `where`, kind, path glob) against brute force over the stored vectors,
with an exact index and with approximate ones (HNSW, IVF), tombstones and a GPU-like search copy."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import numpy as np
import pytest

from faste_mm.errors import ConfigError
from faste_mm.indexers import Collection, ItemRecord, Manifest, SearchFilter

D = 32
N = 400
MODALITIES = ("image", "image+text", "page", "text")


def corpus(n: int = N, seed: int = 0) -> tuple[np.ndarray, list[ItemRecord]]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, D)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    records = [ItemRecord(uri=f"/data/{'invoices' if i % 3 == 0 else 'photos'}/f{i}.{'pdf' if i % 4 == 2 else 'png'}",
                          modality=MODALITIES[i % 4], page=1 if i % 4 == 2 else None,
                          metadata={"tag": ["invoice", "receipt", "photo"][i % 3], "year": 2020 + i % 5,
                                    "starred": i % 7 == 0, "label": str(2020 + i % 5)})
               for i in range(n)]
    return x, records


def build(tmp_path, index_type: str, n: int = N) -> tuple[Collection, np.ndarray, list[ItemRecord]]:
    x, records = corpus(n)
    col = Collection.create(tmp_path / index_type.replace(",", "_"), Manifest(model_id="m", dim=D, index_type=index_type))
    col.add(x, records)
    return col, x, records


def matches(record: ItemRecord, where: SearchFilter) -> bool:
    """The reference semantics, in Python: equal value of the same JSON kind, kind, fnmatch glob."""
    for key, value in where.where.items():
        stored = (record.metadata or {}).get(key, object())
        if isinstance(value, bool) or isinstance(stored, bool):
            if stored is not value:
                return False
        elif isinstance(value, str) != isinstance(stored, str) or stored != value:
            return False
    if where.types and record.modality not in where.modalities:
        return False
    return where.path is None or fnmatch.fnmatchcase(record.uri, where.path)


def brute_force(x: np.ndarray, records, queries: np.ndarray, where: SearchFilter, k: int, dead=frozenset()):
    allowed = np.array([i for i, r in enumerate(records) if matches(r, where) and i not in dead], dtype=np.int64)
    scores = queries @ x[allowed].T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), allowed[order], allowed


FILTERS = [
    SearchFilter(where={"tag": "invoice"}),
    SearchFilter(where={"year": 2022, "tag": "photo"}),
    SearchFilter(where={"label": "2022"}),  # a string: never matches the number 2022
    SearchFilter(where={"starred": True}),
    SearchFilter(types=("pdf",)),
    SearchFilter(types=("image", "text")),
    SearchFilter(path="/data/invoices/*"),
    SearchFilter(where={"tag": "receipt"}, types=("image",), path="*.png"),
]


@pytest.mark.parametrize("where", FILTERS, ids=lambda f: str(f.to_dict()))
def test_filtered_flat_search_equals_brute_force_over_the_matching_items(tmp_path, where):
    col, x, records = build(tmp_path, "Flat")
    queries = corpus(8, seed=1)[0]
    scores, ids = col.search(queries, k=10, where=where)
    ref_scores, ref_ids, allowed = brute_force(x, records, queries, where, 10)
    assert len(allowed) >= 10
    np.testing.assert_allclose(scores, ref_scores, atol=1e-3)  # float16 storage
    assert np.isin(ids, allowed).all()
    # Ties aside, the same items: compare where the reference scores are distinct.
    assert (ids == ref_ids).mean() > 0.95


@pytest.mark.parametrize("index_type", ["HNSW32", "IVF16,Flat"])
@pytest.mark.parametrize("where", [FILTERS[0], FILTERS[1], FILTERS[7], SearchFilter(where={"year": 2021, "starred": True})],
                         ids=["tag", "year+tag", "three-conditions", "very-selective"])
def test_approximate_indexes_return_k_matching_items_when_k_exist(tmp_path, index_type, where):
    col, x, records = build(tmp_path, index_type)
    assert col.rebuild_index() == index_type  # really approximate, not the small-collection fallback
    queries = corpus(16, seed=2)[0]
    k = 10
    scores, ids = col.search(queries, k=k, where=where, nprobe=1, ef_search=10)  # deliberately poor settings
    ref_scores, ref_ids, allowed = brute_force(x, records, queries, where, k)
    want = min(k, len(allowed))
    assert ((ids[:, :want] >= 0).sum(axis=1) == want).all()
    assert (ids[:, want:] == -1).all()
    assert np.isin(ids[ids >= 0], allowed).all()
    # Every returned score is that item's true score, in descending order.
    assert np.all(np.diff(scores[:, :want], axis=1) <= 1e-6)
    found = np.where(ids >= 0, ids, 0)
    true = np.einsum("qd,qkd->qk", queries, x[found])
    np.testing.assert_allclose(scores[ids >= 0], true[ids >= 0], atol=1e-3)


def test_filtered_search_skips_tombstones_and_fills_k(tmp_path):
    col, x, records = build(tmp_path, "HNSW32")
    where = SearchFilter(where={"tag": "invoice"})
    queries = corpus(4, seed=3)[0]
    _, before = col.search(queries, k=5, where=where)
    dead = {int(i) for i in before[:, :3].ravel()}
    col.delete(dead)
    scores, ids = col.search(queries, k=5, where=where)
    assert not (set(ids.ravel().tolist()) & dead)
    assert (ids >= 0).all()
    ref_scores, _, _ = brute_force(x, records, queries, where, 5, dead=dead)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-3)


def test_a_search_copy_without_selectors_filters_by_over_fetching(tmp_path, monkeypatch):
    """A GPU copy takes no id selector; the over-fetch path must give the same exact result."""
    col, x, records = build(tmp_path, "Flat")
    where = SearchFilter(where={"year": 2023}, types=("text", "pdf"))
    queries = corpus(6, seed=4)[0]
    expected = col.search(queries, k=7, where=where)
    monkeypatch.setattr(type(col._index), "can_select", property(lambda self: False))
    scores, ids = col.search(queries, k=7, where=where)
    np.testing.assert_allclose(scores, expected[0], atol=1e-6)
    np.testing.assert_array_equal(ids, expected[1])


def test_fewer_matches_than_k_pad_and_no_match_gives_no_hits(tmp_path):
    col, x, records = build(tmp_path, "Flat", n=40)
    where = SearchFilter(where={"year": 2024, "tag": "invoice"})
    _, _, allowed = brute_force(x, records, x[:1], where, 10)
    scores, ids = col.search(x[:2], k=10, where=where)
    assert 0 < len(allowed) < 10
    assert ((ids >= 0).sum(axis=1) == len(allowed)).all() and np.isinf(scores[ids < 0]).all()
    _, none = col.search(x[:2], k=3, where=SearchFilter(where={"tag": "nothing"}))
    assert (none == -1).all()


@pytest.mark.parametrize("bad, match", [
    (dict(where={"tag": ["a", "b"]}), "values must be"),
    (dict(where={"": "x"}), "non-empty"),
    (dict(types=("audio",)), "'audio' is not one of image, pdf, text, video"),
    (dict(path=" "), "non-empty glob"),
])
def test_bad_filters_are_config_errors_naming_the_field(bad, match):
    with pytest.raises(ConfigError, match=match):
        SearchFilter(**bad)


def test_a_relative_path_glob_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert SearchFilter(path="./photos/*").path == f"{tmp_path}/photos/*"
    assert SearchFilter(path="*/photos/*").path == "*/photos/*"


# ---- Retriever and CLI (tiny model) ---------------------------------------------------------
@pytest.fixture(scope="module")
def filtered_collection(tmp_path_factory):
    """The corpus indexed, plus texts added with metadata; returns (model dir, corpus, collection)."""
    from faste_mm import BatchingConfig, Embedder
    from faste_mm.retrieval.retriever import Retriever
    from tests.helpers.inputs import make_corpus, tiny_vl_dir

    model = tiny_vl_dir(tmp_path_factory.getbasetemp())
    root = make_corpus(tmp_path_factory.mktemp("corpus"))
    col = tmp_path_factory.mktemp("col") / "c"
    embedder = Embedder.from_pretrained(str(model), device="cpu", batching=BatchingConfig(batch_tokens=1 << 16))
    retriever = Retriever(embedder, collection=col, r_max=0.0)
    retriever.index([root])
    texts = [f"note number {i} about invoices and receipts" for i in range(6)]
    retriever.add(texts, metadata=[{"tag": "invoice" if i % 2 else "receipt", "year": 2020 + i} for i in range(6)])
    return retriever, root, col


def test_retriever_search_filters_by_metadata_type_and_path(filtered_collection):
    retriever, root, _ = filtered_collection
    everything = retriever.search("invoice", k=50)
    hits = retriever.search("invoice", k=50, where={"tag": "invoice"})
    assert [h.metadata["tag"] for h in hits] == ["invoice"] * 3
    # The filtered ranking is the unfiltered one restricted to the matching items.
    assert [h.id for h in hits] == [h.id for h in everything if (h.metadata or {}).get("tag") == "invoice"]
    assert {h.page for h in retriever.search("invoice", k=50, type="pdf")} == {1, 2}
    sub = retriever.search("invoice", k=50, path=str(root.resolve() / "sub" / "*"))
    assert sorted(h.uri for h in sub) == [h.uri for h in sorted(everything, key=lambda h: h.uri) if "/sub/" in h.uri]
    batch = retriever.search_batch(["invoice", "receipt"], k=2, where={"year": 2024}, type=["text"])
    assert [[h.metadata["year"] for h in hits] for hits in batch] == [[2024], [2024]]


def test_cli_search_where_type_and_path(filtered_collection):
    import json as _json

    from typer.testing import CliRunner

    from faste_mm.cli.app import app

    retriever, root, col = filtered_collection
    runner = CliRunner()

    def search(*args: str) -> list[dict]:
        result = runner.invoke(app, ["search", "invoice", "-c", str(col), "-k", "50", "--format", "json", *args])
        assert result.exit_code == 0, (result.stdout, result.stderr)
        return _json.loads(result.stdout)["hits"]

    assert {h["metadata"]["tag"] for h in search("--where", "tag=invoice")} == {"invoice"}
    assert [h["metadata"]["year"] for h in search("--where", "tag=receipt", "--where", "year=2022")] == [2022]
    assert search("--where", 'year="2022"') == []  # a quoted number is text, the stored value a number
    assert {h["page"] for h in search("--type", "pdf")} == {1, 2}
    assert {Path(h["uri"]).suffix for h in search("--type", "image", "--type", "text")} >= {".png", ".txt"}
    assert all("/sub/" in h["uri"] for h in search("--path", "*/sub/*")) and search("--path", "*/sub/*")
    bad = runner.invoke(app, ["search", "x", "-c", str(col), "--where", "tag"])
    assert bad.exit_code == 2 and "KEY=VALUE" in bad.stderr
    wrong = runner.invoke(app, ["search", "x", "-c", str(col), "--type", "audio"])
    assert wrong.exit_code == 2 and "--type 'audio' is not one of image, pdf, text, video" in wrong.stderr
