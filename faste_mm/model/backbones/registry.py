"""The one place that knows model families: a row per HF `model_type` with the FastE defaults
(docs/design.md, "Defaults and scope"), the adapter class, how to load and serialize it (the
official prompt format and readout rule of text models), and whether it takes images.
Users override any default through the public configs.
"""

from __future__ import annotations

from dataclasses import dataclass

from faste_mm.errors import ModelLoadError
from faste_mm.model.backbones.base import Backbone
from faste_mm.model.backbones.hf_decoder import HFDecoderBackbone
from faste_mm.model.backbones.qwen3_vl import Qwen3VLBackbone
from faste_mm.model.serialization import SerializerConfig, TextPrompt, TextSerializer, VLSerializer

_WEB_SEARCH = "Given a web search query, retrieve relevant passages that answer the query"
# Qwen3-Embedding: "Instruct: {task}\nQuery:{query}" (no space after "Query:"), EOS readout.
_QWEN_PROMPT = TextPrompt("Instruct: {instruction}\nQuery:{text}", "{text}", _WEB_SEARCH, "eos")
# E5-Mistral-7B-Instruct: "Instruct: {task}\nQuery: {query}", "</s>" appended as readout.
_E5_PROMPT = TextPrompt("Instruct: {instruction}\nQuery: {text}", "{text}", _WEB_SEARCH, "eos")


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    warmup_layer: int  # l_w
    threshold: float  # theta
    adapter: type[Backbone]
    prompt: TextPrompt | None  # None: the processor's chat template (Qwen3-VL)
    is_calibrated: bool = True  # False: theta not reported for this family; run `calibrate`

    @property
    def is_multimodal(self) -> bool:
        """Takes images (and pages): a processor with a chat template, not a bare tokenizer."""
        return self.prompt is None

    @property
    def hf_classes(self) -> tuple[str, str]:
        """(model, preprocessor) class names in `transformers` that load a checkpoint of this family."""
        return ("Qwen3VLModel", "AutoProcessor") if self.is_multimodal else ("AutoModel", "AutoTokenizer")

    def serializer(self, preprocessor, config: SerializerConfig, prompt: TextPrompt | None = None) -> VLSerializer | TextSerializer:
        """The official input format over a processor (multimodal) or tokenizer (text)."""
        if self.is_multimodal:
            return VLSerializer(preprocessor, config)
        return TextSerializer(preprocessor, prompt or self.prompt, config.max_length)


FAMILIES: dict[str, Family] = {
    "qwen3_vl": Family("Qwen3-VL-Embedding", 8, 0.70, Qwen3VLBackbone, prompt=None),
    "qwen3": Family("Qwen3-Embedding", 8, 0.60, HFDecoderBackbone, _QWEN_PROMPT),
    "mistral": Family("E5-Mistral", 8, 0.40, HFDecoderBackbone, _E5_PROMPT),
    # No published theta for these families: 0.60 until `calibrate` picks one for the model.
    "llama": Family("Llama-family decoder", 8, 0.60, HFDecoderBackbone, _E5_PROMPT, is_calibrated=False),
    "qwen2": Family("Qwen2 decoder", 8, 0.60, HFDecoderBackbone, _QWEN_PROMPT, is_calibrated=False),
}

SUPPORTED_MODEL_TYPES = tuple(FAMILIES)


@dataclass(frozen=True, slots=True)
class RerankFamily:
    """A reranker family: a decoder of a `FAMILIES` model type plus its LM head, read out as
    sigmoid((W[yes] - W[no]) . h_last). FastE defaults (l_w, theta) sit here beside the
    embedding families'; no theta is published for rerankers, so these start from the embedding
    backbone's value (docs/rerank.md). `max_length` is the official truncation budget."""

    name: str
    warmup_layer: int  # l_w
    threshold: float  # theta
    head_class: str  # the transformers class with `lm_head` that loads the checkpoint
    max_length: int  # the official format's token budget (docs/rerank.md: how each family truncates)
    example: str  # a hub id, for messages


RERANK_FAMILIES: dict[str, RerankFamily] = {
    "qwen3_vl": RerankFamily("Qwen3-VL-Reranker", 8, 0.70, "Qwen3VLForConditionalGeneration", 10240, "Qwen/Qwen3-VL-Reranker-2B"),
    "qwen3": RerankFamily("Qwen3-Reranker", 8, 0.60, "Qwen3ForCausalLM", 8192, "Qwen/Qwen3-Reranker-0.6B"),
}

# What a checkpoint is for, from its name (hub id or folder) and, failing that, its config's
# architectures: a bare base model (Qwen3VLModel, Qwen3Model) has no LM head to score with.
_ROLE_WORDS = (("reranker", "reranker"), ("embedding", "embedding model"))


def declared_role(name: str, architectures: list[str] | None) -> str | None:
    """"reranker", "embedding model", or None when neither the name nor the config says."""
    base = name.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1].lower()
    for word, role in _ROLE_WORDS:
        if word in base:
            return role
    if architectures and all(arch.endswith("Model") for arch in architectures):
        return "embedding model"
    return None


def rerank_family_for(model_type: str, name: str) -> RerankFamily:
    """The reranker row of a model type; ModelLoadError naming the model when unsupported."""
    if model_type not in RERANK_FAMILIES:
        raise ModelLoadError(
            f"{name}: model_type {model_type!r} is not a supported reranker; faste-mm reranks with "
            f"{' and '.join(f.name for f in RERANK_FAMILIES.values())} (model types {', '.join(RERANK_FAMILIES)})"
        )
    return RERANK_FAMILIES[model_type]


def family_for(model_type: str, name: str) -> Family:
    """The registry row of a model type; ModelLoadError naming the model when unsupported."""
    if model_type not in FAMILIES:
        raise ModelLoadError(
            f"{name}: model_type {model_type!r} is not supported; faste-mm drives decoder-only "
            f"embedding models of types {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return FAMILIES[model_type]
