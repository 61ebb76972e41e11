"""Stage 2 for rerankers: one (query, document) pair -> the exact token ids (and pixels) the
official reranker code feeds its model, plus how many leading positions belong to the
instruction + query (`Serialized.protected`, what `protect="query"` keeps).

Qwen3-VL-Reranker (official `src/models/qwen3_vl_reranker.py`): system turn `SYSTEM_PROMPT`; user
turn `<Instruct>: {instruction}`, `<Query>:` + query media/text, `\\n<Document>:` + document
media/text (videos, images, texts; an empty part is `NULL`); chat template with the generation
prompt; special tokens and the last 5 tokens survive truncation. Qwen3-Reranker (model card): a
fixed text template ending in an empty think block. docs/rerank.md states both in full.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from PIL import Image

from faste_mm.errors import InputError
from faste_mm.model.items import Item
from faste_mm.model.rerank.document_tails import DocumentTails, EncodedPart
from faste_mm.model.rerank.resized_images import ResizedImages
from faste_mm.model.rerank.tower_cache import patch_digest
from faste_mm.model.serialization import SerializerConfig, Serialized, VLSerializer, _handled_truncation, bare_video_pads
from faste_mm.model.video import VideoFrames, read_video

SYSTEM_PROMPT = (
    'Judge whether the Document meets the requirements based on the Query and the Instruct provided. '
    'Note that the answer can only be "yes" or "no".'
)
# Qwen3-VL-Reranker's default instruction (used as given: no punctuation rule, unlike the embedder)
VL_DEFAULT_INSTRUCTION = "Given a search query, retrieve relevant candidates that answer the query."
# Qwen3-Reranker's model-card default
TEXT_DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
QUERY_LABEL, DOCUMENT_LABEL = "<Query>:", "\n<Document>:"
KEPT_TAIL = 5  # `<|im_end|>\n<|im_start|>assistant\n`: never truncated (official tokenize)
VISION_START_ID = 151652  # <|vision_start|>: a special token, so the tokenizer never merges across it
# The official pixel budget of a reranker image: MAX_PIXELS = 1280 tokens of 32 x 32 pixels.
RERANK_MAX_PIXELS = 1280 * 32 * 32


def rerank_serializer_config(max_length: int) -> SerializerConfig:
    """The official reranker budgets: max_length tokens, images 4096..1,310,720 pixels; videos
    sampled as for the embedder (1 fps, at most 64 frames; docs/rerank.md)."""
    return SerializerConfig(max_pixels=RERANK_MAX_PIXELS, max_length=max_length)


@dataclass(frozen=True, slots=True)
class PreparedQuery:
    """A query decoded once and reused for every candidate: its resized image / sampled video,
    the instruction, and the token count of everything up to the end of the query part."""

    item: Item
    instruction: str
    image: Image.Image | None
    video: VideoFrames | None
    protected: int  # tokens of the system turn + instruction + query part
    # the pair prompt up to an image document's `<|vision_start|>`, encoded once (`document_tails`);
    # None where pairs are encoded whole (a text reranker, a video query)
    head: EncodedPart | None = None
    head_text: str = ""


def _official_truncation(ids: torch.Tensor, mm_types: torch.Tensor, max_length: int, special_ids: torch.Tensor):
    """The official rule: of all but the last KEPT_TAIL tokens, every special token (the vision
    pads included) stays and the first `max_length - n_special` others stay; the tail follows.
    Returns (kept ids, kept mm types, keep mask over the input, truncated?)."""
    body = ids[:-KEPT_TAIL]
    keep = torch.ones_like(ids, dtype=torch.bool)
    if body.shape[0] <= max_length:
        return ids, mm_types, keep, False
    special = torch.isin(body, special_ids)  # [T - 5]
    budget = max_length - int(special.sum())
    keep[:-KEPT_TAIL] = special | (torch.cumsum(~special, 0) <= budget)
    return ids[keep], mm_types[keep], keep, True


class VLPairSerializer:
    """Qwen3-VL-Reranker pairs over the processor: images and videos are resized exactly as
    the embedder's serializer does (qwen-vl-utils), with the reranker's pixel budget."""

    def __init__(self, processor, config: SerializerConfig, resized: ResizedImages | None = None,
                 tails: DocumentTails | None = None) -> None:
        self.processor = processor
        self.media = VLSerializer(processor, config)  # image resize and pixel bounds, shared with embedding
        self.config = config
        self.special_ids = torch.tensor(sorted(processor.tokenizer.all_special_ids))
        self.default_instruction = VL_DEFAULT_INSTRUCTION
        self.resized = resized  # files' resized images across queries (None: resized every time)
        self.tails = tails  # image documents' encoded tails across queries (None: each pair encoded whole)
        self.vision_start = processor.tokenizer.convert_ids_to_tokens(VISION_START_ID)

    def _media(self, item: Item) -> tuple[Image.Image | None, VideoFrames | None]:
        video = read_video(item.video, self.config.video, max_tokens=self.config.max_length) if item.has_video else None
        image = None
        if item.has_image:
            prepare = lambda: self.media.prepare_image(item)  # noqa: E731
            image = prepare() if self.resized is None else self.resized.get(item, self.media.pixel_bounds(item), prepare)
        return image, video

    @staticmethod
    def _part(label: str, item: Item, image, video) -> list[dict]:
        """One side of the pair: its label, then video, image, text; NULL when empty (official)."""
        content = [{"type": "text", "text": label}]
        if not item.text and image is None and video is None:
            return content + [{"type": "text", "text": "NULL"}]
        if video is not None:
            content.append({"type": "video", "video": str(item.video)})
        if image is not None:
            content.append({"type": "image", "image": image})
        if item.text:
            content.append({"type": "text", "text": item.text})
        return content

    def _render(self, user: list[dict], generation_prompt: bool) -> str:
        conversation = [
            {"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]},
            {"role": "user", "content": user},
        ]
        prompt = self.processor.apply_chat_template(conversation, tokenize=False, add_generation_prompt=generation_prompt)
        return bare_video_pads(self.processor, prompt)

    def _encode(self, prompt: str, images: list, videos: list[VideoFrames]):
        video_kwargs = {}
        if videos:
            video_kwargs = dict(
                videos=[v.frames for v in videos], video_metadata=[v.metadata() for v in videos],
                do_sample_frames=False, cap_pixels_per_frame=False,
            )
        return self.processor(text=[prompt], images=images or None, do_resize=False, return_tensors="pt", **video_kwargs)

    def query_content(self, query: PreparedQuery) -> list[dict]:
        return [{"type": "text", "text": "<Instruct>: " + query.instruction}] + self._part(
            QUERY_LABEL, query.item, query.image, query.video
        )

    def prepare_query(self, query: Item, instruction: str | None) -> PreparedQuery:
        """Decode the query's media once; count the tokens of the pair prompt up to the end of the
        query part (system turn, `<Instruct>: ...`, `<Query>:` and the query) with the processor."""
        image, video = self._media(query)
        prepared = PreparedQuery(query, (instruction or "").strip() or self.default_instruction, image, video, 0)
        user_turn_end = self.processor.tokenizer.decode([self.processor.tokenizer.convert_tokens_to_ids("<|im_end|>")]) + "\n"
        text = self._render(self.query_content(prepared), generation_prompt=False)
        prefix = text[: -len(user_turn_end)] if text.endswith(user_turn_end) else text
        encoded = self._encode(prefix, [image] if image is not None else [], [video] if video is not None else [])
        prepared = replace(prepared, protected=int(encoded["input_ids"].shape[1]))
        return prepared if self.tails is None or video is not None else self._with_head(prepared)

    def _with_head(self, query: PreparedQuery) -> PreparedQuery:
        """The query with its head: the pair prompt of an image document cut at the document's
        `<|vision_start|>`, encoded (with the query's image) once for every pair of this query."""
        prompt = self._render(self.query_content(query) + self._part(DOCUMENT_LABEL, Item(image="-"), "placeholder", None),
                              generation_prompt=True)
        head_text = prompt[: prompt.rindex(self.vision_start)]
        if head_text.count(self.processor.image_token) != (query.image is not None):
            return query  # an image token written in the query text: pairs are encoded whole
        return replace(query, head=self._encoded(head_text, query.image), head_text=head_text)

    def _encoded(self, text: str, image: Image.Image | None) -> EncodedPart:
        encoded = self._encode(text, [image] if image is not None else [], [])
        pixels = encoded.get("pixel_values")
        return EncodedPart(encoded["input_ids"][0], encoded["mm_token_type_ids"][0], pixels, encoded.get("image_grid_thw"),
                           () if pixels is None else (patch_digest(pixels),))

    def planned_size(self, query: PreparedQuery, document: Item) -> tuple[int, int] | None:
        """(tokens, pixel bytes) `self(query, document)` gives an image or page document, without
        rendering it: the pair prompt tokenized with a placeholder per image, each placeholder
        counted as its image's tokens (the document's at `resized_size`, from the file header or
        the PDF page box; the query's from its resized image), then the official truncation's
        length: all special tokens (the image tokens among them) and max_length others, plus the
        tail. Lets the batcher plan a query's batches and the server count a request's tokens
        before any page is rendered. None for text documents (as cheap to serialize as to count)
        and where the pair holds a video (counting needs the container)."""
        if not document.has_image or document.has_video or query.video is not None:
            return None
        placeholder = "planned"  # the template writes the image's placeholder; the object is not read
        user = self.query_content(query) + self._part(DOCUMENT_LABEL, document, placeholder, None)
        ids = torch.tensor(self.processor.tokenizer(self._render(user, generation_prompt=True))["input_ids"])
        sizes = ([query.image.size] if query.image is not None else []) + [self.media.resized_size(document)]
        plans = [self.media.image_plan(width, height) for width, height in sizes]
        expanded = sum(tokens for tokens, _ in plans) - len(plans)  # each placeholder becomes its image's tokens
        length = ids.shape[0] + expanded
        if length - KEPT_TAIL > self.config.max_length:
            special = int(torch.isin(ids[:-KEPT_TAIL], self.special_ids).sum()) + expanded
            length = max(self.config.max_length, special) + KEPT_TAIL
        return length, sum(nbytes for _, nbytes in plans)

    def keyed(self, query: PreparedQuery, document: Item) -> tuple[Serialized, tuple[str, ...] | None]:
        """(the pair, each of its images' `patch_digest` or None when unknown): a file-backed image
        document after a query with a head is the head's tokens and its kept tail's (the same ids,
        types and pixels as encoding the whole pair); anything else is encoded whole."""
        if query.head is not None and document.has_image and not document.has_video:
            bounds = self.media.pixel_bounds(document)
            tail = self._tail(query, document, bounds)
            if tail is not None:
                return self._joined(query, tail), query.head.digests + tail.digests
        return self(query, document), None

    def _tail(self, query: PreparedQuery, document: Item, bounds: tuple[int, int]) -> EncodedPart | None:
        """The document's kept tail (encoded on first use), or None where the pair's prompt does
        not start with the query's head (then it is encoded whole)."""
        user = self.query_content(query) + self._part(DOCUMENT_LABEL, document, "placeholder", None)
        prompt = self._render(user, generation_prompt=True)
        if not prompt.startswith(query.head_text):
            return None
        text = prompt[len(query.head_text):]
        if not text.startswith(self.vision_start) or text.count(self.processor.image_token) != 1:
            return None
        return self.tails.get(document, bounds, text, lambda: self._encoded(text, self._media(document)[0]))

    def _joined(self, query: PreparedQuery, tail: EncodedPart) -> Serialized:
        head = query.head
        ids = torch.cat([head.input_ids, tail.input_ids])
        mm_types = torch.cat([head.mm_token_type_ids, tail.mm_token_type_ids])
        ids, mm_types, keep, truncated = _official_truncation(ids, mm_types, self.config.max_length, self.special_ids)
        protected = min(int(keep[: query.protected].sum()), ids.shape[0] - 1)
        pixels, grids = tail.pixel_values, tail.image_grid_thw  # a text query's pairs share the kept tensor (never written)
        if head.pixel_values is not None:  # the query's image first, as the prompt has it
            pixels, grids = torch.cat([head.pixel_values, pixels]), torch.cat([head.image_grid_thw, grids])
        return Serialized(input_ids=ids, mm_token_type_ids=mm_types, pixel_values=pixels, image_grid_thw=grids,
                          truncated=truncated, protected=protected)

    def __call__(self, query: PreparedQuery, document: Item) -> Serialized:
        """The pair encoded whole (the official way; `keyed` gives the same from kept tails)."""
        image, video = self._media(document)
        user = self.query_content(query) + self._part(DOCUMENT_LABEL, document, image, video)
        prompt = self._render(user, generation_prompt=True)
        images = [i for i in (query.image, image) if i is not None]
        videos = [v for v in (query.video, video) if v is not None]
        encoded = self._encode(prompt, images, videos)
        ids, mm_types = encoded["input_ids"][0], encoded["mm_token_type_ids"][0]
        ids, mm_types, keep, truncated = _official_truncation(ids, mm_types, self.config.max_length, self.special_ids)
        protected = min(int(keep[: query.protected].sum()), ids.shape[0] - 1)
        return Serialized.from_processor(encoded, ids, mm_types, truncated, protected)


class TextPairSerializer:
    """Qwen3-Reranker pairs (model card): system + user prefix, then
    `<Instruct>: {instruction}\\n<Query>: {query}\\n<Document>: {doc}` truncated on the right to
    max_length minus prefix and suffix, then the assistant turn with an empty think block."""

    PREFIX = f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n"
    SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"

    def __init__(self, tokenizer, config: SerializerConfig) -> None:
        self.tokenizer = tokenizer
        _handled_truncation(tokenizer)
        self.config = config
        self.prefix_ids = tokenizer(self.PREFIX, add_special_tokens=False)["input_ids"]
        self.suffix_ids = tokenizer(self.SUFFIX, add_special_tokens=False)["input_ids"]
        self.default_instruction = TEXT_DEFAULT_INSTRUCTION

    @staticmethod
    def query_text(query: PreparedQuery) -> str:
        return f"<Instruct>: {query.instruction}\n<Query>: {query.item.text or ''}\n"

    def prepare_query(self, query: Item, instruction: str | None) -> PreparedQuery:
        if query.has_image or query.has_video:
            raise InputError(f"{query.describe()}: this is a text-only reranker; the query must be text")
        prepared = PreparedQuery(query, (instruction or "").strip() or self.default_instruction, None, None, 0)
        protected = len(self.prefix_ids) + len(self.tokenizer(self.query_text(prepared))["input_ids"])
        return replace(prepared, protected=protected)

    def planned_size(self, query: PreparedQuery, document: Item) -> None:
        """None: a text pair is as cheap to serialize as to count."""
        return None

    def keyed(self, query: PreparedQuery, document: Item) -> tuple[Serialized, None]:
        """(the pair, None): text pairs have no images to key."""
        return self(query, document), None

    def __call__(self, query: PreparedQuery, document: Item) -> Serialized:
        if document.has_image or document.has_video:
            kind = "videos" if document.has_video else "images"
            raise InputError(f"{document.describe()}: this is a text-only reranker; it cannot score {kind}")
        budget = self.config.max_length - len(self.prefix_ids) - len(self.suffix_ids)
        pair = self.query_text(query) + f"<Document>: {document.text or ''}"
        full = self.tokenizer(pair)["input_ids"]
        body = self.tokenizer(pair, truncation=True, max_length=budget)["input_ids"]
        ids = self.prefix_ids + body + self.suffix_ids
        protected = min(query.protected, len(self.prefix_ids) + len(body))
        return Serialized(input_ids=torch.tensor(ids, dtype=torch.long), truncated=len(full) > len(body), protected=protected)
