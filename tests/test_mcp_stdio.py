"""`faste-mm mcp` driven by the official MCP SDK's stdio client, one server process for the
module: initialize, tools/list with schemas and annotations, each tool (answers checked against
their outputSchema and against `Retriever.search`), resources, progress of the index tool, and
hostile arguments (paths outside the collection, /proc, FIFOs, huge k) answered with isError
while the server keeps serving; a 10 MB query is searched by its first MAX_QUERY_CHARS characters."""

from __future__ import annotations

import os
import shutil

import pytest

pytest.importorskip("mcp", reason="needs the mcp extra: pip install 'faste-mm[mcp]'")
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from faste_mm import BatchingConfig, Embedder, Retriever  # noqa: E402
from faste_mm.cli.app import app  # noqa: E402
from faste_mm.retrieval.search_request import MAX_QUERY_CHARS  # noqa: E402
from faste_mm.serving.mcp_tools import MAX_K, PREVIEW_PX  # noqa: E402
from tests.helpers.mcp_fixtures import check_structured, error_text, images_of, open_session, tiny_collection  # noqa: E402
from tests.helpers.warm_process import cli_command, installed_cli  # noqa: E402
from tests.helpers.rerank_fixtures import reranker_dirs  # noqa: E402, F401
from tests.helpers.inputs import tiny_vl_dir  # noqa: E402
from tests.helpers.bounds import HANG_S  # noqa: E402


@pytest.fixture(scope="module")
def world(tmp_path_factory, reranker_dirs):  # noqa: F811
    base = tmp_path_factory.mktemp("mcp-stdio")
    embedder, col, gallery, inbox = tiny_collection(base, reranker=str(reranker_dirs["qwen3_vl_reranker"]))
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(next(gallery.glob("*.png")), elsewhere / "copy.png")
    os.mkfifo(inbox / "pipe.png")  # a FIFO under the allowed root: never opened
    return {"embedder": embedder, "col": col, "gallery": gallery, "inbox": inbox, "elsewhere": elsewhere}


@pytest.fixture(scope="module")
def client(world, tmp_path_factory):
    """The SDK spawns the server command, a `faste-mm` that runs `faste-mm mcp` on its pipes in a
    process forked from the warm one (tests/helpers/warm_process.py `cli_command`; the installed
    script with FASTE_MM_TEST_FRESH=1): the same server and stdio transport, without ~6 CPU-seconds
    of imports first. The installed console script, started fresh, is the server of
    test_a_model_that_cannot_load_answers_with_the_cli_message."""
    params = StdioServerParameters(command=cli_command(tmp_path_factory.mktemp("mcp-cli")),
                                   args=["mcp", "-c", str(world["col"]), "--allow-index", str(world["inbox"]),
                                         "--device", "cpu"])
    with open(os.devnull, "w") as quiet, open_session(stdio_client(params, errlog=quiet)) as session:
        yield session


@pytest.fixture(scope="module")
def tools(client):
    return {tool.name: tool for tool in client.list_tools().tools}


def test_tools_list_their_schemas_and_honest_annotations(tools):
    assert set(tools) == {"search", "more_like_this", "get_item", "explain", "info", "index"}
    for tool in tools.values():
        assert tool.input_schema["type"] == "object" and tool.output_schema["type"] == "object"
        assert tool.annotations.open_world_hint is False
    assert tools["search"].input_schema["properties"]["k"]["maximum"] == MAX_K
    for name in ("search", "more_like_this", "get_item", "explain", "info"):
        hints = tools[name].annotations
        assert (hints.read_only_hint, hints.destructive_hint, hints.idempotent_hint) == (True, False, True)
    index = tools["index"].annotations
    assert (index.read_only_hint, index.destructive_hint, index.idempotent_hint) == (False, True, True)


def test_search_by_text_equals_the_retrievers_hits_with_links_and_thumbnails(client, tools, world):
    result = client.call("search", {"query": "a sunset over the sea", "k": 4, "rerank": False})
    found = check_structured(tools, "search", result)
    reference = Retriever(world["embedder"], collection=world["col"]).search("a sunset over the sea", k=4, rerank=False)
    assert [h["id"] for h in found["hits"]] == [h.id for h in reference]
    assert [h["score"] for h in found["hits"]] == pytest.approx([h.score for h in reference], abs=1e-5)
    links = [c for c in result.content if c.type == "resource_link"]
    assert [str(link.uri) for link in links] == [f"faste-mm://item/{h.id}" for h in reference]
    pictured = [h for h in found["hits"] if h["kind"] in ("image", "pdf")]
    assert len(images_of(result)) == len(pictured) and all(max(i.size) <= 160 for i in images_of(result))


def test_search_reranks_by_default_with_the_collections_reranker_as_the_library_does(client, tools, world):
    found = check_structured(tools, "search", client.call("search", {"query": "a report", "k": 3}))
    reference = Retriever(world["embedder"], collection=world["col"]).search("a report", k=3)
    assert found["reranked_by"] is not None
    assert [h["id"] for h in found["hits"]] == [h.id for h in reference]
    assert [h["rerank_score"] for h in found["hits"]] == pytest.approx([h.rerank_score for h in reference], abs=1e-4)


