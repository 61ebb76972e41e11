"""sentence-transformers integration against references: the unmodified ST model (r_max 0, queries,
disable_faste) and faste-mm's own `Embedder` on the same checkpoint (FastE)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("sentence_transformers")

from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.base.modules import Normalize, Transformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling  # noqa: E402

from faste_mm import BatchingConfig, ConfigError, Embedder, FastEConfig, FasteError, Item, ModelLoadError  # noqa: E402
from faste_mm.integrations.sentence_transformers import (  # noqa: E402
    FastETransformer,
    disable_faste,
    embedder_from_sentence_transformer,
    enable_faste,
    is_faste_enabled,
)
from tests.helpers.tiny_models import tiny_model_dir  # noqa: E402
from tests.helpers.bounds import HANG_S  # noqa: E402

DEFAULT_INSTRUCTION = "Represent the user's input."
QUERY_INSTRUCTION = "Find me an everyday image that matches the given caption:"  # ends in P*: no '.' added
WEB_SEARCH = "Given a web search query, retrieve relevant passages that answer the query"
ONE_BATCH = BatchingConfig(batch_tokens=1 << 20)  # FastE's alignment trigger is a batch decision
TRIGGER_2 = FastEConfig(r_max=0.5, trigger_layer=2)


def write_sentence_transformers_layout(path: Path, hidden: int) -> Path:
    """The ST files of the published Qwen3-VL-Embedding: Transformer (text, image, message through
    forward().last_hidden_state, chat template with generation prompt) -> last-token Pooling ->
    Normalize; documents get the default instruction as their system prompt."""
    forward = {"method": "forward", "method_output_name": "last_hidden_state"}
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.base.modules.normalize.Normalize"},
    ]
    transformer = {
        "transformer_task": "feature-extraction",
        "modality_config": {"text": forward, "image": forward, "message": {**forward, "format": "structured"}},
        "module_output_name": "token_embeddings",
        "processing_kwargs": {"chat_template": {"add_generation_prompt": True}},
    }
    model_config = {
        "model_type": "SentenceTransformer",
        "prompts": {"query": DEFAULT_INSTRUCTION, "document": DEFAULT_INSTRUCTION},
        "default_prompt_name": "document",
        "similarity_fn_name": "cosine",
    }
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "2_Normalize").mkdir(exist_ok=True)
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "sentence_bert_config.json").write_text(json.dumps(transformer))
    (path / "config_sentence_transformers.json").write_text(json.dumps(model_config))
    pooling = {"embedding_dimension": hidden, "pooling_mode": "lasttoken"}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (path / "2_Normalize" / "config.json").write_text("{}")
    return path


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory) -> Path:
    # a copy: the layout's files are written into the model folder
    path = shutil.copytree(tiny_model_dir(tmp_path_factory.getbasetemp(), "qwen3_vl"), tmp_path_factory.mktemp("st") / "qwen3_vl")
    return write_sentence_transformers_layout(path, hidden=64)


@pytest.fixture(scope="module")
def vl_model_shared(vl_dir) -> SentenceTransformer:
    return SentenceTransformer(str(vl_dir), device="cpu")


@pytest.fixture
def vl_model(vl_model_shared):
    yield vl_model_shared
    disable_faste(vl_model_shared)  # tests share one loaded model; each leaves it unmodified


@pytest.fixture(scope="module")
def vl_embedder(vl_dir) -> Embedder:
    return Embedder.from_pretrained(str(vl_dir), device="cpu", batching=ONE_BATCH)


@pytest.fixture(scope="module")
def images() -> dict[str, Image.Image]:
    # Sides are multiples of 32, so qwen-vl-utils (Embedder) and the processor (ST) keep the size.
    return {"red": Image.new("RGB", (64, 96), (200, 30, 30)), "noise": _noise_image(96, 64)}


@pytest.fixture(scope="module")
def mixed(images):
    """The same items as ST inputs and as faste-mm inputs: texts, an image, image + text."""
    st_inputs = [
        "a red bicycle leaning on a wall",
        images["red"],
        {"image": images["noise"], "text": "some noise seen from far away, with a caption"},
        "short",
        "the quick brown fox jumps over the lazy dog " * 3,
    ]
    faste_inputs = [
        st_inputs[0],
        Item(image=images["red"]),
        Item(image=images["noise"], text=st_inputs[2]["text"]),
        st_inputs[3],
        st_inputs[4],
    ]
    return st_inputs, faste_inputs


def _noise_image(width: int, height: int) -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def test_importing_faste_mm_does_not_import_sentence_transformers():
    code = "import sys, faste_mm, faste_mm.integrations; assert 'sentence_transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=HANG_S)


def test_layout_loads_as_the_published_model_does(vl_model):
    assert vl_model.modalities == ["text", "image", "message"]
    assert [type(module) for module in vl_model] == [Transformer, Pooling, Normalize]


def test_r_max_zero_gives_the_unmodified_models_vectors(vl_model, mixed):
    st_inputs, _ = mixed
    reference = vl_model.encode(st_inputs)
    enable_faste(vl_model, FastEConfig(r_max=0.0, trigger_layer=2), apply_to="all")
    assert isinstance(vl_model[0], FastETransformer)
    np.testing.assert_allclose(vl_model.encode(st_inputs), reference, atol=1e-5)
    np.testing.assert_allclose(vl_model.encode_document(st_inputs, batch_size=2), reference, atol=1e-5)


def test_fast_e_documents_equal_the_embedders(vl_model, vl_embedder, mixed):
    st_inputs, faste_inputs = mixed
    full = vl_model.encode_document(st_inputs)
    enable_faste(vl_model, TRIGGER_2)
    compressed = vl_model.encode_document(st_inputs)
    expected = vl_embedder.encode_documents(faste_inputs, fast_e=TRIGGER_2).embeddings
    np.testing.assert_allclose(compressed, expected, atol=1e-5)
    assert np.abs(compressed - full).max() > 1e-3  # FastE really changed the forward
    np.testing.assert_allclose(np.linalg.norm(compressed, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("threshold", [-1.0, 1.0], ids=["fires-at-warmup", "falls-back-to-last-layer"])
def test_alignment_trigger_equals_the_embedders(vl_model, vl_embedder, mixed, threshold):
    # theta = -1 fires at l_w for any batch, theta = 1 never fires: both are batch-independent.
    st_inputs, faste_inputs = mixed
    fast_e = FastEConfig(r_max=0.5, warmup_layer=1, threshold=threshold)
    enable_faste(vl_model, fast_e, apply_to="all")
    result = vl_embedder.encode(faste_inputs, fast_e=fast_e)
    assert result.stats.batches[0].trigger_layer == (1 if threshold < 0 else vl_embedder.backbone.shape.num_layers - 1)
    np.testing.assert_allclose(vl_model.encode(st_inputs), result.embeddings, atol=1e-5)


def test_documents_setting_keeps_queries_on_the_full_forward(vl_model, vl_embedder, mixed):
    st_inputs, faste_inputs = mixed
    queries = st_inputs[:1] + st_inputs[3:]
    full_queries = vl_model.encode_query(queries, prompt=QUERY_INSTRUCTION)
    full_documents = vl_model.encode_document(st_inputs)
    enable_faste(vl_model, TRIGGER_2, apply_to="documents")
    np.testing.assert_array_equal(vl_model.encode_query(queries, prompt=QUERY_INSTRUCTION), full_queries)
    assert np.abs(vl_model.encode_document(st_inputs) - full_documents).max() > 1e-3


def test_queries_setting_compresses_queries_only(vl_model, vl_embedder, mixed):
    st_inputs, faste_inputs = mixed
    queries, faste_queries = st_inputs[:1] + st_inputs[3:], faste_inputs[:1] + faste_inputs[3:]
    full_documents = vl_model.encode_document(st_inputs)
    enable_faste(vl_model, TRIGGER_2, apply_to="queries")
    expected = vl_embedder.encode_queries(faste_queries, instruction=QUERY_INSTRUCTION, fast_e=TRIGGER_2).embeddings
    np.testing.assert_allclose(vl_model.encode_query(queries, prompt=QUERY_INSTRUCTION), expected, atol=1e-5)
    np.testing.assert_array_equal(vl_model.encode_document(st_inputs), full_documents)


def test_disable_faste_restores_the_original_module_and_vectors(vl_model, mixed):
    st_inputs, _ = mixed
    original = vl_model[0]
    keys = list(vl_model.state_dict())
    reference = vl_model.encode_document(st_inputs)
    enable_faste(vl_model, TRIGGER_2)
    assert list(vl_model.state_dict()) == keys  # same parameter names while enabled
    disable_faste(vl_model)
    assert vl_model[0] is original and not is_faste_enabled(vl_model)
    np.testing.assert_array_equal(vl_model.encode_document(st_inputs), reference)


def test_saving_while_enabled_is_refused_with_the_fix(vl_model, tmp_path):
    enable_faste(vl_model, TRIGGER_2)
    with pytest.raises(FasteError, match="disable_faste"):
        vl_model.save(str(tmp_path / "saved"))


def test_bad_apply_to_is_a_config_error(vl_model):
    with pytest.raises(ConfigError, match="apply_to must be one of documents, queries, all, got 'docs'"):
        enable_faste(vl_model, TRIGGER_2, apply_to="docs")
    assert isinstance(vl_model[0], Transformer)


def test_pipeline_without_last_token_pooling_is_refused(vl_model):
    mean_pooled = SentenceTransformer(modules=[vl_model[0], Pooling(64, "mean"), Normalize()], device="cpu")
    with pytest.raises(ConfigError, match="lasttoken.*Transformer -> Pooling -> Normalize"):
        enable_faste(mean_pooled, TRIGGER_2)


def test_unsupported_model_names_its_type_and_the_supported_ones(tmp_path):
    from transformers import BertConfig, BertModel, BertTokenizerFast

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "red", "bicycle"]))
    config = BertConfig(vocab_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    BertModel(config).save_pretrained(tmp_path / "bert")
    BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(tmp_path / "bert")
    modules = [Transformer(str(tmp_path / "bert")), Pooling(32, "lasttoken"), Normalize()]
    bert = SentenceTransformer(modules=modules, device="cpu")
    with pytest.raises(ModelLoadError, match="'bert' is not supported.*qwen3_vl, qwen3, mistral"):
        enable_faste(bert, TRIGGER_2)
    with pytest.raises(ModelLoadError, match="'bert'"):
        embedder_from_sentence_transformer(bert)


def test_embedder_from_sentence_transformer_shares_the_weights(vl_model, vl_embedder, mixed):
    _, faste_inputs = mixed
    embedder = embedder_from_sentence_transformer(vl_model, ONE_BATCH)
    st_parameters = dict(vl_model[0].model.named_parameters())
    for name, parameter in embedder.backbone.model.named_parameters():
        assert parameter.data_ptr() == st_parameters[name].data_ptr(), name
    for fast_e in (None, TRIGGER_2):
        np.testing.assert_allclose(
            embedder.encode(faste_inputs, fast_e=fast_e).embeddings,
            vl_embedder.encode(faste_inputs, fast_e=fast_e).embeddings,
            atol=1e-6,
        )


def test_text_backbone_with_left_padding(tmp_path):
    """Qwen3-Embedding style: the tokenizer appends EOS, pads on the left, query prompt in ST."""
    from tokenizers import processors

    path = tiny_model_dir(tmp_path.parent, "qwen3")
    embedder = Embedder.from_pretrained(str(path), device="cpu", batching=ONE_BATCH)
    prompts = {"query": f"Instruct: {WEB_SEARCH}\nQuery:", "document": ""}
    # Plain text, as Qwen3-Embedding's ST config has it (not the tokenizer's chat template).
    text_only = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}
    transformer = Transformer(str(path), modality_config=text_only, module_output_name="token_embeddings")
    model = SentenceTransformer(modules=[transformer, Pooling(64, "lasttoken"), Normalize()], prompts=prompts, device="cpu")
    tokenizer = model.tokenizer
    # faste-mm appends EOS as the readout; the published tokenizer does the same via its post-processor.
    tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {tokenizer.eos_token}", special_tokens=[(tokenizer.eos_token, tokenizer.eos_token_id)]
    )
    tokenizer.padding_side = "left"
    texts = ["a red bicycle leaning on a wall", "short", "the quick brown fox jumps over the lazy dog " * 3]
    assert model.preprocess(texts)["attention_mask"][:, 0].tolist() == [0, 0, 1]  # left-padded
    full = model.encode_document(texts)
    full_queries = model.encode_query(texts)
    np.testing.assert_allclose(full, embedder.encode_documents(texts).embeddings, atol=1e-5)

    enable_faste(model, FastEConfig(r_max=0.0), apply_to="all")
    np.testing.assert_allclose(model.encode_document(texts), full, atol=1e-5)
    enable_faste(model, TRIGGER_2, apply_to="all")
    documents = model.encode_document(texts)
    np.testing.assert_allclose(documents, embedder.encode_documents(texts, fast_e=TRIGGER_2).embeddings, atol=1e-5)
    queries = embedder.encode_queries(texts, fast_e=TRIGGER_2).embeddings
    np.testing.assert_allclose(model.encode_query(texts), queries, atol=1e-5)
    assert np.abs(documents - full).max() > 1e-3
    disable_faste(model)
    np.testing.assert_array_equal(model.encode_query(texts), full_queries)


def llama_st_model(tmp_path: Path, max_seq_length: int = 12) -> SentenceTransformer:
    """A Llama-family ST model as such models are published: its own prompts (literal prefixes, not
    faste-mm's "Instruct: ...\\nQuery:" format), the tokenizer's own special tokens (BOS, no EOS
    appended), a max_seq_length, last-token pooling and Normalize."""
    path = tiny_model_dir(tmp_path.parent, "llama")
    text_only = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}
    transformer = Transformer(str(path), modality_config=text_only, module_output_name="token_embeddings")
    transformer.max_seq_length = max_seq_length
    prompts = {"query": "query: ", "document": "passage: "}
    model = SentenceTransformer(modules=[transformer, Pooling(64, "lasttoken"), Normalize()], prompts=prompts,
                                default_prompt_name="document", device="cpu")
    model.tokenizer.pad_token = model.tokenizer.eos_token  # Llama tokenizers ship without one
    model.tokenizer.padding_side = "left"
    return model


LLAMA_TEXTS = ["a red bicycle leaning on a wall", "short", "the quick brown fox jumps over the lazy dog " * 3]


def test_embedder_from_a_llama_st_model_gives_the_st_models_own_vectors(tmp_path):
    model = llama_st_model(tmp_path)
    embedder = embedder_from_sentence_transformer(model, ONE_BATCH)
    assert model.preprocess(LLAMA_TEXTS)["input_ids"].shape[1] == 12  # the long text is truncated
    np.testing.assert_allclose(embedder.encode(LLAMA_TEXTS).embeddings, model.encode(LLAMA_TEXTS), atol=1e-5)
    np.testing.assert_allclose(embedder.encode_documents(LLAMA_TEXTS).embeddings, model.encode_document(LLAMA_TEXTS), atol=1e-5)
    np.testing.assert_allclose(embedder.encode_queries(LLAMA_TEXTS).embeddings, model.encode_query(LLAMA_TEXTS), atol=1e-5)
    # An instruction is a literal ST prompt, as in `encode_query(prompt=...)`.
    np.testing.assert_allclose(embedder.encode_queries(LLAMA_TEXTS, instruction="Represent this: ").embeddings,
                               model.encode_query(LLAMA_TEXTS, prompt="Represent this: "), atol=1e-5)


def test_fast_e_inside_a_llama_st_model_equals_the_embedder_from_it(tmp_path):
    model = llama_st_model(tmp_path, max_seq_length=64)
    embedder = embedder_from_sentence_transformer(model, ONE_BATCH)
    full = model.encode_document(LLAMA_TEXTS)
    enable_faste(model, TRIGGER_2, apply_to="all")
    documents = model.encode_document(LLAMA_TEXTS)
    np.testing.assert_allclose(documents, embedder.encode_documents(LLAMA_TEXTS, fast_e=TRIGGER_2).embeddings, atol=1e-5)
    np.testing.assert_allclose(model.encode_query(LLAMA_TEXTS), embedder.encode_queries(LLAMA_TEXTS, fast_e=TRIGGER_2).embeddings,
                               atol=1e-5)
    assert np.abs(documents - full).max() > 1e-3  # FastE really changed the forward


def test_embedder_from_a_pipeline_it_cannot_reproduce_is_refused(tmp_path):
    model = llama_st_model(tmp_path)
    mean_pooled = SentenceTransformer(modules=[model[0], Pooling(64, "mean"), Normalize()], device="cpu")
    with pytest.raises(ConfigError, match="lasttoken"):
        embedder_from_sentence_transformer(mean_pooled)
