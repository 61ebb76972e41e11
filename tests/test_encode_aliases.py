"""`encode_query` / `encode_document` (the sentence-transformers names) on `Embedder` and on
`Retriever`: the same vectors as the plural forms, a lone string, image or Item taken as one
input (by the plural forms too), and the retriever's forms using the collection's settings (what
`search` and `index` use)."""

from __future__ import annotations


import numpy as np
import pytest

from faste_mm import FastEConfig, Item
from faste_mm.errors import CollectionError
from faste_mm.indexers import Collection
from faste_mm.retrieval.retriever import DEFAULT_QUERY_INSTRUCTION, Retriever

from tests.helpers.inputs import noise_image

QUERY = "Find me an everyday image that matches the given caption:"


def test_embedder_singular_forms_equal_the_plural_forms(vl_embedder, image_dir):
    fast_e = FastEConfig(r_max=0.5, trigger_layer=2)
    texts = ["a red bicycle", "a green square"]
    np.testing.assert_array_equal(vl_embedder.encode_query(texts, instruction=QUERY).embeddings,
                                  vl_embedder.encode_queries(texts, instruction=QUERY).embeddings)
    docs = [image_dir / "red.png", "a note about bicycles"]
    np.testing.assert_array_equal(vl_embedder.encode_document(docs, fast_e=fast_e).embeddings,
                                  vl_embedder.encode_documents(docs, fast_e=fast_e).embeddings)


@pytest.mark.parametrize("one", ["a red bicycle", Item(text="a red bicycle")])
def test_a_lone_input_is_one_item_not_its_characters(vl_embedder, one):
    result = vl_embedder.encode_query(one, instruction=QUERY)
    assert result.embeddings.shape == (1, vl_embedder.dim)
    np.testing.assert_array_equal(result.embeddings,
                                  vl_embedder.encode_queries(["a red bicycle"], instruction=QUERY).embeddings)


def test_a_lone_image_path_is_one_document(vl_embedder, image_dir):
    result = vl_embedder.encode_document(image_dir / "red.png")
    np.testing.assert_array_equal(result.embeddings, vl_embedder.encode_documents([image_dir / "red.png"]).embeddings)


def test_the_plural_forms_take_a_lone_input_as_one_query_or_document(vl_embedder, image_dir, tmp_path):
    """`encode_queries("a bear")` is one query, not one per character; a lone image or Item too,
    on the Embedder and the Retriever alike (the one rule: `items.expand_items`)."""
    from PIL import Image

    picture = Image.open(image_dir / "red.png")
    folder = tmp_path / "imgs"
    folder.mkdir()
    noise_image(folder / "a.png", (64, 64), 3)
    with Retriever(vl_embedder, collection=tmp_path / "col") as retriever:
        retriever.index([folder])
        for owner in (vl_embedder, retriever):
            for one in ("a bear", Item(text="a bear"), image_dir / "red.png", picture):
                alone, listed = owner.encode_queries(one), owner.encode_queries([one])
                assert alone.embeddings.shape == (1, vl_embedder.dim), (type(owner).__name__, one)
                np.testing.assert_array_equal(alone.embeddings, listed.embeddings)
            for one in (image_dir / "red.png", picture, "a note about bears"):
                np.testing.assert_array_equal(owner.encode_documents(one).embeddings,
                                              owner.encode_documents([one]).embeddings)


def test_retriever_encodes_with_the_collection_settings(vl_embedder, tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    noise_image(folder / "a.png", (64, 64), 3)
    retriever = Retriever(vl_embedder, collection=tmp_path / "col", r_max=0.5)
    retriever.index([folder])
    # The documents' vectors are the stored ones (the collection's FastE), within float16 storage.
    with Collection.open(tmp_path / "col") as col:
        stored = col.vectors([retriever.search("x", k=1)[0].id])
    np.testing.assert_allclose(retriever.encode_document(folder / "a.png").embeddings, stored, atol=2e-3)
    np.testing.assert_array_equal(retriever.encode_documents([folder / "a.png"]).embeddings,
                                  vl_embedder.encode_documents([folder / "a.png"], fast_e=FastEConfig(r_max=0.5)).embeddings)
    # Queries: the full forward with the default query instruction, which is what search scores with.
    expected = vl_embedder.encode_queries(["a red bicycle"], instruction=DEFAULT_QUERY_INSTRUCTION).embeddings
    np.testing.assert_array_equal(retriever.encode_query("a red bicycle").embeddings, expected)
    np.testing.assert_array_equal(retriever.encode_queries(["a red bicycle"]).embeddings, expected)
    hit = retriever.search("a red bicycle", k=1)[0]
    assert hit.score == pytest.approx(float(stored[0] @ expected[0]), abs=1e-4)
    retriever.close()


def test_retriever_documents_need_an_existing_collection(vl_embedder, tmp_path):
    retriever = Retriever(vl_embedder, collection=tmp_path / "nowhere")
    with pytest.raises(CollectionError):
        retriever.encode_document("a note")