def test_search_by_an_indexed_image_finds_that_image_first(client, tools, world):
    image = sorted(world["gallery"].glob("*.png"))[1]
    found = check_structured(tools, "search", client.call("search", {"image": str(image), "k": 3, "rerank": False}))
    assert found["hits"][0]["uri"] == str(image.resolve())
    assert found["hits"][0]["score"] == pytest.approx(1.0, abs=1e-3)


def test_more_like_this_leaves_the_item_out(client, tools):
    found = check_structured(tools, "more_like_this", client.call("more_like_this", {"id": 0, "k": 3}))
    assert len(found["hits"]) == 3 and 0 not in [h["id"] for h in found["hits"]]


def test_get_item_of_a_pdf_page_has_its_rendered_page(client, tools, world):
    pages = check_structured(tools, "search", client.call("search", {"query": "report", "type": ["pdf"], "k": 2}))
    page = pages["hits"][0]
    result = client.call("get_item", {"id": page["id"]})
    item = check_structured(tools, "get_item", result)
    assert item["uri"].endswith("report.pdf") and item["page"] in (1, 2)
    [picture] = images_of(result)
    assert max(picture.size) <= PREVIEW_PX and picture.format == "JPEG"


def test_explain_shows_the_readout_attention_as_a_heatmap(client, tools, world):
    image_hit = next(h for h in check_structured(tools, "search", client.call("search", {"query": "x", "k": 6}))["hits"]
                     if h["kind"] == "image")
    result = client.call("explain", {"query": "a forest", "id": image_hit["id"]})
    why = check_structured(tools, "explain", result)
    assert 0 <= why["score"] <= 1 and why["image_share"] > 0
    assert why["query_share"] + why["document_share"] == pytest.approx(1.0, abs=1e-3)
    assert len(images_of(result)) == 1


def test_info_reports_the_profile_and_counts(client, tools, world):
    info = check_structured(tools, "info", client.call("info"))
    assert info["items"] == 4 + 2 + 1 and info["model"] == str(tiny_vl_dir(world["col"].parent.parent))
    assert info["index_roots"] == [str(world["inbox"].resolve())]


def test_index_is_refused_outside_the_allowed_roots_and_reports_progress_inside(client, tools, world):
    assert "outside the folders this server may index" in error_text(
        client.call("index", {"paths": [str(world["elsewhere"])]}))
    assert "never read" in error_text(client.call("index", {"paths": ["/proc/self"]}))
    assert "not a regular file" in error_text(client.call("index", {"paths": [str(world["inbox"] / "pipe.png")]}))
    missing = str(world["inbox"] / "images")  # under an allowed root, but a mistyped folder: named, nothing indexed
    assert f"{missing}: no such file or folder" in error_text(client.call("index", {"paths": [missing]}))
    updates = []

    async def progress(done, total, message):
        updates.append((done, total, message))

    report = check_structured(tools, "index", client.call("index", {"paths": [str(world["inbox"] / "new-scene.png")]},
                                                          progress=progress))["report"]
    assert report["embedded"] == 1 and updates and updates[-1][0] == updates[-1][1] == 1
    again = check_structured(tools, "index", client.call("index", {"paths": [str(world["inbox"] / "new-scene.png")]}))
    assert again["report"]["embedded"] == 0 and again["report"]["unchanged"] == 1  # idempotent, as annotated
    new = check_structured(tools, "search", client.call("search", {"image": str(world["inbox"] / "new-scene.png"),
                                                                   "k": 1, "rerank": False}))
    assert new["hits"][0]["uri"] == str((world["inbox"] / "new-scene.png").resolve())  # the server searches it now


def test_resources_list_and_read_items(client):
    # the results' view (ui://) is test_mcp_app_view's
    listed = [r for r in client.list_resources().resources if not str(r.uri).startswith("ui://")]
    assert len(listed) >= 7 and all(str(r.uri).startswith("faste-mm://item/") for r in listed)
    image = next(r for r in listed if r.name.endswith(".png"))
    contents = client.read_resource(image.uri).contents
    assert [c.mime_type for c in contents] == ["application/json", "image/jpeg"]


@pytest.mark.parametrize("arguments, message", [
    ({"query": "x", "k": 10**9}, f"less than or equal to {MAX_K}"),
    ({"query": "x", "k": "many"}, "argument `k`"),
    ({"query": "x", "colour": "red"}, "argument `colour`: unknown argument"),
    ({"image": "/proc/self/environ"}, "never read"),
    ({"image": "/etc/passwd"}, "is not a file of the collection"),
    ({"image": "file:///etc/passwd"}, "URLs are not fetched"),
    ({"image": "ELSEWHERE/copy.png"}, "is not a file of the collection"),
    ({"image": "INBOX/pipe.png"}, "not a regular file"),
    ({"image": "data:image/png;base64,AAAA"}, "not a readable image"),
    ({}, "give a `query` text"),
])
def test_hostile_search_arguments_are_refused_and_the_server_keeps_serving(client, world, arguments, message):
    arguments = {key: value.replace("ELSEWHERE", str(world["elsewhere"])).replace("INBOX", str(world["inbox"]))
                 if isinstance(value, str) else value for key, value in arguments.items()}
    assert message in error_text(client.call("search", arguments))
    assert not client.call("search", {"query": "still serving", "k": 1}).is_error


