"""Document-like inputs drawn by the benchmarks themselves (Pillow, DejaVu or Pillow's own font),
not random noise: a text page with margins, a two-column paper page, a slide and a screenshot of
the search page. Each is what duplicate-patch removal meets in a real folder (blank margins,
flat backgrounds, repeated rules and panels) and is saved as a PNG, a kind it applies to.

Receives a folder and a seed; hands on {kind: [paths]} for `faste_mm.bench.patch_dedup`.
"""

from __future__ import annotations

import random
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

PAGE_KINDS = ("text-page", "paper-2col", "slide", "screenshot")
_WORDS = ("retrieval embedding compression readout prefix layer vision tower patch merge token page "
          "document query index search model vector budget attention position frame batch result "
          "the of and a to in is for on with as by that this from are be at an or it").split()


def _font(size: int, bold: bool = False) -> ImageFont.ImageFont:
    name = "DejaVuSans-Bold.ttf" if bold else "DejaVuSans.ttf"
    for folder in ("/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/dejavu"):
        if (Path(folder) / name).exists():
            return ImageFont.truetype(str(Path(folder) / name), size)
    return ImageFont.load_default(size=size)  # Pillow's own FreeType font


def _line(rng: random.Random, width_px: int, size: int) -> str:
    words = []
    while sum(len(w) + 1 for w in words) * size * 0.55 < width_px:
        words.append(rng.choice(_WORDS))
    return " ".join(words[:-1])


def _paragraphs(draw: ImageDraw.ImageDraw, rng: random.Random, box: tuple[int, int, int, int], size: int,
                gap: int = 3) -> None:
    """Lines of words filling `box` (left, top, right, bottom), a blank line between paragraphs."""
    left, top, right, bottom = box
    font = _font(size)
    y = top
    while y + size < bottom:
        lines = rng.randint(3, 8)
        for index in range(lines):
            if y + size >= bottom:
                break
            width = right - left if index < lines - 1 else rng.randint((right - left) // 3, right - left)
            draw.text((left, y), _line(rng, width, size), fill=(20, 20, 20), font=font)
            y += size + gap
        y += size


def text_page(rng: random.Random) -> Image.Image:
    """An A4 page at 150 dpi (1240 x 1754) with 1-inch margins, a heading, body text, a page number."""
    page = Image.new("RGB", (1240, 1754), "white")
    draw = ImageDraw.Draw(page)
    draw.text((150, 150), "Chapter " + str(rng.randint(1, 9)) + ": " + _line(rng, 500, 30).title(),
              fill="black", font=_font(30, bold=True))
    _paragraphs(draw, rng, (150, 230, 1090, 1560), 17)
    draw.text((610, 1640), str(rng.randint(1, 300)), fill="black", font=_font(16))
    return page


def paper_page(rng: random.Random) -> Image.Image:
    """A two-column paper page (US letter at 150 dpi, 1275 x 1650): title, authors, two columns with
    a figure box, narrow margins."""
    page = Image.new("RGB", (1275, 1650), "white")
    draw = ImageDraw.Draw(page)
    draw.text((180, 110), _line(rng, 900, 28).title(), fill="black", font=_font(28, bold=True))
    draw.text((400, 160), "A. Author, B. Author, C. Author", fill=(40, 40, 40), font=_font(18))
    column, gutter, left = 500, 55, 110
    for index in range(2):
        x = left + index * (column + gutter)
        if index == 1:  # a figure: a framed plot with axes and a curve
            draw.rectangle((x, 240, x + column, 600), outline=(0, 0, 0), width=2)
            draw.line([(x + 40 + i * 4, 560 - int(300 * (i / 110) ** 0.5)) for i in range(110)], fill=(30, 60, 200), width=3)
            draw.text((x, 612), "Figure 1: " + _line(rng, column - 100, 14), fill="black", font=_font(14))
            _paragraphs(draw, rng, (x, 660, x + column, 1520), 14, gap=2)
        else:
            _paragraphs(draw, rng, (x, 240, x + column, 1520), 14, gap=2)
    draw.text((630, 1560), str(rng.randint(1, 12)), fill="black", font=_font(14))
    return page


def slide(rng: random.Random) -> Image.Image:
    """A 16:9 slide (1600 x 900): a coloured title bar, bullets on a flat background, a footer."""
    page = Image.new("RGB", (1600, 900), (248, 248, 244))
    draw = ImageDraw.Draw(page)
    draw.rectangle((0, 0, 1600, 130), fill=(24, 64, 120))
    draw.text((70, 40), _line(rng, 900, 44).title(), fill="white", font=_font(44, bold=True))
    for index in range(rng.randint(4, 6)):
        y = 200 + index * 95
        draw.ellipse((90, y + 12, 106, y + 28), fill=(24, 64, 120))
        draw.text((130, y), _line(rng, rng.randint(600, 1100), 32), fill=(30, 30, 30), font=_font(32))
    draw.line((70, 830, 1530, 830), fill=(180, 180, 180), width=2)
    draw.text((70, 845), "faste-mm  |  " + str(rng.randint(1, 40)), fill=(120, 120, 120), font=_font(20))
    return page


def screenshot(rng: random.Random) -> Image.Image:
    """A 1440 x 900 screenshot of a search page: header bar, search box, a result list with
    thumbnails and snippets, a sidebar of filters."""
    page = Image.new("RGB", (1440, 900), "white")
    draw = ImageDraw.Draw(page)
    draw.rectangle((0, 0, 1440, 64), fill=(32, 33, 36))
    draw.text((24, 18), "faste-mm", fill="white", font=_font(24, bold=True))
    draw.rounded_rectangle((260, 12, 1000, 52), radius=20, fill="white", outline=(200, 200, 200))
    draw.text((285, 20), " ".join(rng.choice(_WORDS) for _ in range(4)), fill=(60, 60, 60), font=_font(20))
    draw.rectangle((0, 64, 220, 900), fill=(245, 246, 248))
    for index, label in enumerate(("All", "Images", "PDF pages", "Videos", "Text")):
        draw.text((24, 100 + index * 40), label, fill=(40, 40, 40), font=_font(18))
    for index in range(6):
        y = 100 + index * 130
        shade = tuple(rng.randint(60, 220) for _ in range(3))
        draw.rectangle((260, y, 360, y + 100), fill=shade)
        draw.text((380, y), _line(rng, 600, 22).title(), fill=(26, 13, 171), font=_font(22))
        draw.text((380, y + 34), _line(rng, 900, 16), fill=(60, 60, 60), font=_font(16))
        draw.text((380, y + 58), _line(rng, 700, 16), fill=(60, 60, 60), font=_font(16))
        draw.text((380, y + 82), f"score 0.{rng.randint(40, 99)}", fill=(0, 120, 0), font=_font(14))
    return page


_RENDER = {"text-page": text_page, "paper-2col": paper_page, "slide": slide, "screenshot": screenshot}


def render_pages(folder: Path, kinds: list[str], n: int, seed: int = 0) -> dict[str, list[Path]]:
    """`n` PNG images of each of `kinds` (PAGE_KINDS) in `folder`, different text on each."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    out: dict[str, list[Path]] = {}
    for kind in kinds:
        out[kind] = []
        for index in range(n):
            path = folder / f"{kind}-{index:03d}.png"
            _RENDER[kind](rng).save(path)
            out[kind].append(path)
    return out
