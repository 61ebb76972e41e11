"""The LangChain and LlamaIndex adapters on the tiny model: their vectors equal `Embedder`'s and
`Retriever`'s (query side with the query instruction and the full forward, document side with
FastE, as the CLI embeds them), a round trip through each framework's own in-memory vector
index, and their retrievers' documents equal `faste-mm search`'s hits."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("langchain_core", reason="needs the langchain extra: pip install 'faste-mm[langchain]'")
pytest.importorskip("llama_index.core", reason="needs the llamaindex extra: pip install 'faste-mm[llamaindex]'")
from langchain_core.vectorstores import InMemoryVectorStore  # noqa: E402
from llama_index.core import VectorStoreIndex  # noqa: E402
from llama_index.core.schema import ImageNode, TextNode  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from faste_mm import FastEConfig, Retriever  # noqa: E402
from faste_mm.cli.app import app  # noqa: E402
from faste_mm.errors import ConfigError, InputError  # noqa: E402
from faste_mm.integrations.langchain import FasteMMEmbeddings, FasteMMRetriever  # noqa: E402
from faste_mm.integrations.llama_index import FasteMMEmbedding  # noqa: E402
from faste_mm.integrations.llama_index import FasteMMRetriever as LlamaRetriever  # noqa: E402
from faste_mm.retrieval.profile import DOCUMENT_R_MAX, QUERY_INSTRUCTION  # noqa: E402
from tests.helpers.mcp_fixtures import tiny_collection  # noqa: E402
from tests.helpers.bounds import HANG_S  # noqa: E402

TEXTS = ["a red bicycle leaning on a wall", "notes about a picnic by the lake", "quarterly report, revenue chart"]
QUERY = "something to ride"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    embedder, col, gallery, _ = tiny_collection(tmp_path_factory.mktemp("frameworks"))
    return {"embedder": embedder, "col": col, "images": sorted(gallery.glob("*.png"))}


def _cli_hits(col: Path, query: str, *options: str) -> list[dict]:
    result = CliRunner().invoke(app, ["search", query, "-c", str(col), "--no-server", "--format", "json", *options])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["hits"]


# ---- LangChain -----------------------------------------------------------------------------
def test_langchain_vectors_equal_the_embedders_on_both_sides(world):
    embedder = world["embedder"]
    lc = FasteMMEmbeddings(embedder)
    np.testing.assert_allclose(lc.embed_query(QUERY),
                               embedder.encode_queries([QUERY], instruction=QUERY_INSTRUCTION).embeddings[0], atol=1e-6)
    documents = embedder.encode_documents(TEXTS, fast_e=FastEConfig(r_max=DOCUMENT_R_MAX)).embeddings
    np.testing.assert_allclose(lc.embed_documents(TEXTS), documents, atol=1e-6)
    np.testing.assert_allclose(lc.embed_image([str(p) for p in world["images"][:2]]),
                               embedder.encode_documents(world["images"][:2],
                                                         fast_e=FastEConfig(r_max=DOCUMENT_R_MAX)).embeddings, atol=1e-6)
    assert not np.allclose(lc.embed_query(TEXTS[0]), lc.embed_documents(TEXTS[:1])[0])  # two sides, two formats


def test_langchain_with_a_collection_embeds_as_its_search_and_index_do(world):
    import asyncio

    lc = FasteMMEmbeddings(world["embedder"], collection=world["col"])
    reference = Retriever(world["embedder"], collection=world["col"])
    np.testing.assert_allclose(asyncio.run(lc.aembed_query(QUERY)), reference.encode_queries([QUERY]).embeddings[0],
                               atol=1e-6)
    np.testing.assert_allclose(asyncio.run(lc.aembed_documents(TEXTS)), reference.encode_documents(TEXTS).embeddings,
                               atol=1e-6)
    with pytest.raises(ConfigError, match="r_max"):
        FasteMMEmbeddings(world["embedder"], collection=world["col"], r_max=0.3)


def test_langchain_in_memory_store_round_trip(world):
    lc = FasteMMEmbeddings(world["embedder"])
    store = InMemoryVectorStore(lc)
    store.add_texts(TEXTS, ids=["a", "b", "c"])
    found = store.similarity_search_with_score(QUERY, k=3)
    scores = np.asarray(lc.embed_documents(TEXTS)) @ np.asarray(lc.embed_query(QUERY))
    assert [doc.id for doc, _ in found] == [["a", "b", "c"][i] for i in np.argsort(-scores)]
    assert [score for _, score in found] == pytest.approx(sorted(scores, reverse=True), abs=1e-5)


def test_langchain_retriever_documents_equal_the_cli_hits(world):
    hits = _cli_hits(world["col"], "a report with a chart", "-k", "5", "--type", "pdf", "--type", "text")
    documents = FasteMMRetriever(collection=str(world["col"]), k=5, type=["pdf", "text"]).invoke("a report with a chart")
    assert [(d.metadata["id"], d.metadata["uri"], d.metadata["page"]) for d in documents] == \
        [(h["id"], h["uri"], h["page"]) for h in hits]
    assert [d.metadata["score"] for d in documents] == pytest.approx([h["score"] for h in hits], abs=1e-5)
    note = next(d for d in documents if d.metadata["uri"].endswith("picnic.txt"))
    assert note.page_content.startswith("notes about a picnic")


def test_langchain_retriever_lexical_mode_and_a_bad_input(world):
    shared = Retriever.open(world["col"], device="cpu")
    documents = FasteMMRetriever.from_retriever(shared, k=3, mode="lexical").invoke("picnic")
    assert documents[0].metadata["uri"].endswith("picnic.txt") and documents[0].metadata["found_by"] == "lexical"
    with pytest.raises(InputError, match="does-not-exist.png"):
        FasteMMEmbeddings(world["embedder"]).embed_image(["does-not-exist.png"])


# ---- LlamaIndex ----------------------------------------------------------------------------
def test_llama_index_vectors_equal_the_embedders_and_batches_honour_embed_batch_size(world):
    embedder = world["embedder"]
    li = FasteMMEmbedding(embedder, embed_batch_size=2)
    np.testing.assert_allclose(li.get_query_embedding(QUERY),
                               embedder.encode_queries([QUERY], instruction=QUERY_INSTRUCTION).embeddings[0], atol=1e-6)
    batches = []
    documents = li._sides.documents
    li._sides.documents = lambda inputs: batches.append(len(inputs)) or documents(inputs)
    vectors = li.get_text_embedding_batch(TEXTS)
    images = li.get_image_embedding_batch([str(p) for p in world["images"][:3]])
    assert batches == [2, 1, 2, 1]
    fast_e = FastEConfig(r_max=DOCUMENT_R_MAX)
    np.testing.assert_allclose(vectors, embedder.encode_documents(TEXTS, fast_e=fast_e).embeddings, atol=1e-6)
    np.testing.assert_allclose(images, embedder.encode_documents(world["images"][:3], fast_e=fast_e).embeddings,
                               atol=1e-6)


def test_llama_index_vector_store_index_round_trip(world):
    li = FasteMMEmbedding(world["embedder"])
    nodes = [TextNode(text=text, id_=name) for text, name in zip(TEXTS, "abc")]
    found = VectorStoreIndex(nodes, embed_model=li).as_retriever(similarity_top_k=3).retrieve(QUERY)
    scores = np.asarray(li.get_text_embedding_batch(TEXTS)) @ np.asarray(li.get_query_embedding(QUERY))
    assert [n.node.node_id for n in found] == [["a", "b", "c"][i] for i in np.argsort(-scores)]
    assert [n.score for n in found] == pytest.approx(sorted(scores, reverse=True), abs=1e-5)


def test_llama_index_multimodal_index_embeds_images_as_documents(world):
    from llama_index.core.indices import MultiModalVectorStoreIndex

    li = FasteMMEmbedding(world["embedder"])
    images = [ImageNode(image_path=str(p), id_=p.name, text=p.stem) for p in world["images"]]
    index = MultiModalVectorStoreIndex(images, embed_model=li, image_embed_model=li)
    found = index.as_retriever(similarity_top_k=2, image_similarity_top_k=2).text_to_image_retrieve(QUERY)
    vectors = np.asarray(li.get_image_embedding_batch([str(p) for p in world["images"]]))
    best = np.argsort(-(vectors @ np.asarray(li.get_query_embedding(QUERY))))[:2]
    assert [n.node.node_id for n in found] == [world["images"][i].name for i in best]


def test_llama_index_retriever_nodes_equal_the_cli_hits(world):
    hits = _cli_hits(world["col"], "an ocean at sunset", "-k", "4")
    found = LlamaRetriever(world["col"], k=4).retrieve("an ocean at sunset")
    assert [int(n.node.node_id) for n in found] == [h["id"] for h in hits]
    assert [n.score for n in found] == pytest.approx([h["score"] for h in hits], abs=1e-5)
    for node, hit in zip(found, hits):
        assert node.node.metadata["uri"] == hit["uri"]
        assert isinstance(node.node, ImageNode) == (hit["uri"].endswith(".png"))


def test_no_framework_is_imported_by_faste_mm_or_its_help():
    import subprocess

    code = ("import sys, faste_mm; from faste_mm.cli.app import app; "
            "print(sorted(m for m in ('langchain_core', 'llama_index', 'mcp', 'torch') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=HANG_S).stdout
    assert loaded.strip() == "[]"
