"""The evaluation protocol on the tiny model: Full is the reference (retention exactly 1), each
setting's vectors and ranks equal a naive re-computation, baselines are configured as documented,
downscaling caps pixels per image, and cached embeddings resume a run."""

from __future__ import annotations

import numpy as np
import pytest

from faste_mm import BatchingConfig, Embedder, FastEConfig
from faste_mm.datasets import EvalConfig, evaluate, load_task
from faste_mm.datasets.encoding import downscale_pixels, token_pixels
from faste_mm.errors import ConfigError

from tests.helpers.eval_fixtures import eval_data_dir, eval_model_dir  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def embedder(eval_model_dir) -> Embedder:
    # chunk_items=3: candidates are embedded in several slices, as a long run would be.
    return Embedder.from_pretrained(str(eval_model_dir), device="cpu", batching=BatchingConfig(batch_tokens=1 << 20, chunk_items=3))


@pytest.fixture(scope="module")
def tasks(eval_data_dir):
    return [load_task(name, eval_data_dir) for name in ("mscoco", "docvqa", "nights")]


@pytest.fixture(scope="module")
def results(embedder, tasks, tmp_path_factory):
    cache = tmp_path_factory.mktemp("eval_cache")
    return evaluate(embedder, tasks, EvalConfig(r_max=(0.0, 0.5)), cache_dir=cache), cache


def _naive_ranks(queries: np.ndarray, candidates: np.ndarray, lists) -> list[int]:
    """Reference: sort each list by (score descending, list position); the gold is position 0."""
    ranks = []
    for q, ids in zip(queries, lists):
        scored = sorted(range(len(ids)), key=lambda j: (-float(candidates[ids[j]] @ q), j))
        ranks.append(scored.index(0))
    return ranks


def test_full_is_the_reference_retention_exactly_one_no_removal_no_speedup(results):
    for task in results[0].tasks:
        full = task.setting("full", 0.0)
        assert set(full.retention.values()) == {1.0}
        assert (full.prefix_removal, full.flops_reduction, full.forward_speedup, full.total_speedup) == (0.0, 0.0, 1.0, 1.0)
        assert full.stats.mean_trigger_layer is None
    summary = results[0].summary()[0]
    assert summary["method"] == "full" and summary["recall@10_retention"] == 1.0


@pytest.mark.parametrize("method", ["faste", "fastv", "block-last"])
def test_setting_scores_equal_a_naive_recomputation(results, embedder, tasks, method):
    evaluation, cache = results
    setting = next(s for s in EvalConfig(r_max=(0.5,)).settings(6) if s.method == method)
    for task, result in zip(tasks, evaluation.tasks):
        queries = embedder.encode(task.query_items()).embeddings  # full forward, own instructions
        reference = embedder.encode_documents(task.candidate_items(), fast_e=setting.fast_e)
        ranks = _naive_ranks(queries, reference.embeddings, [q.candidates for q in task.queries])
        got = result.setting(method, 0.5)
        assert got.scores.recall_at_1 == np.mean(np.array(ranks) < 1)
        assert got.scores.ndcg_at_10 == pytest.approx(np.mean([1 / np.log2(r + 2) for r in ranks]))
        assert got.prefix_removal == pytest.approx(reference.stats.prefix_removal)
        assert got.flops_reduction == pytest.approx(reference.stats.flops_reduction)
        (stored,) = cache.glob(f"*/{task.spec.subset}/{method}-r0.50.npy")
        np.testing.assert_allclose(np.load(stored), reference.embeddings, atol=1e-5)
        (stored_queries,) = cache.glob(f"*/{task.spec.subset}/queries.npy")
        np.testing.assert_allclose(np.load(stored_queries), queries, atol=1e-5)


def test_every_compressing_method_removes_about_half_of_the_prefix(results):
    for task in results[0].tasks:
        for method in ("faste", "fixed", "fastv", "random", "block-last"):
            # R_i = max(1, round(N_i / 2)) per sample: the realised share is r_max up to rounding.
            assert task.setting(method, 0.5).prefix_removal == pytest.approx(0.5, abs=0.05)


def test_downscaling_leaves_text_candidates_alone_and_shrinks_images(results):
    by_task = {task.task: task for task in results[0].tasks}
    assert by_task["docvqa"].setting("downscale", 0.5).prefix_removal == 0.0
    for name in ("mscoco", "nights"):
        assert by_task[name].setting("downscale", 0.5).prefix_removal > 0.0


def test_downscale_caps_follow_visual_tokens_times_one_minus_r(embedder, tasks):
    mscoco, docvqa, _ = tasks
    # 128x96 px images: 4x3 = 12 tokens of 32x32 px; half of them = 6 tokens.
    assert token_pixels(embedder) == 32 * 32
    assert downscale_pixels(embedder, mscoco.candidate_items()[:2], 0.5) == [6 * 32 * 32] * 2
    # Never below min_pixels (4096 px = 4 tokens).
    assert downscale_pixels(embedder, mscoco.candidate_items()[:1], 0.9) == [4096]
    assert downscale_pixels(embedder, docvqa.candidate_items(), 0.5) == [None] * len(docvqa.candidates)


def test_rerun_resumes_from_the_cache_without_embedding(results, embedder, tasks, monkeypatch):
    evaluation, cache = results

    def no_forward(*args, **kwargs):
        raise AssertionError("a cached setting was embedded again")

    monkeypatch.setattr(Embedder, "encode", no_forward)
    again = evaluate(embedder, tasks, EvalConfig(r_max=(0.0, 0.5)), cache_dir=cache)
    assert again.to_dict()["tasks"] == evaluation.to_dict()["tasks"]


def test_a_changed_setting_is_not_served_from_the_cache(results, embedder, tasks):
    _, cache = results
    calls = []
    original = Embedder.encode

    def counting(self, *args, **kwargs):
        calls.append(kwargs.get("fast_e"))
        return original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Embedder, "encode", counting)
        evaluate(embedder, tasks[:1], EvalConfig(r_max=(0.5,), methods=("random",), fast_e=FastEConfig(r_max=0.0, seed=7)), cache_dir=cache)
    assert any(fast_e is not None and fast_e.seed == 7 for fast_e in calls)


def test_settings_full_first_then_methods_with_documented_baselines():
    settings = EvalConfig(r_max=(0.0, 0.3)).settings(28)
    assert [s.key for s in settings][:3] == ["full", "faste-r0.30", "fixed-r0.30"]
    by_method = {s.method: s.fast_e for s in settings}
    assert by_method["fixed"].trigger_layer == 14
    assert by_method["fastv"] == FastEConfig.fastv(0.3)
    assert by_method["random"].ranking == "random" and by_method["block-last"].ranking == "block-last"
    assert by_method["downscale"] is None and by_method["full"] is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"methods": ("faste", "tome")}, "faste, fixed, fastv, random, block-last, downscale; got faste, tome"),
        ({"r_max": (0.3, 1.0)}, r"r_max must be in \[0, 1\), got 1.0"),
        ({"fast_e": {"threshold": 0.5}}, "EvalConfig.fast_e must be a FastEConfig"),
    ],
)
def test_invalid_eval_config_names_field_and_range(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        EvalConfig(**kwargs)


def test_fixed_layer_beyond_the_model_depth_is_a_config_error():
    with pytest.raises(ConfigError, match="trigger_layer of the 'fixed' baseline must be < 6"):
        EvalConfig(fast_e=FastEConfig(r_max=0.0, trigger_layer=6)).settings(6)
