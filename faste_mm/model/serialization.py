"""Stage 2: serialization. Turns one `Item` into the exact token ids (and pixels) the official
embedding code would feed the model, so vectors match the published models.

Receives `Item`s; hands on `Serialized` (1-D tensors for one item) to the batcher.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Literal

import torch
from PIL import Image

from faste_mm.errors import ConfigError, InputError
from faste_mm.model.file_decoding import load_image, pdf_page_size, read_image_size
from faste_mm.model.items import Item
from faste_mm.model.video import VideoConfig, read_video

from faste_mm.model.official import DOCUMENT_INSTRUCTION as DEFAULT_INSTRUCTION
from faste_mm.model.official import OFFICIAL_MAX_PIXELS, OFFICIAL_MIN_PIXELS, PIXELS_PER_VISUAL_TOKEN


def pixel_budget(max_pixels: int | None = None, visual_tokens: int | None = None,
                 names: tuple[str, str] = ("max_pixels", "visual_tokens")) -> int | None:
    """The image/page pixel cap given either as pixels or as merged visual tokens (N tokens =
    N x 32 x 32 px); None when neither is given. `names` are the caller's spellings of the two
    arguments (CLI flags or keyword names), used in the errors. Raises ConfigError when both
    are given or a value is not a positive int."""
    if max_pixels is not None and visual_tokens is not None:
        raise ConfigError(f"give {names[0]} or {names[1]}, not both ({names[0]} {max_pixels}, "
                          f"{names[1]} {visual_tokens}); {names[1]} N means {names[0]} N x {PIXELS_PER_VISUAL_TOKEN}")
    for name, value in zip(names, (max_pixels, visual_tokens)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{name} must be a positive whole number, got {value!r}")
    return visual_tokens * PIXELS_PER_VISUAL_TOKEN if visual_tokens is not None else max_pixels


@dataclass(frozen=True, slots=True)
class SerializerConfig:
    """Image and length settings of the official Qwen3-VL-Embedding preprocessing.

    min_pixels/max_pixels bound the resized image (the official 4 to 1800 visual tokens of 32x32 px);
    max_length truncates the token sequence on the right, as the official code does.
    video: frame sampling and per-frame pixel budget of video items (faste_mm.model.video).
    """

    min_pixels: int = OFFICIAL_MIN_PIXELS
    max_pixels: int = OFFICIAL_MAX_PIXELS
    max_length: int = 8192
    image_patch_size: int = 16  # qwen-vl-utils resizes to multiples of patch * merge = 32
    video: VideoConfig = field(default_factory=VideoConfig)

    def __post_init__(self) -> None:
        if not 1 <= self.min_pixels <= self.max_pixels:
            raise ConfigError(
                f"SerializerConfig: need 1 <= min_pixels <= max_pixels, got {self.min_pixels} and {self.max_pixels}"
            )
        if self.max_length < 8:
            raise ConfigError(f"SerializerConfig.max_length must be >= 8, got {self.max_length}")
        if not isinstance(self.video, VideoConfig):
            raise ConfigError(f"SerializerConfig.video must be a VideoConfig, got {type(self.video).__name__}")


@dataclass(frozen=True, slots=True)
class Serialized:
    """One item ready for batching (all tensors on CPU)."""

    input_ids: torch.Tensor  # [T] int64
    mm_token_type_ids: torch.Tensor | None = None  # [T] 0 text, 1 image, 2 video
    pixel_values: torch.Tensor | None = None  # [P, C] flattened patches of the one image
    image_grid_thw: torch.Tensor | None = None  # [1, 3]
    truncated: bool = False
    position_ids: torch.Tensor | None = None  # [3, T] MRoPE positions, filled by the backbone in the workers
    pixel_values_videos: torch.Tensor | None = None  # [P_v, C] flattened patches of the one video
    video_grid_thw: torch.Tensor | None = None  # [1, 3] (frame pairs, h, w) patches
    protected: int = 0  # leading positions a compressor must keep (a reranker pair's instruction + query)

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[0])

    @classmethod
    def from_processor(cls, encoded, input_ids: torch.Tensor, mm_token_type_ids: torch.Tensor, truncated: bool,
                       protected: int = 0) -> "Serialized":
        """One item from the Qwen3-VL processor's output (`encoded`: its pixel tensors) and the
        token ids kept after truncation."""
        return cls(
            input_ids=input_ids,
            mm_token_type_ids=mm_token_type_ids,
            pixel_values=encoded.get("pixel_values"),
            image_grid_thw=encoded.get("image_grid_thw"),
            truncated=truncated,
            pixel_values_videos=encoded.get("pixel_values_videos"),
            video_grid_thw=encoded.get("video_grid_thw"),
            protected=protected,
        )


def normalize_instruction(instruction: str | None) -> str:
    """Official rule: strip; append '.' unless the last character is Unicode punctuation (P*)."""
    text = (instruction or "").strip()
    if not text:
        return DEFAULT_INSTRUCTION
    if not unicodedata.category(text[-1]).startswith("P"):
        text += "."
    return text


def build_conversation(item: Item, instruction: str | None, image: Image.Image | None = None) -> list[dict]:
    """The official two-turn conversation: system = instruction, user = [video?, image?, text?] or NULL."""
    content: list[dict] = []
    if item.video is not None:
        content.append({"type": "video", "video": str(item.video)})
    if item.image is not None:
        content.append({"type": "image", "image": image if image is not None else item.image})
    if item.text:
        content.append({"type": "text", "text": item.text})
    if not content:
        content.append({"type": "text", "text": "NULL"})
    return [
        {"role": "system", "content": [{"type": "text", "text": normalize_instruction(instruction)}]},
        {"role": "user", "content": content},
    ]


def bare_video_pads(processor, prompt: str) -> str:
    """transformers 4.57 (the official pin) replaces the whole <|vision_start|><|video_pad|>
    <|vision_end|> by "<t seconds><|vision_start|>pads<|vision_end|>" per frame pair; 5.x
    replaces the pad token only, nesting that inside a second start/end pair. Passing the
    bare pad token gives the official text under both."""
    video = processor.video_token
    return prompt.replace(f"{processor.vision_start_token}{video}{processor.vision_end_token}", video)


def _handled_truncation(tokenizer) -> None:
    """Mark transformers' "Token indices sequence length is longer than the specified maximum"
    warning as already given: the serializers truncate at max_length themselves (and say so in
    `Serialized.truncated`), so the warning would only alarm the user."""
    flags = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(flags, dict):
        flags["sequence-length-is-longer-than-the-specified-maximum"] = True


class VLSerializer:
    """Qwen3-VL-Embedding serialization: chat template + qwen-vl-utils resize + processor."""

    def __init__(self, processor, config: SerializerConfig) -> None:
        self.processor = processor
        _handled_truncation(getattr(processor, "tokenizer", None))
        self.config = config
        self.image_token_id = processor.image_token_id
        self.video_token_id = processor.video_token_id

    def render_prompt(self, item: Item, instruction: str | None) -> str:
        conversation = build_conversation(item, instruction)
        prompt = self.processor.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        return bare_video_pads(self.processor, prompt)

    def pixel_bounds(self, item: Item) -> tuple[int, int]:
        """(min_pixels, max_pixels) of this item's resize: the item's own max_pixels, if set,
        replaces the config's. Raises InputError when it is below min_pixels."""
        if item.max_pixels is None:
            return self.config.min_pixels, self.config.max_pixels
        if item.max_pixels < self.config.min_pixels:
            raise InputError(
                f"{item.describe()}: Item.max_pixels {item.max_pixels} is below min_pixels "
                f"{self.config.min_pixels}; raise it or lower SerializerConfig.min_pixels"
            )
        return self.config.min_pixels, item.max_pixels

    def prepare_image(self, item: Item) -> Image.Image:
        """Decode, paste RGBA on white and smart-resize exactly as qwen-vl-utils does."""
        from qwen_vl_utils import fetch_image

        min_pixels, max_pixels = self.pixel_bounds(item)
        image = load_image(item, max_pixels)
        try:
            return fetch_image(
                {"image": image, "min_pixels": min_pixels, "max_pixels": max_pixels},
                image_patch_size=self.config.image_patch_size,
            )
        except ValueError as error:  # qwen-vl-utils rejects aspect ratios beyond 200:1
            raise _resize_error(item, error) from None

    def resized_size(self, item: Item) -> tuple[int, int]:
        """(width, height) that `prepare_image` returns, without decoding image files or
        rendering PDF pages: the original size comes from the header (the page box, at the
        renderer's scale) and goes through the same qwen-vl-utils `smart_resize`."""
        from qwen_vl_utils import smart_resize
        from qwen_vl_utils.vision_process import SPATIAL_MERGE_SIZE

        min_pixels, max_pixels = self.pixel_bounds(item)
        width, height = pdf_page_size(item, max_pixels) if item.is_pdf else read_image_size(item)
        # fetch_image's own factor: image_patch_size * SPATIAL_MERGE_SIZE (16 * 2 = 32 px).
        factor = self.config.image_patch_size * SPATIAL_MERGE_SIZE
        try:
            height, width = smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
        except ValueError as error:
            raise _resize_error(item, error) from None
        return width, height

    def planned_size(self, item: Item, instruction: str | None) -> tuple[int, int] | None:
        """(tokens, pixel bytes) `__call__` gives an image item, without its pixels: the prompt
        with one image placeholder, tokenized, plus the image's tokens ((h/16) * (w/16) patches,
        2x2 merged) at `resized_size`, capped at max_length; and the bytes of its float32 patches
        ([h/16 * w/16, 3 * temporal_patch_size * 16 * 16]). The batcher plans batches from them
        and serializes (renders, resizes) an image only when its batch is prepared. None for text
        (as cheap to serialize as to count) and video (counting needs the container)."""
        if not item.has_image or item.has_video:
            return None
        n_image, nbytes = self.image_plan(*self.resized_size(item))
        n_text = len(self.processor.tokenizer(self.render_prompt(item, instruction))["input_ids"])
        # the placeholder becomes the image tokens
        return min(n_text - 1 + n_image, self.config.max_length), nbytes

    def image_plan(self, width: int, height: int) -> tuple[int, int]:
        """(merged visual tokens, bytes of the float32 patches) of an image already resized to
        width x height: (h/16) * (w/16) patches of 3 * temporal_patch_size * 16 * 16 floats, 2x2 merged."""
        image_processor = self.processor.image_processor
        n_patches = (height // image_processor.patch_size) * (width // image_processor.patch_size)
        patch_floats = 3 * image_processor.temporal_patch_size * image_processor.patch_size**2
        return n_patches // image_processor.merge_size**2, n_patches * patch_floats * 4

    def __call__(self, item: Item, instruction: str | None) -> Serialized:
        # qwen-vl-utils' fetch_video: sampled frames, resized; the processor then neither
        # resamples nor resizes them (do_sample_frames=False, do_resize=False), as officially
        video = read_video(item.video, self.config.video, max_tokens=self.config.max_length) if item.has_video else None
        image = self.prepare_image(item) if item.has_image else None
        prompt = self.render_prompt(item, instruction)
        video_kwargs = {}
        if video is not None:
            video_kwargs = dict(
                videos=[video.frames], video_metadata=[video.metadata()], do_sample_frames=False,
                cap_pixels_per_frame=False,  # a resize option only: silences transformers' notice
            )
        encoded = self.processor(
            text=[prompt],
            images=[image] if image is not None else None,
            do_resize=False,
            return_tensors="pt",
            **video_kwargs,
        )
        input_ids = encoded["input_ids"][0]
        mm_types = encoded["mm_token_type_ids"][0]
        truncated = input_ids.shape[0] > self.config.max_length
        if truncated:
            # The official code truncates on the right at max_length; cutting into the image or
            # video placeholder would desynchronise pixels and tokens, so that case is refused.
            kept = input_ids[: self.config.max_length]
            if bool((mm_types[self.config.max_length :] != 0).any()):
                what = "video" if video is not None else "image"
                advice = (
                    "sample fewer frames or fewer pixels per frame (video max_frames / max_pixels; "
                    "--video-max-frames / --video-max-pixels)" if video is not None
                    else "lower max_pixels or raise max_length"
                )
                raise InputError(
                    f"{item.describe()}: {input_ids.shape[0]} tokens exceed max_length "
                    f"{self.config.max_length} inside the {what}; {advice}"
                )
            input_ids = kept
            mm_types = mm_types[: self.config.max_length]
        return Serialized.from_processor(encoded, input_ids, mm_types, truncated)


@dataclass(frozen=True, slots=True)
class TextPrompt:
    """Prompt format of a text embedding model.

    query_template is used when an instruction is present, document_template otherwise; both may
    use `{instruction}` and `{text}`. readout "eos" appends the tokenizer's EOS token as the
    readout (Qwen3-Embedding, E5-Mistral); "last" reads out the last prompt token.
    """

    query_template: str = "Instruct: {instruction}\nQuery: {text}"
    document_template: str = "{text}"
    default_query_instruction: str = "Given a web search query, retrieve relevant passages that answer the query"
    readout: Literal["eos", "last"] = "eos"

    def __post_init__(self) -> None:
        if self.readout not in ("eos", "last"):
            raise ConfigError(f"TextPrompt.readout must be 'eos' or 'last', got {self.readout!r}")
        for name in ("query_template", "document_template"):
            if "{text}" not in getattr(self, name):
                raise ConfigError(f"TextPrompt.{name} must contain '{{text}}', got {getattr(self, name)!r}")

    def render(self, text: str, instruction: str | None) -> str:
        template = self.document_template if instruction is None else self.query_template
        return template.format(instruction=(instruction or "").strip(), text=text)


class TextSerializer:
    """Serialization for decoder-only text embedding models (Qwen3-Embedding, E5-Mistral, Llama...)."""

    def __init__(self, tokenizer, prompt: TextPrompt, max_length: int) -> None:
        self.tokenizer = tokenizer
        _handled_truncation(tokenizer)
        self.prompt = prompt
        self.max_length = max_length
        if prompt.readout == "eos" and tokenizer.eos_token_id is None:
            raise ConfigError("TextPrompt.readout='eos' but the tokenizer defines no eos_token; use readout='last'")

    def render_prompt(self, item: Item, instruction: str | None) -> str:
        return self.prompt.render(item.text or "", instruction)

    def planned_size(self, item: Item, instruction: str | None) -> None:
        """None: text is as cheap to serialize as to count (see `VLSerializer.planned_size`)."""
        return None

    def __call__(self, item: Item, instruction: str | None) -> Serialized:
        if item.has_image or item.has_video:
            kind = "videos" if item.has_video else "images"
            raise InputError(f"{item.describe()}: this is a text-only model; it cannot embed {kind}")
        eos = self.tokenizer.eos_token_id
        ids = self.tokenizer(self.render_prompt(item, instruction), add_special_tokens=True)["input_ids"]
        # Some tokenizers (the published Qwen3-Embedding one) already append EOS: never add a second.
        if self.prompt.readout == "eos" and ids and ids[-1] == eos:
            ids = ids[:-1]
        reserve = 1 if self.prompt.readout == "eos" else 0
        truncated = len(ids) > self.max_length - reserve
        ids = ids[: self.max_length - reserve]
        if reserve:
            ids = ids + [eos]
        if not ids:
            raise InputError(f"{item.describe()}: the prompt tokenizes to nothing; give some text")
        return Serialized(input_ids=torch.tensor(ids, dtype=torch.long), truncated=truncated)


def _resize_error(item: Item, error: ValueError) -> InputError:
    """qwen-vl-utils' smart resize refuses an image (an aspect ratio of 200:1 or more): say what to do."""
    return InputError(f"{item.describe()}: cannot resize the image ({error}); crop it or cut it into pieces "
                      f"so that its long side is less than 200 times its short side")
