"""Properties: budgets, keep plans, batching order, batch invariance, unit norm, Matryoshka, configs."""

from __future__ import annotations

import typing

import numpy as np
import pytest
import torch

from faste_mm import BatchingConfig, ConfigError, Embedder, FastEConfig
from faste_mm.model.batching import plan_batches
from faste_mm.model.decoder_state import DecoderState
from faste_mm.model.ablations import block_last_scores
from faste_mm.model.faste import plan_keep, prefix_budgets


@pytest.mark.parametrize("r_max", [0.0, 0.3, 0.5, 0.7, 0.99])
def test_budget_is_max_one_python_round_of_kept_share(r_max):
    n_prefix = torch.arange(1, 400)
    expected = [max(1, round((1 - r_max) * n)) for n in n_prefix.tolist()]
    assert prefix_budgets(n_prefix, r_max).tolist() == expected


def test_budget_edge_cases():
    assert prefix_budgets(torch.tensor([1, 5, 7, 10]), 0.5).tolist() == [1, 2, 4, 5]  # half to even
    assert prefix_budgets(torch.tensor([1, 10, 1000]), 0.99).tolist() == [1, 1, 10]
    assert prefix_budgets(torch.tensor([0]), 0.5).tolist() == [0]  # no prefix: nothing to keep


def _state(lengths, width, hidden=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    valid = torch.arange(width)[None] < lengths[:, None]
    return DecoderState(
        hidden=torch.randn(len(lengths), width, hidden, generator=g),
        cos=torch.ones(len(lengths), width, 2),
        sin=torch.zeros(len(lengths), width, 2),
        valid=valid,
        lengths=lengths,
        source_index=torch.arange(width).expand(len(lengths), width),
    )


@pytest.mark.parametrize("seed", range(5))
def test_keep_plan_keeps_top_budget_in_causal_order_and_readout_last(seed):
    state = _state([9, 2, 6, 12], width=12, seed=seed)
    scores = torch.rand(4, 12, generator=torch.Generator().manual_seed(seed)).masked_fill(~state.prefix_mask, float("-inf"))
    budgets = prefix_budgets(state.lengths - 1, 0.5)
    plan = plan_keep(scores, budgets, state)
    assert plan.lengths.tolist() == (budgets + 1).tolist()
    for b in range(4):
        r, n = int(budgets[b]), int(state.lengths[b]) - 1
        kept = plan.index[b, :r].tolist()
        assert kept == sorted(kept) and len(set(kept)) == r
        assert set(kept) == set(scores[b, :n].topk(r).indices.tolist())
        assert int(plan.index[b, r]) == n  # the readout is always kept, last
    gathered = state.gather(plan.index, plan.lengths)
    rows = torch.arange(4)
    assert torch.equal(gathered.readout_hidden(), state.hidden[rows, state.lengths - 1])
    assert gathered.valid.sum(1).tolist() == plan.lengths.tolist()


def test_block_last_keeps_the_last_state_of_each_block():
    state = _state([11], width=11)  # N = 10 prefix states
    budgets = torch.tensor([4])  # blocks of sizes 2, 3, 2, 3 -> ends 1, 4, 6, 9
    plan = plan_keep(block_last_scores(state, budgets), budgets, state)
    assert plan.index[0].tolist() == [1, 4, 6, 9, 10]


def test_plan_batches_respects_the_token_budget_and_sorts_by_length():
    lengths = [5, 50, 7, 300, 20, 20, 1]
    batches = plan_batches(lengths, BatchingConfig(batch_tokens=100, max_batch_size=3))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert batches[0] == [3]  # longer than the budget: alone
    for batch in batches:
        assert len(batch) <= 3
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 100
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat, reverse=True)


@pytest.mark.parametrize("batch_tokens", [64, 300, 1 << 20])
@pytest.mark.parametrize("fast_e", [None, FastEConfig(r_max=0.5, trigger_layer=2)])
def test_output_order_and_values_do_not_depend_on_batching(model_dirs, vl_embedder, mixed_items, batch_tokens, fast_e):
    embedder = Embedder(vl_embedder.loaded, BatchingConfig(batch_tokens=batch_tokens))
    res = embedder.encode(mixed_items, fast_e=fast_e)
    alone = np.stack([embedder.encode([item], fast_e=fast_e).embeddings[0] for item in mixed_items])
    np.testing.assert_allclose(res.embeddings, alone, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(res.embeddings, axis=1), 1.0, atol=1e-5)
    reversed_res = embedder.encode(mixed_items[::-1], fast_e=fast_e)
    np.testing.assert_allclose(reversed_res.embeddings[::-1], res.embeddings, atol=2e-5)


def test_matryoshka_keeps_first_dims_and_renormalises(vl_embedder, mixed_items):
    full = vl_embedder.encode(mixed_items).embeddings
    short = vl_embedder.encode(mixed_items, dim=16).embeddings
    assert short.shape == (len(mixed_items), 16)
    expected = full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True)
    np.testing.assert_allclose(short, expected, atol=1e-5)
    with pytest.raises(ConfigError, match="dim must be in"):
        vl_embedder.encode(mixed_items, dim=10_000)


