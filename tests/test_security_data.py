"""Data and limits found by the adversarial round of issue 38 (items 2-8), each through the real
CLI or server: an empty int8 collection, killed re-exports, rerank/explain input bounds, a
Retriever shared across threads, hostile plan files and odd names."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from faste_mm.cli.app import app
from faste_mm.model.rerank.reranker import Reranker
from tests.helpers.processors import processor_with, recording_class
from tests.helpers.rerank_fixtures import ONE_BATCH, reranker_dirs, vl_reranker  # noqa: F401  (fixtures)
from tests.helpers.inputs import tiny_vl_dir
from tests.helpers.bounds import HANG_S

runner = CliRunner()


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(tiny_vl_dir(tmp_path_factory.getbasetemp()))


def invoke(*args: object, code: int = 0):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    return result


@pytest.mark.parametrize("vectors", ["int8", "float32"])
def test_an_empty_collection_answers_a_search_with_no_hits(model, tmp_path, vectors):
    """Item 6: `--vectors int8` (index `auto` -> SQ8, which FAISS trains) over an empty folder."""
    (tmp_path / "empty").mkdir()
    invoke("index", tmp_path / "empty", "-c", tmp_path / "col", "--model", model, "--device", "cpu", "--vectors", vectors)
    hits = json.loads(invoke("search", "anything", "-c", tmp_path / "col", "--format", "json").stdout)
    assert hits["hits"] == []


# ---- item 4: the rerank caches see a replaced file ---------------------------------------------
def _replace_keeping_stat(path: Path, other: Path, in_place: bool) -> None:
    """Put `other`'s bytes at `path` (same size), by rewriting it or by renaming a new file over
    it, and set its mtime back: only the inode or ctime tells that it changed."""
    import os

    before = os.stat(path)
    if in_place:
        path.write_bytes(other.read_bytes())
    else:
        os.replace(other, path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_size == before.st_size and os.stat(path).st_mtime_ns == before.st_mtime_ns


@pytest.mark.parametrize("in_place", [True, False], ids=["rewritten", "renamed-over"])
def test_rerank_of_a_replaced_image_of_the_same_size_and_mtime_is_scored_afresh(vl_reranker, tmp_path, in_place):
    from PIL import Image

    photo, other, copy = tmp_path / "photo.bmp", tmp_path / "other.bmp", tmp_path / "copy.bmp"
    Image.new("RGB", (96, 64), (220, 30, 30)).save(photo)
    Image.effect_noise((96, 64), 90).convert("RGB").save(other)
    copy.write_bytes(other.read_bytes())
    first = vl_reranker.score("a red square", [photo]).scores[0]
    _replace_keeping_stat(photo, other, in_place)
    expected = vl_reranker.score("a red square", [copy]).scores[0]  # the new picture under a name never cached
    assert expected != pytest.approx(first, abs=1e-6)
    assert vl_reranker.score("a red square", [photo]).scores[0] == pytest.approx(expected, abs=1e-6)


# ---- item 5: rerank and explain inputs are bounded before they are tokenized --------------------
FIVE_MB = "word " * 1_000_000


@pytest.fixture(scope="module")
def recording_reranker(vl_reranker, reranker_dirs):
    """`vl_reranker`'s weights behind a tokenizer that records the length of every text it is
    handed, then tokenizes it (a subclass of the model's own tokenizer class, loaded from its
    files); and that list of lengths."""
    lengths: list[int] = []

    def record(text=None, *args, **kwargs):
        texts = [text] if isinstance(text, str) else [t for t in (text or []) if isinstance(t, str)]
        lengths.extend(len(t) for t in texts)

    processor = vl_reranker.serializer.processor
    tokenizer = recording_class(type(processor.tokenizer), record).from_pretrained(str(reranker_dirs["qwen3_vl_reranker"]))
    loaded = replace(vl_reranker.loaded, preprocessor=processor_with(processor, tokenizer=tokenizer))
    return Reranker(loaded, batching=ONE_BATCH), lengths


@pytest.fixture()
def tokenized_lengths(recording_reranker) -> list[int]:
    """The length of every text the served reranker's tokenizer is handed during this test."""
    lengths = recording_reranker[1]
    lengths.clear()
    return lengths


