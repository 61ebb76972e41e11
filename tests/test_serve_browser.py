"""The search page in a real browser (Debian's chromium driven by Playwright) against a live
`faste-mm serve` subprocess on a loopback port: load, type a query, see k thumbnails, upload an
image, "more like this", reload from the URL; a screenshot is saved under the test's tmp dir.

Skipped only when chromium or Playwright is missing (CI installs chromium in .ci/run).
"""

from __future__ import annotations

import os

import pytest

from faste_mm import BatchingConfig, Embedder, Retriever
from faste_mm.retrieval.search_request import DEFAULTS, OPTIONS
from faste_mm.serving.options_route import search_options
from tests.helpers.browser import CHROMIUM, browser, serving  # noqa: F401 (the shared browser fixture)
from tests.helpers.serve_fixtures import make_gallery, scene_image
from tests.helpers.inputs import tiny_vl_dir
from tests.helpers.tiny_models import tiny_model_dir

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
K = 6


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A collection of 10 images + a 2-page PDF, served by `faste-mm serve -c DIR --port 0`."""
    base = tmp_path_factory.mktemp("serve-browser")
    model = tiny_vl_dir(tmp_path_factory.getbasetemp())
    embedder = Embedder.from_pretrained(str(model), device="cpu", batching=BatchingConfig(batch_tokens=1 << 16))
    gallery = make_gallery(base / "gallery")
    Retriever(embedder, collection=base / "photos", r_max=0.5).index([gallery])
    reranker = tiny_model_dir(tmp_path_factory.getbasetemp(), "qwen3_vl_reranker")  # the page's rerank toggle and "why"
    with serving("-c", str(base / "photos"), "--device", "cpu", "--rerank", str(reranker)) as url:
        yield url, base


def _thumbnails_loaded(page) -> int:
    return page.evaluate("[...document.querySelectorAll('.card img')].filter(i => i.complete && i.naturalWidth > 0).length")


def _watched_page(browser):
    """A desktop-sized page and the list its script errors and Content-Security-Policy blocks land in."""
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    # The page runs under its Content-Security-Policy: anything it blocks is reported here.
    page.on("console", lambda message: errors.append(message.text) if "Content Security Policy" in message.text else None)
    return page, errors


def test_search_page_queries_uploads_more_like_this_and_reloads_from_the_url(browser, server, tmp_path):
    url, base = server
    page, errors = _watched_page(browser)
    page.goto(url + "/")
    page.wait_for_selector("#collection strong")
    assert "12 items" in page.inner_text("#collection")  # 10 images + 2 PDF pages

    # type a query, Enter submits: k cards (k past the 12 items), each image with its thumbnail, the query in the URL
    page.select_option("#k", str(search_options()["page"]["k"][1]))
    page.fill("#q", "a sunset over the sea")
    page.press("#q", "Enter")
    page.wait_for_selector(".card")
    assert page.locator(".card").count() == 12
    page.wait_for_function("() => [...document.querySelectorAll('.card img')].every(i => i.complete && i.naturalWidth > 0)")
    assert _thumbnails_loaded(page) == 12  # every hit here is an image or a PDF page
    assert "q=a+sunset+over+the+sea" in page.url
    assert page.locator(".card .page").all_inner_texts().count("page 1") == 1
    page.screenshot(path=str(tmp_path / "search.png"))
    page.emulate_media(color_scheme="dark")
    page.wait_for_timeout(400)  # let the colour transitions finish (a picture, not an assertion)
    page.screenshot(path=str(tmp_path / "search-dark.png"))
    page.emulate_media(color_scheme="light")
    if os.environ.get("FASTE_MM_SCREENSHOT"):  # refresh the README's picture: FASTE_MM_SCREENSHOT=docs/serve-page.png
        page.screenshot(path=os.environ["FASTE_MM_SCREENSHOT"], full_page=True)

    # upload an image: the search runs with it and the image chip shows
    scene_image(tmp_path / "query.png", 3)
    page.set_input_files("#image", str(tmp_path / "query.png"))
    page.wait_for_selector("#image-chip:not([hidden])")
    page.wait_for_function("() => document.querySelector('#status-text').textContent.includes('query.png')")
    first_after_upload = page.locator(".card .name").first.inner_text()
    assert first_after_upload  # the grid re-rendered with results for the image

    # more like this: searches with that item, leaves it out, puts its id in the URL
    card = page.locator(".card").nth(1)
    chosen = card.get_attribute("data-id")
    card.locator(".more").click()
    page.wait_for_function(f"() => document.querySelector('#status-text').textContent.includes('#{chosen}')")
    assert f"id={chosen}" in page.url
    assert chosen not in page.locator(".card").evaluate_all("cards => cards.map(c => c.dataset.id)")
    assert page.locator(".card").count() == 11  # the other items of the collection

    # reload from a shared URL: the query is restored and searched again
    page.goto(url + "/?q=forest&k=24")
    page.wait_for_selector(".card")
    assert page.input_value("#q") == "forest" and page.input_value("#k") == "24"
    assert page.locator(".card").count() == 12  # the collection holds 12 items
    assert not errors, errors


def test_the_pages_controls_are_the_declared_options_and_a_search_sends_the_declared_k(browser, server):
    url, _ = server
    page, errors = _watched_page(browser)
    page.goto(url + "/")
    page.wait_for_selector("#collection strong")

    def values(select: str) -> list[str]:
        return page.eval_on_selector_all(f"{select} option", "options => options.map(o => o.value)")

    assert page.input_value("#k") == str(DEFAULTS["k"])
    assert values("#k") == [str(k) for k in search_options()["page"]["k"]]
    assert values("#mode") == list(OPTIONS["mode"].choices) and page.input_value("#mode") == DEFAULTS["mode"]
    assert values("#f-sort") == list(OPTIONS["sort"].choices) and page.input_value("#f-sort") == DEFAULTS["sort"]
    assert values("#f-type") == ["", *OPTIONS["type"].choices]
    page.fill("#q", "a sunset over the sea")
    with page.expect_request(lambda asked: asked.url.endswith("/search") and asked.method == "POST") as asked:
        page.press("#q", "Enter")
    body = asked.value.post_data_json
    assert (body["k"], body["mode"], body["sort"]) == (DEFAULTS["k"], DEFAULTS["mode"], DEFAULTS["sort"])
    page.wait_for_selector(".card")
    assert page.locator(".card").count() == DEFAULTS["k"] and "k=" not in page.url  # the default stays out of links
    # a shared link's k that the menu lacks is kept, in order; one past the server's bounds is the default
    page.goto(url + f"/?q=forest&k={DEFAULTS['k'] + 1}")
    page.wait_for_selector(".card")
    assert page.input_value("#k") == str(DEFAULTS["k"] + 1)
    assert [int(v) for v in values("#k")] == sorted(int(v) for v in values("#k"))
    page.goto(url + f"/?q=forest&k={OPTIONS['k'].maximum('http') + 1}")
    page.wait_for_selector(".card")
    assert page.input_value("#k") == str(DEFAULTS["k"])
    assert not errors, errors


def test_search_page_reranks_shows_both_scores_and_why_this_result(browser, server):
    url, _ = server
    page, errors = _watched_page(browser)
    page.goto(url + "/")
    page.wait_for_selector("#rerank-toggle:not([hidden])")
    assert f"top {DEFAULTS['rerank_top']} hits" in page.get_attribute("#rerank-toggle", "title")  # the server's depth (/info)
    page.check("#rerank")
    page.fill("#q", "a sunset over the sea")
    page.press("#q", "Enter")
    page.wait_for_selector(".card .rerank-row:not([hidden]), #banner:not([hidden])", timeout=120_000)
    assert page.locator("#banner").is_hidden(), page.inner_text("#banner-text")
    scores = page.locator(".card .rerank-value").all_inner_texts()
    assert len(scores) == DEFAULTS["k"] and all(float(s) > 0 for s in scores[:3])  # both scores on every card
    page.locator(".card").first.locator(".why").click()
    page.wait_for_selector(".card .why-panel:not([hidden]), #banner:not([hidden])", timeout=120_000)
    assert page.locator("#banner").is_hidden(), page.inner_text("#banner-text")
    assert "not attribution" in page.locator(".card .why-label").first.inner_text()
    page.wait_for_selector(".card .thumb canvas.heat")  # the patch grid over the thumbnail
    assert not errors, errors


def test_search_page_shows_the_server_message_when_a_request_fails(browser, server):
    url, _ = server
    page = browser.new_page()
    page.goto(url + "/?id=987654")
    page.wait_for_selector("#banner:not([hidden])")
    text = page.inner_text("#banner-text")
    assert "404" in text and "987654" in text


def test_search_page_says_when_the_collection_is_empty(browser, tmp_path, server):
    """The page reads the item count from /info (its value for an empty collection is tested in
    test_serve_api); here /info is answered with zero items, saving a second model load."""
    url, _ = server
    page = browser.new_page()
    page.route("**/info", lambda route: route.fulfill(
        json={"model": "m", "dim": 64, "collection": {"name": "empty", "items": 0}}))
    page.goto(url + "/")
    page.wait_for_selector("#banner:not([hidden])")
    assert "empty" in page.inner_text("#banner-text") and "faste-mm index" in page.inner_text("#banner-text")


def test_search_page_on_a_phone_keeps_the_query_box_wide_and_every_control_shown(browser, server):
    url, _ = server
    page = browser.new_page(viewport={"width": 390, "height": 844})
    page.goto(url + "/")
    page.wait_for_selector("#collection strong")
    query = page.locator("#q").bounding_box()
    assert query["width"] >= 0.7 * 390, query  # it once shrank to ~90 px beside the selectors
    for control in ("#mode", "#k", "#go"):
        assert page.locator(control).is_visible(), control
    brand = page.locator(".brand span").bounding_box()
    assert brand["height"] < 30, brand  # "faste-mm" on one line
    page.fill("#q", "a sunset over the sea")
    page.press("#q", "Enter")
    page.wait_for_selector(".card")
    assert page.input_value("#q") == "a sunset over the sea"


def test_search_page_previews_a_hit_names_a_filter_that_matches_nothing_and_shows_a_notes_lines(browser, server):
    url, _ = server
    page, errors = _watched_page(browser)
    page.goto(url + "/?q=forest")
    page.wait_for_selector(".card img")
    # a thumbnail opens a larger preview the server renders (/previews/{id}); Esc closes it
    page.locator(".card .thumb").first.click()
    page.wait_for_selector("#lightbox:not([hidden])")
    page.wait_for_function("() => { const i = document.querySelector('#lightbox-img'); "
                           "return i.complete && i.naturalWidth > 0 && i.src.startsWith('blob:'); }")  # fetched: its size header read
    assert "score" in page.inner_text("#lightbox-caption")
    page.keyboard.press("Escape")
    page.wait_for_selector("#lightbox", state="hidden")
    # no notes in this collection: the status names the filter and how to drop it
    page.select_option("#f-type", "text")
    page.wait_for_function("() => document.querySelector('#status-text').textContent.startsWith('No results')")
    status = page.inner_text("#status-text")
    assert "with type text" in status and "Clear the filters" in status, status
    page.click("#f-clear")
    page.wait_for_selector(".card .thumb")  # the clear's own search has answered: it cannot land after the next one
    # a note's card shows its first lines (the snippet /search sends; test_serve_api checks the server's side)

    def as_note(route):
        body = route.fetch().json()
        body["hits"][0].update(thumbnail=None, kind="text", name="minutes.txt", page=None,
                               snippet="Board minutes, 3 May: the invoice RE16 TGK was paid.")
        route.fulfill(json=body)

    page.route("**/search", as_note)
    page.fill("#q", "minutes")
    page.press("#q", "Enter")
    page.wait_for_selector(".card .note .snippet")
    assert "invoice RE16 TGK" in page.locator(".card .note .snippet").first.inner_text()
    assert not errors, errors


# The test's view of the page's /search fetches: each one that settled (its reply read, or failed or
# aborted) is counted one task later, so after the page's own handling of that reply has run.
COUNT_SETTLED_SEARCHES = """
window.settledSearches = 0;
const pageFetch = window.fetch.bind(window);
window.fetch = (input, init) => {
  const call = pageFetch(input, init);
  if (!String(input).endsWith("/search")) return call;
  const settle = () => setTimeout(() => { window.settledSearches += 1; }, 0);
  return call.then((response) => {
    const read = response.json.bind(response);
    response.json = () => { const body = read(); body.then(settle, settle); return body; };
    return response;
  }, (error) => { settle(); throw error; });
};
"""


def test_search_page_shows_the_later_search_when_an_earlier_reply_arrives_last(browser, server):
    """Filters changed one after another: "Newest first" (its reply held back by the test until the
    next search is on screen), then "PDF pages". The grid, URL and controls must all be the later
    search's, also after the earlier reply is let through."""
    from playwright.sync_api import Error as PlaywrightError

    url, _ = server
    page, errors = _watched_page(browser)
    page.add_init_script(COUNT_SETTLED_SEARCHES)
    page.goto(url + "/?q=sunset")
    page.wait_for_function(f"() => document.querySelectorAll('.card').length === {DEFAULTS['k']} "
                           f"&& window.settledSearches === 1")
    held = []

    def hold_the_earlier(route):  # told apart by body, not by order: an aborted request may never get here
        if route.request.post_data_json.get("type") is None:
            held.append(route)
        else:
            route.continue_()

    page.route("**/search", hold_the_earlier)
    page.select_option("#f-sort", "-date")  # the earlier search: its reply waits in `held`
    page.select_option("#f-type", "pdf")  # the later one: answered at once
    page.wait_for_function("() => document.querySelector('#status-text').textContent.includes('type pdf')")
    for route in held:  # the earlier reply now comes last (unless the page already aborted it)
        try:
            route.continue_()
        except PlaywrightError:
            pass
    page.wait_for_function("() => window.settledSearches === 3")  # both later fetches handled by the page
    kinds = page.eval_on_selector_all(".card", "cards => cards.map(c => c.dataset.kind)")
    assert kinds == ["pdf", "pdf"], kinds  # the 2 PDF pages, not the k hits of "Newest first" alone
    assert "type pdf" in page.inner_text("#status-text")
    assert "sort=-date" in page.url and "type=pdf" in page.url
    assert page.input_value("#f-sort") == "-date" and page.input_value("#f-type") == "pdf"
    assert page.locator("#banner").is_hidden()  # the superseded search reports nothing
    assert not errors, errors
