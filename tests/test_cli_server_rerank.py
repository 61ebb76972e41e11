"""`faste-mm search --rerank` through a running `faste-mm serve` that has that reranker loaded (issue
38, item 15): the server reranks with its warm reranker and the CLI loads neither model; the hits
and both scores equal a search that loads them here (`--no-server`). A search that would rerank
otherwise (FastE on the reranker, another reranker) runs here, as before."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("fastapi", reason="needs the serve extra: pip install 'faste-mm[serve]'")

from faste_mm.cli.app import app  # noqa: E402
from tests.helpers.warm_process import run_cli, start_cli  # noqa: E402
from tests.helpers.inputs import tiny_vl_dir  # noqa: E402
from tests.helpers.serve_fixtures import make_gallery  # noqa: E402
from tests.helpers.tiny_models import tiny_model_dir  # noqa: E402
from tests.helpers.bounds import first_line  # noqa: E402

runner = CliRunner()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(collection, reranker folder, env) of `faste-mm serve -c COL --rerank RR` over 3 images and a 2-page PDF."""
    base = tmp_path_factory.mktemp("server-rerank")
    reranker = tiny_model_dir(tmp_path_factory.getbasetemp(), "qwen3_vl_reranker")
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "FASTE_MM_COLLECTION")}
    env.update({"XDG_DATA_HOME": str(base / "data"), "FASTE_MM_DEVICE": "cpu"})
    col = base / "col"
    # both forked from the warm process of tests/helpers/warm_process.py: no fresh torch import
    made = run_cli(["index", str(make_gallery(base / "gallery", n=3)), "-c", str(col),
                    "--model", str(tiny_vl_dir(tmp_path_factory.getbasetemp()))], env=env)
    assert made.returncode == 0, made.stderr
    proc = start_cli(["serve", "-c", str(col), "--port", "0", "--threads", "1", "--rerank", str(reranker)], env=env)
    line = first_line(proc, "faste-mm serve")  # printed once the server is announced and its socket listens
    assert line.startswith("serving on http://127.0.0.1:"), proc.stderr.read() if not line else line
    try:
        yield col, reranker, env
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        proc.close()


def _search(env: dict, *args: str) -> tuple[dict, str]:
    result = runner.invoke(app, ["search", *args, "--format", "json", "--debug"], env=env)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout), result.stderr


def test_a_reranked_search_goes_through_the_server_that_has_the_reranker_loaded(served):
    col, reranker, env = served
    args = ["a sunset over the sea", "-c", str(col), "-k", "3", "--rerank", str(reranker), "--rerank-top", "4"]
    through, said = _search(env, *args)
    assert "through the server at http://127.0.0.1:" in said, said
    local, said_locally = _search(env, *args, "--no-server")
    assert "through the server" not in said_locally
    assert [h["id"] for h in through["hits"]] == [h["id"] for h in local["hits"]] and len(local["hits"]) == 3
    for a, b in zip(through["hits"], local["hits"]):
        assert a["score"] == pytest.approx(b["score"], abs=1e-5)
        assert a["rerank_score"] == pytest.approx(b["rerank_score"], abs=1e-5)


def test_a_search_that_reranks_otherwise_runs_here(served):
    col, reranker, env = served
    _, said = _search(env, "a sunset", "-c", str(col), "-k", "2", "--rerank", str(reranker), "--rerank-r-max", "0.5")
    assert "loading the model here" in said and "has not loaded the reranker this search uses" in said
    plain, said = _search(env, "a sunset", "-c", str(col), "-k", "2", "--no-rerank")  # no reranker asked: the server
    assert "through the server" in said and all("rerank_score" not in h for h in plain["hits"])
