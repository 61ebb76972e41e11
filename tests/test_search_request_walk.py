"""One search request, every front end (issue 45): on a collection that records a reranker, the
same request asked of the Python API, the command line (here and answered by a running server:
the thin client), POST /search as JSON and as a form, the MCP `search` tool (the official SDK's
client over /mcp), LangChain and LlamaIndex has the same defaults and gives the same hits,
reranked by default or not. Also: the manual's table, the front ends' own code and the search page
restate no option (the page builds its controls from GET /search/options); `where` takes the same
shapes everywhere and a wrong one is named alike; more like this is one thing everywhere; a 300 KB
query (Python) or a long one (MCP) is searched by its first 2,000 characters; `search --mode
lexical` imports no torch; the Embedder and the Retriever embed a query with the same instruction."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="needs the serve extra: pip install 'faste-mm[serve]'")
pytest.importorskip("mcp", reason="needs the mcp extra: pip install 'faste-mm[mcp]'")
pytest.importorskip("langchain_core", reason="needs the langchain extra")
pytest.importorskip("llama_index.core", reason="needs the llamaindex extra")
import httpx2  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from faste_mm import Retriever  # noqa: E402
from faste_mm.cli.app import app  # noqa: E402
from faste_mm.errors import ConfigError  # noqa: E402
from faste_mm.retrieval.search_request import (DEFAULTS, MAX_QUERY_CHARS, OPTIONS, WHERE_SHAPES, options_for,  # noqa: E402
                                               options_table)
from faste_mm.serving.discovery import find_server  # noqa: E402
from tests.helpers.bounds import first_line  # noqa: E402
from tests.helpers.photo_fixtures import exif_block, make_photo  # noqa: E402
from tests.helpers.warm_process import start_cli  # noqa: E402
from tests.helpers.mcp_fixtures import (check_structured, error_text, http_transport, open_session,  # noqa: E402
                                        tiny_collection)
from tests.helpers.rerank_fixtures import reranker_dirs  # noqa: E402, F401

ROOT = Path(__file__).parents[1]
runner = CliRunner()
QUERY = "a picnic by the lake"


@pytest.fixture(scope="module")
def world(tmp_path_factory, reranker_dirs):  # noqa: F811
    """A collection recording the tiny reranker, served by `faste-mm serve -c` (which loads it)."""
    base = tmp_path_factory.mktemp("walk")
    embedder, col, gallery, _ = tiny_collection(base, reranker=str(reranker_dirs["qwen3_vl_reranker"]))
    # a photo with a date taken and GPS in Nairobi: the facts a hit carries and `where` matches
    make_photo(gallery / "nairobi.jpg", 3, exif=exif_block(taken="2024:05:01 10:00:00", gps=(-1.2864, 36.8172, 1700.0)))
    Retriever(embedder, collection=col).index([gallery])
    server = start_cli(["serve", "-c", str(col), "--port", "0", "--device", "cpu", "--threads", "1"])
    try:
        line = first_line(server, "faste-mm serve")
        assert line.startswith("serving on "), line
        address = find_server(col)
        yield {"embedder": embedder, "col": col, "gallery": gallery, "url": line.split()[-1],
               "headers": {"Authorization": f"Bearer {address.token}"}}
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)


def _python(world, **options) -> list[dict]:
    with Retriever(world["embedder"], collection=world["col"]) as retriever:
        return [_plain(hit.to_dict()) for hit in retriever.search(QUERY, **options)]


def _plain(hit: dict) -> dict:
    return {"id": hit["id"], "rerank_score": hit.get("rerank_score")}


def _cli(world, *args: str) -> tuple[list[dict], str]:
    result = runner.invoke(app, ["search", QUERY, "-c", str(world["col"]), "--device", "cpu", "--format", "json",
                                 "--debug", *args])
    assert result.exit_code == 0, result.output
    return [_plain(hit) for hit in json.loads(result.stdout)["hits"]], result.stderr


def _http(world, json_body=None, form=None) -> dict:
    answer = httpx2.post(world["url"] + "search", json=json_body, data=form, headers=world["headers"], timeout=300)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _mcp(world, arguments: dict) -> dict:
    with open_session(http_transport(world["url"] + "mcp", world["headers"], timeout=300)) as session:
        tools = {tool.name: tool for tool in session.list_tools().tools}
        found = check_structured(tools, "search", session.call("search", arguments))
        found["schema"] = tools["search"].input_schema
        return found


def _same(expected: list[dict], got: list[dict], where: str) -> None:
    assert [h["id"] for h in got] == [h["id"] for h in expected], where
    for a, b in zip(expected, got):
        if a["rerank_score"] is None:
            assert b["rerank_score"] is None, where
        else:
            assert b["rerank_score"] == pytest.approx(a["rerank_score"], abs=1e-4), where


@pytest.mark.parametrize("reranked", [True, False], ids=["reranked-by-default", "not-reranked"])
def test_every_front_end_gives_the_same_hits_for_the_same_request(world, reranked):
    from faste_mm.integrations.langchain import FasteMMRetriever as LangChainRetriever
    from faste_mm.integrations.llama_index import FasteMMRetriever as LlamaRetriever

    off = {} if reranked else {"rerank": False}
    expected = _python(world, k=3, **off)
    assert all((h["rerank_score"] is not None) == reranked for h in expected)  # the collection's reranker, by default
    flags = () if reranked else ("--no-rerank",)
    local, _ = _cli(world, "-k", "3", "--no-server", *flags)
    served, said = _cli(world, "-k", "3", *flags)
    assert "through the server" in said, said
    body = _http(world, {"query": QUERY, "k": 3, **off})
    assert (body["rerank"] is not None) == reranked
    form = _http(world, form={"q": QUERY, "k": "3", **({} if reranked else {"rerank": "false"})})
    mcp = _mcp(world, {"query": QUERY, "k": 3, "thumbnails": False, **off})
    assert (mcp["reranked_by"] is not None) == reranked
    chain = LangChainRetriever(collection=str(world["col"]), k=3, device="cpu", **off).invoke(QUERY)
    llama = LlamaRetriever(collection=str(world["col"]), k=3, device="cpu", **off).retrieve(QUERY)
    for name, got in (("cli", local), ("thin client", served), ("http json", [_plain(h) for h in body["hits"]]),
                      ("http form", [_plain(h) for h in form["hits"]]), ("mcp", [_plain(h) for h in mcp["hits"]]),
                      ("langchain", [_plain(d.metadata) for d in chain]),
                      ("llama_index", [_plain(n.node.metadata) for n in llama])):
        _same(expected, got, name)


def test_every_front_end_shows_the_declared_defaults(world):
    from faste_mm.cli.search_command import search_command
    from faste_mm.integrations.langchain import FasteMMRetriever
    from faste_mm.serving.api import SEARCH_BODY
    from faste_mm.serving.mcp_tools import SearchArgs

    import inspect

    cli = inspect.signature(search_command).parameters
    for name, declared in OPTIONS.items():
        default = DEFAULTS[name]
        if "http" in declared.fronts:
            assert SEARCH_BODY.model_fields[name].default == default, name
        if "mcp" in declared.fronts:
            assert SearchArgs.model_fields[name].default == default, name
        if "adapters" in declared.fronts and name != "query":
            assert FasteMMRetriever.model_fields[name].default == default, name
        if "cli" in declared.fronts and declared.flag is not None:
            assert cli[name].default == ([] if declared.kind in ("texts", "where") else default), name
    assert SEARCH_BODY.model_fields["rerank"].default is None  # HTTP reranks by default, as everywhere
    body = _http(world, {"query": QUERY})
    assert body["k"] == DEFAULTS["k"] and body["rerank"]["top"] == DEFAULTS["rerank_top"]


def test_the_manuals_search_options_table_is_the_generated_one():
    manual = (ROOT / "docs" / "search.md").read_text(encoding="utf-8")
    assert options_table() in manual, "docs/search.md: paste the table printed by python -m faste_mm.retrieval.search_request"


FRONT_ENDS = ["cli/search_command.py", "cli/server_search.py", "cli/options.py", "faste_mm/serving/inputs.py",
              "faste_mm/serving/api.py", "faste_mm/serving/engine.py", "faste_mm/serving/mcp_tools.py",
              "faste_mm/serving/discovery.py", "faste_mm/serving/rerank.py", "faste_mm/serving/options_route.py",
              "faste_mm/integrations/langchain.py", "faste_mm/integrations/llama_index.py",
              "faste_mm/integrations/frameworks.py", "faste_mm/retrieval/retriever.py", "faste_mm/bench/client.py"]
PAGE = ["faste_mm/serving/static/index.html", "faste_mm/serving/static/app.js"]


def _literal(default) -> str:
    return rf"[\"']{re.escape(default)}[\"']" if isinstance(default, str) else rf"{default}\b"


def test_no_front_end_restates_an_options_default_or_bound():
    """The options are declared once: a front end's own code never writes `k: int = 10`,
    `rerank_top=50`, `Field(10, ...)`, `"-k", default=10`, a help saying "Default 50", its own check
    of a bound ("k must be in 1..1000"), its own query length, or a hand list of the sorts or modes."""
    for path in FRONT_ENDS:
        code = (ROOT / path).read_text(encoding="utf-8")
        for name, default in DEFAULTS.items():
            declared = OPTIONS[name]
            if isinstance(default, (int, str)) and not isinstance(default, bool):
                pattern = rf"\b{name}\s*(?::[^=\n]*)?=\s*{_literal(default)}"
                assert not re.search(pattern, code), f"{path} restates {name}'s default {default!r}"
                for flag in filter(None, [declared.flag]):  # the flag's declaration: up to the next one
                    for at in [m.end() for m in re.finditer(rf"[\"']{re.escape(flag)}[\"']", code)]:
                        call = re.split(r"\n\w|add_argument\(|Annotated\[", code[at:at + 600])[0]
                        assert not re.search(rf"default\s*=\s*{_literal(default)}", call), f"{path}: {flag} default"
                        assert not re.search(rf"[Dd]efault:?\s+{re.escape(str(default))}\b", call), \
                            f"{path}: {flag}'s help says its default {default!r}"
            if declared.kind in ("int", "float"):
                assert not re.search(rf"\b{name} must be", code), f"{path} checks {name}'s bounds with its own words"
        assert not re.search(r'"relevance",\s*"date",\s*"-date"', code), f"{path} restates the sorts"
        assert not re.search(r'Literal\["dense",\s*"lexical"', code), f"{path} restates the modes"
        assert "SEARCH_RERANK_TOP" not in code and "MAX_K = 50" not in code, path
        assert not re.search(r"MAX_QUERY_CHARS\s*=|\"query\":\s*\{\"max_length\"", code), f"{path}: its own query cut"


def test_the_search_page_lists_no_option_and_writes_no_default():
    """The page builds k, mode, order and type from GET /search/options: its HTML lists none of
    the declared choices nor a number of results, its script compares with no default."""
    html, script = ((ROOT / path).read_text(encoding="utf-8") for path in PAGE)
    for name in ("mode", "sort", "type"):
        for choice in OPTIONS[name].choices:
            assert f'<option value="{choice}"' not in html, f"index.html lists the {name} {choice!r}"
    assert not re.search(r'<option value="\d+"', html), "index.html lists its own numbers of results"
    for name, default in DEFAULTS.items():
        if isinstance(default, (int, str)) and not isinstance(default, bool):
            assert not re.search(rf"[\"']{re.escape(str(default))}[\"']", script), f"app.js writes {name}'s default"
    assert not re.search(r"\bk\b\s*[!=]==?\s*[\"']?\d", script), "app.js compares k with a number of its own"


def test_more_like_this_is_one_thing_in_python_the_cli_the_page_and_mcp(world):
    image = sorted(world["gallery"].glob("*.png"))[0]
    with Retriever(world["embedder"], collection=world["col"]) as retriever:
        by_id = retriever.more_like(1, k=3)
        by_path = retriever.more_like(str(image), k=3)
        image_id = retriever.search(image=image, k=1, rerank=False)[0].id
    assert 1 not in [h.id for h in by_id] and len(by_id) == 3
    page = _http(world, {"id": 1, "k": 3})  # the page's "more like this"
    assert [h["id"] for h in page["hits"]] == [h.id for h in by_id] and page["rerank"] is None
    cli = runner.invoke(app, ["search", "--like", "1", "-k", "3", "-c", str(world["col"]), "--no-server",
                              "--format", "json"])
    assert cli.exit_code == 0, cli.output
    assert [h["id"] for h in json.loads(cli.stdout)["hits"]] == [h.id for h in by_id]
    assert image_id not in [h.id for h in by_path]
    like_path = runner.invoke(app, ["search", "--like", str(image), "-k", "3", "-c", str(world["col"]), "--no-server",
                                    "--format", "json"])
    assert [h["id"] for h in json.loads(like_path.stdout)["hits"]] == [h.id for h in by_path]
    mcp = _mcp(world, {"like": 1, "k": 3, "thumbnails": False})
    assert [h["id"] for h in mcp["hits"]] == [h.id for h in by_id]
    unknown = httpx2.post(world["url"] + "search", json={"id": 999999}, headers=world["headers"], timeout=60)
    assert unknown.status_code == 404 and "999999" in unknown.text


def test_mcp_search_takes_every_option_and_its_hits_carry_their_facts(world):
    arguments = {"query": QUERY, "k": 4, "where": ["taken>=1970", "width>=1"], "since": "1970", "until": "2100",
                 "sort": "-date", "min_score": -1.0, "rerank": False, "thumbnails": False}
    mcp = _mcp(world, arguments)
    assert set(OPTIONS) - {"video", "instruction"} <= set(mcp["schema"]["properties"])
    assert mcp["schema"]["properties"]["k"]["maximum"] == OPTIONS["k"].maximum("mcp")
    with Retriever(world["embedder"], collection=world["col"]) as retriever:
        expected = retriever.search(QUERY, k=4, where=["taken>=1970", "width>=1"], since="1970", until="2100",
                                    sort="-date", min_score=-1.0, rerank=False)
    assert [h["id"] for h in mcp["hits"]] == [h.id for h in expected]
    assert [h["facts"] for h in mcp["hits"]] == [None if h.facts is None else h.facts.to_dict() for h in expected]
    assert any(h["facts"] is not None for h in mcp["hits"])
    # a mapping reads as the CLI's KEY=VALUE words: a fact's name is the fact, as `--where country=Kenya`
    kenya = _mcp(world, {"query": QUERY, "where": {"country": "Kenya"}, "rerank": False, "thumbnails": False})
    words = _mcp(world, {"query": QUERY, "where": ["country=Kenya"], "rerank": False, "thumbnails": False})
    assert kenya["hits"] == words["hits"] and [Path(h["uri"]).name for h in kenya["hits"]] == ["nairobi.jpg"]


def _mcp_error(world, arguments: dict) -> str:
    with open_session(http_transport(world["url"] + "mcp", world["headers"], timeout=300)) as session:
        return error_text(session.call("search", arguments))


def test_where_takes_the_same_shapes_in_python_json_and_mcp_and_names_them_when_wrong(world):
    shapes = {"one condition": "country=Kenya", "conditions": ["country=Kenya"], "mapping": {"country": "Kenya"}}
    with Retriever(world["embedder"], collection=world["col"]) as retriever:
        for shape, where in shapes.items():
            python = [Path(h.uri).name for h in retriever.search(QUERY, where=where, rerank=False)]
            http = [h["name"] for h in _http(world, {"query": QUERY, "where": where, "rerank": False})["hits"]]
            mcp = _mcp(world, {"query": QUERY, "where": where, "rerank": False, "thumbnails": False})
            assert python == http == [h["name"] for h in mcp["hits"]] == ["nairobi.jpg"], shape
        # one value per key (a list is not "any of"), conditions are strings, and nothing else is a `where`
        for wrong in ({"country": ["Kenya"]}, ["country=Kenya", 3], 5):
            with pytest.raises(ConfigError) as python:
                retriever.search(QUERY, where=wrong)
            http = httpx2.post(world["url"] + "search", json={"query": QUERY, "where": wrong}, headers=world["headers"],
                               timeout=60)
            mcp = _mcp_error(world, {"query": QUERY, "where": wrong})
            assert http.status_code == 400
            for message in (str(python.value), http.json()["error"]["message"], mcp):
                assert f"where must be {WHERE_SHAPES}" in message, message
                assert "Input should be" not in message, message  # not pydantic's complaint per union member
            assert "argument `where`" in mcp


def test_mcp_searches_a_long_query_by_its_first_max_query_chars_characters(world):
    long = ("a picnic by the lake under a red umbrella, " * 200)[:3 * MAX_QUERY_CHARS]
    whole = _mcp(world, {"query": long, "k": 3, "rerank": False, "thumbnails": False})
    cut = _mcp(world, {"query": long[:MAX_QUERY_CHARS], "k": 3, "rerank": False, "thumbnails": False})
    assert whole["hits"] == cut["hits"] and whole["query"]["text"] == long[:MAX_QUERY_CHARS]
    assert "maxLength" not in whole["schema"]["properties"]["query"]  # no length of MCP's own


def test_the_search_options_route_is_the_declaration(world):
    from faste_mm.serving.options_route import search_options

    answer = httpx2.get(world["url"] + "search/options", timeout=60)  # public, like the page
    assert answer.status_code == 200 and answer.json() == search_options()
    options = answer.json()["options"]
    assert set(options) == set(options_for("http"))
    for name, shown in options.items():
        assert shown["default"] == DEFAULTS[name] and shown.get("choices", []) == list(OPTIONS[name].choices), name
    assert options["k"]["max"] == OPTIONS["k"].maximum("http")
    k_menu = answer.json()["page"]["k"]
    assert k_menu[0] == DEFAULTS["k"] and k_menu == sorted(k_menu) and k_menu[-1] <= options["k"]["max"]


def test_the_bench_clients_k_is_the_declared_default():
    import argparse

    from faste_mm.bench.client import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).k == DEFAULTS["k"]


def test_a_300_kb_query_with_the_collections_reranker_is_searched_by_its_first_2000_characters(world):
    long = ("a picnic by the lake under a red umbrella, " * 8000)[:300_000]
    with Retriever(world["embedder"], collection=world["col"]) as retriever:
        whole = retriever.search(long, k=3)
        cut = retriever.search(long[:MAX_QUERY_CHARS], k=3)
    assert all(h.rerank_score is not None for h in whole)  # the collection's reranker ran ...
    assert [(h.id, h.rerank_score, h.score) for h in whole] == [(h.id, h.rerank_score, h.score) for h in cut]  # ... on the cut


def test_the_embedder_and_the_retriever_embed_a_query_alike(world):
    embedder = world["embedder"]
    with Retriever(embedder, collection=world["col"]) as retriever:
        from_retriever = retriever.encode_queries(["a bear"]).embeddings
    np.testing.assert_allclose(embedder.encode_queries(["a bear"]).embeddings, from_retriever, atol=1e-6)


def test_lexical_search_without_a_server_imports_no_torch(world, tmp_path):
    expected = _cli(world, "--mode", "lexical", "--no-rerank", "--no-server")[0]
    loaded = tmp_path / "modules.json"
    code = ("import json, sys\nfrom faste_mm.cli.app import main\n"
            f"sys.argv = ['faste-mm', 'search', {QUERY!r}, '-c', {str(world['col'])!r}, '--mode', 'lexical', "
            "'--no-rerank', '--no-server', '--format', 'json']\n"
            "try:\n    main()\nexcept SystemExit as done:\n    assert not done.code, done.code\n"
            f"open({str(loaded)!r}, 'w').write(json.dumps(sorted(sys.modules)))\n")
    env = {key: value for key, value in os.environ.items() if key != "FASTE_MM_COLLECTION"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert [_plain(h) for h in json.loads(result.stdout)["hits"]] == expected
    modules = json.loads(loaded.read_text())
    assert [m for m in modules if m.split(".")[0] in ("torch", "transformers")] == []


def test_the_requests_choices_are_the_indexers_modes_and_kinds():
    from faste_mm.indexers.search import MODES
    from faste_mm.kinds import KINDS

    assert OPTIONS["mode"].choices == MODES and set(OPTIONS["type"].choices) == set(KINDS)


def test_a_parsed_querys_filters_join_a_request():
    from faste_mm.retrieval.search_request import SearchRequest

    request = SearchRequest.of("test", query="my photos", where=["tag=trip"])
    joined = request.with_filters(where=["place~lisbon"], since="2024-05", until="2024-05")
    assert joined.where == ("tag=trip", "place~lisbon") and joined.since == "2024-05" and joined.query == "my photos"
    assert set(options_for("python")) == set(OPTIONS)
