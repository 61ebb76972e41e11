"""Loads a reranker checkpoint (hub id or local directory): the decoder as a backbone adapter of
its `FAMILIES` row, plus the one LM-head direction the score needs, W[yes] - W[no]. The rest of
the LM head is dropped: a reranker never generates.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from faste_mm.errors import ConfigError, ModelLoadError
from faste_mm.model.backbones.base import Backbone
from faste_mm.model.backbones.loading import (check_local_path, checkpoint_dtype, choose_dtype, hub_unreachable, load_config,
                                              resolve_device, weights_error, without_weights_bar)
from faste_mm.model.backbones.preprocessors import load_preprocessor
from faste_mm.model.backbones.registry import RerankFamily, declared_role, family_for, rerank_family_for

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadedReranker:
    backbone: Backbone
    family: RerankFamily
    preprocessor: object  # the processor (Qwen3-VL-Reranker) or tokenizer (Qwen3-Reranker)
    yes_minus_no: torch.Tensor  # [H] float32: W_lm[yes] - W_lm[no]
    model_id: str
    revision: str | None
    model_type: str
    pad_token_id: int

    @property
    def is_multimodal(self) -> bool:
        return self.model_type == "qwen3_vl"


def load_reranker(
    name_or_path: str | os.PathLike,
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    revision: str | None = None,
    attn_implementation: str = "sdpa",
) -> LoadedReranker:
    """Load a Qwen3-VL-Reranker or Qwen3-Reranker; ModelLoadError naming the model and the fix
    (an embedding model given as a reranker is refused before its weights are read)."""
    torch_device = resolve_device(device)
    choose_dtype(dtype, torch_device)  # an unknown name fails before anything is read
    name_or_path = os.fspath(name_or_path)
    check_local_path(name_or_path)
    offline = hub_unreachable(name_or_path)
    config = load_config(name_or_path, revision, offline)
    family = rerank_family_for(config.model_type, name_or_path)
    if declared_role(name_or_path, getattr(config, "architectures", None)) == "embedding model":
        raise ModelLoadError(f"{name_or_path}: this is an embedding model, not a reranker; use it as the embedding "
                             f"model (Embedder.from_pretrained, --model) and rerank with a reranker such as {family.example}")
    # The embedder's rule: a float32 checkpoint is never rounded down to bfloat16 on a CPU.
    dtype_choice = choose_dtype(dtype, torch_device, checkpoint_dtype(config))
    if dtype_choice.dtype == torch.int8:
        raise ConfigError(f"{name_or_path}: dtype int8 is offered for embedding models only; load the reranker with "
                          f"dtype auto")
    log.info("%s runs in %s", name_or_path, dtype_choice.describe())
    try:
        import transformers

        # parsed once per process while its files are unchanged (model/backbones/preprocessors.py)
        preprocessor = load_preprocessor(name_or_path, config.model_type == "qwen3_vl", revision, offline is not None)
        with without_weights_bar():
            model = getattr(transformers, family.head_class).from_pretrained(
                name_or_path, revision=revision, dtype=dtype_choice.dtype, attn_implementation=attn_implementation,
                local_files_only=offline is not None,
            )
    except Exception as error:  # noqa: BLE001 - damaged files raise whatever their reader raises
        raise weights_error(name_or_path, error) from None
    model_id = str(Path(name_or_path).absolute()) if Path(name_or_path).is_dir() else str(name_or_path)
    return assemble_reranker(model.to(torch_device).eval(), preprocessor, model_id, revision)


def assemble_reranker(model: torch.nn.Module, preprocessor, model_id: str, revision: str | None = None) -> LoadedReranker:
    """Adapter + score direction over an already-loaded LM-head model (Qwen3VLForConditionalGeneration
    or Qwen3ForCausalLM) and its processor / tokenizer; nothing is copied but the two head rows."""
    model_type = model.config.model_type
    family = rerank_family_for(model_type, model_id)
    tokenizer = getattr(preprocessor, "tokenizer", preprocessor)
    vocab = tokenizer.get_vocab()
    if "yes" not in vocab or "no" not in vocab:
        raise ModelLoadError(f"{model_id}: the tokenizer has no 'yes' / 'no' tokens; it is not a Qwen reranker tokenizer")
    head = model.lm_head.weight  # [V, H]
    yes_minus_no = (head[vocab["yes"]].float() - head[vocab["no"]].float()).detach().clone()  # [H]
    backbone = family_for(model_type, model_id).adapter(model.model)
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return LoadedReranker(backbone, family, preprocessor, yes_minus_no, model_id, revision, model_type, int(pad_token_id or 0))
