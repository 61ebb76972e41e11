"""sentence-transformers integration. `enable_faste` swaps the first module of a loaded
`SentenceTransformer` (its HF `Transformer`) for `FastETransformer`, whose forward re-packs ST's
features into a right-padded `Batch` and runs faste-mm's runner; tokenization, pooling and
normalisation stay ST's own. `embedder_from_sentence_transformer` goes the other way.

Needs the extra: `pip install faste-mm[st]` (sentence-transformers >= 5.4).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Literal

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import InputModule, Normalize, Transformer
from sentence_transformers.sentence_transformer.modules import Pooling

from faste_mm.model.backbones.loading import assemble
from faste_mm.model.backbones.registry import Family, family_for
from faste_mm.model.batching import Batch, BatchingConfig
from faste_mm.model.ablations import policy_for
from faste_mm.model.faste import FastE, FastEConfig
from faste_mm.model.embedder import Embedder
from faste_mm.model.items import Item
from faste_mm.model.serialization import Serialized
from faste_mm.errors import ConfigError, FasteError, InputError, ModelLoadError
from faste_mm.model.runner import run_decoder, settle_kernel

log = logging.getLogger(__name__)

ApplyTo = Literal["documents", "queries", "all"]
APPLY_TO = ("documents", "queries", "all")


def enable_faste(
    model: SentenceTransformer, fast_e: FastEConfig, apply_to: ApplyTo = "documents"
) -> SentenceTransformer:
    """Run the model's transformer step through faste-mm's runner with FastE; returns `model`.

    `encode`, `encode_query` and `encode_document` keep their signatures and outputs (unit vectors
    from ST's own Pooling + Normalize). apply_to picks the batches that get FastE, by the `task`
    ST passes to its modules: "documents" = `encode_document` and plain `encode` (no task),
    "queries" = `encode_query` (or `task="query"`), "all" = every batch; the others run the
    unmodified forward. Calling it again replaces the settings. Inference only.

    Raises ModelLoadError for models faste-mm cannot drive (not a decoder embedding model of a
    supported type, ONNX/OpenVINO backends), ConfigError for a pipeline whose output would differ
    (no last-token Pooling followed by Normalize, a non-`forward` modality method, flash-attention
    unpadded inputs) or a bad `apply_to`.

    Example:
        >>> model = SentenceTransformer("Qwen/Qwen3-VL-Embedding-2B")
        >>> enable_faste(model, FastEConfig(r_max=0.5))
        >>> docs = model.encode_document(["a red bicycle", Image.open("photo.jpg")])
    """
    if apply_to not in APPLY_TO:
        raise ConfigError(f"apply_to must be one of {', '.join(APPLY_TO)}, got {apply_to!r}")
    if not isinstance(fast_e, FastEConfig):
        raise ConfigError(f"enable_faste needs a FastEConfig, got {type(fast_e).__name__}; use FastEConfig(r_max=0.5)")
    transformer = _transformer_module(model)  # the original module, also when FastE is already on
    _check_pipeline(model, transformer)
    embedder = embedder_from_sentence_transformer(model)
    resolved = embedder.resolve_fast_e(fast_e)
    policy = policy_for(resolved, embedder.backbone.shape.num_layers)
    model[0] = FastETransformer(transformer, embedder, policy, apply_to)
    log.info("FastE enabled for %s (%s): %s", embedder.model_id, apply_to, resolved.to_dict())
    return model


def disable_faste(model: SentenceTransformer) -> SentenceTransformer:
    """Put the original `Transformer` module back (a no-op when FastE is not enabled); returns `model`."""
    if isinstance(model[0], FastETransformer):
        model[0] = model[0].original
    return model


def is_faste_enabled(model: SentenceTransformer) -> bool:
    return isinstance(model[0], FastETransformer)


def embedder_from_sentence_transformer(model: SentenceTransformer, batching: BatchingConfig | None = None) -> Embedder:
    """An `Embedder` over the weights and processor/tokenizer an ST model already holds, giving
    the ST model's own vectors (full forward == `model.encode`, FastE == `enable_faste`).

    Nothing is loaded or copied: the backbone adapter wraps the ST module's own HF model.
    Vision-language models use faste-mm's serializer (the official Qwen3-VL-Embedding format,
    which their ST configuration reproduces); text models tokenize through the ST module itself
    (`SentenceTransformerText`: its prompts, tokenizer call and max_seq_length), so the readout
    is the token ST's last-token pooling reads. Documents (and plain `encode`) get ST's document
    prompt, queries its query prompt; an `instruction` is a literal ST prompt.
    Raises ModelLoadError naming the model type when faste-mm cannot drive the model, ConfigError
    for a pipeline whose output it cannot reproduce (not Transformer -> last-token Pooling ->
    Normalize).
    """
    transformer = _transformer_module(model)
    _check_pipeline(model, transformer)
    hf_model = transformer.model
    model_id = str(getattr(hf_model.config, "_name_or_path", "") or "sentence-transformers model")
    family = family_for(hf_model.config.model_type, model_id)  # "not supported" before looking inside
    base = _base_model(hf_model, family, model_id)
    preprocessor = transformer.processor if family.is_multimodal else transformer.tokenizer
    loaded = assemble(base, preprocessor, model_id)
    if not family.is_multimodal:
        loaded = dataclasses.replace(loaded, serializer=SentenceTransformerText(model))
    return Embedder(loaded, batching)


@dataclass(frozen=True, slots=True)
class _STQueryPrompt:
    """What `Embedder.encode_queries` reads from a serializer's `prompt`: the instruction queries
    get when none is given (here ST's own query prompt; "" when it has none)."""

    default_query_instruction: str


class SentenceTransformerText:
    """Serializer of a text ST model: each text tokenized by the ST pipeline's own `preprocess`
    (the prompt prepended as ST does, its tokenizer call with its special tokens, truncation at
    max_seq_length), so faste-mm reads out the token ST's last-token pooling reads.

    instruction None -> a document: the prompt `encode_document` uses ("document", "passage" or
    "corpus", else the default prompt), task "document"; any other instruction is used as the
    literal prompt of a query (task "query"), as `encode_query(prompt=...)` does.
    """

    def __init__(self, model: SentenceTransformer) -> None:
        self._model = model
        names = [name for name in ("document", "passage", "corpus") if name in model.prompts]
        self.document_prompt = model._resolve_prompt(None, names[0] if names else None)
        query = model.prompts.get("query") if "query" in model.prompts else model._resolve_prompt(None, None)
        self.prompt = _STQueryPrompt(query or "")

    def render_prompt(self, item: Item, instruction: str | None) -> str:
        prompt = self.document_prompt if instruction is None else instruction
        return (prompt or "") + (item.text or "")

    def __call__(self, item: Item, instruction: str | None) -> Serialized:
        if item.has_image:
            raise InputError(f"{item.describe()}: this is a text-only model; it cannot embed images")
        prompt, task = (self.document_prompt, "document") if instruction is None else (instruction, "query")
        features = self._model.preprocess([item.text or ""], prompt=prompt or None, task=task)
        if "attention_mask" not in features:
            raise ConfigError("the ST module returned no attention_mask (flattened inputs); set "
                              "model[0].unpad_inputs = False")
        input_ids = features["input_ids"][0][features["attention_mask"][0].bool()].to(torch.long).cpu()  # [T]
        if input_ids.numel() == 0:
            raise InputError(f"{item.describe()}: the prompt tokenizes to nothing; give some text")
        limit = self._model.max_seq_length
        return Serialized(input_ids=input_ids, truncated=limit is not None and input_ids.numel() >= limit)


class FastETransformer(InputModule):
    """Stands in for ST's `Transformer` at index 0 while FastE is enabled.

    Preprocessing, modalities and tokenizer come from the original module; forward runs faste-mm's
    runner for the batches `apply_to` selects and the original forward for the others. Its
    state_dict keys are the original's (`model.*`). Saving is refused: call `disable_faste` first.
    """

    # ST hands a module only the forward kwargs it declares; `task` says query or document.
    forward_kwargs = {"task"}

    def __init__(self, original: Transformer, embedder: Embedder, policy: FastE, apply_to: ApplyTo) -> None:
        super().__init__()
        # The HF model is registered under the original's name so parameters, .to() and state_dict
        # keys are those of the unwrapped module; the Transformer itself stays out of the module
        # tree (object.__setattr__ skips nn.Module registration) so nothing is listed twice.
        self.model = original.model
        object.__setattr__(self, "original", original)
        self.embedder = embedder
        self.policy = policy
        self.apply_to = apply_to

    def applies_to(self, task: str | None) -> bool:
        """Whether a batch with this ST `task` gets FastE (None: plain `encode`, a document)."""
        role = "queries" if task == "query" else "documents"
        return self.apply_to == "all" or self.apply_to == role

    def forward(self, features: dict[str, Any], task: str | None = None, **kwargs) -> dict[str, Any]:
        if not self.applies_to(task):
            # Exactly the call the unwrapped pipeline makes: `task` only if the original declares it.
            if "task" in self.original.forward_kwargs:
                kwargs = {**kwargs, "task": task}
            return self.original(features, **kwargs)
        if self.training and torch.is_grad_enabled():
            raise FasteError("FastE is inference-only; call disable_faste(model) before training")
        batch, readout = batch_from_features(features, self.embedder.loaded.pad_token_id)
        backbone = self.embedder.backbone
        kernel = settle_kernel(backbone, batch, self.policy, self.embedder.unpadded)
        vectors, trace = run_decoder(backbone, batch, self.policy, kernel)  # [B, H] unit vectors
        log.debug(
            "FastE batch of %d: trigger layer %s, kept %d of %d prefix tokens",
            trace.batch_size,
            trace.trigger_layer,
            trace.kept_prefix_tokens,
            trace.prefix_tokens,
        )
        # The readout vector goes where ST's last-token Pooling reads (the last valid position of
        # its own attention mask); Normalize then returns it unchanged, as it is unit norm already.
        width = features["attention_mask"].shape[1]
        token_embeddings = vectors.new_zeros(vectors.shape[0], width, vectors.shape[1])  # [B, T, H]
        token_embeddings[torch.arange(vectors.shape[0], device=vectors.device), readout] = vectors
        features["token_embeddings"] = token_embeddings
        return features

    # -- everything else is the original module's --

    def preprocess(self, inputs, prompt: str | None = None, **kwargs) -> dict[str, Any]:
        return self.original.preprocess(inputs, prompt=prompt, **kwargs)

    @property
    def modalities(self) -> list:
        return self.original.modalities

    @property
    def modality_config(self) -> dict:
        return self.original.modality_config

    @property
    def processor(self):
        return self.original.processor

    @property
    def tokenizer(self):
        return self.original.tokenizer

    @tokenizer.setter
    def tokenizer(self, value) -> None:
        self.original.tokenizer = value

    @property
    def max_seq_length(self) -> int | None:
        return self.original.max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value: int | None) -> None:
        self.original.max_seq_length = value

    @property
    def config(self):
        return self.original.config

    @property
    def auto_model(self):
        return self.original.model

    def get_embedding_dimension(self) -> int:
        return self.original.get_embedding_dimension()

    def get_config_dict(self) -> dict[str, Any]:
        return self.original.get_config_dict()

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        # Refused rather than saved as the original: a checkpoint that silently dropped FastE, or
        # one that needs faste-mm to load, would both surprise; FastE is an inference setting.
        raise FasteError(
            f"cannot save to {output_path}: FastE is enabled on this SentenceTransformer; call "
            "faste_mm.integrations.sentence_transformers.disable_faste(model) before saving, then "
            "enable_faste again"
        )

    def __repr__(self) -> str:
        fast_e = self.policy.config
        return f"FastETransformer(apply_to={self.apply_to!r}, r_max={fast_e.r_max}, original={self.original!r})"


