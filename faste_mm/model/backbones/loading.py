"""Loads a checkpoint (hub id or local directory) into a backbone adapter plus its serializer,
choosing both from the config's `model_type` via the family registry.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from faste_mm.model.backbones.base import Backbone
from faste_mm.model.backbones.registry import Family, family_for
from faste_mm.errors import ConfigError, ModelLoadError
from faste_mm.model.serialization import SerializerConfig, TextPrompt, TextSerializer, VLSerializer

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class LoadedModel:
    backbone: Backbone
    serializer: VLSerializer | TextSerializer
    family: Family
    preprocessor: object  # the processor (multimodal) or tokenizer the serializer is built on
    model_id: str
    revision: str | None
    model_type: str
    pad_token_id: int


def resolve_device(device: str | torch.device) -> torch.device:
    """"auto" -> CUDA when available, else CPU."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} requested but no CUDA GPU is available; use device='cpu'")
    return resolved


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """"auto" -> bfloat16 on CUDA, float32 on CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype must be 'auto' or one of {', '.join(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def check_local_path(name_or_path: str | os.PathLike) -> None:
    """ModelLoadError when `name_or_path` can only mean a local folder (it starts with '.', '/'
    or '~', or has more '/' than a hub id's "org/name") and no such folder exists: a typo in a
    path, told apart from a hub id before anything compares it with a collection's model."""
    name_or_path = os.fspath(name_or_path)
    is_path = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1 or "\\" in name_or_path
    if is_path and not Path(name_or_path).expanduser().is_dir():
        what = "is a file, not a model folder" if Path(name_or_path).expanduser().exists() else "does not exist"
        raise ModelLoadError(f"{name_or_path}: model not found (the folder {what}); check the path, or give a "
                             f"hub id such as Qwen/Qwen3-VL-Embedding-2B")


def load_model(
    name_or_path: str | os.PathLike,
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    revision: str | None = None,
    serializer: SerializerConfig | None = None,
    prompt: TextPrompt | None = None,
    attn_implementation: str = "sdpa",
) -> LoadedModel:
    """Load model + processor/tokenizer; raises ModelLoadError naming the model and the fix."""
    from transformers import AutoConfig

    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    serializer_config = serializer or SerializerConfig()
    name_or_path = os.fspath(name_or_path)  # a hub id or a folder, str or path alike
    check_local_path(name_or_path)
    try:
        config = AutoConfig.from_pretrained(name_or_path, revision=revision)
    except (OSError, ValueError) as error:
        raise ModelLoadError(
            f"{name_or_path}: cannot load the model config ({error}). Check the hub id or local "
            "directory; without internet, pass a local directory that holds the downloaded model."
        ) from None
    family = family_for(config.model_type, name_or_path)  # refuse unsupported models before downloading weights
    kwargs = dict(revision=revision, dtype=torch_dtype, attn_implementation=attn_implementation)
    try:
        import transformers

        model_class, preprocessor_class = (getattr(transformers, name) for name in family.hf_classes)
        preprocessor = preprocessor_class.from_pretrained(name_or_path, revision=revision)
        model = model_class.from_pretrained(name_or_path, **kwargs)
    except Exception as error:  # noqa: BLE001 - a damaged file raises whatever its reader raises
        # (UnpicklingError, SafetensorError, ...): one line of it, never a 160-line traceback.
        reason = (str(error).strip().splitlines() or [""])[0][:300]
        raise ModelLoadError(f"{name_or_path}: cannot load weights or processor ({type(error).__name__}: {reason}); "
                             f"the files may be damaged or incomplete — download the model again") from None
    # A local directory is recorded absolute so collections find it again from any folder.
    model_id = str(Path(name_or_path).absolute()) if Path(name_or_path).is_dir() else str(name_or_path)
    return assemble(model.to(torch_device).eval(), preprocessor, model_id, revision, serializer_config, prompt)


def assemble(
    model: torch.nn.Module,
    preprocessor,
    model_id: str,
    revision: str | None = None,
    serializer: SerializerConfig | None = None,
    prompt: TextPrompt | None = None,
) -> LoadedModel:
    """Adapter + serializer over an already-loaded base model (Qwen3VLModel or a decoder such as
    Qwen3Model) and its processor (VL) or tokenizer (text); nothing is loaded or copied."""
    model_type = model.config.model_type
    family = family_for(model_type, model_id)
    backbone = family.adapter(model)
    built_serializer = family.serializer(preprocessor, serializer or SerializerConfig(), prompt)
    tokenizer = preprocessor.tokenizer if family.is_multimodal else preprocessor
    if not family.is_calibrated:
        log.warning(
            "%s: no published FastE threshold for %s; using %.2f, run `faste-mm calibrate` to choose one",
            model_id,
            family.name,
            family.threshold,
        )
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return LoadedModel(
        backbone=backbone,
        serializer=built_serializer,
        family=family,
        preprocessor=preprocessor,
        model_id=model_id,
        revision=revision,
        model_type=model_type,
        pad_token_id=int(pad_token_id or 0),
    )