@pytest.mark.parametrize("ranking", ["readout", "fastv", "random", "block-last"])
def test_every_ranking_keeps_exactly_the_budget(vl_embedder, mixed_items, ranking):
    res = vl_embedder.encode(mixed_items, fast_e=FastEConfig(r_max=0.7, trigger_layer=2, ranking=ranking))
    trace = res.stats.batches[0]
    serialized = [vl_embedder.serializer(i, getattr(i, "instruction", None)) for i in res.items]
    assert trace.kept_prefix_tokens == int(prefix_budgets(torch.tensor([s.length - 1 for s in serialized]), 0.7).sum())
    assert trace.trigger_layer == 2
    assert np.allclose(np.linalg.norm(res.embeddings, axis=1), 1.0, atol=1e-5)


def test_random_ranking_is_reproducible_per_seed(vl_embedder, mixed_items):
    run = lambda seed: vl_embedder.encode(mixed_items, fast_e=FastEConfig(r_max=0.7, trigger_layer=2, ranking="random", seed=seed))
    assert np.array_equal(run(1).embeddings, run(1).embeddings)
    assert not np.array_equal(run(1).embeddings, run(2).embeddings)


def test_fastv_preset_ranks_after_layer_two():
    config = FastEConfig.fastv(0.5)
    assert (config.trigger_layer, config.ranking) == (2, "fastv")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(r_max=1.0), "r_max"),
        (dict(r_max=-0.1), "r_max"),
        (dict(warmup_layer=-1), "warmup_layer"),
        (dict(threshold=1.5), "threshold"),
        (dict(trigger_layer=-2), "trigger_layer"),
        (dict(ranking="topk"), "ranking"),
        (dict(fastv_queries=0), "fastv_queries"),
    ],
)
def test_invalid_fast_e_config_names_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=f"FastEConfig.{field}"):
        FastEConfig(**kwargs)


def test_trigger_layer_beyond_the_model_depth_is_refused(vl_embedder):
    with pytest.raises(ConfigError, match="trigger_layer must be < 6"):
        vl_embedder.encode(["x"], fast_e=FastEConfig(trigger_layer=6))


def test_backbone_defaults_fill_warmup_and_threshold(vl_embedder, text_embedders):
    assert vl_embedder.resolve_fast_e(FastEConfig()).threshold == 0.70
    assert text_embedders["qwen3"].resolve_fast_e(FastEConfig()).threshold == 0.60
    assert text_embedders["mistral"].resolve_fast_e(FastEConfig()).threshold == 0.40
    assert vl_embedder.resolve_fast_e(FastEConfig(threshold=0.5, warmup_layer=3)).warmup_layer == 3


@pytest.mark.parametrize("workers, chunk_items, prefetch", [(0, 256, 4), (2, 2, 1), (3, 1, 2)])
def test_background_preprocessing_gives_the_same_rows_as_inline(vl_embedder, mixed_items, workers, chunk_items, prefetch):
    config = BatchingConfig(batch_tokens=200, workers=workers, chunk_items=chunk_items, prefetch_batches=prefetch)
    res = Embedder(vl_embedder.loaded, config).encode(mixed_items)
    np.testing.assert_allclose(res.embeddings, vl_embedder.encode(mixed_items).embeddings, atol=2e-5)
    assert res.stats.serialize_s > 0


def test_a_bad_item_stops_the_pipeline_cleanly_and_a_later_call_still_works(vl_embedder, mixed_items, tmp_path):
    from faste_mm import InputError, Item

    config = BatchingConfig(workers=2, chunk_items=1, prefetch_batches=1)
    embedder = Embedder(vl_embedder.loaded, config)
    with pytest.raises(InputError, match="nope.png"):
        embedder.encode([*mixed_items, Item(image=tmp_path / "nope.png"), *mixed_items])
    assert embedder.encode(mixed_items).ok.all()


def test_preprocessing_crashes_surface_in_the_caller():
    from faste_mm.model.prefetch import prefetch_batches

    def explode(index):
        raise SystemExit("worker died")  # not an Exception: must not be recorded as an item failure

    with pytest.raises(SystemExit, match="worker died"):
        list(prefetch_batches([0, 1], explode, BatchingConfig(workers=1), pad_token_id=0))