def batch_from_features(features: dict[str, Any], pad_token_id: int) -> tuple[Batch, torch.Tensor]:
    """ST features (left- or right-padded) -> (right-padded `Batch`, [B] readout position in ST's layout).

    The runner needs right padding with the readout at lengths - 1; one index gather moves each
    row's contiguous valid tokens to the front. Images and videos keep ST's order (the processor's, by row).
    """
    if "cu_seq_lens_q" in features:
        raise ConfigError(
            "FastE got unpadded (flash-attention flattened) inputs; set model[0].original.unpad_inputs = False"
        )
    if "input_ids" not in features or "attention_mask" not in features:
        raise InputError(f"FastE needs input_ids and attention_mask features, got {sorted(features)}")
    mask = features["attention_mask"].bool()  # [B, T]
    width = mask.shape[1]
    positions = torch.arange(width, device=mask.device)
    lengths = mask.sum(dim=1)  # [B]
    first = mask.int().argmax(dim=1)  # [B] first valid position: 0 when right-padded
    contiguous = (positions[None, :] >= first[:, None]) & (positions[None, :] < (first + lengths)[:, None])
    if not torch.equal(contiguous, mask) or bool((lengths == 0).any()):
        raise InputError("FastE needs each row's valid tokens in one left- or right-padded run")
    index = (first[:, None] + positions[None, :]).clamp(max=width - 1)  # [B, T] source slot per new slot
    valid = positions[None, :] < lengths[:, None]  # [B, T]
    input_ids = features["input_ids"].gather(1, index).masked_fill(~valid, pad_token_id)
    mm_token_type_ids = features.get("mm_token_type_ids")
    if mm_token_type_ids is not None:
        mm_token_type_ids = mm_token_type_ids.gather(1, index).masked_fill(~valid, 0)
    batch = Batch(
        rows=list(range(mask.shape[0])),
        input_ids=input_ids,
        valid=valid,
        lengths=lengths,
        mm_token_type_ids=mm_token_type_ids,
        pixel_values=features.get("pixel_values"),
        image_grid_thw=features.get("image_grid_thw"),
        pixel_values_videos=features.get("pixel_values_videos"),
        video_grid_thw=features.get("video_grid_thw"),
    )
    return batch, first + lengths - 1


