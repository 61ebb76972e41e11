"""The code blocks of README.md and docs/*.md, and the sandbox they run in (tests/test_docs_blocks.py).

A fenced block tagged `bash`, `sh`, `shell` or `console` runs in bash (`console`: only its `$ `
lines), one tagged `python` runs in the document's Python session; other tags (`text`, `json`,
...) are not run. An HTML comment on the line right before the fence skips a block, with the
reason the suite reports: `<!-- skip: needs CUDA -->` (docs/contributing.md lists the reasons).

The sandbox is a fresh folder per document: HOME with ~/Pictures, ~/papers and ~/scans, a
working folder with the sample files the docs name (photos/, images/, query.jpg, report.pdf,
clip.mp4, ...), and the hub ids the docs use replaced by tiny random-weight models.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

from tests.helpers.serve_fixtures import make_gallery, scene_image

ROOT = Path(__file__).resolve().parents[2]
SHELL_TAGS = {"bash", "sh", "shell", "console"}
RUN_TAGS = SHELL_TAGS | {"python"}
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<tag>[\w+-]*)")
_SKIP = re.compile(r"^\s*<!--\s*skip:\s*(?P<reason>.+?)\s*-->\s*$")
# Pages of benchmark commands and their recorded runs: every block there is a long benchmark.
BENCHMARK_PAGES = {"benchmarks.md", "benchmarks-log.md", "performance.md"}


@dataclass(frozen=True, slots=True)
class Block:
    path: Path      # the document
    line: int       # 1-based line of the opening fence
    tag: str        # the fence's language tag, lower case
    code: str       # the block's text, its indentation removed
    skip: str | None  # the reason given by a `<!-- skip: ... -->` comment, else None

    @property
    def label(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.tag in RUN_TAGS and self.skip is None


def documents() -> list[Path]:
    """README.md and every markdown file under docs/, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def extract(path: Path) -> list[Block]:
    """Every fenced block of `path` (indented fences inside list items too), in order."""
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        body = [line[indent:] if line[:indent].strip() == "" else line for line in lines[i + 1:end]]
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        skip = _SKIP.match(previous)
        reason = skip["reason"] if skip else None
        if reason is None and path.name in BENCHMARK_PAGES and opening["tag"].lower() in RUN_TAGS:
            reason = "long benchmark (a benchmark page: its commands reproduce recorded runs)"
        blocks.append(Block(path, i + 1, opening["tag"].lower(), "\n".join(body) + "\n", reason))
        i = end + 1
    return blocks


def shell_script(block: Block) -> str:
    """The commands of a shell block (`console`: the `$ ` lines only, output lines dropped).
    A line that is only `pip install ...` is left out: the test extra installs every extra the
    docs name, and a test never installs packages."""
    lines = block.code.split("\n")
    if block.tag == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    kept = [line for line in lines if not re.match(r"\s*(python -m )?pip install\b", line)]
    return "\n".join(kept).strip("\n") + "\n"


# Values a tiny model (64 dimensions) cannot take, scaled down for it; the docs keep the real ones.
TINY_VALUES = {"--dim 512": "--dim 32", "dim=512": "dim=32"}


def substitute(code: str, models: dict[str, Path]) -> str:
    """The block with each hub id replaced by its tiny stand-in's folder and each of
    `TINY_VALUES` by the value the tiny model takes."""
    for hub_id, folder in models.items():
        code = code.replace(hub_id, str(folder))
    for real, tiny in TINY_VALUES.items():
        code = code.replace(real, tiny)
    return code


def _write_video(path: Path, seconds: float = 2, fps: int = 4, size: tuple[int, int] = (96, 64)) -> None:
    import av
    import numpy as np

    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        for i in range(int(seconds * fps)):
            pixels = np.full((size[1], size[0], 3), (40 * i) % 255, dtype=np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())


def _one_page_pdf(path: Path) -> Path:
    """A one-page report (a title bar and lines of "text"). One page, because a page is embedded
    at the pixel cap (1,800 visual tokens): the tower's cost, even for a tiny model."""
    page = Image.new("RGB", (400, 520), "white")
    draw = ImageDraw.Draw(page)
    draw.rectangle((32, 32, 368, 58), fill=(79, 70, 229))
    for row in range(14):
        draw.rectangle((32, 84 + row * 26, 368 - (row * 37) % 120, 93 + row * 26), fill=(200, 204, 214))
    page.save(path, "PDF", resolution=144)
    return path


def _photos(root: Path, n: int) -> Path:
    """`n` generated scenes (no PDF) in `root`."""
    make_gallery(root, n=n)
    (root / "report.pdf").unlink()
    return root


def make_sandbox(root: Path) -> tuple[Path, Path]:
    """(home, work): the files the documented commands name (docs/contributing.md lists them).
    Small on purpose: a few 160x120 images, one-page PDFs, notes, a 2-second clip."""
    home, work = root / "home", root / "work"
    _photos(home / "Pictures", 4)
    (home / "papers").mkdir(parents=True)
    _one_page_pdf(home / "papers" / "report.pdf")
    (home / "papers" / "notes.md").write_text("# Notes\n\nThe invoice INV-2024-001 from Müller: total amount 120 EUR.\n")
    _one_page_pdf((home / "scans").mkdir() or home / "scans" / "scan-1.pdf")
    scene_image(home / "scans" / "receipt.png", 7)
    work.mkdir(parents=True)
    _photos(work / "images", 2)
    _photos(work / "photos", 3)
    (work / "photos" / "day2").mkdir()
    scene_image(work / "photos" / "day2" / "harbour.png", 11)
    (work / "docs").mkdir()
    _one_page_pdf(work / "docs" / "invoice.pdf")
    (work / "docs" / "notes.txt").write_text("a red bicycle leaning on a wall, and the invoice total for March\n")
    for name, seed in (("query.jpg", 2), ("photo.jpg", 3), ("cat.png", 4), ("scan.png", 5), ("page.png", 6), ("x.png", 8)):
        scene_image(work / name, seed)
    _one_page_pdf(work / "report.pdf")
    (work / "notes.txt").write_text("notes about a red bicycle and a quarterly report\n")
    (work / "my-queries.txt").write_text("a red bicycle\nthe invoice total\n")
    _write_video(work / "clip.mp4")
    return home, work