def test_the_model_starts_after_a_small_first_chunk_not_a_whole_one():
    """Length sorting needs a whole chunk serialized, so the first chunks are small (16, then
    doubling up to chunk_items): the first batch is ready after 16 items, not 256."""
    from faste_mm.model.prefetch import FIRST_CHUNK_ITEMS, _ramped_chunks, prefetch_batches
    from faste_mm.model.serialization import Serialized

    assert [len(c) for c in _ramped_chunks(list(range(150)), 40)] == [16, 32, 40, 40, 22]
    assert [len(c) for c in _ramped_chunks(list(range(5)), 256)] == [5]
    assert sum(_ramped_chunks(list(range(300)), 64), []) == list(range(300))  # every item once, in order
    serialized = []

    def serialize(index: int) -> Serialized:
        serialized.append(index)
        return Serialized(input_ids=torch.ones(4 + index % 3, dtype=torch.long))

    first = next(prefetch_batches(list(range(300)), serialize, BatchingConfig(workers=0, chunk_items=256), pad_token_id=0))
    assert len(serialized) == FIRST_CHUNK_ITEMS and set(first.rows) <= set(range(FIRST_CHUNK_ITEMS))


def test_fastv_scores_equal_a_naive_full_attention_matrix_per_row(vl_embedder, mixed_items):
    """FastV-style scores: the attention each prefix key receives, averaged over heads and the
    sampled query rows, from a full per-row [T, T] causal softmax computed the plain way."""
    from faste_mm.model.batching import collate
    from faste_mm.model.items import as_item
    from faste_mm.model.ablations import fastv_attention

    backbone = vl_embedder.backbone
    serialized = [backbone.with_positions(vl_embedder.serializer(as_item(x, i), None)) for i, x in enumerate(mixed_items)]
    state = backbone.embed(collate(serialized, list(range(len(serialized))), vl_embedder.loaded.pad_token_id))
    n_queries = 5
    with torch.no_grad():
        got = fastv_attention(backbone, 1, state, n_queries)
        for b, length in enumerate(state.lengths.tolist()):
            rows = slice(0, length)
            q = backbone.project_queries(1, state.hidden[b : b + 1, rows], state.cos[b : b + 1, rows], state.sin[b : b + 1, rows])[0]
            k = backbone.project_keys(1, state.hidden[b : b + 1, rows], state.cos[b : b + 1, rows], state.sin[b : b + 1, rows])[0]
            k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)  # query head h reads kv head h // G
            logits = (q.float() @ k.float().transpose(1, 2)) * backbone.attention_scale(1)  # [A, T, T]
            causal = torch.ones(length, length, dtype=torch.bool).tril()
            attention = logits.masked_fill(~causal, float("-inf")).softmax(dim=-1).mean(dim=0)  # [T, T]
            samples = min(n_queries, state.hidden.shape[1])
            picked = [j * length // samples for j in range(samples)] if length >= samples else list(range(length))
            expected = attention[picked].mean(dim=0)[: length - 1]  # prefix keys only
            torch.testing.assert_close(got[b, : length - 1], expected, atol=1e-5, rtol=1e-4)
            assert torch.isinf(got[b, length - 1 :]).all()  # readout and padding never ranked


def test_batch_tokens_and_bytes_follow_the_models_device_unless_given():
    """None: 4,096 tokens and 96 MiB on a CPU (its caches, host memory), 16,384 tokens and 512 MiB
    on CUDA (larger batches for the GPU); a value the caller gives is kept on every device; the
    CLI's help states the same numbers."""
    from faste_mm.cli.options import DEFAULT_BATCH_TOKENS, BatchTokens
    from faste_mm.model.batching import BATCH_BYTES, BATCH_TOKENS

    default = BatchingConfig()
    assert default.batch_bytes is None and default.byte_budget == BATCH_BYTES["cpu"] == 96 * 2**20
    assert default.batch_tokens is DEFAULT_BATCH_TOKENS is None and default.token_budget == BATCH_TOKENS["cpu"] == 4096
    on_cpu, on_cuda = default.for_device(torch.device("cpu")), default.for_device(torch.device("cuda", 0))
    assert (on_cpu.batch_tokens, on_cpu.batch_bytes) == (4096, 96 * 2**20)
    assert (on_cuda.batch_tokens, on_cuda.batch_bytes) == (16384, 512 * 2**20)
    help_ = typing.get_args(BatchTokens)[1].help
    assert f"{BATCH_TOKENS['cpu']} on a CPU" in help_ and f"{BATCH_TOKENS['cuda']} on a GPU" in help_
    given = BatchingConfig(batch_bytes=2**20, batch_tokens=999)
    assert (given.for_device(torch.device("cuda")).batch_bytes, given.for_device(torch.device("cuda")).batch_tokens) == (2**20, 999)
    with pytest.raises(ConfigError, match="batch_tokens"):
        BatchingConfig(batch_tokens=0)
    page_bytes, page_tokens = 31_457_280, 1_292  # a reranker's page at 1,310,720 px
    on_gpu = plan_batches([page_tokens] * 20, default.for_device(torch.device("cuda")), [page_bytes] * 20)
    assert [len(b) for b in on_gpu] == [12, 8]  # the token budget, not the bytes, bounds it
    assert [len(b) for b in plan_batches([page_tokens] * 20, default, [page_bytes] * 20)] == [3] * 6 + [2]
