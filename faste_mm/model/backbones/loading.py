"""Loads a checkpoint (hub id or local directory) into a backbone adapter plus its serializer,
choosing both from the config's `model_type` via the family registry.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from faste_mm.model.backbones.base import Backbone
from faste_mm.model.backbones.preprocessors import load_preprocessor
from faste_mm.model.backbones.registry import Family, declared_role, family_for
from faste_mm.errors import ConfigError, ModelLoadError
from faste_mm.model.serialization import SerializerConfig, TextPrompt, TextSerializer, VLSerializer
from faste_mm.model.cpu.machine import read_cpu_flags  # noqa: F401 (choose_dtype's default; tests patch it here)

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# CPU flags (Linux /proc/cpuinfo) that mean native bfloat16 matrix products, best first: Intel AMX,
# AVX512-BF16 (Intel Cooper Lake+, AMD Zen 4+), ARMv8.6 BF16 (Graviton 3+). Without one, torch
# emulates bfloat16 and runs it slower than float32.
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    """The dtype a model runs in and why, for `bench`, `embed` and `info`-like output:
    e.g. DtypeChoice(torch.bfloat16, "CPU has avx512_bf16 and the checkpoint is bfloat16")."""

    dtype: torch.dtype
    reason: str
    # torch.int8 only: the dtype of everything but the int8 linear layers (model/cpu/int8.py)
    rest: torch.dtype | None = None
    # torch.int8 only: how the int8 layers code their activations (`Int8Trial.codes`)
    int8_codes: str = "u8"

    @property
    def weights_dtype(self) -> torch.dtype:
        """The dtype the checkpoint is loaded in (int8's linear layers are quantized after)."""
        return self.rest if self.dtype == torch.int8 else self.dtype

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def describe(self) -> str:
        return f"{self.name}: {self.reason}"

    def to_dict(self) -> dict:
        return {"dtype": self.name, "reason": self.reason}


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
    dtype_choice: DtypeChoice  # the dtype the model runs in, and why


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


def choose_dtype(
    dtype: str | torch.dtype,
    device: torch.device,
    checkpoint_dtype: torch.dtype | None = None,
    cpu_flags: Callable[[], frozenset[str]] | None = None,
) -> DtypeChoice:
    """The dtype to run in, with the reason ("int8": torch.int8, meaning int8 linear layers over
    bfloat16 where the CPU multiplies it natively, float32 otherwise, only on a CPU with int8 dot
    products; ConfigError elsewhere).

    "auto": bfloat16 on CUDA; on a CPU, bfloat16 when the CPU multiplies bfloat16 natively (a flag
    of `CPU_BF16_FLAGS`) and the checkpoint is stored in 16 bits (`checkpoint_dtype`; None = not
    known, taken as 16-bit like the published Qwen checkpoints), float32 otherwise: a float32
    checkpoint is never rounded down on a CPU, and emulated bfloat16 is slower than float32.
    `cpu_flags` (default `read_cpu_flags`, looked up per call) is injectable for tests. Raises ConfigError for an unknown name.
    """
    if isinstance(dtype, torch.dtype):
        return DtypeChoice(dtype, "given by the caller")
    if dtype == "int8":  # opt-in: int8 linear layers (model/cpu/int8.py); refused where it does not pay
        from faste_mm.model.cpu.int8 import INT8_TRIAL_ENV, int8_support, int8_trial

        flags = (cpu_flags or read_cpu_flags)()
        feature = int8_support(device, flags)
        rest = torch.bfloat16 if any(flag in flags for flag in CPU_BF16_FLAGS) else torch.float32
        rest_name = str(rest).removeprefix("torch.")
        trial = int8_trial(rest, flags)
        if not trial.accepted:
            raise ConfigError(f"dtype int8 is slower than {rest_name} on this CPU ({trial.describe()}): use dtype auto "
                              f"({rest_name} here); {INT8_TRIAL_ENV}=skip "
                              f"takes int8 anyway")
        return DtypeChoice(torch.int8, f"asked for (--dtype int8): int8 linear layers on {feature}, the rest "
                                       f"{rest_name}; {trial.describe()}", rest, trial.codes)
    if dtype != "auto":
        if dtype not in _DTYPES:
            raise ConfigError(f"dtype must be 'auto', 'int8' or one of {', '.join(_DTYPES)}, got {dtype!r}")
        return DtypeChoice(_DTYPES[dtype], "asked for (--dtype)")
    if device.type == "cuda":
        return DtypeChoice(torch.bfloat16, "CUDA device")
    if device.type != "cpu":
        return DtypeChoice(torch.float32, f"{device.type} device")
    feature = next((flag for flag in CPU_BF16_FLAGS if flag in (cpu_flags or read_cpu_flags)()), None)
    if feature is None:
        return DtypeChoice(torch.float32, f"CPU has no native bfloat16 ({' / '.join(CPU_BF16_FLAGS)} missing)")
    if checkpoint_dtype is not None and checkpoint_dtype.itemsize > 2:
        return DtypeChoice(torch.float32, f"the checkpoint is stored in {str(checkpoint_dtype).removeprefix('torch.')}")
    return DtypeChoice(torch.bfloat16, f"CPU has {feature}")


def resolve_dtype(dtype: str | torch.dtype, device: torch.device, checkpoint_dtype: torch.dtype | None = None) -> torch.dtype:
    """`choose_dtype`'s dtype (see there for what "auto" picks)."""
    return choose_dtype(dtype, device, checkpoint_dtype).dtype


def checkpoint_dtype(config) -> torch.dtype | None:
    """The dtype a checkpoint's weights are stored in, from its config (`dtype`, formerly
    `torch_dtype`, on the top-level or the text config); None when it does not say."""
    for holder in (config, getattr(config, "text_config", None)):
        value = getattr(holder, "dtype", None) or getattr(holder, "torch_dtype", None)
        if isinstance(value, torch.dtype):
            return value
        if isinstance(value, str) and value in _DTYPES:
            return _DTYPES[value]
    return None


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


def hub_unreachable(name_or_path: str) -> str | None:
    """For a hub id: why the hub cannot be asked (offline mode, or its host refuses or does not
    resolve), else None. Checked once, in a few seconds: asked anyway, the hub client retries
    every request five times with back-off (over a minute) before the cache is even looked at."""
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    if Path(name_or_path).expanduser().is_dir():
        return None
    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    url = urlsplit(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=_HUB_CONNECT_S).close()
    except OSError as error:
        return f"{host} cannot be reached from this machine ({error.strerror or error})"
    return None


_HUB_CONNECT_S = 5.0


def offline_error(name_or_path: str, why: str) -> ModelLoadError:
    """The model is neither reachable nor in the local cache: say so once, and how to use a copy."""
    get = f"where there is internet, `hf download {name_or_path} --local-dir DIR`, and copy DIR here"
    return ModelLoadError(f"{name_or_path}: cannot download the model: {why}, and it is not in the local "
                          f"Hugging Face cache", hint=f"{get}; then load it with from_pretrained(DIR)",
                          cli_hint=f"{get}; then pass --model DIR")


def load_config(name_or_path: str, revision: str | None, offline: str | None = None):
    """The checkpoint's transformers config; ModelLoadError naming the model and the fix.
    offline: why the hub cannot be asked (`hub_unreachable`): only the local cache is read."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(name_or_path, revision=revision, local_files_only=offline is not None)
    except (OSError, ValueError) as error:
        if offline is not None:
            raise offline_error(name_or_path, offline) from None
        reason = " ".join(str(error).split())  # one line: the hub's message carries newlines
        raise ModelLoadError(
            f"{name_or_path}: cannot load the model config ({reason}). Check the hub id or local "
            "directory; without internet, pass a local directory that holds the downloaded model."
        ) from None


def weights_error(name_or_path: str, error: Exception) -> ModelLoadError:
    """A damaged file raises whatever its reader raises (UnpicklingError, SafetensorError, ...):
    one line of it, never a 160-line traceback."""
    reason = (str(error).strip().splitlines() or [""])[0][:300]
    return ModelLoadError(f"{name_or_path}: cannot load weights or processor ({type(error).__name__}: {reason}); "
                          f"the files may be damaged or incomplete — download the model again")


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
    torch_device = resolve_device(device)
    choose_dtype(dtype, torch_device)  # an unknown name fails before anything is read
    serializer_config = serializer or SerializerConfig()
    name_or_path = os.fspath(name_or_path)  # a hub id or a folder, str or path alike
    check_local_path(name_or_path)
    offline = hub_unreachable(name_or_path)
    config = load_config(name_or_path, revision, offline)
    family = family_for(config.model_type, name_or_path)  # refuse unsupported models before downloading weights
    if declared_role(name_or_path, getattr(config, "architectures", None)) == "reranker":
        raise ModelLoadError(f"{name_or_path}: this is a reranker, not an embedding model; load it as the reranker "
                             f"(Reranker.from_pretrained, --rerank) and embed with an embedding model such as "
                             f"Qwen/Qwen3-VL-Embedding-2B")
    dtype_choice = choose_dtype(dtype, torch_device, checkpoint_dtype(config))
    log.info("%s runs in %s", name_or_path, dtype_choice.describe())
    kwargs = dict(revision=revision, dtype=dtype_choice.weights_dtype,
                  attn_implementation=attn_implementation, local_files_only=offline is not None)
    try:
        import transformers

        model_class = getattr(transformers, family.hf_classes[0])
        # parsed once per process while its files are unchanged (preprocessors.py)
        preprocessor = load_preprocessor(name_or_path, family.is_multimodal, revision, offline is not None)
        with without_weights_bar():
            model = model_class.from_pretrained(name_or_path, **kwargs)
    except Exception as error:  # noqa: BLE001 - a damaged file raises whatever its reader raises
        raise weights_error(name_or_path, error) from None
    # A local directory is recorded absolute so collections find it again from any folder.
    model_id = str(Path(name_or_path).absolute()) if Path(name_or_path).is_dir() else str(name_or_path)
    model = model.to(torch_device).eval()
    if dtype_choice.dtype == torch.int8:  # loaded in `rest`, its linear layers quantized here
        from faste_mm.model.cpu.int8 import quantize_model

        quantize_model(model, dtype_choice.int8_codes)
    return assemble(model, preprocessor, model_id, revision, serializer_config, prompt, dtype_choice)


@contextmanager
def without_weights_bar() -> Iterator[None]:
    """transformers' "Loading weights" bar off while faste-mm loads a model (a bar per load in every
    `watch`, `mcp` and LangChain start says nothing a log line does not), through transformers' own
    switch, and back as it was after: the program's other loads keep theirs. Downloads keep the hub's
    bars (a download of several GB is worth watching)."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as transformers_logging

    was_shown = transformers_logging.is_progress_bar_enabled()
    hub_was_off = are_progress_bars_disabled()
    transformers_logging.disable_progress_bar()  # also switches the hub's off ...
    if not hub_was_off:
        enable_progress_bars()  # ... which stay on for downloads
    try:
        yield
    finally:
        if was_shown:
            transformers_logging.enable_progress_bar()  # the hub's too: put back as they were
            if hub_was_off:
                disable_progress_bars()


def assemble(
    model: torch.nn.Module,
    preprocessor,
    model_id: str,
    revision: str | None = None,
    serializer: SerializerConfig | None = None,
    prompt: TextPrompt | None = None,
    dtype_choice: DtypeChoice | None = None,
) -> LoadedModel:
    """Adapter + serializer over an already-loaded base model (Qwen3VLModel or a decoder such as
    Qwen3Model) and its processor (VL) or tokenizer (text); nothing is loaded or copied.
    `dtype_choice`: why the model runs in its dtype (default: the loaded model's, as given)."""
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
        dtype_choice=dtype_choice or DtypeChoice(backbone.dtype, "the loaded model's"),
    )
