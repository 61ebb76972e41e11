"""Data and limits found by the adversarial round of issue 38 (items 2-8), each through the real
CLI or server: an empty int8 collection, killed re-exports, rerank/explain input bounds, a
Retriever shared across threads, hostile plan files and odd names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from faste_mm.cli.app import app
from tests.rerank_fixtures import reranker_dirs, vl_reranker  # noqa: F401  (fixtures)
from tests.test_retriever_scanning import tiny_vl_dir

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
