""""Why this result": the reranker readout's attention over a pair's document part, the quantity
FastE ranks prefix states by, mapped back to what the user gave: image and video patches
(through the 2x2 merge to the resized image's patch grid) and character spans of the text.

It is attention, not attribution: where the last token looked at one layer, not why the score
is what it is. Receives one serialized pair and its recorded weights; hands on an `Explanation`.

Sum rule: the weights over all prefix positions sum to 1 (softmax over the prefix, mean over
heads). query_share covers the protected span (system turn, instruction, query); the rest is
document_share = sum of every visual map + sum of the text spans + template_share (the
`<Document>:` label, vision start/end and timestamp tokens, the closing chat tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from faste_mm.model.items import Item
from faste_mm.model.serialization import Serialized

MERGE = 2  # Qwen3-VL merges 2x2 patches into one visual token
PATCH = 16  # pixels per patch side


@dataclass(frozen=True, slots=True)
class VisualMap:
    """One document image (grid [h/2, w/2]) or video (grid [frame pairs, h/2, w/2]): the readout
    attention per visual token; `patches` spreads each token's weight evenly over its 2x2
    patches ([h, w] or [t, h, w]), so both sum to the same total. `size`: (width, height) in
    pixels of the resized image / frames the model saw (patches are 16 x 16 pixels)."""

    kind: str  # "image" | "video"
    grid: np.ndarray
    patches: np.ndarray
    size: tuple[int, int]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "grid": self.grid.tolist(), "size": list(self.size), "total": float(self.grid.sum())}


@dataclass(frozen=True, slots=True)
class TextSpan:
    """Characters [start, end) of the document's text and the attention its token received."""

    start: int
    end: int
    text: str
    weight: float

    def to_dict(self) -> dict:
        return {"start": self.start, "end": self.end, "text": self.text, "weight": self.weight}


@dataclass(frozen=True, slots=True)
class Explanation:
    """`Reranker.explain`: the pair's score, the layer whose readout attention is shown, and the
    attention split as the module docstring's sum rule states."""

    score: float
    layer: int
    query_share: float
    document_share: float
    template_share: float
    images: list[VisualMap] = field(default_factory=list)
    text: list[TextSpan] = field(default_factory=list)
    truncated: bool = False

    def to_dict(self) -> dict:
        return {
            "score": self.score,
            "layer": self.layer,
            "label": "readout attention (where the reranker's last token looked), not attribution",
            "query_share": self.query_share,
            "document_share": self.document_share,
            "template_share": self.template_share,
            "images": [m.to_dict() for m in self.images],
            "text": [s.to_dict() for s in self.text],
            "truncated": self.truncated,
        }


def explain_pair(
    serialized: Serialized, weights: np.ndarray, document: Item, tokenizer, score: float, layer: int,
    image_token_id: int | None = None, video_token_id: int | None = None,
) -> Explanation:
    """weights: [n_prefix] float, the readout attention over the pair's prefix positions."""
    ids = serialized.input_ids[: len(weights)].tolist()
    start = serialized.protected
    assigned = np.zeros(len(ids), dtype=bool)
    assigned[:start] = True  # the query span
    images = []
    for kind, token_id, grids in (("video", video_token_id, serialized.video_grid_thw), ("image", image_token_id, serialized.image_grid_thw)):
        if token_id is None or grids is None:
            continue
        positions = [p for p, t in enumerate(ids) if t == token_id]
        offset = 0
        for t, h, w in grids.tolist():
            count = t * h * w // (MERGE * MERGE)
            chunk = positions[offset : offset + count]
            offset += count
            if not chunk or chunk[0] < start:  # the query's own media
                continue
            assigned[chunk] = True
            grid = weights[chunk].reshape(t, h // MERGE, w // MERGE)
            patches = np.kron(grid, np.ones((1, MERGE, MERGE))) / (MERGE * MERGE)
            if kind == "image":
                grid, patches = grid[0], patches[0]
            images.append(VisualMap(kind, grid, patches, (w * PATCH, h * PATCH)))
    spans = _text_spans(ids, weights, start, document.text or "", tokenizer, assigned)
    document_share = float(weights[start:].sum())
    visual = sum(float(m.grid.sum()) for m in images)
    return Explanation(
        score=score,
        layer=layer,
        query_share=float(weights[:start].sum()),
        document_share=document_share,
        template_share=document_share - visual - sum(s.weight for s in spans),
        images=images,
        text=spans,
        truncated=serialized.truncated,
    )


def _text_spans(ids, weights, start, text: str, tokenizer, assigned) -> list[TextSpan]:
    """Tokens of the document part whose bytes overlap the document's text. The text follows the
    `<Document>:` label (or the document's last media) and ends at the closing `<|im_end|>`."""
    if not text:
        return []
    pieces = _token_bytes(tokenizer, ids[start:])
    ends = np.cumsum([len(p) for p in pieces])
    begins = ends - np.array([len(p) for p in pieces])
    joined = b"".join(pieces)
    close = joined.rfind(b"<|im_end|>")
    media = joined.rfind(b"<|vision_end|>")
    label = joined.find(b"<Document>:")
    if close < 0 or label < 0:
        return []
    text_start = media + len(b"<|vision_end|>") if media > label else label + len(b"<Document>:")
    if joined[text_start : text_start + 1] == b" " and not text.startswith(" "):
        text_start += 1  # Qwen3-Reranker's "<Document>: {doc}"
    encoded = text.encode()
    text_end = min(close, text_start + len(encoded))
    char_at = np.concatenate([[0], np.cumsum([len(c.encode()) for c in text])])  # byte offset of each char
    spans = []
    for k, (a, b) in enumerate(zip(begins.tolist(), ends.tolist())):
        lo, hi = max(a, text_start), min(b, text_end)
        position = start + k
        if lo >= hi or assigned[position]:
            continue
        assigned[position] = True
        first = int(np.searchsorted(char_at, lo - text_start, side="right")) - 1
        last = int(np.searchsorted(char_at, hi - text_start, side="left"))
        spans.append(TextSpan(first, last, text[first:last], float(weights[position])))
    return spans


def _token_bytes(tokenizer, ids: list[int]) -> list[bytes]:
    """Each token's bytes: byte-level BPE tokens through the GPT-2 byte alphabet, added and
    special tokens as their literal text."""
    decoder = _byte_decoder()
    added = set(tokenizer.get_added_vocab())
    pieces = []
    for token in tokenizer.convert_ids_to_tokens(ids):
        if token in added:
            pieces.append(token.encode())
        else:
            pieces.append(bytes(decoder.get(c, 0) for c in token))
    return pieces


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: printable bytes map to themselves, the others
    to 256 + n in order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes)}
