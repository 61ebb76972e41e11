"""Generated inputs for the server tests: colourful, clearly distinct images (so the search
page's screenshot shows something a person can tell apart) and a small indexed collection."""

from __future__ import annotations

import colorsys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

SCENES = ("sunset", "forest", "ocean", "desert", "aurora", "lavender", "citrus", "glacier",
          "ember", "meadow", "dusk", "coral", "orchid", "slate")


def scene_image(path: Path, seed: int, size: tuple[int, int] = (160, 120)) -> Path:
    """A gradient with a few soft shapes; hue, layout and shapes follow `seed`."""
    rng = np.random.default_rng(seed)
    width, height = size
    hue = (seed * 0.137) % 1.0
    top = np.array(colorsys.hsv_to_rgb(hue, 0.55, 0.95)) * 255
    bottom = np.array(colorsys.hsv_to_rgb((hue + 0.12) % 1.0, 0.85, 0.45)) * 255
    t = np.linspace(0, 1, height)[:, None, None]
    pixels = (top * (1 - t) + bottom * t).repeat(width, axis=1).astype(np.uint8)
    image = Image.fromarray(pixels, "RGB")
    draw = ImageDraw.Draw(image, "RGBA")
    for _ in range(3):
        r = int(rng.integers(height // 8, height // 3))
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        shade = tuple(int(c * 255) for c in colorsys.hsv_to_rgb((hue + rng.uniform(0.3, 0.7)) % 1.0, 0.5, 1.0))
        draw.ellipse((x - r, y - r, x + r, y + r), fill=(*shade, 150))
    horizon = int(height * rng.uniform(0.6, 0.8))
    draw.polygon([(0, height), (0, horizon), (width // 3, horizon - height // 6), (2 * width // 3, horizon),
                  (width, horizon - height // 10), (width, height)], fill=(20, 24, 40, 120))
    image.save(path)
    return path


def make_gallery(root: Path, n: int = 10) -> Path:
    """`n` scene images and a two-page PDF report (a page of "text" lines and a chart) under
    `root`. Returns root."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        scene_image(root / f"{SCENES[i % len(SCENES)]}-{i}.png", i + 1)
    pages = [_report_page((400, 520), chart=False), _report_page((520, 400), chart=True)]
    pages[0].save(root / "report.pdf", "PDF", save_all=True, append_images=pages[1:], resolution=144)
    return root


def _report_page(size: tuple[int, int], chart: bool) -> Image.Image:
    page = Image.new("RGB", size, (255, 255, 255))
    draw = ImageDraw.Draw(page)
    width, height = size
    draw.rectangle((32, 32, width - 32, 58), fill=(79, 70, 229))
    if chart:
        for i, value in enumerate((0.35, 0.6, 0.45, 0.8, 0.7, 0.95)):
            x = 48 + i * (width - 96) // 6
            draw.rectangle((x, height - 40 - int(value * (height - 130)), x + (width - 96) // 8, height - 40),
                           fill=(124, 58, 237) if i % 2 else (99, 102, 241))
        return page
    for row in range(16):
        y = 84 + row * 26
        draw.rectangle((32, y, width - 32 - (row * 37) % 120, y + 9), fill=(200, 204, 214))
    return page


def served_photo_folder(embedder, tmp_path: Path, new_seeds: dict[str, int]):
    """A folder with one indexed photo (the collection a served watcher starts from), then the
    photos named in `new_seeds` written beside it, not yet indexed: (folder, seed Retriever)."""
    from faste_mm import Retriever

    folder = tmp_path / "photos"
    folder.mkdir()
    scene_image(folder / "harbour.png", 3)
    seed = Retriever(embedder, collection=tmp_path / "col", r_max=0.5)
    seed.index([folder])  # the served collection exists before serve starts
    for name, image_seed in new_seeds.items():
        scene_image(folder / name, image_seed)
    return folder, seed