def test_a_10_mb_query_is_searched_by_its_first_characters_as_in_every_front_end(client, tools):
    huge = check_structured(tools, "search", client.call("search", {"query": "x" * (10 << 20), "k": 1, "rerank": False,
                                                                    "thumbnails": False}))
    cut = check_structured(tools, "search", client.call("search", {"query": "x" * MAX_QUERY_CHARS, "k": 1,
                                                                   "rerank": False, "thumbnails": False}))
    assert huge["hits"] == cut["hits"] and huge["query"]["text"] == "x" * MAX_QUERY_CHARS


def test_unknown_ids_and_uris_are_refused_by_name(client):
    assert "id 999999: no such item" in error_text(client.call("get_item", {"id": 999999}))
    assert "no such item" in error_text(client.call("more_like_this", {"id": 999999}))
    assert "no tool 'delete_everything'" in error_text(client.call("delete_everything"))
    with pytest.raises(Exception, match="not an item of this server"):
        client.read_resource("faste-mm://item/../../etc/passwd")


def test_a_model_that_cannot_load_answers_with_the_cli_message(tmp_path):
    """Also the installed `faste-mm` script in a fresh interpreter as the SDK's server: nothing
    its imports print reaches stdout, the protocol's channel."""
    model = shutil.copytree(tiny_vl_dir(tmp_path.parent), tmp_path / "model")
    embedder = Embedder.from_pretrained(str(model), device="cpu", batching=BatchingConfig(batch_tokens=1 << 16))
    Retriever(embedder, collection=tmp_path / "col").add(["a note"])
    shutil.rmtree(model)
    cli = CliRunner().invoke(app, ["search", "a note", "-c", str(tmp_path / "col"), "--no-server"])
    assert cli.exit_code == 1
    params = StdioServerParameters(command=installed_cli(), args=["mcp", "-c", str(tmp_path / "col")])
    with open(os.devnull, "w") as quiet, open_session(stdio_client(params, errlog=quiet)) as session:
        message = error_text(session.call_tool("search", {"query": "a note"}))
        assert message.split(";")[0] in " ".join(cli.output.split())
        assert not session.call_tool("info", {}).is_error  # what needs no model still answers


def test_a_replaced_indexed_file_is_not_read_by_search_or_get_item(tmp_path, world):
    from faste_mm.indexers import Collection
    from faste_mm.retrieval.stored_files import ReplacedFileError
    from faste_mm.serving.mcp_paths import IndexRoots, query_image_file
    from faste_mm.serving.mcp_tools import EngineSlot, GetItemArgs, McpTools

    picture = shutil.copy(next(world["gallery"].glob("*.png")), tmp_path / "victim.png")
    Retriever(world["embedder"], collection=tmp_path / "col").index([picture])
    os.replace(shutil.copy(sorted(world["gallery"].glob("*.png"))[-1], tmp_path / "other.png"), picture)  # new inode
    with Collection.open(tmp_path / "col") as col:
        with pytest.raises(ReplacedFileError, match="victim.png"):
            query_image_file(str(picture), col, IndexRoots())
    tools = McpTools(tmp_path / "col", EngineSlot(engine=object()), IndexRoots())
    answer = tools.get_item(GetItemArgs(id=0))
    assert answer.pictures == [] and "no picture" in answer.summary and answer.result.uri == str(picture)


def test_the_engine_loads_once_a_tool_before_it_is_ready_waits_and_a_failed_load_is_tried_again():
    import threading

    from faste_mm.errors import ModelLoadError
    from faste_mm.serving.mcp_tools import EngineSlot

    entered, release, loads = threading.Event(), threading.Event(), []

    class _Engine:
        def start(self):
            return self

    def load():
        loads.append(1)
        if len(loads) == 1:
            raise ModelLoadError("no such model: try again")
        entered.set()
        assert release.wait(HANG_S), "the test never released the load"
        return _Engine()

    slot = EngineSlot(load)
    with pytest.raises(ModelLoadError, match="no such model"):
        slot.get()
    got = []
    waiting = [threading.Thread(target=lambda: got.append(slot.get())) for _ in range(2)]
    for thread in waiting:
        thread.start()
    assert entered.wait(HANG_S), "the second load never started"
    assert got == [] and all(thread.is_alive() for thread in waiting)  # both wait for the one load
    release.set()
    for thread in waiting:
        thread.join(HANG_S)
        assert not thread.is_alive(), "a waiter never got the loaded engine"
    assert len(loads) == 2 and got[0] is got[1]
