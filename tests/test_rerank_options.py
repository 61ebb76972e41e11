"""The reranker's tower cache size on the CLI: one option (`--rerank-tower-cache-mb`) declared once,
taken by search, serve and eval, reaching `Reranker(tower_cache_bytes=...)`; eval's settings share
one cache."""

from __future__ import annotations

import json

import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

from faste_mm import Embedder, Retriever
from faste_mm.cli.app import app
from faste_mm.cli.options import RERANK_TOWER_CACHE_MB
from faste_mm.datasets import load_task
from faste_mm.datasets.rerank_eval import evaluate_rerank
from faste_mm.model.rerank.reranker import Reranker
from faste_mm.model.rerank.tower_cache import DEFAULT_TOWER_CACHE_BYTES

from tests.helpers.eval_fixtures import eval_data_dir, eval_model_dir  # noqa: F401  (fixtures)
from tests.helpers.rerank_fixtures import ONE_BATCH, reranker_dirs, vl_reranker  # noqa: F401  (fixtures)

FLAG = "--rerank-tower-cache-mb"


def test_the_option_states_the_librarys_default_and_is_on_search_serve_and_eval():
    assert RERANK_TOWER_CACHE_MB << 20 == DEFAULT_TOWER_CACHE_BYTES
    commands = typer.main.get_command(app).commands
    for name in ("search", "serve", "eval"):
        options = {opt for param in commands[name].params for opt in param.opts}
        assert FLAG in options, name


@pytest.fixture()
def recorded(monkeypatch) -> list[dict]:
    """Every Reranker.from_pretrained call's keyword arguments (the reranker still loads)."""
    calls: list[dict] = []
    real = Reranker.from_pretrained.__func__

    def recording(cls, name, **kwargs):
        calls.append(kwargs)
        return real(cls, name, **kwargs)

    monkeypatch.setattr(Reranker, "from_pretrained", classmethod(recording))
    return calls


def test_load_reranker_bounds_the_tower_cache_and_zero_turns_it_off(reranker_dirs):
    from faste_mm.cli.collection_commands import load_reranker

    model = str(reranker_dirs["qwen3_vl_reranker"])
    assert load_reranker(model, None, "0", "none", "cpu", 3).tower_cache.max_bytes == 3 << 20
    assert load_reranker(model, None, "0", "none", "cpu", 0).tower_cache is None
    assert load_reranker(model, None, "0", "none", "cpu").tower_cache.max_bytes == DEFAULT_TOWER_CACHE_BYTES


def test_search_passes_the_option_and_its_variable_to_the_reranker(eval_model_dir, reranker_dirs, tmp_path, recorded,
                                                                     monkeypatch):
    gallery = tmp_path / "g"
    gallery.mkdir()
    for i, color in enumerate([(200, 30, 30), (30, 200, 30)]):
        Image.new("RGB", (64, 64 + 16 * i), color).save(gallery / f"c{i}.png")
    with Retriever(Embedder.from_pretrained(str(eval_model_dir), device="cpu"), collection=tmp_path / "col", r_max=0.0) as r:
        r.index([gallery])
    base = ["search", "red", "-c", str(tmp_path / "col"), "-k", "2", "--rerank", str(reranker_dirs["qwen3_vl_reranker"]),
            "--device", "cpu", "--format", "json"]
    given = CliRunner().invoke(app, [*base, FLAG, "7"])
    assert given.exit_code == 0, given.output
    assert [h["rerank_score"] is not None for h in json.loads(given.stdout)["hits"]] == [True, True]
    monkeypatch.setenv("FASTE_MM_RERANK_TOWER_CACHE_MB", "0")
    from_env = CliRunner().invoke(app, base)
    assert from_env.exit_code == 0, from_env.output
    assert [call["tower_cache_bytes"] for call in recorded] == [7 << 20, 0]
    refused = CliRunner().invoke(app, [*base, FLAG, "-1"])
    assert refused.exit_code == 2 and FLAG in refused.output


def test_eval_passes_the_option_to_the_reranker(eval_model_dir, eval_data_dir, reranker_dirs, tmp_path, recorded):
    args = ["eval", "nights", "--data", str(eval_data_dir), "--model", str(eval_model_dir), "--device", "cpu",
            "--out", str(tmp_path / "out"), "--limit", "2", "--methods", "faste", "--r-max", "0",
            "--rerank", str(reranker_dirs["qwen3_vl_reranker"]), "--rerank-top", "2", FLAG, "5", "--format", "json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert [call["tower_cache_bytes"] for call in recorded] == [5 << 20]


def test_eval_settings_share_one_tower_cache(eval_model_dir, eval_data_dir, reranker_dirs, monkeypatch):
    reranker = Reranker.from_pretrained(str(reranker_dirs["qwen3_vl_reranker"]), device="cpu", batching=ONE_BATCH)
    embedder = Embedder.from_pretrained(str(eval_model_dir), device="cpu")
    task = load_task("nights", eval_data_dir, limit=2)
    calls: list[int] = []
    tower = reranker.backbone.encode_vision
    monkeypatch.setattr(reranker.backbone, "encode_vision", lambda batch: calls.append(1) or tower(batch))
    evaluate_rerank(embedder, reranker, [task], top=2, r_max=(0.0,))
    alone = len(calls)
    calls.clear()
    reranker.tower_cache.clear()
    evaluate_rerank(embedder, reranker, [task], top=2, r_max=(0.0, 0.5, 0.7))
    assert alone > 0 and len(calls) == alone  # the r 0.5 and 0.7 settings found every candidate's tower kept
