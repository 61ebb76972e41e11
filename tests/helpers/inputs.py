"""Generated inputs the tests share: noise images, PDFs, a mixed corpus (and what indexing it
yields), videos and a silent audio file, short texts; and the tiny Qwen3-VL model built once per
run into the session's base temp directory (every module asking gets the same files and model_id)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from tests.helpers.tiny_models import tiny_model_dir


def tiny_vl_dir(base: Path) -> Path:
    """The tiny Qwen3-VL model (`base`: the worker's basetemp), built once per run."""
    return tiny_model_dir(base, "qwen3_vl")


def noise_image(path: Path, size: tuple[int, int], seed: int, mode: str = "RGB") -> Path:
    """A random image: distinct seeds give clearly distinct embeddings even from random weights."""
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode).save(path)
    return path


def two_page_pdf(path: Path) -> Path:
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument.new()
    for width, height in ((200, 300), (300, 200)):
        pdf.new_page(width, height)
    pdf.save(str(path))
    pdf.close()
    return path


def make_corpus(root: Path) -> Path:
    """Images of mixed sizes and modes, a duplicate, a 2-page PDF, a text file, bad files, an
    unsupported file, and a hidden folder. Returns `root`."""
    root.mkdir(parents=True, exist_ok=True)
    noise_image(root / "red.png", (100, 70), 1)
    noise_image(root / "green_rgba.png", (64, 160), 2, "RGBA")
    noise_image(root / "gray.jpg", (90, 90), 3, "L")
    (root / "sub").mkdir(exist_ok=True)
    noise_image(root / "sub" / "wide.webp", (200, 50), 4)
    noise_image(root / "sub" / "small.bmp", (40, 40), 5)
    (root / "sub" / "copy_of_red.png").write_bytes((root / "red.png").read_bytes())
    two_page_pdf(root / "doc.pdf")
    (root / "notes.txt").write_text("a red bicycle leaning on a wall", encoding="utf-8")
    (root / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not really a png")
    (root / "empty.jpg").write_bytes(b"")
    (root / "readme.docx").write_bytes(b"unsupported, ignored when walking")
    (root / ".hidden").mkdir(exist_ok=True)
    noise_image(root / ".hidden" / "secret.png", (50, 50), 6)
    return root


# What `make_corpus` yields when indexed: files the walk selects, items embedded / reused, failures.
CORPUS_FILES = 10  # 6 images (one a duplicate) + pdf + txt + corrupt + empty
CORPUS_EMBEDDED = 5 + 2 + 1  # distinct images, PDF pages, text
CORPUS_REUSED = 1  # copy_of_red.png
CORPUS_FAILED = 2  # corrupt.png, empty.jpg


def pdf_of_sizes(path: Path, sizes: list[tuple[float, float]], marks: int = 0) -> Path:
    """A PDF with one page per (width, height) in points; `marks` draws that many black boxes
    on each page (pages of different content embed differently)."""
    import pypdfium2 as pdfium
    import pypdfium2.raw as raw

    pdf = pdfium.PdfDocument.new()
    for number, (width, height) in enumerate(sizes):
        page = pdf.new_page(width, height)
        for k in range(marks + number % 3):
            box = raw.FPDFPageObj_CreateNewRect(10 + 20 * k, 10 + 15 * number % 200, 15, 30)
            raw.FPDFPageObj_SetFillColor(box, 0, 0, 0, 255)
            raw.FPDFPath_SetDrawMode(box, raw.FPDF_FILLMODE_ALTERNATE, 0)
            raw.FPDFPage_InsertObject(page.raw, box)
        raw.FPDFPage_GenerateContent(page.raw)
    pdf.save(path)
    return path


def write_video(path: Path, seconds: float, fps: int, size=(64, 48), codec="libx264", gop: int | None = None) -> Path:
    """A clip whose frames all differ (moving bar, changing colour, noise), so a wrong frame shows."""
    import av

    width, height = size
    rng = np.random.default_rng(len(str(path)))
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if gop is not None:
            stream.codec_context.gop_size = gop
        for i in range(int(seconds * fps)):
            rgb = rng.integers(0, 60, (height, width, 3), dtype=np.uint8)
            rgb[..., 0] += np.uint8((i * 9) % 190)
            rgb[:, : (i * 3) % width, 1] = 230
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_audio(path: Path) -> Path:
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=16000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 16000
        for _ in range(10):
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


# Texts of different lengths (the forward-equivalence and unpadded-kernel tests).
TEXTS = [
    "a red bicycle leaning on a wall",
    "short",
    "the quick brown fox jumps over the lazy dog " * 4,
    "Paris is the capital and largest city of France.",
]
