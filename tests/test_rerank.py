"""Rerankers: the official format and score on transformers' own forward, FastE against a naive
reference that deletes tokens, protect="query", and the API's behaviour on bad inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from faste_mm import BatchingConfig, Embedder, Item
from faste_mm.errors import InputError, ModelLoadError
from faste_mm.model.faste import FastEConfig
from faste_mm.model.file_decoding import load_image
from faste_mm.model.rerank.pair_format import RERANK_MAX_PIXELS, VL_DEFAULT_INSTRUCTION, TEXT_DEFAULT_INSTRUCTION, rerank_serializer_config
from faste_mm.model.rerank.policy import ProtectedFastE
from faste_mm.model.rerank.reranker import Reranker
from faste_mm.model.video import VideoConfig, read_video
from faste_mm.testing import build_tiny_model

from tests.helpers.rerank_fixtures import ONE_BATCH, reranker_dirs, text_reranker, vl_lm, vl_reranker  # noqa: F401
from tests.helpers.reference import init_text_sample, init_vl_sample, naive_readout, official_text_scores, official_vl_pair_inputs, official_vl_scores

def _as_official(item: Item) -> dict:
    image = item.image
    if item.is_pdf:  # the page as rendered (rendering is the embedder's, tested there)
        image = load_image(item, item.max_pixels or RERANK_MAX_PIXELS)
    return {"text": item.text, "image": image, "video": None if item.video is None else str(item.video)}


def _official_vl(vl_reranker, vl_lm, query: Item, documents: list[Item], max_length: int):
    processor = vl_reranker.loaded.preprocessor
    fetch = lambda path: read_video(path, VideoConfig(), max_tokens=max_length)  # noqa: E731
    pairs = [official_vl_pair_inputs(processor, _as_official(query), _as_official(d), VL_DEFAULT_INSTRUCTION, max_length, fetch)
             for d in documents]
    with torch.no_grad():
        return pairs, official_vl_scores(vl_lm, processor, pairs, vl_reranker.loaded.pad_token_id).numpy()


def _vl_cases(image_dir):
    page = Item(image=image_dir / "doc.pdf", page=2, max_pixels=60_000)  # a small render keeps the test fast
    return {
        "text": (Item(text="what leans on the wall?"), [Item(text="a red bicycle leaning on a wall"), Item(text="short"), Item(text="")]),
        "image": (Item(text="a red square"), [Item(image=image_dir / "red.png"), Item(text="a caption", image=image_dir / "green_rgba.png")]),
        "page": (Item(text="which page is landscape?"), [page, Item(image=image_dir / "gray.jpg")]),
        "image query": (Item(image=image_dir / "gray.jpg", text="like this"), [Item(text="grey"), Item(image=image_dir / "red.png")]),
    }


@pytest.mark.parametrize("case", ["text", "image", "page", "image query"])
def test_vl_scores_equal_the_official_formula_on_transformers_forward(vl_reranker, vl_lm, image_dir, case):
    query, documents = _vl_cases(image_dir)[case]
    pairs, expected = _official_vl(vl_reranker, vl_lm, query, documents, vl_reranker.serializer.config.max_length)
    prepared = vl_reranker.prepare_query(query)
    for (official_ids, _), document in zip(pairs, documents):  # the same tokens, in the same order
        assert vl_reranker.serializer(prepared, document).input_ids.tolist() == official_ids
    result = vl_reranker.score(query, documents)  # one right-padded batch vs the official left-padded one
    np.testing.assert_allclose(result.scores, expected, atol=1e-5)


def test_video_pairs_equal_the_official_formula(vl_reranker, vl_lm, tmp_path):
    from tests.helpers.inputs import write_video

    clip = write_video(tmp_path / "clip.mp4", 4, 5)
    query, documents = Item(text="a moving bar"), [Item(video=clip), Item(video=clip, text="with a caption"), Item(text="no video")]
    _, expected = _official_vl(vl_reranker, vl_lm, query, documents, vl_reranker.serializer.config.max_length)
    np.testing.assert_allclose(vl_reranker.score(query, documents).scores, expected, atol=1e-5)


def test_truncation_keeps_special_tokens_and_the_last_five_like_the_official_code(vl_reranker, reranker_dirs, vl_lm, image_dir):
    short = Reranker(vl_reranker.loaded, serializer=rerank_serializer_config(max_length=40), batching=ONE_BATCH)
    query, documents = Item(text="a red square"), [Item(text="words " * 60, image=image_dir / "red.png"), Item(text="x " * 80)]
    pairs, expected = _official_vl(short, vl_lm, query, documents, 40)
    prepared = short.prepare_query(query)
    for (official_ids, _), document in zip(pairs, documents):
        serialized = short.serializer(prepared, document)
        assert serialized.truncated and serialized.input_ids.tolist() == official_ids
    np.testing.assert_allclose(short.score(query, documents).scores, expected, atol=1e-5)


def test_text_reranker_equals_the_model_card_formula(text_reranker, reranker_dirs):
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    path = str(reranker_dirs["qwen3_reranker"])
    lm, tokenizer = Qwen3ForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    documents = ["The capital of China is Beijing.", "Gravity is a force " * 30, "x", ""]
    for max_length, reranker in ((8192, text_reranker), (60, Reranker(text_reranker.loaded, serializer=rerank_serializer_config(60)))):
        with torch.no_grad():
            expected = official_text_scores(lm, tokenizer, "What is the capital of China?", documents, TEXT_DEFAULT_INSTRUCTION, max_length)
        got = reranker.score("What is the capital of China?", documents).scores
        np.testing.assert_allclose(got, expected.numpy(), atol=1e-5)


# -- FastE: a naive reference that literally deletes tokens --


def _naive_vl(vl_reranker, vl_lm, query, documents, protect: bool, **faste):
    prepared = vl_reranker.prepare_query(query)
    serialized = [vl_reranker.serializer(prepared, d) for d in documents]
    protected = [s.protected for s in serialized] if protect else None
    with torch.no_grad():
        samples = [init_vl_sample(vl_lm.model, s) for s in serialized]
        text = vl_lm.model.language_model
        z, trigger, curve = naive_readout(list(text.layers), text.norm, samples, protected=protected, **faste)
    return torch.sigmoid(z.float() @ vl_reranker.loaded.yes_minus_no).numpy(), trigger, curve


@pytest.mark.parametrize("protect, trigger_layer, r_max", [("none", 1, 0.5), ("query", 4, 0.7), ("query", 1, 0.3)])
def test_faste_on_pairs_equals_naive_token_deletion(vl_reranker, vl_lm, image_dir, protect, trigger_layer, r_max):
    query, documents = Item(text="a red square on a page"), [Item(image=image_dir / "red.png"), Item(text="a bicycle " * 5),
                                                              Item(text="green", image=image_dir / "green_rgba.png")]
    expected, _, _ = _naive_vl(vl_reranker, vl_lm, query, documents, protect == "query", r_max=r_max, trigger_layer=trigger_layer)
    reranker = Reranker(vl_reranker.loaded, fast_e=FastEConfig(r_max=r_max, trigger_layer=trigger_layer), protect=protect, batching=ONE_BATCH)
    result = reranker.score(query, documents)
    np.testing.assert_allclose(result.scores, expected, atol=1e-5)
    assert result.stats.kept_prefix_tokens < result.stats.prefix_tokens


def test_faste_alignment_trigger_on_pairs_equals_naive_reference(vl_reranker, vl_lm, image_dir):
    query, documents = Item(text="which one is red?"), [Item(image=image_dir / "red.png"), Item(text="a red bicycle leaning on a wall")]
    _, _, curve = _naive_vl(vl_reranker, vl_lm, query, documents, False)
    theta = float(np.median(curve[2:]))  # crossed somewhere after the warm-up
    expected, trigger, _ = _naive_vl(vl_reranker, vl_lm, query, documents, True, r_max=0.5, warmup=2, theta=theta)
    reranker = Reranker(vl_reranker.loaded, fast_e=FastEConfig(r_max=0.5, warmup_layer=2, threshold=theta), protect="query", batching=ONE_BATCH)
    result = reranker.score(query, documents)
    assert result.stats.batches[0].trigger_layer == trigger
    np.testing.assert_allclose(result.scores, expected, atol=1e-5)


def test_text_reranker_faste_equals_naive_token_deletion(text_reranker, reranker_dirs):
    from transformers import Qwen3ForCausalLM

    lm = Qwen3ForCausalLM.from_pretrained(str(reranker_dirs["qwen3_reranker"])).eval()
    documents = ["Paris is the capital and largest city of France. " * 3, "a red bicycle"]
    prepared = text_reranker.prepare_query("capital of France?")
    serialized = [text_reranker.serializer(prepared, Item(text=d)) for d in documents]
    with torch.no_grad():
        samples = [init_text_sample(lm.model, s) for s in serialized]
        z, _, _ = naive_readout(list(lm.model.layers), lm.model.norm, samples, r_max=0.6, trigger_layer=3,
                                protected=[s.protected for s in serialized])
    expected = torch.sigmoid(z.float() @ text_reranker.loaded.yes_minus_no).numpy()
    reranker = Reranker(text_reranker.loaded, fast_e=FastEConfig(r_max=0.6, trigger_layer=3), protect="query", batching=ONE_BATCH)
    np.testing.assert_allclose(reranker.score("capital of France?", documents).scores, expected, atol=1e-5)


@pytest.mark.parametrize("r_max", [0.5, 0.9])
def test_protect_query_never_drops_a_query_position(vl_reranker, image_dir, r_max):
    prepared = vl_reranker.prepare_query(Item(text="a long query about red squares and bicycles on walls"))
    documents = [Item(image=image_dir / "red.png"), Item(text="a bicycle " * 20), Item(text="z")]
    serialized = [vl_reranker.backbone.with_positions(vl_reranker.serializer(prepared, d)) for d in documents]
    from faste_mm.model.batching import collate

    batch = collate(serialized, list(range(len(serialized))), vl_reranker.loaded.pad_token_id)
    backbone = vl_reranker.backbone
    config = FastEConfig(r_max=r_max, warmup_layer=0, threshold=-1.0)  # fires before layer 0
    with torch.inference_mode():
        state = backbone.embed(batch)
        plan = ProtectedFastE(config, backbone.shape.num_layers, batch.protected).before_layer(0, state, backbone).plan
    for row, item in enumerate(serialized):
        kept = plan.index[row, : int(plan.lengths[row])].tolist()
        n_prefix, protected = item.length - 1, item.protected
        assert set(range(protected)) <= set(kept)  # every instruction + query position survives
        assert len(kept) - 1 == protected + max(1, round((1 - r_max) * (n_prefix - protected)))
        assert kept[-1] == n_prefix  # the readout stays last


def test_r_max_zero_is_the_exact_full_forward(vl_reranker, image_dir):
    documents = [Item(image=image_dir / "red.png"), "a red bicycle"]
    zero = Reranker(vl_reranker.loaded, fast_e=FastEConfig(r_max=0.0), protect="query", batching=ONE_BATCH)
    np.testing.assert_array_equal(zero.score("red", documents).scores, vl_reranker.score("red", documents).scores)


# -- the API on good and bad inputs --


def test_rerank_orders_candidates_by_score_with_their_input_index(vl_reranker, image_dir):
    documents = ["a red bicycle leaning on a wall", image_dir / "red.png", "the quick brown fox", "short"]
    scores = vl_reranker.score("red things", documents).scores
    ranking = vl_reranker.rerank("red things", documents, top_n=3)
    assert [r.index for r in ranking.results] == list(np.argsort(-scores, kind="stable")[:3])
    assert [r.score for r in ranking.results] == pytest.approx(sorted(scores.tolist(), reverse=True)[:3])


def test_a_candidate_scores_the_same_alone_and_in_a_padded_batch(vl_reranker, image_dir):
    documents = ["a red bicycle leaning on a wall " * 4, Item(image=image_dir / "green_rgba.png"), "x"]
    together = vl_reranker.score("green", documents).scores
    alone = [vl_reranker.score("green", [d]).scores[0] for d in documents]
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_an_empty_document_list_returns_an_empty_result(vl_reranker):
    result = vl_reranker.score("anything", [])
    assert result.scores.shape == (0,) and result.failures == []
    assert vl_reranker.rerank("anything", [], top_n=5).results == []


def test_an_unreadable_candidate_is_reported_and_the_others_still_scored(vl_reranker, image_dir, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png at all")
    documents = ["a red bicycle", broken, Item(image=image_dir / "red.png")]
    result = vl_reranker.score("red", documents)
    assert [f.source for f in result.failures] == [1] and "broken.png" in result.failures[0].reason
    assert list(result.ok) == [True, False, True] and np.isnan(result.scores[1])
    np.testing.assert_allclose(result.scores[[0, 2]], vl_reranker.score("red", [documents[0], documents[2]]).scores, atol=1e-5)
    assert sorted(r.index for r in result.ranked()) == [0, 2]  # a failed candidate is never ranked
    with pytest.raises(InputError, match="broken.png"):
        vl_reranker.score("red", documents, on_error="raise")


def test_an_unreadable_query_is_named(vl_reranker, tmp_path):
    broken = tmp_path / "query.png"
    broken.write_bytes(b"nope")
    with pytest.raises(InputError, match="query.png"):
        vl_reranker.score(broken, ["a"])


def test_the_text_reranker_refuses_images_per_candidate(text_reranker, image_dir):
    result = text_reranker.score("red", ["a red bicycle", image_dir / "red.png"])
    assert list(result.ok) == [True, False] and "text-only reranker" in result.failures[0].reason


def test_an_embedding_model_is_refused_as_a_reranker_and_the_reverse(reranker_dirs, tmp_path):
    from transformers import AutoConfig

    embedding = tmp_path / "tiny-embedder"  # the config is enough: the refusal comes before any weights
    config = AutoConfig.from_pretrained(str(reranker_dirs["qwen3_vl_reranker"]))
    config.architectures = ["Qwen3VLModel"]
    config.save_pretrained(embedding)
    with pytest.raises(ModelLoadError, match="tiny-embedder: this is an embedding model, not a reranker.*Reranker-2B"):
        Reranker.from_pretrained(str(embedding), device="cpu")
    with pytest.raises(ModelLoadError, match="qwen3_vl_reranker: this is a reranker, not an embedding model.*Embedding-2B"):
        Embedder.from_pretrained(str(reranker_dirs["qwen3_vl_reranker"]), device="cpu")


# -- explain: attention over the document, mapped to the grid and the text --


def test_explain_weights_equal_naive_readout_attention_and_sum_as_documented(vl_reranker, vl_lm, image_dir):
    from tests.helpers.reference import _causal_mask, naive_readout_scores

    document = Item(text="a red square, héllo wörld", image=image_dir / "red.png")
    explanation = vl_reranker.explain("which is red?", document, layer=3)
    serialized = vl_reranker.serializer(vl_reranker.prepare_query("which is red?"), document)
    with torch.no_grad():  # the sample alone through layers 0..2 (DeepStack included), then layer 3's attention
        sample = init_vl_sample(vl_lm.model, serialized)
        layers = vl_lm.model.language_model.layers
        for index in range(3):
            sample.hidden = layers[index](sample.hidden, attention_mask=_causal_mask(sample.hidden.shape[1]),
                                          position_embeddings=(sample.cos, sample.sin))
            if index < len(sample.deepstack):
                sample.hidden[0, torch.tensor(sample.visual)] += sample.deepstack[index]
        expected = np.array(naive_readout_scores(layers[3], sample))
    protected = serialized.protected
    assert explanation.layer == 3
    assert explanation.score == pytest.approx(float(vl_reranker.score("which is red?", [document]).scores[0]), abs=1e-6)
    assert explanation.query_share == pytest.approx(expected[:protected].sum(), abs=1e-5)
    assert explanation.query_share + explanation.document_share == pytest.approx(1.0, abs=1e-5)
    (image,) = explanation.images
    _, h, w = serialized.image_grid_thw[-1].tolist()
    assert image.grid.shape == (h // 2, w // 2) and image.patches.shape == (h, w) and image.size == (w * 16, h * 16)
    pads = (serialized.input_ids == vl_lm.config.image_token_id).nonzero()[:, 0].numpy()
    np.testing.assert_allclose(image.grid.ravel(), expected[pads], atol=1e-5)  # row-major over the merged grid
    assert image.patches.sum() == pytest.approx(image.grid.sum(), abs=1e-6)
    assert "".join(span.text for span in explanation.text) == document.text  # spans tile the text
    parts = image.grid.sum() + sum(span.weight for span in explanation.text) + explanation.template_share
    assert parts == pytest.approx(explanation.document_share, abs=1e-6) and explanation.template_share >= 0


def test_explain_on_the_text_reranker_maps_tokens_to_text_spans(text_reranker):
    explanation = text_reranker.explain("capital?", "Paris is the capital of France.")
    assert "".join(span.text for span in explanation.text) == "Paris is the capital of France."
    assert explanation.images == [] and 0 <= explanation.layer < text_reranker.backbone.shape.num_layers
    assert explanation.query_share + explanation.document_share == pytest.approx(1.0, abs=1e-5)


def test_bad_reranker_options_and_inputs_are_named(vl_reranker, image_dir):
    from faste_mm.errors import ConfigError

    with pytest.raises(ConfigError, match="protect must be one of none, query, got 'all'"):
        Reranker(vl_reranker.loaded, protect="all")
    with pytest.raises(ConfigError, match="layer must be in 0..5"):
        vl_reranker.explain("q", "d", layer=6)
    with pytest.raises(InputError, match="doc.pdf.*2 pages"):
        vl_reranker.score(image_dir / "doc.pdf", ["a"])
    with pytest.raises(ConfigError, match="top_n must be >= 0"):
        vl_reranker.score("q", []).ranked(-1)


def test_a_float32_checkpoint_loads_in_float32_from_a_path_whatever_the_cpu(reranker_dirs, monkeypatch):
    """The embedder's dtype rule holds for rerankers: "auto" never rounds a float32 checkpoint down
    to bfloat16, even on a CPU with native bf16 (here faked), and a Path names the folder."""
    import torch

    from faste_mm.model.backbones import loading

    monkeypatch.setattr(loading, "read_cpu_flags", lambda *_: frozenset({"avx512_bf16"}))
    assert loading.choose_dtype("auto", torch.device("cpu")).dtype == torch.bfloat16  # the fake is seen
    reranker = Reranker.from_pretrained(reranker_dirs["qwen3_reranker"], device="cpu")
    assert reranker.backbone.dtype == torch.float32
