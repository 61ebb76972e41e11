"""Query understanding wired into the search (issue 47 item 1): every front end sends the sentence
as typed and the executor reads its dates, places, cameras, ratings, kinds and "quoted phrases".
Generated photos with EXIF dates, cameras and GPS of real cities and two notes, indexed with the
tiny model; k above the collection size, so the model's meaning never cuts: the items that come
back are exactly those the understood filters keep, through the Python API, the CLI (`--format
json` and the stderr line), HTTP /search and the MCP `search` tool (the official SDK client)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from faste_mm.model.embedder import Embedder
from faste_mm.retrieval.retriever import Retriever

from tests.helpers.browser import CHROMIUM, browser, serving  # noqa: F401 (the shared browser fixture)
from tests.helpers.cli import invoke
from tests.helpers.inputs import tiny_vl_dir
from tests.helpers.photo_fixtures import exif_block, make_photo

INTENDENTE, MITTE, KYOTO = (38.7205, -9.1355, 50.0), (52.52, 13.405, 40.0), (35.0116, 135.7681, 50.0)
PHOTOS = {  # name -> (EXIF date, make, model, GPS)
    "lisbon_2024_07.jpg": ("2024:07:14 18:00:00", "Google", "Pixel 8", INTENDENTE),
    "lisbon_2023_05.jpg": ("2023:05:02 10:00:00", "Apple", "iPhone 13", INTENDENTE),
    "berlin_2024_07.jpg": ("2024:07:20 12:00:00", "Canon", "Canon EOS R6", MITTE),
    "kyoto_2019_04.jpg": ("2019:04:05 09:00:00", "Apple", "iPhone 8", KYOTO),
    "nogps_2024_07.jpg": ("2024:07:15 12:00:00", "Google", "Pixel 8", None),
}
NOTES = {"fox.txt": "the quick brown fox jumps over the lazy dog",
         "fox_again.txt": "a brown fox, quick and quiet, and a brown dog"}
ALL = set(PHOTOS) | set(NOTES)
K = 50  # above the collection's 7 items


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    root = tmp_path_factory.mktemp("asked")
    for i, (name, (taken, make, model, gps)) in enumerate(PHOTOS.items()):
        make_photo(root / name, seed=i, exif=exif_block(taken, "+00:00", make, model, gps=gps))
    for name, text in NOTES.items():
        (root / name).write_text(text)
    embedder = Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu")
    retriever = Retriever(embedder, collection=root.parent / "asked-col", r_max=0.0)
    assert retriever.index([root]).failed == 0
    return retriever


def names(hits) -> list[str]:
    return [Path(h.uri if hasattr(h, "uri") else h["uri"]).name for h in hits]


def test_the_python_api_keeps_exactly_the_items_the_words_mean(library):
    assert set(names(library.search("photos in Lisbon", k=K))) == {"lisbon_2024_07.jpg", "lisbon_2023_05.jpg"}
    assert set(names(library.search("street shot on a Pixel in July 2024", k=K))) == {
        "lisbon_2024_07.jpg", "nogps_2024_07.jpg"}
    assert set(names(library.search("Lissabon", k=K))) == {"lisbon_2024_07.jpg", "lisbon_2023_05.jpg"}


def test_literal_searches_the_words_as_typed(library):
    assert set(names(library.search("photos in Lisbon", k=K, literal=True))) == ALL
    assert library.understand("photos in Lisbon", literal=True).parts == ()


def test_the_requests_own_filters_and_the_understood_ones_all_hold(library):
    assert names(library.search("photos in Lisbon", k=K, since="2024")) == ["lisbon_2024_07.jpg"]
    assert set(names(library.search("photos in Lisbon", k=K, where=["camera~iphone"]))) == {"lisbon_2023_05.jpg"}


def test_a_query_of_filters_only_lists_the_matching_items_newest_first(library):
    hits = library.search("July 2024", k=K)
    assert names(hits) == ["berlin_2024_07.jpg", "nogps_2024_07.jpg", "lisbon_2024_07.jpg"]
    assert {h.found_by for h in hits} == {"filters"}
    assert names(library.search("July 2024", k=2)) == ["berlin_2024_07.jpg", "nogps_2024_07.jpg"]
    assert names(library.search("July 2024", k=K, sort="date"))[0] == "lisbon_2024_07.jpg"


def test_a_quoted_phrase_finds_only_the_item_whose_text_holds_it(library):
    assert names(library.search('"quick brown fox"', k=K)) == ["fox.txt"]
    assert names(library.search('"quick brown fox"', k=K, mode="hybrid")) == ["fox.txt"]
    assert set(names(library.search('"brown"', k=K, mode="lexical"))) == {"fox.txt", "fox_again.txt"}
    assert len(library.search('"quick brown fox"', k=K, literal=True)) == len(ALL)


def test_a_phrase_matches_words_in_order_whatever_the_punctuation(library):
    assert names(library.search('"brown fox, quick"', k=K)) == ["fox_again.txt"]
    assert names(library.search('notes «lazy dog»', k=K)) == ["fox.txt"]


def test_a_phrase_filter_of_no_words_is_refused_naming_it():
    from faste_mm.errors import ConfigError
    from faste_mm.indexers.filters import SearchFilter

    with pytest.raises(ConfigError, match="phrases must be non-empty"):
        SearchFilter(phrases=("  ",))


def test_understand_shows_the_parts_and_the_meaning(library):
    asked = library.understand("beach in Lisbon 2024")
    assert asked.text == "beach"
    assert asked.summary() == "understood: place Lisbon · taken 2024 · 'beach'"
    assert [p["kind"] for p in asked.to_dict()["parts"]] == ["place", "date"]


def test_the_cli_prints_what_it_understood_and_json_carries_it(library):
    done = invoke("search", "-c", library.collection, "beach in Lisbon 2024", "-k", K, "--format", "json",
                  "--no-server")
    payload = json.loads(done.stdout)
    assert names(payload["hits"]) == ["lisbon_2024_07.jpg"]
    understood = payload["query"]["understood"]
    assert understood["text"] == "beach" and {p["kind"] for p in understood["parts"]} == {"place", "date"}
    assert "understood: place Lisbon · taken 2024 · 'beach'" in done.stderr
    literal = invoke("search", "-c", library.collection, "photos in Lisbon 2024", "-k", K, "--format", "json",
                     "--no-server", "--literal")
    assert len(json.loads(literal.stdout)["hits"]) == len(ALL)
    assert "understood" not in literal.stderr
    assert json.loads(literal.stdout)["query"]["understood"]["literal"] is True


def test_the_cli_lists_a_query_of_filters_only_without_a_model(library):
    done = invoke("search", "-c", library.collection, "July 2024", "-k", K, "--format", "json", "--no-server")
    assert names(json.loads(done.stdout)["hits"]) == ["berlin_2024_07.jpg", "nogps_2024_07.jpg",
                                                      "lisbon_2024_07.jpg"]


@pytest.fixture(scope="module")
def http(library):
    pytest.importorskip("fastapi", reason="needs the serve extra: pip install 'faste-mm[serve]'")
    from fastapi.testclient import TestClient

    from faste_mm.serving.api import create_app
    from faste_mm.serving.engine import ServeConfig, ServeEngine

    retriever = Retriever(library.embedder, collection=library.collection, r_max=0.0)
    with TestClient(create_app(ServeEngine(library.embedder, retriever, ServeConfig())),
                    base_url="http://127.0.0.1:8000") as client:
        yield client


def test_http_search_understands_the_query_and_says_so(http):
    answer = http.post("/search", json={"query": "photos in Lisbon", "k": K}).json()
    assert set(names(answer["hits"])) == {"lisbon_2024_07.jpg", "lisbon_2023_05.jpg"}
    assert [p["label"] for p in answer["query"]["understood"]["parts"]] == ["kind image", "place Lisbon"]
    literal = http.post("/search", json={"query": "photos in Lisbon", "k": K, "literal": True}).json()
    assert len(literal["hits"]) == len(ALL) and literal["query"]["understood"]["parts"] == []
    form = http.post("/search", data={"q": "photos in Lisbon", "k": str(K), "literal": "true"}).json()
    assert len(form["hits"]) == len(ALL)
    listed = http.post("/search", json={"query": "July 2024", "k": K}).json()
    assert names(listed["hits"]) == ["berlin_2024_07.jpg", "nogps_2024_07.jpg", "lisbon_2024_07.jpg"]
    assert names(http.post("/search", json={"query": '"quick brown fox"', "k": K}).json()["hits"]) == ["fox.txt"]


def test_the_mcp_search_tool_understands_the_query(library, tmp_path_factory):
    pytest.importorskip("mcp", reason="needs the mcp extra: pip install 'faste-mm[mcp]'")
    from mcp.client.stdio import StdioServerParameters, stdio_client

    from tests.helpers.mcp_fixtures import check_structured, open_session
    from tests.helpers.warm_process import cli_command

    params = StdioServerParameters(command=cli_command(tmp_path_factory.mktemp("asked-mcp")),
                                   args=["mcp", "-c", str(library.collection), "--device", "cpu"])
    with open(os.devnull, "w") as quiet, open_session(stdio_client(params, errlog=quiet)) as session:
        tools = {tool.name: tool for tool in session.list_tools().tools}
        found = session.call("search", {"query": "photos in Lisbon", "k": K, "thumbnails": False})
        result = check_structured(tools, "search", found)
        assert set(names(result["hits"])) == {"lisbon_2024_07.jpg", "lisbon_2023_05.jpg"}
        assert [p["kind"] for p in result["query"]["understood"]["parts"]] == ["kind", "place"]
        assert found.content[0].text.startswith("understood: kind image · place Lisbon\n2 results")
        literal = check_structured(tools, "search", session.call(
            "search", {"query": "photos in Lisbon", "k": K, "literal": True, "thumbnails": False}))
        assert len(literal["hits"]) == len(ALL)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_the_page_shows_understood_parts_as_chips_that_remove_them(library, browser):  # noqa: F811
    from faste_mm.serving.options_route import search_options

    def cards(page) -> set[str]:
        return set(page.locator(".card .name").all_inner_texts())

    with serving("-c", str(library.collection), "--device", "cpu") as url:
        page = browser.new_page()
        try:
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(url + "/")
            page.wait_for_selector("#collection strong")
            page.select_option("#k", str(search_options()["page"]["k"][-1]))  # the most the page offers
            page.fill("#q", "beach in Lisbon 2024")
            page.press("#q", "Enter")
            page.wait_for_selector("#understood:not([hidden]) .chip")
            assert page.locator("#understood .chip > span").all_inner_texts() == ["place Lisbon", "taken 2024"]
            page.wait_for_function("() => document.querySelectorAll('.card').length === 1")
            assert cards(page) == {"lisbon_2024_07.jpg"}
            # the date chip removed: "2024" becomes words, the place stays a filter
            page.click("#understood .chip:nth-child(2) .chip-x")
            page.wait_for_function("() => document.querySelectorAll('#understood .chip').length === 1")
            page.wait_for_function("() => document.querySelectorAll('.card').length === 2")
            assert cards(page) == {"lisbon_2024_07.jpg", "lisbon_2023_05.jpg"}
            # literal: nothing understood, every item comes back
            page.check("#literal")
            page.wait_for_function(f"() => document.querySelectorAll('.card').length === {len(ALL)}")
            assert page.locator("#understood").is_hidden()
            assert errors == []
        finally:
            page.close()


def test_a_search_answered_by_the_running_server_says_what_it_understood(library):
    with serving("-c", str(library.collection), "--device", "cpu"):
        done = invoke("search", "-c", library.collection, "beach in Lisbon 2024", "-k", K, "--format", "json",
                      "--debug")
    payload = json.loads(done.stdout)
    assert "search: through the server at" in done.stderr  # the thin client, not a local search
    assert names(payload["hits"]) == ["lisbon_2024_07.jpg"]
    assert payload["query"]["understood"]["text"] == "beach"
    assert "understood: place Lisbon · taken 2024 · 'beach'" in done.stderr
