"""The one place that knows model families: a row per HF `model_type` with the FastE defaults
(paper, "Backbone-Specific Settings"), the adapter class, how to load and serialize it (the
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


def family_for(model_type: str, name: str) -> Family:
    """The registry row of a model type; ModelLoadError naming the model when unsupported."""
    if model_type not in FAMILIES:
        raise ModelLoadError(
            f"{name}: model_type {model_type!r} is not supported; faste-mm drives decoder-only "
            f"embedding models of types {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return FAMILIES[model_type]