def _transformer_module(model: SentenceTransformer) -> Transformer:
    first = model[0]
    if isinstance(first, FastETransformer):
        return first.original
    if not isinstance(first, Transformer):
        raise ModelLoadError(
            f"the first module of this SentenceTransformer is {type(first).__name__}; faste-mm needs a "
            "sentence_transformers Transformer module there (Router and static-embedding models are not supported)"
        )
    if first.backend != "torch":
        raise ModelLoadError(
            f"this SentenceTransformer uses the {first.backend!r} backend; FastE runs PyTorch layers, "
            "load it with backend='torch'"
        )
    return first


def _check_pipeline(model: SentenceTransformer, transformer: Transformer) -> None:
    """FastE yields the readout vector only; refuse pipelines whose output would then differ."""
    modules = list(model)
    has_pooling = len(modules) > 2 and isinstance(modules[1], Pooling) and modules[1].pooling_mode == "lasttoken"
    if not has_pooling or not isinstance(modules[2], Normalize):
        found = " -> ".join(type(module).__name__ for module in modules)
        raise ConfigError(
            f"FastE needs Transformer -> Pooling(pooling_mode='lasttoken') -> Normalize, as the published "
            f"Qwen3-VL-Embedding / Qwen3-Embedding models have; this model is {found}"
        )
    if transformer.module_output_name != "token_embeddings":
        raise ConfigError(
            f"FastE feeds Pooling through 'token_embeddings', but this Transformer module writes "
            f"{transformer.module_output_name!r}; use the default module_output_name"
        )
    for modality, params in transformer.modality_config.items():
        output = params.get("method_output_name")
        if params.get("method") != "forward" or output not in ("last_hidden_state", ("last_hidden_state",)):
            raise ConfigError(
                f"FastE reproduces forward().last_hidden_state, but modality {modality!r} uses "
                f"{params.get('method')}().{output}; use the default modality_config"
            )
    if getattr(transformer, "can_flatten_inputs", False):
        raise ConfigError(
            "this model unpads text inputs for flash-attention; FastE needs padded batches: "
            "set model[0].unpad_inputs = False before enable_faste"
        )


def _base_model(hf_model: torch.nn.Module, family: Family, model_id: str) -> torch.nn.Module:
    """The base model under a task head (`.model` of *ForConditionalGeneration / *ForCausalLM)."""
    candidates = [hf_model, getattr(hf_model, "model", None)]
    if family.is_multimodal:
        import transformers

        base_class = getattr(transformers, family.hf_classes[0])
        found = [c for c in candidates if isinstance(c, base_class)]
    else:
        parts = ("embed_tokens", "layers", "norm", "rotary_emb")
        found = [c for c in candidates if c is not None and all(hasattr(c, part) for part in parts)]
    if not found:
        raise ModelLoadError(
            f"{model_id}: cannot find the base decoder (embed_tokens, layers, norm) inside "
            f"{type(hf_model).__name__}; load the model with transformer_task='feature-extraction'"
        )
    return found[0]
