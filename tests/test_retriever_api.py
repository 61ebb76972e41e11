"""Retriever end to end on a tiny model: index a generated folder, search by text and image,
incremental re-runs, deletes, compaction, settings mismatches and index types."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from faste_mm import BatchingConfig, Embedder, FastEConfig, Item
from faste_mm.errors import CollectionError
from faste_mm.indexers import Collection
from faste_mm.retriever import DEFAULT_QUERY_INSTRUCTION, IndexOptions, Retriever, collection_path

from tests.test_retriever_scanning import (
    CORPUS_EMBEDDED,
    CORPUS_FAILED,
    CORPUS_FILES,
    CORPUS_REUSED,
    make_corpus,
    noise_image,
    tiny_vl_dir,
)


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> Embedder:
    return Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu",
                                    batching=BatchingConfig(batch_tokens=1 << 16))


@pytest.fixture(scope="module")
def indexed(embedder, tmp_path_factory):
    """The corpus indexed once with r_max=0.5 (read-only for the tests that use it)."""
    root = make_corpus(tmp_path_factory.mktemp("corpus"))
    retriever = Retriever(embedder, collection=tmp_path_factory.mktemp("col") / "c", r_max=0.5)
    seen = []
    report = retriever.index([root], progress=seen.append)
    return retriever, root, report, seen


def test_index_reports_embedded_reused_and_failed_items(indexed):
    retriever, root, report, seen = indexed
    assert (report.files_scanned, report.embedded, report.reused, report.failed) == (
        CORPUS_FILES, CORPUS_EMBEDDED, CORPUS_REUSED, CORPUS_FAILED)
    assert {Path(f.uri).name for f in report.failures} == {"corrupt.png", "empty.jpg"}
    assert any("empty" in f.error for f in report.failures)
    assert report.prefix_removal == pytest.approx(0.5, abs=0.05) and report.prefix_tokens > 0
    assert seen[0].files_done == 0 and seen[-1].files_done == seen[-1].files_total == CORPUS_FILES
    info = retriever.info()
    assert (info.n_ok, info.n_failed) == (CORPUS_EMBEDDED + CORPUS_REUSED, CORPUS_FAILED)
    assert sorted(Path(r.uri).name for r in info.failures) == ["corrupt.png", "empty.jpg"]
    assert report.to_dict()["failures"][0].keys() == {"uri", "page", "error"}


def test_stored_vectors_match_the_embedder_with_the_collection_fast_e(indexed, embedder):
    retriever, root, _, _ = indexed
    files = [root / "red.png", root / "notes.txt", root / "doc.pdf"]
    expected = embedder.encode_documents([files[0], Item(text=files[1].read_text()), files[2]],
                                         fast_e=FastEConfig(r_max=0.5)).embeddings
    ids = {(Path(h.uri).name, h.page): h.id for h in retriever.search("anything", k=50)}
    with Collection.open(retriever.collection) as col:
        got = col.vectors([ids[("red.png", None)], ids[("notes.txt", None)], ids[("doc.pdf", 1)], ids[("doc.pdf", 2)]])
        # The duplicate reuses red.png's stored vector instead of being embedded again.
        np.testing.assert_array_equal(col.vectors([ids[("copy_of_red.png", None)]]), got[:1])
    np.testing.assert_allclose(got, expected, atol=2e-3)  # float16 storage


def test_an_indexed_image_searched_by_itself_comes_first_with_score_one(indexed):
    retriever, root, _, _ = indexed
    for name in ("green_rgba.png", "gray.jpg", "sub/wide.webp"):
        hits = retriever.search(image=root / name, k=3)
        assert Path(hits[0].uri) == (root / name).resolve()
        assert hits[0].score == pytest.approx(1.0, abs=2e-3)


def test_text_search_ranks_by_inner_product_with_the_query_instruction(indexed, embedder):
    retriever, root, _, _ = indexed
    hits = retriever.search("a red bicycle", k=50)
    assert len(hits) == CORPUS_EMBEDDED + CORPUS_REUSED  # every live item, failures never
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)
    query = embedder.encode_queries(["a red bicycle"], instruction=DEFAULT_QUERY_INSTRUCTION).embeddings[0]
    with Collection.open(retriever.collection) as col:
        stored = col.vectors([h.id for h in hits])
    np.testing.assert_allclose(scores, stored @ query, atol=1e-4)
    assert {(Path(h.uri).name, h.page) for h in hits} >= {("doc.pdf", 1), ("doc.pdf", 2)}
    batch = retriever.search_batch(["a red bicycle", root / "gray.jpg"], k=2)
    assert [h.id for h in batch[0]] == [h.id for h in hits[:2]] and Path(batch[1][0].uri).name == "gray.jpg"


def test_rerun_is_incremental_changes_are_reembedded_and_vanished_files_removed(embedder, tmp_path):
    root = make_corpus(tmp_path / "corpus")
    retriever = Retriever(embedder, collection=tmp_path / "col", r_max=0.0)
    retriever.index([root])
    again = retriever.index([root])
    assert (again.embedded, again.reused, again.failed, again.removed, again.unchanged) == (0, 0, 0, 0, CORPUS_FILES)
    noise_image(root / "gray.jpg", (90, 90), 99, "L")  # new content
    (root / "sub" / "wide.webp").unlink()
    stat = (root / "red.png").stat()
    os.utime(root / "red.png", (stat.st_atime, stat.st_mtime + 10))  # touched, same bytes
    report = retriever.index([root])
    assert (report.embedded, report.reused, report.removed) == (1, 1, 1)
    uris = {Path(h.uri).name for h in retriever.search("anything", k=50)}
    assert "wide.webp" not in uris and {"gray.jpg", "red.png"} <= uris
    assert retriever.info().n_ok == CORPUS_EMBEDDED + CORPUS_REUSED - 1


def test_delete_add_and_compact(embedder, tmp_path):
    root = make_corpus(tmp_path / "corpus")
    retriever = Retriever(embedder, collection=tmp_path / "col", r_max=0.0)
    retriever.index([root / "red.png", root / "gray.jpg", root / "readme.docx"])
    info = retriever.info()
    assert info.n_failed == 1 and "unsupported" in info.failures[0].error  # named explicitly
    ids = retriever.add(["a note about bicycles", Item(image=root / "green_rgba.png")],
                        metadata=[{"source": "manual"}, None])
    hit = retriever.search("a note about bicycles", k=10)
    assert {h.id for h in hit} >= set(ids.tolist())
    assert next(h for h in hit if h.id == ids[0]).metadata == {"source": "manual"}
    assert retriever.delete(ids[:1]) == 1
    assert ids[0] not in {h.id for h in retriever.search("a note about bicycles", k=10)}
    assert retriever.remove([root]) and retriever.info().n_ok == 0
    assert retriever.compact() == 4
    assert retriever.info().n_deleted == 0 and retriever.search("x", k=5) == []


def test_a_different_model_is_refused_until_reindex(embedder, tmp_path):
    root = make_corpus(tmp_path / "corpus")
    Retriever(embedder, collection=tmp_path / "col", r_max=0.0).index([root / "red.png"])
    other_dir = shutil.copytree(embedder.model_id, tmp_path / "other-model")
    other = Embedder.from_pretrained(str(other_dir), device="cpu")
    with pytest.raises(CollectionError, match="model_id.*--reindex"):
        Retriever(other, collection=tmp_path / "col").index([root / "gray.jpg"])
    report = Retriever(other, collection=tmp_path / "col").index([root / "gray.jpg"], options=IndexOptions(reindex=True))
    assert report.embedded == 1
    reopened = Retriever.open(tmp_path / "col")
    assert reopened.embedder.model_id == str(other_dir) and reopened.info().n_ok == 1
    assert reopened.r_max == 0.5  # the new collection's settings


def test_index_types_and_rebuild_give_the_same_results(embedder, tmp_path):
    root = tmp_path / "many"
    root.mkdir()
    for i in range(12):
        noise_image(root / f"{i:02d}.png", (48, 48), 100 + i)
    retriever = Retriever(embedder, collection=tmp_path / "col", r_max=0.0)
    retriever.index([root], options=IndexOptions(index_type="IVF4,Flat"))
    assert retriever.info().index_factory == "IVF4,Flat"
    queries = [root / f"{i:02d}.png" for i in (0, 5, 11)]
    ivf = retriever.search_batch(queries, k=3)
    assert [Path(h[0].uri).name for h in ivf] == ["00.png", "05.png", "11.png"]
    assert retriever.rebuild_index("HNSW16") == "HNSW16"
    assert [Path(h[0].uri).name for h in retriever.search_batch(queries, k=3)] == ["00.png", "05.png", "11.png"]
    flat = (retriever.rebuild_index("Flat"), retriever.search_batch(queries, k=5))[1]
    retriever.rebuild_index()
    again = retriever.search_batch(queries, k=5)
    assert [[(h.id, h.score) for h in q] for q in again] == [[(h.id, h.score) for h in q] for q in flat]


def test_collection_names_resolve_under_the_user_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    base = tmp_path / "data" / "faste-mm" / "collections"
    assert collection_path(None) == base / "default"
    assert collection_path("photos") == base / "photos"
    assert collection_path("./photos") == Path("photos").absolute() and collection_path("a/b") == Path("a/b").absolute()


def test_a_missing_named_path_is_reported_on_every_run(embedder, tmp_path):
    retriever = Retriever(embedder, collection=tmp_path / "col", r_max=0.0)
    for _ in range(3):
        report = retriever.index([tmp_path / "gone.png"])
        assert [Path(f.uri).name for f in report.failures] == ["gone.png"]
        assert "not found" in report.failures[0].error
