"""The README's picture of the search page: a real `faste-mm serve` on a tiny-model collection of
generated images, a PDF report and a note, driven by Debian's chromium through Playwright (as
tests/test_serve_browser.py drives it), then screenshotted.

    python docs/tools/serve_page.py              # writes docs/serve-page.png
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # tests.serve_fixtures: the scenes the browser test shows too

from faste_mm import BatchingConfig, Embedder, Retriever  # noqa: E402
from faste_mm.testing import build_tiny_model  # noqa: E402
from tests.serve_fixtures import make_gallery  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
QUERY = "a sunset over the sea"


def build_collection(base: Path) -> Path:
    model = build_tiny_model(base / "model", "qwen3_vl")
    gallery = make_gallery(base / "Pictures", n=14)
    (gallery / "trip-notes.md").write_text("# Trip notes\n\nSunset at the harbour, then the coast road north.\n")
    embedder = Embedder.from_pretrained(str(model), device="cpu", batching=BatchingConfig(batch_tokens=1 << 16))
    Retriever(embedder, collection=base / "photos", r_max=0.5).index([gallery])
    return base / "photos"


def screenshot(collection: Path, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    server = subprocess.Popen([sys.executable, "-m", "faste_mm.cli.app", "serve", "-c", str(collection), "--port", "0",
                               "--device", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = server.stdout.readline()
        if not line.startswith("serving on "):
            raise SystemExit(f"faste-mm serve did not start: {line!r}")
        url = line.split()[-1].rstrip("/")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 760})
            page.goto(f"{url}/?q={QUERY.replace(' ', '+')}")
            page.wait_for_selector(".card")
            page.wait_for_function(
                "() => [...document.querySelectorAll('.card img')].every(i => i.complete && i.naturalWidth > 0)")
            page.screenshot(path=str(out))
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "docs" / "serve-page.png"
    with tempfile.TemporaryDirectory() as tmp:
        screenshot(build_collection(Path(tmp)), target)
    print(target)
