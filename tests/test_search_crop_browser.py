"""Search by a region on the search page, in a real browser (Debian's chromium driven by Playwright)
against a live `faste-mm serve`: a box dragged with the mouse on a hit's preview, and one drawn
with a finger (touch input) on a PDF page's, search by that region (`like` + `crop` in the
picture's own pixels, scaled from the preview's displayed size) and show its hits.

Skipped only when chromium or Playwright is missing (CI installs chromium in .ci/run).
"""

from __future__ import annotations

import math

import pytest

from faste_mm import BatchingConfig, Embedder, Retriever
from faste_mm.model.file_decoding import load_image
from faste_mm.model.items import Item
from faste_mm.retrieval.profile import read_profile
from tests.helpers.browser import CHROMIUM, browser, serving  # noqa: F401 (the shared browser fixture)
from tests.helpers.inputs import tiny_vl_dir
from tests.helpers.serve_fixtures import make_gallery, scene_image

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
BIG = (2000, 1500)  # a photo larger than its preview (1280 px), shown smaller still: two scales between


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """4 scenes, a large one and a 2-page PDF, served by `faste-mm serve -c DIR --port 0`."""
    base = tmp_path_factory.mktemp("crop-browser")
    embedder = Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu",
                                        batching=BatchingConfig(batch_tokens=1 << 16))
    gallery = make_gallery(base / "gallery", n=4)
    scene_image(gallery / "panorama.png", 7, size=BIG)
    Retriever(embedder, collection=base / "photos", r_max=0.5).index([gallery])
    with serving("-c", str(base / "photos"), "--device", "cpu") as url:
        yield url, embedder, base


def _open_preview(page, card) -> tuple[int, dict]:
    """Open the preview of the hit on `card`: (its id, the displayed picture's box)."""
    item_id = int(card.get_attribute("data-id"))
    card.locator(".thumb").click()
    page.wait_for_selector("#lightbox-hint:not([hidden])")  # the preview said its picture's size: a region can be drawn
    page.wait_for_function("() => { const i = document.querySelector('#lightbox-img'); "
                           "return i.complete && i.naturalWidth > 0; }")
    return item_id, page.locator("#lightbox-img").bounding_box()


def _expected_crop(frame: dict, start: tuple[float, float], end: tuple[float, float], size: tuple[int, int]) -> list:
    sx, sy = size[0] / frame["width"], size[1] / frame["height"]
    x, y = math.floor((start[0] - frame["x"]) * sx), math.floor((start[1] - frame["y"]) * sy)
    return [x, y, round((end[0] - start[0]) * sx), round((end[1] - start[1]) * sy)]


def _region_search(page, action) -> dict:
    """The body of the /search request `action` makes, once its hits are on screen."""
    with page.expect_request(lambda r: r.url.endswith("/search") and "crop" in (r.post_data or "")) as asked:
        action()
    body = asked.value.post_data_json
    page.wait_for_function(f"() => document.querySelector('#status-text').textContent"
                           f".includes('region of #{body['id']}')")
    return body


def _close(expected: list, sent: list) -> bool:
    return all(abs(a - b) <= 1 for a, b in zip(expected, sent))  # a pixel of rounding in the browser's layout


def test_a_box_dragged_on_a_hits_preview_searches_by_that_region(browser, server):
    url, embedder, base = server
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url + "/?q=a+wide+view&k=12")
    page.wait_for_selector(".card img")
    item_id, frame = _open_preview(page, page.locator(".card", has=page.locator(".name", has_text="panorama.png")))
    assert frame["width"] < 1280  # shown smaller than its preview, which is smaller than the picture
    start = (frame["x"] + frame["width"] * 0.2, frame["y"] + frame["height"] * 0.25)
    end = (frame["x"] + frame["width"] * 0.6, frame["y"] + frame["height"] * 0.7)

    def drag():
        page.mouse.move(*start)
        page.mouse.down()
        page.mouse.move((start[0] + end[0]) / 2, (start[1] + end[1]) / 2, steps=3)
        assert page.locator("#crop-box").is_visible()  # the box follows the pointer
        page.mouse.move(*end, steps=3)
        page.mouse.up()

    body = _region_search(page, drag)
    expected = _expected_crop(frame, start, end, BIG)
    assert body["id"] == item_id and _close(expected, body["crop"]), (expected, body)
    assert page.locator("#lightbox").is_hidden() and f"id={item_id}" in page.url and "crop=" in page.url
    with Retriever(embedder, collection=base / "photos") as retriever:
        hits = retriever.more_like(item_id, crop=tuple(body["crop"]), k=12)
    assert page.eval_on_selector_all(".card", "cards => cards.map(c => Number(c.dataset.id))") == [h.id for h in hits]
    assert item_id not in [h.id for h in hits]

    # a click on the preview (no box) searches nothing; reloading the URL searches the same region again
    _open_preview(page, page.locator(".card").first)
    page.locator("#lightbox-img").click()
    assert page.locator("#lightbox").is_visible() and "region of" in page.inner_text("#status-text")
    page.keyboard.press("Escape")
    page.reload()
    page.wait_for_function(f"() => document.querySelector('#status-text').textContent.includes('region of #{item_id}')")
    assert not errors, errors


def test_a_box_drawn_with_a_finger_on_a_pdf_pages_preview_searches_by_that_region(browser, server):
    url, embedder, base = server
    context = browser.new_context(viewport={"width": 1280, "height": 860}, has_touch=True)
    page = context.new_page()
    page.goto(url + "/?q=a+report&k=12")
    page.wait_for_selector(".card img")
    card = page.locator(".card[data-kind='pdf']").first
    page_number = int(card.locator(".page").inner_text().split()[-1])
    item_id, frame = _open_preview(page, card)
    rendered = load_image(Item(image=base / "gallery" / "report.pdf", page=page_number),
                          read_profile(base / "photos").max_pixels)
    start = (frame["x"] + frame["width"] * 0.1, frame["y"] + frame["height"] * 0.1)
    end = (frame["x"] + frame["width"] * 0.5, frame["y"] + frame["height"] * 0.4)
    cdp = context.new_cdp_session(page)

    def touch(kind: str, at: tuple[float, float] | None) -> None:
        cdp.send("Input.dispatchTouchEvent", {"type": kind, "touchPoints": [] if at is None else
                                              [{"x": at[0], "y": at[1], "id": 1}]})

    def draw():
        touch("touchStart", start)
        touch("touchMove", ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2))
        touch("touchMove", end)
        touch("touchEnd", None)

    body = _region_search(page, draw)
    expected = _expected_crop(frame, start, end, rendered.size)
    assert body["id"] == item_id and _close(expected, body["crop"]), (expected, body)
    with Retriever(embedder, collection=base / "photos") as retriever:
        hits = retriever.more_like(item_id, crop=tuple(body["crop"]), k=12)
    assert page.eval_on_selector_all(".card", "cards => cards.map(c => Number(c.dataset.id))") == [h.id for h in hits]
    context.close()
