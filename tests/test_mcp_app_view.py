"""The search results' view for MCP Apps hosts, end to end: `faste-mm mcp` driven by the official
SDK's client declares the view on its search tools, lists it and reads it back as one
self-contained HTML document, and answers searches with what the view draws (facts, the
understood query, thumbnails tagged with their items). Then the view itself in chromium (via
Playwright), inside a sandboxed iframe of a test page that plays the host's side of the bridge
with real answers of that server: the grid shows every hit with its facts and picture, the
understood query as chips, a hit without a picture, a failed search, the host's theme; nothing
logs an error or breaks the view's Content-Security-Policy."""

from __future__ import annotations

import json
import os
import re
from html.parser import HTMLParser

import pytest

pytest.importorskip("mcp", reason="needs the mcp extra: pip install 'faste-mm[mcp]'")
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

from faste_mm import Embedder, Retriever  # noqa: E402
from faste_mm.serving.mcp_view import APP_MIME_TYPE, EXTENSIONS, PICTURE_ITEM_KEY, VIEW_URI, view_html  # noqa: E402
from tests.helpers.browser import CHROMIUM, browser  # noqa: E402, F401 (the shared browser fixture)
from tests.helpers.inputs import tiny_vl_dir  # noqa: E402
from tests.helpers.mcp_fixtures import check_structured, open_session  # noqa: E402
from tests.helpers.photo_fixtures import make_dated_photos  # noqa: E402
from tests.helpers.warm_process import cli_command  # noqa: E402

needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
QUERY = "beach photos since 2021 shot on a Pixel"  # understood: kind image, taken since 2021, camera Pixel
VIEW_ORIGIN, HOST_ORIGIN = "http://view.test", "http://host.test"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    base = tmp_path_factory.mktemp("mcp-app")
    make_dated_photos(base / "files", seed=30)
    (base / "files" / "picnic.txt").write_text("notes about a picnic by the lake\n", encoding="utf-8")
    embedder = Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu")
    Retriever(embedder, collection=base / "col", r_max=0.0).index([base / "files"])
    params = StdioServerParameters(command=cli_command(tmp_path_factory.mktemp("mcp-app-cli")),
                                   args=["mcp", "-c", str(base / "col"), "--device", "cpu"])
    with open(os.devnull, "w") as quiet, open_session(stdio_client(params, errlog=quiet)) as session:
        yield session


@pytest.fixture(scope="module")
def tools(client):
    return {tool.name: tool for tool in client.list_tools().tools}


@pytest.fixture(scope="module")
def understood_search(client, tools):
    """The search of QUERY: (its arguments, the tool result as it travels on the wire)."""
    arguments = {"query": QUERY, "k": 8}
    result = client.call("search", arguments)
    check_structured(tools, "search", result)
    return arguments, _wire(result)


def _wire(result) -> dict:
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


# ---- the protocol side (the SDK's client) ---------------------------------------------------------
def test_the_search_tools_name_the_view_and_the_server_declares_mcp_apps(tools, tmp_path):
    from faste_mm.serving.mcp_paths import IndexRoots
    from faste_mm.serving.mcp_server import build_server
    from faste_mm.serving.mcp_tools import EngineSlot, McpTools

    for name in ("search", "more_like_this"):
        assert tools[name].meta == {"ui": {"resourceUri": VIEW_URI}, "ui/resourceUri": VIEW_URI}, name
    assert all(tools[name].meta is None for name in ("get_item", "explain", "info", "index"))
    # capabilities.extensions, sent where the protocol revision has the field (2026-07-28 on)
    server = build_server(McpTools(tmp_path, EngineSlot(engine=object()), IndexRoots()))
    assert server.create_initialization_options().capabilities.extensions == EXTENSIONS


def test_the_view_is_listed_and_reads_back_as_one_self_contained_html_document(client):
    listed = {str(r.uri): r for r in client.list_resources().resources}
    view = listed[VIEW_URI]
    assert view.mime_type == APP_MIME_TYPE == "text/html;profile=mcp-app"
    assert view.meta == {"ui": {"prefersBorder": True}}
    [content] = client.read_resource(VIEW_URI).contents
    assert (str(content.uri), content.mime_type, content.meta) == (VIEW_URI, APP_MIME_TYPE, view.meta)
    html = content.text
    assert html == view_html() and html.lower().startswith("<!doctype html>")
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html).group(1)
    assert "default-src 'none'" in policy and "connect-src 'none'" in policy and "img-src data:" in policy
    assert "unsafe" not in policy and "__" not in html  # every placeholder filled
    tags = _Tags()
    tags.feed(html)
    assert tags.fetching == [] and tags.scripts == 1  # one inline script; nothing loaded from anywhere
    assert not re.search(r"https?://", html)


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.fetching: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag, attrs) -> None:
        self.scripts += tag == "script"
        self.fetching += [f"<{tag} {name}>" for name, _ in attrs if name in ("src", "href", "srcset", "action")]


