"""Retriever end to end on a tiny model: index a generated folder, search by text and image,
incremental re-runs (which never load the model when nothing is new), add with on_error,
non-finite vectors, deletes, removes, compaction, settings mismatches and index types."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from faste_mm import BatchingConfig, Embedder, FastEConfig, Item
from faste_mm.model.embedder import EmbedResult
from faste_mm.errors import CollectionError, ConfigError, InputError, ModelLoadError
from faste_mm.indexers import Collection
from faste_mm.retrieval.maintenance import collection_path
from faste_mm.retrieval.model_spec import ModelSpec
from faste_mm.retrieval.profile import read_profile
from faste_mm.retrieval.results import IndexOptions
from faste_mm.retrieval.retriever import DEFAULT_QUERY_INSTRUCTION, Retriever

from tests.helpers.inputs import (
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
                        metadata=[{"source": "manual"}, None]).ids
    hit = retriever.search("a note about bicycles", k=10)
    assert {h.id for h in hit} >= set(ids.tolist())
    assert next(h for h in hit if h.id == ids[0]).metadata == {"source": "manual"}
    assert retriever.delete(ids[:1]) == 1
    assert ids[0] not in {h.id for h in retriever.search("a note about bicycles", k=10)}
    assert retriever.remove([root]).uris and retriever.info().n_ok == 0
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


def test_a_missing_path_is_an_input_error_naming_it_and_nothing_is_created(embedder, tmp_path):
    """A mistyped folder (the README's ./images in a fresh clone) must not leave an empty collection
    and a 0-result search: the run refuses, naming every path that does not exist."""
    (tmp_path / "real").mkdir()
    retriever = Retriever(embedder, collection=tmp_path / "col", r_max=0.0)
    with pytest.raises(InputError, match=r"gone\.png, .*images: no such file or folder; check the path"):
        retriever.index([tmp_path / "gone.png", tmp_path / "real", tmp_path / "images"])
    assert not (tmp_path / "col").exists()


class PoisonedEmbedder(Embedder):
    """The tiny model, except that rows whose item names `poisoned` come back NaN, as a float16
    overflow would (a stand-in for a model that misbehaves on one input)."""

    def __init__(self, base: Embedder, poisoned: str) -> None:
        super().__init__(base.loaded, base.batching)
        self.poisoned = poisoned

    def encode(self, inputs, **options) -> EmbedResult:
        result = super().encode(inputs, **options)
        for row, item in enumerate(result.items):
            if self.poisoned in item.describe():
                result.embeddings[row] = np.nan
        return result


def three_images(root: Path) -> Path:
    root.mkdir(parents=True)
    for i, name in enumerate(("a.png", "b.png", "c.png")):
        noise_image(root / name, (48, 48), 300 + i)
    return root


def test_a_rerun_with_nothing_new_to_embed_never_loads_the_model(embedder, tmp_path):
    model = shutil.copytree(embedder.model_id, tmp_path / "model")
    root = three_images(tmp_path / "imgs")
    Retriever(ModelSpec(str(model), device="cpu"), collection=tmp_path / "col", r_max=0.0).index([root])
    shutil.rmtree(model)  # from here on, loading the model raises ModelLoadError
    retriever = Retriever.open(tmp_path / "col", device="cpu")
    again = retriever.index([root])
    assert (again.unchanged, again.embedded, again.failed, again.index_factory) == (3, 0, 0, "Flat")
    stat = (root / "a.png").stat()
    os.utime(root / "a.png", (stat.st_atime, stat.st_mtime + 10))  # touched: same bytes
    shutil.copy(root / "b.png", root / "b_copy.png")  # same bytes as an indexed file
    (root / "c.png").unlink()
    reused = retriever.index([root])
    assert (reused.reused, reused.embedded, reused.removed) == (2, 0, 1)
    assert retriever.info().n_ok == 3
    noise_image(root / "new.png", (48, 48), 999)  # the first file that needs the model
    with pytest.raises(ModelLoadError, match="model"):
        retriever.index([root])


def test_a_model_with_another_id_is_refused_before_it_loads(embedder, tmp_path):
    root = three_images(tmp_path / "imgs")
    Retriever(embedder, collection=tmp_path / "col", r_max=0.0).index([root])
    elsewhere = ModelSpec("someone/no-such-model", device="cpu")  # a hub id: loading it would fail
    with pytest.raises(CollectionError, match="model_id.*no-such-model.*reindex=True"):
        Retriever(elsewhere, collection=tmp_path / "col").index([root])
    # A path that names no folder is a typo, not another model: "not found", before any comparison.
    with pytest.raises(ModelLoadError, match="model not found"):
        Retriever(ModelSpec(str(tmp_path / "no-such-model"), device="cpu"), collection=tmp_path / "col").index([root])


def test_add_with_skip_stores_the_good_items_and_records_the_bad_one(embedder, tmp_path):
    root = three_images(tmp_path / "imgs")
    retriever = Retriever(embedder, collection=tmp_path / "col", r_max=0.0)
    items = ["a note about bicycles", root / "missing.png", Item(image=root / "a.png")]
    with pytest.raises(InputError, match="missing.png"):
        retriever.add(items)  # on_error="raise" (the default) stores nothing
    report = retriever.add(items, metadata=[{"n": 0}, {"n": 1}, {"n": 2}], on_error="skip")
    assert report.ids[1] == -1 and (report.ids[[0, 2]] >= 0).all()
    assert [Path(f.uri).name for f in report.failures] == ["missing.png"] and "missing.png" in report.failures[0].error
    assert report.to_dict()["ids"][1] == -1
    info = retriever.info()
    assert (info.n_ok, info.n_failed) == (2, 1) and Path(info.failures[0].uri).name == "missing.png"
    hits = retriever.search("a note about bicycles", k=5)
    assert {h.id for h in hits} == set(report.ids[[0, 2]].tolist())
    assert {h.metadata["n"] for h in hits} == {0, 2}
    with pytest.raises(ConfigError, match="on_error"):
        retriever.add(items, on_error="ignore")


def test_a_non_finite_vector_fails_only_its_item(embedder, tmp_path):
    root = three_images(tmp_path / "imgs")
    poisoned = PoisonedEmbedder(embedder, "b.png")
    report = Retriever(poisoned, collection=tmp_path / "col", r_max=0.0).index([root])
    assert (report.embedded, report.failed) == (2, 1)
    (failure,) = report.failures
    assert Path(failure.uri).name == "b.png" and "b.png" in failure.error and "non-finite" in failure.error
    healthy = Retriever(embedder, collection=tmp_path / "col", r_max=0.0)
    assert {Path(h.uri).name for h in healthy.search("anything", k=5)} == {"a.png", "c.png"}
    retried = healthy.index([root], options=IndexOptions(retry_failed=True))
    assert (retried.embedded, retried.failed, healthy.info().n_ok) == (1, 0, 3)
    adder = Retriever(poisoned, collection=tmp_path / "col", r_max=0.0)
    with pytest.raises(InputError, match="input 1: .*b.png.*non-finite"):
        adder.add(["a caption", root / "b.png"])
    skipped = adder.add(["a caption", root / "b.png"], on_error="skip")
    assert skipped.ids[1] == -1 and "non-finite" in skipped.failures[0].error
    info = healthy.info()  # + the caption; the failed re-add replaced b.png, as a changed file that fails would
    assert (info.n_ok, info.n_failed, Path(info.failures[0].uri).name) == (3, 1, "b.png")


def test_remove_reports_the_targets_that_matched_nothing(embedder, tmp_path):
    root = three_images(tmp_path / "imgs")
    retriever = Retriever(embedder, collection=tmp_path / "col", r_max=0.0)
    retriever.index([root])
    (kept,) = [h.id for h in retriever.search(image=root / "c.png", k=1)]
    report = retriever.remove([root / "a.png", root / "nope.png", tmp_path / "im"], ids=[kept, 12345])
    assert [Path(u).name for u in report.uris] == ["a.png"] and report.ids == (kept,)
    assert report.unmatched == (str(root / "nope.png"), str(tmp_path / "im"), "12345")  # "im" is no folder prefix
    assert retriever.info().n_ok == 1
    assert retriever.remove([root]).to_dict() == {"uris": [str((root / "b.png").resolve())], "ids": [],
                                                  "unmatched": [], "excluded": [str(root.resolve())]}


def test_reindex_checks_the_index_type_the_model_and_the_folder_before_erasing(embedder, tmp_path):
    root = three_images(tmp_path / "imgs")
    col = tmp_path / "col"
    Retriever(embedder, collection=col, r_max=0.0).index([root])
    with pytest.raises(ConfigError, match="'Bogus'"):
        Retriever(embedder, collection=col).index([root], options=IndexOptions(reindex=True, index_type="Bogus"))
    unloadable = ModelSpec(str(tmp_path / "no-such-model"), device="cpu")
    with pytest.raises(ModelLoadError):
        Retriever(unloadable, collection=col).index([root], options=IndexOptions(reindex=True))
    (col / "notes.txt").write_text("mine")  # `create` would refuse the folder after the erase
    with pytest.raises(CollectionError, match="notes.txt.*nothing was erased"):
        Retriever(embedder, collection=col).index([root], options=IndexOptions(reindex=True))
    assert Retriever.open(col).info().n_ok == 3 and (col / "notes.txt").read_text() == "mine"


def test_a_bad_index_type_for_an_existing_collection_is_refused_before_anything_is_embedded(embedder, tmp_path):
    model = shutil.copytree(embedder.model_id, tmp_path / "model")
    root = three_images(tmp_path / "imgs")
    Retriever(ModelSpec(str(model), device="cpu"), collection=tmp_path / "col", r_max=0.0).index([root])
    shutil.rmtree(model)  # embedding the new file would now raise ModelLoadError
    noise_image(root / "new.png", (48, 48), 999)
    retriever = Retriever.open(tmp_path / "col", device="cpu")
    with pytest.raises(ConfigError, match="'Bogus' is not a valid FAISS factory string"):
        retriever.index([root], options=IndexOptions(index_type="Bogus"))
    info = retriever.info()
    assert (info.n_ok, info.n_failed, info.index_type) == (3, 0, "auto")


def test_add_refuses_two_rows_with_one_uri_and_page_and_stores_nothing(embedder, tmp_path):
    root = three_images(tmp_path / "imgs")
    retriever = Retriever(embedder, collection=tmp_path / "col", r_max=0.0)
    missing = root / "missing.png"
    with pytest.raises(InputError, match=f"inputs 1 and 2 are both {missing}.*nothing was stored"):
        retriever.add(["hello", missing, missing], on_error="skip")  # two failure rows
    with pytest.raises(InputError, match="inputs 0 and 1 are both doc.*uris="):
        retriever.add([root / "a.png", root / "missing2.png"], uris=["doc", "doc"], on_error="skip")
    with pytest.raises(InputError, match="inputs 0 and 2 are both item:"):
        retriever.add(["same text", "other", "same text"])
    info = retriever.info()
    assert (info.n_ok, info.n_failed) == (0, 0)


def test_add_refuses_an_item_resized_to_another_max_pixels_than_the_collection(embedder, tmp_path):
    root = three_images(tmp_path / "imgs")
    retriever = Retriever(embedder, collection=tmp_path / "col", r_max=0.0)
    retriever.add(["a caption"])
    cap = read_profile(tmp_path / "col").max_pixels
    for on_error in ("raise", "skip"):
        with pytest.raises(InputError, match=rf"input 1 \(.*b.png\): Item.max_pixels=8192.*max_pixels={cap}"):
            retriever.add([root / "a.png", Item(image=root / "b.png", max_pixels=8192)], on_error=on_error)
    assert retriever.info().n_ok == 1
    assert (retriever.add([Item(image=root / "c.png", max_pixels=cap), Item(text="t", max_pixels=8192)]).ids >= 0).all()


@pytest.mark.parametrize("target", ["", "  "])
def test_remove_refuses_an_empty_target_which_would_match_every_file(embedder, tmp_path, target):
    root = three_images(tmp_path / "imgs")
    retriever = Retriever(embedder, collection=tmp_path / "col", r_max=0.0)
    retriever.index([root])
    with pytest.raises(InputError, match=f"target 1 is '{target}', which would match every file"):
        retriever.remove([root / "a.png", target])
    assert retriever.info().n_ok == 3
