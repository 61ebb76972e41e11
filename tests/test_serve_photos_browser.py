"""The search page's photo controls in a real browser (chromium via Playwright) against a live
`faste-mm serve`: a query typed in Japanese, a date range, the order toggle, the minimum-score
slider, and each card's date taken and place; the state survives a reload from the URL."""

from __future__ import annotations


import pytest

from faste_mm import Embedder, Retriever
from tests.helpers.photo_fixtures import make_dated_photos
from tests.helpers.inputs import tiny_vl_dir
from tests.helpers.browser import CHROMIUM, browser, serving  # noqa: F401 (the shared browser fixture)

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
# The photos: tests/helpers/photo_fixtures.py's DATED_PHOTOS (p0 in Lisbon, p4 undated)
QUERY = "海辺の夕日"  # "sunset at the beach"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("serve-photos")
    make_dated_photos(base / "photos", seed=20, titled=True)
    embedder = Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu")
    Retriever(embedder, collection=base / "col", r_max=0.0).index([base / "photos"])
    with serving("-c", str(base / "col"), "--device", "cpu") as url:
        yield url


def _names(page) -> list[str]:
    return page.locator(".card .name").all_inner_texts()


def _searched(page, action) -> None:
    """Run `action` and wait for the search it starts to be rendered."""
    with page.expect_response(lambda r: r.url.endswith("/search")):
        action()
    page.wait_for_function("() => !document.body.classList.contains('busy')")


def test_photo_filters_order_and_a_japanese_query_in_the_page(browser, server):  # noqa: F811
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(server + "/")
    page.wait_for_selector("#collection strong")

    page.fill("#q", QUERY)  # non-Latin input: typed, sent, echoed and kept in the URL
    _searched(page, lambda: page.press("#q", "Enter"))
    assert page.locator(".card").count() == 5
    assert QUERY in page.inner_text("#status-text") and page.input_value("#q") == QUERY
    lisbon = page.locator(".card", has_text="p0.jpg").locator(".facts").inner_text()
    assert lisbon.startswith("2021-06-01") and "Lisbon, Portugal" in lisbon and "Google Pixel 8" in lisbon
    assert page.locator(".card", has_text="p4.jpg").locator(".facts").inner_text() == "no date · Google Pixel 8"

    _searched(page, lambda: page.select_option("#f-sort", "-date"))  # newest first, the undated photo last
    assert _names(page) == ["p3.jpg", "p2.jpg", "p1.jpg", "p0.jpg", "p4.jpg"]
    _searched(page, lambda: page.fill("#f-since", "2023-01-01"))
    _searched(page, lambda: page.fill("#f-until", "2024-06-30"))
    assert _names(page) == ["p2.jpg", "p1.jpg"]  # the undated photo is left out of a date range
    assert "since=2023-01-01" in page.url and "sort=-date" in page.url

    _searched(page, lambda: page.fill("#f-min", "1"))  # nothing scores a cosine of 1 against a text
    assert page.locator(".card").count() == 0 and page.inner_text("#f-min-value") == "1.00"
    _searched(page, lambda: page.fill("#f-min", "0"))
    assert page.inner_text("#f-min-value") == "off" and page.locator(".card").count() == 2
    _searched(page, lambda: page.fill("#f-min", "0.5"))
    page.select_option("#mode", "lexical")  # words: no cosine to cut by, so the slider is off, not an error
    assert page.locator("#f-min").is_disabled() and page.inner_text("#f-min-value") == "n/a"
    page.fill("#q", "photo")
    _searched(page, lambda: page.press("#q", "Enter"))
    assert page.locator(".card").count() == 2 and "min=" not in page.url
    page.select_option("#mode", "dense")
    assert page.locator("#f-min").is_enabled() and page.inner_text("#f-min-value") == "0.50"
    _searched(page, lambda: page.fill("#f-min", "0"))
    page.fill("#q", QUERY)
    _searched(page, lambda: page.press("#q", "Enter"))

    page.reload()  # the query, the range and the order come back from the URL
    page.wait_for_selector(".card")
    page.wait_for_function("() => !document.body.classList.contains('busy')")
    assert page.input_value("#q") == QUERY and page.input_value("#f-since") == "2023-01-01"
    assert _names(page) == ["p2.jpg", "p1.jpg"]
    assert not errors, errors