def test_the_search_answer_carries_what_the_view_draws_and_stays_whole_for_other_clients(understood_search):
    _, result = understood_search
    found = result["structuredContent"]
    hits = found["hits"]
    assert sorted(h["name"] for h in hits) == ["p0.jpg", "p1.jpg", "p2.jpg", "p3.jpg"]  # images since 2021
    lisbon = next(h for h in hits if h["name"] == "p0.jpg")["facts"]
    assert lisbon["taken"].startswith("2021-06-01") and "Lisbon" in lisbon["place"]
    assert lisbon["camera"] == "Google Pixel 8"
    assert [p["kind"] for p in found["query"]["understood"]["parts"]] == ["kind", "date", "camera"]
    # what a client without MCP Apps reads is as before: the summary, a link per hit, each
    # picture after its label; the pictures only gain their item in `_meta`
    content = result["content"]
    assert content[0]["type"] == "text" and "4 results" in content[0]["text"]
    assert [c["uri"] for c in content if c["type"] == "resource_link"] == [h["resource"] for h in hits]
    pictures = [(i, c) for i, c in enumerate(content) if c["type"] == "image"]
    assert [c["_meta"] for _, c in pictures] == [{PICTURE_ITEM_KEY: h["id"]} for h in hits]
    assert all(content[i - 1]["text"].startswith(f"{h['rank']}. {h['name']}") for (i, _), h in zip(pictures, hits))


# ---- the view in a browser, the test page as its host ----------------------------------------------
HOST_PAGE = """<!doctype html><html><body>
<script>
const RESULT = __RESULT__, ARGUMENTS = __ARGUMENTS__, CONTEXT = __CONTEXT__;
window.bridge = { methods: [], sizes: [], answers: {} };
const view = () => document.getElementById("view").contentWindow;
const post = (message) => view().postMessage(Object.assign({ jsonrpc: "2.0" }, message), "*");
window.askView = (id, method) => post({ id, method, params: {} });
window.addEventListener("message", (event) => {
  if (event.source !== view()) return;
  const message = event.data;
  window.bridge.methods.push(message.method || "answer");
  if (message.method === undefined) window.bridge.answers[message.id] = message;
  if (message.method === "ui/initialize") {
    post({ id: message.id, result: { protocolVersion: message.params.protocolVersion, hostCapabilities: {},
                                     hostInfo: { name: "test-host", version: "1" }, hostContext: CONTEXT } });
  } else if (message.method === "ui/notifications/initialized") {
    post({ method: "ui/notifications/tool-input", params: { arguments: ARGUMENTS } });
    post({ method: "ui/notifications/tool-result", params: RESULT });
  } else if (message.method === "ui/notifications/size-changed") {
    window.bridge.sizes.push(message.params);
  }
});
</script>
<iframe id="view" sandbox="allow-scripts" src="__VIEW__" width="960" height="900"></iframe>
</body></html>"""


def _script_json(value) -> str:
    return json.dumps(value).replace("</", "<\\/")


def _open_view(browser, html: str, result: dict, arguments: dict, context: dict | None = None):  # noqa: F811
    """A page at HOST_ORIGIN hosting the view (served from another origin, in a sandboxed iframe)
    that answers its handshake and then hands it `result`: (page, the view's frame, errors)."""
    page = browser.new_page(viewport={"width": 1000, "height": 950})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error"
            or "Content Security Policy" in message.text else None)
    host = (HOST_PAGE.replace("__RESULT__", _script_json(result)).replace("__ARGUMENTS__", _script_json(arguments))
            .replace("__CONTEXT__", _script_json(context or {"theme": "light", "displayMode": "inline"}))
            .replace("__VIEW__", f"{VIEW_ORIGIN}/view.html"))
    page.route(f"{HOST_ORIGIN}/", lambda route: route.fulfill(body=host, content_type="text/html"))
    page.route(f"{VIEW_ORIGIN}/view.html", lambda route: route.fulfill(body=html, content_type="text/html"))
    page.goto(f"{HOST_ORIGIN}/")
    page.wait_for_function("() => window.bridge.methods.includes('ui/notifications/initialized')")
    return page, page.frame_locator("#view"), errors


