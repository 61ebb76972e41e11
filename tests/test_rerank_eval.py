"""Two-stage evaluation: the embedder's top-N reranked, metrics before and after, equal to a
by-hand recomputation; `faste-mm eval --rerank` end to end."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from faste_mm import Embedder
from faste_mm.cli.app import app
from faste_mm.datasets import load_task
from faste_mm.datasets.metrics import gold_ranks, score_ranks
from faste_mm.datasets.rerank_eval import evaluate_rerank

from tests.helpers.eval_fixtures import eval_data_dir, eval_model_dir  # noqa: F401  (fixtures)
from tests.helpers.rerank_fixtures import ONE_BATCH, reranker_dirs, vl_reranker  # noqa: F401  (fixtures)


def test_reranked_metrics_equal_a_by_hand_rerank_of_the_top_n(eval_model_dir, eval_data_dir, vl_reranker):
    embedder = Embedder.from_pretrained(str(eval_model_dir), device="cpu")
    task = load_task("mscoco", eval_data_dir, limit=3)
    (full, faste) = evaluate_rerank(embedder, vl_reranker, [task], top=2, r_max=(0.0, 0.5), protect=("query",))
    queries = embedder.encode_queries(task.query_items()).embeddings
    candidates = embedder.encode_documents(task.candidate_items()).embeddings
    lists = [q.candidates for q in task.queries]
    before = gold_ranks(queries, candidates, lists)
    assert full.before.recall_at_1 == score_ranks(before).recall_at_1
    after = []
    for query, ids, rank in zip(task.query_items(), lists, before):
        first = sorted(range(len(ids)), key=lambda j: (-float(candidates[ids[j]] @ queries[len(after)]), j))
        if rank >= 2:
            after.append(rank)
            continue
        scores = vl_reranker.score(query, [task.candidate_items()[ids[j]] for j in first[:2]]).scores
        reordered = [first[j] for j in sorted(range(2), key=lambda j: (-scores[j], j))]
        after.append(reordered.index(0))
    assert full.after.recall_at_1 == float(np.mean(np.array(after) < 1))
    assert full.pairs == 2 * len(task.queries) and full.prefix_kept == 1.0
    assert faste.protect == "query" and faste.prefix_kept < 1.0


def test_eval_cli_reranks_and_reports_before_and_after(eval_model_dir, eval_data_dir, reranker_dirs, tmp_path):
    args = ["eval", "nights", "--data", str(eval_data_dir), "--model", str(eval_model_dir), "--device", "cpu",
            "--out", str(tmp_path / "out"), "--limit", "2", "--methods", "faste", "--r-max", "0",
            "--rerank", str(reranker_dirs["qwen3_vl_reranker"]), "--rerank-top", "2", "--rerank-r-max", "0,0.5",
            "--format", "json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rerank"]
    assert [(r["r_max"], r["protect"]) for r in rows] == [(0.0, "none"), (0.5, "none")]
    assert {"recall_at_1", "ndcg_at_5"} <= set(rows[0]["after"])
    assert json.loads((tmp_path / "out" / "rerank.json").read_text()) == rows


def test_rerank_command_prints_candidates_best_first_equal_to_the_python_api(reranker_dirs, vl_reranker, image_dir):
    from faste_mm.model.rerank.reranker import Reranker

    model = str(reranker_dirs["qwen3_vl_reranker"])
    args = ["rerank", "red things", str(image_dir / "red.png"), "--text", "a red bicycle", "--text", "short",
            "--model", model, "--device", "cpu", "--format", "json", "--top-n", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)["results"]
    expected = Reranker.from_pretrained(model, device="cpu").rerank("red things", ["a red bicycle", "short", image_dir / "red.png"], top_n=2)
    assert [r["score"] for r in got] == [r.score for r in expected.results]


def test_rerank_eval_takes_the_first_stage_from_the_evaluation_cache(eval_model_dir, eval_data_dir, vl_reranker, tmp_path):
    from faste_mm.datasets import evaluate
    from faste_mm.datasets.protocol import EvalConfig

    embedder = Embedder.from_pretrained(str(eval_model_dir), device="cpu")
    task = load_task("mscoco", eval_data_dir, limit=2)
    evaluate(embedder, [task], EvalConfig(r_max=(0.0,), methods=("faste",)), cache_dir=tmp_path)
    embedded = []
    for name in ("encode_queries", "encode_documents"):
        original = getattr(embedder, name)
        setattr(embedder, name, lambda items, *a, _o=original, **k: embedded.append(len(items)) or _o(items, *a, **k))
    cached = evaluate_rerank(embedder, vl_reranker, [task], top=2, cache_dir=tmp_path)
    assert embedded == []  # the evaluation stored both sides: nothing is embedded again
    uncached = evaluate_rerank(embedder, vl_reranker, [task], top=2)
    assert embedded and [(r.before, r.after) for r in cached] == [(r.before, r.after) for r in uncached]
