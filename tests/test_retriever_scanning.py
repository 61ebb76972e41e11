"""Folder scanning (kinds, hidden files, --exclude, named vs walked files), plus the generated
inputs shared by the retriever and collection CLI tests.

One tiny Qwen3-VL model is built per test run into the session's base temp directory, so every
module that asks for it gets the same files (and the same model_id) without building twice.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from faste_mm.errors import ConfigError, InputError
from faste_mm.retrieval.scanning import ScanFilter, file_kind, scan_paths
from faste_mm.testing import build_tiny_model


def tiny_vl_dir(base: Path) -> Path:
    path = base / "retriever-tiny-qwen3-vl"
    if not (path / "config.json").exists():
        build_tiny_model(path, "qwen3_vl")
    return path


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


# ---- scanning tests (no model) ---------------------------------------------------------------
def _names(scan, root: Path) -> list[str]:
    return sorted(Path(f.uri).relative_to(root.resolve()).as_posix() for f in scan.files())


def test_walk_selects_supported_files_and_skips_hidden_and_unsupported(tmp_path):
    root = make_corpus(tmp_path / "corpus")
    scan = scan_paths([root])
    assert _names(scan, root) == ["corrupt.png", "doc.pdf", "empty.jpg", "gray.jpg", "green_rgba.png",
                                  "notes.txt", "red.png", "sub/copy_of_red.png", "sub/small.bmp", "sub/wide.webp"]
    assert len(scan.files()) == CORPUS_FILES
    assert scan.roots[0][0] == str(root.resolve()) and not scan.named and not scan.missing
    assert {f.kind for f in scan.files()} == {"image", "pdf", "text"}
    with_hidden = scan_paths([root], ScanFilter(include_hidden=True))
    assert "secret.png" in {Path(f.uri).name for f in with_hidden.files()}


def test_exclude_globs_match_names_folders_and_relative_paths(tmp_path):
    root = make_corpus(tmp_path / "corpus")
    assert not any(n.endswith(".png") for n in _names(scan_paths([root], ScanFilter(exclude=("*.png",))), root))
    assert not any(n.startswith("sub/") for n in _names(scan_paths([root], ScanFilter(exclude=("sub",))), root))
    assert _names(scan_paths([root], ScanFilter(exclude=("sub/*.bmp",))), root).count("sub/small.bmp") == 0


def test_named_files_keep_unsupported_kinds_and_report_missing_paths(tmp_path):
    root = make_corpus(tmp_path / "corpus")
    scan = scan_paths([root / "readme.docx", root / "red.png", root / "nope.png"])
    assert [(f.path.name, f.kind) for f in scan.named] == [("readme.docx", "unsupported"), ("red.png", "image")]
    assert len(scan.missing) == 1 and "nope.png" in scan.missing[0][1] and "not found" in scan.missing[0][1]


def test_scan_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="exclude"):
        ScanFilter(exclude="*.png")
    with pytest.raises(InputError, match="no paths"):
        scan_paths([])
    assert file_kind(Path("A.JPEG")) == "image" and file_kind(Path("x.md")) == "text"
