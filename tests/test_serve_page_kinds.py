"""The search page with every kind of item, in Debian's chromium (Playwright) against a live
`faste-mm serve` on loopback: a video shows a frame of itself as its thumbnail (not a 404) and a
play badge, a note shows as a note, and the filter controls (type, path, metadata) return what
the API returns for the same filters. A screenshot is saved under the test's tmp dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="needs the serve extra: pip install 'faste-mm[serve]'")
pytest.importorskip("av")

from faste_mm import BatchingConfig, Embedder, Item, Retriever  # noqa: E402
from faste_mm.serving.thumbnails import thumbnail  # noqa: E402
from tests.helpers.browser import CHROMIUM, browser, serving  # noqa: E402, F401 (the shared browser fixture)
from tests.helpers.serve_fixtures import scene_image  # noqa: E402
from tests.helpers.inputs import tiny_vl_dir  # noqa: E402
from tests.helpers.inputs import write_video  # noqa: E402


@pytest.fixture(scope="module")
def collection(tmp_path_factory) -> Path:
    """3 images, a video, a .txt note in the folder, and a note with metadata added by the API."""
    base = tmp_path_factory.mktemp("page-kinds")
    folder = base / "mixed"
    folder.mkdir()
    for i in range(3):
        scene_image(folder / f"scene-{i}.png", i + 1)
    write_video(folder / "clip.mp4", seconds=2, fps=4, size=(96, 64))
    (folder / "groceries.txt").write_text("milk, bread, apples and a bag of coffee beans", encoding="utf-8")
    embedder = Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu",
                                        batching=BatchingConfig(batch_tokens=1 << 16))
    with Retriever(embedder, collection=base / "col", r_max=0.0) as retriever:
        retriever.index([folder])
        retriever.add([Item(text="notes about a picnic by the lake")], uris=["notes:picnic"],
                      metadata=[{"year": 2024}])
    return base / "col"


def test_a_video_thumbnail_is_a_frame_of_the_video(collection, tmp_path):
    from faste_mm.indexers import Collection

    with Collection.open(collection) as col:
        records = col.get(sorted(col.live_ids(range(1000))))
    video = next(r for r in records if r.uri.endswith("clip.mp4"))
    import io

    from PIL import Image

    with Image.open(io.BytesIO(thumbnail(video, tmp_path / "thumbs"))) as picture:
        assert picture.format == "JPEG" and picture.size == (96, 64)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_the_page_shows_videos_and_notes_and_filters_like_the_api(collection, browser, tmp_path):  # noqa: F811
    with serving("-c", str(collection), "--device", "cpu") as url:
        page = browser.new_page(viewport={"width": 1280, "height": 820})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(url + "/")
        page.wait_for_selector("#collection strong")
        page.fill("#q", "a short clip")
        page.press("#q", "Enter")
        page.wait_for_selector(".card")
        assert page.locator(".card").count() == 6  # 3 images, the video, 2 notes
        video = page.locator('.card[data-kind="video"]')
        assert video.count() == 1 and video.locator(".kind").inner_text().lower() == "video"
        page.wait_for_function("() => [...document.querySelectorAll('.card img')].every(i => i.complete && i.naturalWidth > 0)")
        assert video.locator("img").evaluate("i => i.naturalWidth") > 0  # a frame, not a 404
        assert page.locator('.card[data-kind="text"] .note').count() == 2
        assert page.locator('.card[data-kind="text"] .ext').all_inner_texts() != []
        page.screenshot(path=str(tmp_path / "kinds.png"))
        if os.environ.get("FASTE_MM_SCREENSHOT_KINDS"):
            page.screenshot(path=os.environ["FASTE_MM_SCREENSHOT_KINDS"], full_page=True)

        def names() -> list[str]:
            page.wait_for_function("() => !document.body.classList.contains('busy')")
            return sorted(page.locator(".card .name").all_inner_texts())

        page.select_option("#f-type", "video")
        page.wait_for_function("() => document.querySelectorAll('.card').length === 1")
        assert names() == ["clip.mp4"] and "type=video" in page.url
        page.select_option("#f-type", "text")
        page.wait_for_function("() => document.querySelectorAll('.card').length === 2")
        page.fill("#f-where", "year=2024")
        page.press("#f-where", "Enter")
        page.wait_for_function("() => document.querySelectorAll('.card').length === 1")
        assert names() == ["notes:picnic"]
        page.click("#f-clear")
        page.fill("#f-path", "*.png")
        page.press("#f-path", "Enter")
        page.wait_for_function("() => document.querySelectorAll('.card').length === 3")
        assert names() == ["scene-0.png", "scene-1.png", "scene-2.png"]
        page.fill("#f-where", "nonsense")
        page.press("#f-where", "Enter")
        page.wait_for_selector("#banner:not([hidden])")
        assert "KEY=VALUE" in page.inner_text("#banner")
        page.close()
        assert not errors, errors
