"""Data and limits found by the adversarial round of issue 38 (items 2-8), each through the real
CLI or server: an empty int8 collection, killed re-exports, rerank/explain input bounds, a
Retriever shared across threads, hostile plan files and odd names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from faste_mm.cli.app import app
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
