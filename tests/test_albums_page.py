"""The search page's album strip (faste_mm/serving/static/albums.js) in a real browser: the
collection's albums listed as buttons, one clicked shows its members as the results (the same ids,
in the same order, as `Albums.show`), and `/?album=NAME` opens it from a link."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="needs the serve extra: pip install 'faste-mm[serve]'")

from faste_mm import BatchingConfig, Embedder, Retriever  # noqa: E402
from tests.helpers.browser import CHROMIUM, browser, serving  # noqa: E402, F401 (the shared browser fixture)
from tests.helpers.inputs import tiny_vl_dir  # noqa: E402
from tests.helpers.serve_fixtures import scene_image  # noqa: E402

from playwright.sync_api import expect  # noqa: E402

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")


def test_the_page_lists_the_albums_and_shows_one_as_its_results(browser, tmp_path_factory):  # noqa: F811
    base = tmp_path_factory.mktemp("albums-page")
    (base / "photos").mkdir()
    for i in range(5):
        scene_image(base / "photos" / f"p{i}.png", i)
    embedder = Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu",
                                        batching=BatchingConfig(batch_tokens=1 << 16))
    with Retriever(embedder, collection=base / "col", r_max=0.0) as retriever:
        retriever.index([base / "photos"])
        sunsets = [h.id for h in retriever.albums().add("sunsets", "a sunset at the beach", limit=3).hits]
        streets = [h.id for h in retriever.albums().add("streets", "a street at night", limit=2).hits]
    with serving("-c", str(base / "col"), "--device", "cpu") as url:
        page = browser.new_page(viewport={"width": 1280, "height": 820})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(url + "/")
        page.wait_for_selector("#albums button.album")
        assert page.locator("#albums button.album").all_inner_texts() == ["streets", "sunsets"]
        page.click("#albums button[data-album=sunsets]")
        expect(page.locator("#albums button.active")).to_have_text("sunsets")
        expect(page.locator(".card")).to_have_count(3)
        assert _card_ids(page) == sunsets
        assert "album=sunsets" in page.url
        page.goto(url + "/?album=streets")  # a link to an album opens it
        expect(page.locator("#albums button.active")).to_have_text("streets")
        expect(page.locator(".card")).to_have_count(2)
        assert _card_ids(page) == streets
        assert not errors, errors


def _card_ids(page) -> list[int]:
    return [int(card.get_attribute("data-id")) for card in page.locator(".card").all()]