@needs_chromium
def test_the_view_shows_each_hit_with_its_facts_and_thumbnail_and_the_understood_query(browser, client,
                                                                                        understood_search):
    arguments, result = understood_search
    found = result["structuredContent"]
    html = client.read_resource(VIEW_URI).contents[0].text  # the document the server serves
    page, view, errors = _open_view(browser, html, result, arguments)
    cards = view.locator(".card")
    cards.first.wait_for()
    assert cards.evaluate_all("cards => cards.map(c => Number(c.dataset.id))") == [h["id"] for h in found["hits"]]
    view.locator(".card img").first.wait_for()
    loaded = view.locator(".card img").evaluate_all("images => images.map(i => i.complete && i.naturalWidth > 0)")
    assert loaded == [True] * len(found["hits"])  # every hit's own thumbnail, from the answer itself
    for hit in found["hits"]:
        card = view.locator(f".card[data-id='{hit['id']}']")
        assert card.locator(".name").inner_text() == hit["name"]
        assert card.locator(".path").get_attribute("title") == hit["uri"]
        assert card.locator(".numbers").inner_text() == f"image · score {hit['score']:.4f}"
        assert card.locator(".facts").inner_text().startswith(hit["taken"][:10])
        assert card.locator(".facts").inner_text().endswith("Google Pixel 8")
    lisbon = next(h for h in found["hits"] if h["name"] == "p0.jpg")
    assert f"{lisbon['facts']['place']} ·" in view.locator(f".card[data-id='{lisbon['id']}'] .facts").inner_text()
    understood = found["query"]["understood"]
    chips = view.locator("#understood .chip")
    assert chips.all_inner_texts() == [p["label"] for p in understood["parts"]] + [f"“{understood['text']}”"]
    assert chips.evaluate_all("chips => chips.map(c => c.dataset.kind)") == ["kind", "date", "camera", "meaning"]
    status = view.locator("#status").inner_text()
    assert status.startswith(f"{len(found['hits'])} results for “{QUERY}”") and found["mode"] in status
    page.wait_for_function("() => window.bridge.sizes.length > 0")  # the view tells the host its size
    assert page.evaluate("window.bridge.sizes.at(-1).height") > 200
    # it answers the host's requests: ping, and a method it does not have, by name
    page.evaluate("askView(901, 'ping'); askView(902, 'tools/list')")
    page.wait_for_function("() => window.bridge.answers[901] && window.bridge.answers[902]")
    answers = page.evaluate("window.bridge.answers")
    assert answers["901"]["result"] == {} and answers["902"]["error"]["code"] == -32601
    assert not errors, errors


@needs_chromium
def test_the_view_shows_a_hit_without_a_picture_a_failed_search_and_the_hosts_theme(browser, client):
    html = client.read_resource(VIEW_URI).contents[0].text
    arguments = {"query": "a picnic by the lake", "k": 6}
    found = client.call("search", arguments)
    note = next(h for h in found.structured_content["hits"] if h["kind"] == "text")
    context = {"theme": "dark", "styles": {"variables": {"--color-background-primary": "rgb(1, 2, 3)"}}}
    page, view, errors = _open_view(browser, html, _wire(found), arguments, context)
    card = view.locator(f".card[data-id='{note['id']}']")
    assert card.locator(".kind-badge").text_content() == "text" and card.locator("img").count() == 0
    # a note has no date, place or camera to show: no facts line (not even an empty one)
    assert card.locator(".facts").evaluate("p => getComputedStyle(p).display") == "none"
    assert view.locator(".card img").count() == 5  # the photos' thumbnails
    assert view.locator("body").evaluate("b => getComputedStyle(b).backgroundColor") == "rgb(1, 2, 3)"
    assert view.locator("html").get_attribute("data-theme") == "dark"
    assert not errors, errors
    page.close()

    failed = client.call("search", {})
    assert failed.is_error
    page, view, errors = _open_view(browser, html, _wire(failed), {})
    view.locator("#problem").wait_for()
    assert "give a `query` text" in failed.content[0].text
    assert view.locator("#problem").inner_text() == failed.content[0].text
    assert view.locator(".card").count() == 0 and view.locator("#status").inner_text() == "The search failed."
    assert not errors, errors