@pytest.fixture(scope="module")
def rerank_client(model, recording_reranker):
    from fastapi.testclient import TestClient

    from faste_mm import Embedder
    from faste_mm.serving import ServeConfig, ServeEngine, create_app

    engine = ServeEngine(Embedder.from_pretrained(model, device="cpu"), None, ServeConfig(), reranker=recording_reranker[0])
    with TestClient(create_app(engine), base_url="http://127.0.0.1:8000") as client:
        yield client


def test_rerank_of_a_5mb_document_tokenizes_only_what_the_model_sees(rerank_client, vl_reranker, tokenized_lengths):
    response = rerank_client.post("/v1/rerank", json={"query": "words", "documents": [FIVE_MB, "a short one"]})
    assert response.status_code == 200, response.text[:300]
    assert tokenized_lengths and max(tokenized_lengths) < len(FIVE_MB) // 10
    cut = FIVE_MB[: len(FIVE_MB) // 8]  # still far more than the model keeps: the same pair
    expected = vl_reranker.score("words", [cut, "a short one"]).scores
    scores = {r["index"]: r["relevance_score"] for r in response.json()["results"]}
    assert [scores[0], scores[1]] == pytest.approx(expected.tolist(), abs=1e-6)


def test_explain_with_a_5mb_query_tokenizes_only_what_the_model_sees(rerank_client, tokenized_lengths):
    response = rerank_client.post("/explain", json={"query": FIVE_MB, "document": "a short document"})
    assert response.status_code == 200, response.text[:300]
    assert tokenized_lengths and max(tokenized_lengths) < len(FIVE_MB) // 10


def test_rerank_over_the_token_limit_is_413_naming_it(model, vl_reranker):
    from fastapi.testclient import TestClient

    from faste_mm import Embedder
    from faste_mm.serving import ServeConfig, ServeEngine, create_app

    engine = ServeEngine(Embedder.from_pretrained(model, device="cpu"), None, ServeConfig(max_request_tokens=4096),
                         reranker=vl_reranker)
    with TestClient(create_app(engine), base_url="http://127.0.0.1:8000") as client:
        response = client.post("/v1/rerank", json={"query": "words", "documents": [FIVE_MB]})
    assert response.status_code == 413 and "--max-request-tokens" in response.json()["error"]["message"]


# ---- item 7: one Retriever shared by threads --------------------------------------------------
def test_a_retriever_is_shared_by_threads(model, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from faste_mm import Embedder, Retriever
    from tests.helpers.serve_fixtures import make_gallery

    retriever = Retriever(Embedder.from_pretrained(model, device="cpu"), collection=tmp_path / "col")
    retriever.index([make_gallery(tmp_path / "gallery", n=4)])
    queries = ["sunset", "forest", "ocean", "desert"] * 3
    expected = [[(h.id, h.score) for h in retriever.search(q, k=3)] for q in queries[:4]]
    with ThreadPoolExecutor(4) as pool:  # the reader was opened on this thread; each worker uses it
        found = list(pool.map(lambda q: [(h.id, h.score) for h in retriever.search(q, k=3)], queries))
    assert found == expected * 3
    fresh = Retriever(Embedder.from_pretrained(model, device="cpu"), collection=tmp_path / "col")
    with ThreadPoolExecutor(1) as pool:  # opened on a worker thread, then used on this one
        pool.submit(fresh.search, "sunset").result(timeout=HANG_S)
    assert [(h.id, h.score) for h in fresh.search("sunset", k=3)] == expected[0]


# ---- item 2: a killed re-export keeps the previous LanceDB table -------------------------------
def _rows_collection(root: Path, n: int, seed: int) -> None:
    """A collection of `n` rows in parts of 100 (one exported batch each), uris f{seed}-{i}."""
    import numpy as np

    from faste_mm.indexers import Collection, ItemRecord, Manifest

    x = np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    with Collection.create(root, Manifest(model_id="m", dim=16)) as col:
        for start in range(0, n, 100):
            col.add(x[start:start + 100], [ItemRecord(uri=f"/docs/f{seed}-{i}.txt", modality="text")
                                           for i in range(start, start + 100)])


def _export_cli(collection: Path, to: str, crash_at: str | None = None) -> "subprocess.CompletedProcess":
    import os
    from faste_mm.indexers.crash_points import CRASH_ENV
    from tests.helpers.warm_process import run_cli

    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    if crash_at is not None:
        env[CRASH_ENV] = crash_at
    return run_cli(["export", "-c", collection, "--to", to], env=env, timeout=300)  # tests/helpers/warm_process.py


def test_a_killed_reexport_to_lancedb_keeps_the_previous_table(tmp_path):
    import lancedb

    _rows_collection(tmp_path / "old", 300, seed=1)
    _rows_collection(tmp_path / "new", 500, seed=2)
    to = f"lancedb:{tmp_path / 'db'}/items"
    assert _export_cli(tmp_path / "old", to).returncode == 0
    killed = _export_cli(tmp_path / "new", to, crash_at="export-after-batch#3")
    assert killed.returncode == -9, killed.stderr[-2000:]
    table = lancedb.connect(str(tmp_path / "db")).open_table("items")
    uris = table.to_arrow().column("uri").to_pylist()
    assert len(uris) == 300 and all("/f1-" in uri for uri in uris)  # the old table, whole
    done = _export_cli(tmp_path / "new", to)
    assert done.returncode == 0, done.stderr[-2000:]
    assert lancedb.connect(str(tmp_path / "db")).open_table("items").count_rows() == 500


# ---- item 8: odd query texts and table names get a clear error, not a traceback ----------------
@pytest.fixture(scope="module")
def lexical_client(model, tmp_path_factory):
    from fastapi.testclient import TestClient

    from faste_mm import Embedder, Retriever
    from faste_mm.serving import ServeConfig, ServeEngine, create_app

    base = tmp_path_factory.mktemp("lexical")
    (base / "notes").mkdir()
    (base / "notes" / "minutes.txt").write_text("minutes of the garden committee")
    embedder = Embedder.from_pretrained(model, device="cpu")
    Retriever(embedder, collection=base / "col").index([base / "notes"])
    engine = ServeEngine(embedder, Retriever(embedder, collection=base / "col"), ServeConfig())
    with TestClient(create_app(engine), base_url="http://127.0.0.1:8000", raise_server_exceptions=False) as client:
        yield client


@pytest.mark.parametrize("mode", ["lexical", "hybrid"])
def test_a_nul_byte_in_a_query_separates_words_and_a_lone_surrogate_is_a_400(lexical_client, mode):
    def search(query: str):
        return lexical_client.post("/search", content=json.dumps({"query": query, "mode": mode}),
                                   headers={"content-type": "application/json"})

    nul = search("garden\u0000committee")
    assert nul.status_code == 200, nul.text[:300]
    assert [Path(h["uri"]).name for h in nul.json()["hits"]] == ["minutes.txt"]
    surrogate = search("garden \ud800")
    assert surrogate.status_code == 400, surrogate.text[:300]
    message = surrogate.json()["error"]["message"]
    assert "unpaired surrogate" in message and "position 7" in message and "lexical syntax" not in message


def test_a_nul_byte_in_an_fts5_expression_is_named(tmp_path):
    from faste_mm.errors import InputError
    from faste_mm.indexers import Collection, ItemRecord, Manifest

    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=4)) as col:
        col.add(np.eye(4, dtype=np.float32)[:1], [ItemRecord(uri="/n.txt", modality="text", text="garden")])
        with pytest.raises(InputError, match="NUL character"):
            col.find(3, texts=["garden\x00x"], mode="lexical", lexical_syntax=True)


@pytest.mark.parametrize("table", ["my table", "a;b", "..", "x" * 300, ".hidden"])
def test_an_odd_lancedb_table_name_is_refused_naming_the_rule(tmp_path, table):
    _rows_collection(tmp_path / "c", 100, seed=3)
    result = runner.invoke(app, ["export", "-c", str(tmp_path / "c"), "--to", f"lancedb:{tmp_path / 'db'}/{table}"])
    assert result.exit_code != 0
    assert "not a LanceDB table name" in result.stderr and "letters, digits" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not (tmp_path / "db").exists() or not any((tmp_path / "db").iterdir())
