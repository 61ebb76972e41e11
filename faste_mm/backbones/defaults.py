"""Per-backbone defaults, as data: FastE warm-up layer and threshold (paper, "Backbone-Specific
Settings") and, for text models, the prompt format and readout rule of the official code.
Keyed by the HF config's `model_type`; users override any field through the public configs.
"""

from __future__ import annotations

from dataclasses import dataclass

from faste_mm.serialization import TextPrompt

_WEB_SEARCH = "Given a web search query, retrieve relevant passages that answer the query"
# Qwen3-Embedding: "Instruct: {task}\nQuery:{query}" (no space after "Query:"), EOS readout.
_QWEN_PROMPT = TextPrompt("Instruct: {instruction}\nQuery:{text}", "{text}", _WEB_SEARCH, "eos")
# E5-Mistral-7B-Instruct: "Instruct: {task}\nQuery: {query}", "</s>" appended as readout.
_E5_PROMPT = TextPrompt("Instruct: {instruction}\nQuery: {text}", "{text}", _WEB_SEARCH, "eos")


@dataclass(frozen=True, slots=True)
class BackboneDefaults:
    name: str
    warmup_layer: int  # l_w
    threshold: float  # theta
    prompt: TextPrompt | None  # None: chat-template serialization (Qwen3-VL)
    is_calibrated: bool = True  # False: theta not reported for this family; run `calibrate`


BACKBONE_DEFAULTS: dict[str, BackboneDefaults] = {
    "qwen3_vl": BackboneDefaults("Qwen3-VL-Embedding", warmup_layer=8, threshold=0.70, prompt=None),
    "qwen3": BackboneDefaults("Qwen3-Embedding", warmup_layer=8, threshold=0.60, prompt=_QWEN_PROMPT),
    "mistral": BackboneDefaults("E5-Mistral", warmup_layer=8, threshold=0.40, prompt=_E5_PROMPT),
    # No published theta for these families: 0.60 until `calibrate` picks one for the model.
    "llama": BackboneDefaults("Llama-family decoder", 8, 0.60, _E5_PROMPT, is_calibrated=False),
    "qwen2": BackboneDefaults("Qwen2 decoder", 8, 0.60, _QWEN_PROMPT, is_calibrated=False),
}

SUPPORTED_MODEL_TYPES = tuple(BACKBONE_DEFAULTS)
