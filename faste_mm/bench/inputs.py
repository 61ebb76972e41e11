"""Benchmark inputs from a compact spec: `text:TOKENS` (documents of exactly TOKENS prompt-free
tokens), `text:MIN-MAX` (lengths drawn uniformly from MIN..MAX, seeded), `image:WxH` (noise PNGs, so decoding costs what real photos cost), `page:WxH`
(one-page PDFs rendered by pypdfium2 like real documents), `video:SECONDS` or `video:SECONDS@WxH`
(an H.264 clip at 25 fps, 640x360 by default, moving shapes over noise), or an existing folder.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from PIL import Image, ImageDraw

from faste_mm.errors import ConfigError

_WORDS = (
    "retrieval embedding compression readout prefix layer document page image caption query model "
    "vector index search bicycle wall river mountain city table figure chart invoice report summary"
).split()


def make_inputs(spec: str, n: int, workdir: Path, tokenizer) -> list:
    """Build `n` inputs described by `spec` (files under `workdir`); a folder spec takes its first n files."""
    kind, _, value = spec.partition(":")
    rng = random.Random(0)
    low, _, high = value.partition("-")
    if kind == "text" and low.isdigit() and (high.isdigit() or not high):
        low, high = int(low), int(high or low)
        if not 1 <= low <= high:
            raise ConfigError(f"--inputs {spec}: token lengths must satisfy 1 <= MIN <= MAX")
        return [_text_of_tokens(rng.randint(low, high), tokenizer, rng) for _ in range(n)]
    if kind in ("image", "page"):
        size = re.fullmatch(r"([1-9]\d*)x([1-9]\d*)", value.lower())
        if size is None:
            raise ConfigError(f"--inputs {spec}: expected {kind}:WIDTHxHEIGHT in pixels, e.g. {kind}:1240x1754")
        width, height = int(size[1]), int(size[2])
        workdir.mkdir(parents=True, exist_ok=True)
        return [_write_image(workdir, i, width, height, rng) if kind == "image" else _write_page(workdir, i, width, height, rng) for i in range(n)]
    if kind == "video":
        clip = re.fullmatch(r"(\d+(?:\.\d+)?)(?:@([1-9]\d*)x([1-9]\d*))?", value.lower())
        if clip is None or float(clip[1]) <= 0:
            raise ConfigError(f"--inputs {spec}: expected video:SECONDS or video:SECONDS@WIDTHxHEIGHT, e.g. video:30@1280x720")
        workdir.mkdir(parents=True, exist_ok=True)
        width, height = (int(clip[2]), int(clip[3])) if clip[2] else (640, 360)
        path = _write_video(workdir / f"clip_{value.replace('@', '_')}.mp4", float(clip[1]), width, height)
        return [path] * n  # one file: every item decodes it again, as distinct files would be
    folder = Path(spec)
    if folder.is_dir():
        from faste_mm.retrieval.scanning import document_items

        items, _ = document_items([folder])
        if not items:
            raise ConfigError(f"--inputs {spec}: no images, PDFs or text files in this folder")
        return items[:n]
    raise ConfigError(f"--inputs must be text:TOKENS, text:MIN-MAX, image:WxH, page:WxH, video:SECONDS or a folder; got {spec!r}")


def _text_of_tokens(tokens: int, tokenizer, rng: random.Random) -> str:
    words = " ".join(rng.choice(_WORDS) for _ in range(tokens * 2))
    ids = tokenizer(words, add_special_tokens=False)["input_ids"][:tokens]
    return tokenizer.decode(ids)


def _write_image(workdir: Path, index: int, width: int, height: int, rng: random.Random) -> Path:
    path = workdir / f"image_{index:05d}.png"
    Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3)).save(path)
    return path


def _write_page(workdir: Path, index: int, width: int, height: int, rng: random.Random) -> Path:
    """A text page: lines of words on white, saved as a one-page PDF."""
    page = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(page)
    for y in range(20, height - 20, 18):
        draw.text((20, y), " ".join(rng.choice(_WORDS) for _ in range(max(1, width // 60))), fill="black")
    path = workdir / f"page_{index:05d}.pdf"
    page.save(path, "PDF", resolution=72.0)
    return path


def _write_video(path: Path, seconds: float, width: int, height: int, fps: int = 25) -> Path:
    """H.264 (x264's default keyframe interval, 250 frames) of a bright square crossing a noisy
    gradient: frames differ, so decoding costs what a real clip's would."""
    import av
    import numpy as np

    width, height = width - width % 2, height - height % 2  # yuv420p needs even sizes
    rng = np.random.default_rng(0)
    base = (np.linspace(0, 160, width, dtype=np.float32)[None, :, None] + rng.integers(0, 40, (height, width, 3))).astype(np.uint8)
    side = max(8, min(width, height) // 5)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps, options={"preset": "veryfast"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(int(seconds * fps)):
            frame = base.copy()
            x, y = (i * 7) % max(1, width - side), (i * 3) % max(1, height - side)
            frame[y : y + side, x : x + side] = (255, 200 - (i % 100), (i * 5) % 256)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path
