"""Matryoshka collections: `dim` stores the first d dimensions re-normalised, records it in the
manifest, truncates queries the same way, and refuses another dim like any other setting."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from faste_mm import BatchingConfig, Embedder
from faste_mm.cli.app import app
from faste_mm.errors import CollectionError, ConfigError
from faste_mm.indexers import Collection
from faste_mm.retrieval.profile import CollectionProfile
from faste_mm.retrieval.retriever import DEFAULT_QUERY_INSTRUCTION, Retriever

from tests.helpers.inputs import noise_image, tiny_vl_dir

TEXTS = ["a red bicycle leaning on a wall", "a bowl of soup", "the quick brown fox", "tax invoice 2024"]
DIM = 16


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> Embedder:
    return Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu",
                                    batching=BatchingConfig(batch_tokens=1 << 16))


def renormalised_prefix(x: np.ndarray, d: int) -> np.ndarray:
    return x[:, :d] / np.linalg.norm(x[:, :d], axis=1, keepdims=True)


def test_stored_vectors_and_queries_are_truncated_and_renormalised(embedder, tmp_path):
    assert embedder.dim > DIM
    r = Retriever(embedder, collection=tmp_path / "c", r_max=0.0, dim=DIM)
    ids = r.add(TEXTS).ids
    with Collection.open(tmp_path / "c") as col:
        stored, profile = col.vectors(ids), CollectionProfile.from_manifest(col.manifest)
    assert (col.manifest.dim, profile.model_dim, profile.is_matryoshka) == (DIM, embedder.dim, True)
    full = embedder.encode_documents(TEXTS).embeddings
    np.testing.assert_allclose(stored, renormalised_prefix(full, DIM), atol=2e-3)  # float16 storage
    # Search scores are the truncated query against the truncated documents (brute force).
    query = embedder.encode_queries(["bicycle"], instruction=DEFAULT_QUERY_INSTRUCTION).embeddings
    expected = (renormalised_prefix(query, DIM) @ stored.T)[0]
    hits = r.search("bicycle", k=len(TEXTS))
    assert [h.id for h in hits] == [int(ids[i]) for i in np.argsort(-expected)]
    np.testing.assert_allclose([h.score for h in hits], np.sort(expected)[::-1], atol=1e-3)
    # Retriever.export writes the truncated vectors as stored.
    import pyarrow.parquet as pq

    exported = pq.read_table(r.export(tmp_path / "c.parquet").path).to_pydict()
    assert exported["id"] == ids.tolist()
    np.testing.assert_array_equal(np.array(exported["vector"], dtype=np.float32), stored)
    # Retriever.open reads the dim back from the manifest (and loads the model it records as the fixture did).
    reopened = Retriever.open(tmp_path / "c", device="cpu", batching=BatchingConfig(batch_tokens=1 << 16))
    assert reopened.profile().dim == DIM and [h.id for h in reopened.search("bicycle", k=2)] == [h.id for h in hits[:2]]


def test_another_dim_is_refused_like_another_model(embedder, tmp_path):
    Retriever(embedder, collection=tmp_path / "c", r_max=0.0, dim=DIM).add(TEXTS[:1])
    with pytest.raises(CollectionError, match=rf"dim \(--dim\): collection has {DIM}, request has {DIM * 2}"):
        Retriever(embedder, collection=tmp_path / "c", r_max=0.0, dim=DIM * 2).add(TEXTS[1:2])
    # no dim given: the collection's (the defaults rule), not the model's full width
    assert Retriever(embedder, collection=tmp_path / "c", r_max=0.0).add(TEXTS[1:2]).ids.shape == (1,)
    with pytest.raises(ConfigError, match=f"wider than .*\\({embedder.dim}\\)"):
        Retriever(embedder, collection=tmp_path / "new", dim=embedder.dim + 1).add(TEXTS[:1])
    with pytest.raises(ConfigError, match="dim must be None"):
        Retriever(embedder, dim=0)


def test_cli_index_dim_is_kept_by_later_runs_and_another_is_refused(embedder, tmp_path):
    model = embedder.model_id  # the tiny model's directory
    folder = tmp_path / "photos"
    folder.mkdir()
    noise_image(folder / "a.png", (64, 64), 1)
    col = str(tmp_path / "col")
    runner = CliRunner()

    def index(*args: str, code: int = 0):
        result = runner.invoke(app, ["index", str(folder), "-c", col, "--model", model, "--r-max", "0", *args])
        assert result.exit_code == code, (result.stdout, result.stderr)
        return result

    index("--dim", str(DIM))
    noise_image(folder / "b.png", (64, 64), 2)
    index()  # no --dim: the collection's
    info = json.loads(runner.invoke(app, ["info", "-c", col, "--format", "json"]).stdout)
    assert (info["dim"], info["settings"]["model_dim"], info["n_ok"]) == (DIM, embedder.dim, 2)
    refused = index("--dim", str(DIM * 2), code=1)
    assert f"dim (--dim): collection has {DIM}, request has {DIM * 2}" in refused.stderr
