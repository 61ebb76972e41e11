"""The MCP server (Model Context Protocol, the official `mcp` SDK's low-level `Server`): the
tools of `serving.mcp_tools` with JSON-Schema input and output schemas and honest annotations,
the collection's items and albums as resources (`faste-mm://item/<id>`, `faste-mm://album/<name>`,
subscribable: serving/mcp_albums.py), the search results' view for MCP Apps hosts
(`serving.mcp_view`), over stdio (`faste-mm mcp`) or the streamable HTTP transport mounted at /mcp
inside `faste-mm serve` (`http_endpoint`).

Receives MCP requests; validates arguments against the tool's model, runs the tool in a worker
thread (the model is blocking work), and answers with structuredContent, a text summary,
`resource_link`s to the items and JPEGs as `image` content. A tool's failure is an answer with
isError and the message a CLI user would read, never a dropped connection. Needs the `mcp`
extra: pip install 'faste-mm[mcp]'.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.to_thread
import mcp_types as types
from mcp.server.lowlevel import Server
from pydantic import BaseModel, ValidationError

from faste_mm.errors import FasteError
from faste_mm.serving.mcp_albums import AlbumWatch, album_name, album_resources, album_template, read_album
from faste_mm.serving.mcp_tools import (ITEM_URI, PREVIEW_PX, ExplainArgs, ExplainOut, GetItemArgs, IndexArgs, IndexOut,
                                        InfoArgs, InfoOut, ItemOut, McpTools, MoreLikeThisArgs, SearchArgs, SearchOut,
                                        ToolAnswer)
from faste_mm.errors import InputError
from faste_mm.serving import mcp_view
from faste_mm.serving.thumbnails import has_thumbnail, preview

log = logging.getLogger(__name__)

RESOURCES_PAGE = 100  # items per resources/list page (the cursor is the last id)
INSTRUCTIONS = ("Search the user's indexed files (photos, PDFs, videos, notes) by meaning, words or picture. "
                "Start with `search`; look closer with `get_item`; `more_like_this` finds similar items; `explain` "
                "shows where the reranker looked; `info` describes the collection.")


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool: its name, what it does, its argument and answer models, and its annotations."""

    name: str
    title: str
    description: str
    args: type[BaseModel]
    out: type[BaseModel]
    read_only: bool = True
    destructive: bool = False
    idempotent: bool = True
    meta: dict | None = None  # the tool's `_meta` (the search tools name their MCP Apps view)

    def tool(self) -> types.Tool:
        return types.Tool(name=self.name, title=self.title, description=self.description,
                          input_schema=self.args.model_json_schema(), output_schema=self.out.model_json_schema(),
                          annotations=types.ToolAnnotations(title=self.title, read_only_hint=self.read_only,
                                                            destructive_hint=self.destructive,
                                                            idempotent_hint=self.idempotent, open_world_hint=False),
                          meta=self.meta)


SPECS = (
    ToolSpec("search", "Search the collection",
             "Find items by a text query and/or a picture (an indexed image's path or a data: URL); modes dense "
             "(meaning), lexical (words) and hybrid; filters by metadata, kind and path glob; optional reranking. "
             "Each hit has its file path, page, score and metadata, a link to the item and a small thumbnail.",
             SearchArgs, SearchOut, meta=mcp_view.tool_meta()),
    ToolSpec("more_like_this", "Find similar items", "Items most like an indexed item (by its id), itself left out.",
             MoreLikeThisArgs, SearchOut, meta=mcp_view.tool_meta()),
    ToolSpec("get_item", "Look at one item",
             f"An item's metadata, its text (text files, PDF text layers) and a picture up to {PREVIEW_PX} px "
             f"(a PDF page rendered, a video frame).", GetItemArgs, ItemOut),
    ToolSpec("explain", "Why this hit",
             "Where the reranker's readout looked in an item for a query: its score, the share of attention on "
             "the picture (shown as a heatmap over it) and on each text span. Attention, not attribution. Needs "
             "a reranker (faste-mm mcp --rerank MODEL, or the collection's).", ExplainArgs, ExplainOut),
    ToolSpec("info", "About the collection",
             "The collection's model, settings (profile), item counts and the measured fidelity of its settings.",
             InfoArgs, InfoOut),
    # Not read-only: it writes the collection; destructive: items of files gone from an indexed
    # folder are removed; idempotent: a second run with the same paths finds nothing to do.
    ToolSpec("index", "Index files",
             "Add files and folders to the collection, or bring them up to date (only new and changed files are "
             "embedded; files gone from an indexed folder are removed). Only under the folders the user allowed "
             "with --allow-index. Reports progress.", IndexArgs, IndexOut, read_only=False, destructive=True),
)
_BY_NAME = {spec.name: spec for spec in SPECS}


def build_server(tools: McpTools) -> Server:
    """The MCP server over `tools` (handlers registered; run it with `run_stdio` or `http_endpoint`)."""
    from faste_mm import __version__

    albums = AlbumWatch(tools.collection)  # album resources' subscriptions (serving/mcp_albums.py)

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[spec.tool() for spec in SPECS])

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        result = await _call(tools, ctx, params.name, params.arguments)
        if params.name == "index":  # it refreshed the albums: tell their subscribers now
            await anyio.to_thread.run_sync(albums.check)
        return result

    async def list_resources(ctx, params) -> types.ListResourcesResult:
        after = _cursor(None if params is None else params.cursor)
        records = await anyio.to_thread.run_sync(
            lambda: tools.reader().read(lambda rows: rows.live_records_after(after, RESOURCES_PAGE)))
        resources = [types.Resource(uri=ITEM_URI.format(id=r.id), name=_name(r.uri, r.page), description=r.uri,
                                    mime_type="application/json") for r in records]
        more = len(records) == RESOURCES_PAGE
        if after < 0:  # the first page: the search results' view, the albums, then the items
            resources = ([mcp_view.view_resource()] + await anyio.to_thread.run_sync(album_resources, tools.collection)
                         + resources)
        return types.ListResourcesResult(resources=resources, next_cursor=str(records[-1].id) if more else None)

    async def list_templates(ctx, params) -> types.ListResourceTemplatesResult:
        template = types.ResourceTemplate(uri_template="faste-mm://item/{id}", name="item",
                                          description="An indexed item by id: its metadata as JSON, and its picture",
                                          mime_type="application/json")
        return types.ListResourceTemplatesResult(resource_templates=[template, album_template()])

    async def read_resource(ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        if str(params.uri) == mcp_view.VIEW_URI:
            return mcp_view.read_view()
        if album_name(str(params.uri)) is not None:
            return await anyio.to_thread.run_sync(read_album, tools.collection, str(params.uri))
        return await anyio.to_thread.run_sync(functools.partial(_read_item, tools, str(params.uri)))

    server = Server("faste-mm", version=__version__, title="faste-mm", instructions=INSTRUCTIONS,
                    on_list_tools=list_tools, on_call_tool=call_tool, on_list_resources=list_resources,
                    on_list_resource_templates=list_templates, on_read_resource=read_resource,
                    on_subscribe_resource=albums.subscribe, on_unsubscribe_resource=albums.unsubscribe)
    server.extensions.update(mcp_view.EXTENSIONS)  # capabilities.extensions: MCP Apps
    return server


async def _call(tools: McpTools, ctx, name: str, arguments) -> types.CallToolResult:
    spec = _BY_NAME.get(name)
    if spec is None:
        return _error(f"no tool {name!r}; the tools are {', '.join(_BY_NAME)}")
    try:
        args = spec.args.model_validate(arguments or {})
    except ValidationError as error:
        return _error(f"{name}: {_validation_message(error)}")

    def progress(done: float, total: float | None, message: str | None) -> None:
        anyio.from_thread.run(ctx.session.report_progress, done, total, message)

    try:
        answer = await anyio.to_thread.run_sync(functools.partial(getattr(tools, name), args, progress))
    except FasteError as error:
        log.info("%s refused: %s", name, error)
        return _error(str(error))
    except Exception as error:  # noqa: BLE001 - the server keeps serving; the log has the traceback
        log.exception("%s failed", name)
        return _error(f"{name}: internal error ({type(error).__name__}: {error}); see the server's log")
    return _result(answer)


def _result(answer: ToolAnswer) -> types.CallToolResult:
    structured = answer.result.model_dump(mode="json")
    content: list = [types.TextContent(type="text", text=answer.summary)]
    for item_id, name, uri in answer.links:
        content.append(types.ResourceLink(type="resource_link", uri=ITEM_URI.format(id=item_id), name=name,
                                          description=uri, mime_type="application/json"))
    for item_id, label, data in answer.pictures:
        content.append(types.TextContent(type="text", text=label))
        # tagged with its item: the MCP Apps view pairs thumbnails with hits by it (`_meta` is for
        # clients, not the model)
        content.append(types.ImageContent(type="image", data=base64.b64encode(data).decode("ascii"),
                                          mime_type="image/jpeg", meta={mcp_view.PICTURE_ITEM_KEY: item_id}))
    return types.CallToolResult(content=content, structured_content=structured, is_error=False)


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


def _validation_message(error: ValidationError) -> str:
    """Pydantic's complaints, one per argument, without echoing the values (a 10 MB query stays out)."""
    parts = []
    for problem in error.errors()[:5]:
        where = ".".join(str(p) for p in problem.get("loc", ())) or "arguments"
        message = problem.get("msg", "invalid")
        value = problem.get("input")
        if isinstance(value, str) and problem.get("type") == "string_too_long":
            message += f" (got {len(value):,})"
        if problem.get("type") == "extra_forbidden":
            message = "unknown argument"
        parts.append(f"argument `{where}`: {message}")
    return "; ".join(parts) + "; see the tool's inputSchema"


def _cursor(cursor: str | None) -> int:
    if cursor is None:
        return -1
    if not (cursor.isascii() and cursor.isdigit() and len(cursor) <= 19):
        from mcp.shared.exceptions import MCPError

        raise MCPError(types.INVALID_PARAMS, f"bad cursor {cursor[:40]!r}; pass the nextCursor of a resources/list")
    return int(cursor)


def _read_item(tools: McpTools, uri: str) -> types.ReadResourceResult:
    """faste-mm://item/<id>: the item's metadata and text as JSON, and its picture as a JPEG blob."""
    from mcp.shared.exceptions import MCPError

    prefix = ITEM_URI.format(id="")
    number = uri[len(prefix):] if uri.startswith(prefix) else ""
    if not (number.isascii() and number.isdigit() and len(number) <= 19):
        raise MCPError(types.INVALID_PARAMS, f"{uri[:80]}: not an item of this server; items are {prefix}ID")
    try:
        answer = tools.get_item(GetItemArgs(id=int(number), preview=False))
    except FasteError as error:
        raise MCPError(types.INVALID_PARAMS, str(error)) from None
    item: ItemOut = answer.result
    contents: list = [types.TextResourceContents(uri=uri, mime_type="application/json",
                                                 text=json.dumps(item.model_dump(mode="json"), ensure_ascii=False))]
    if has_thumbnail(item.uri, item.page):
        try:
            data = preview(tools.record(item.id), PREVIEW_PX)
            contents.append(types.BlobResourceContents(uri=uri, mime_type="image/jpeg",
                                                       blob=base64.b64encode(data).decode("ascii")))
        except InputError as error:  # gone, or no longer the file indexed: the metadata alone
            log.warning("%s", error)
    return types.ReadResourceResult(contents=contents)


def _name(uri: str, page: int | None) -> str:
    return Path(uri).name + ("" if page is None else f" (page {page})")


# ---- transports --------------------------------------------------------------------------------
async def run_stdio(tools: McpTools) -> None:
    """Serve MCP on this process's stdin/stdout until the client closes it (stdout carries only
    the protocol: logs go to stderr)."""
    from mcp.server.stdio import stdio_server

    server = build_server(tools)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def http_endpoint(tools: McpTools):
    """(ASGI app, session manager) of the streamable HTTP transport for mounting inside serve.
    The manager's `run()` must be entered for the app's lifetime (serve's lifespan does). The
    SDK's own Host checks stay off: serve's guard applies its --allowed-host rules to /mcp as to
    every route, and its API key (serving.api)."""
    from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager

    manager = StreamableHTTPSessionManager(app=build_server(tools), json_response=False, stateless=False,
                                           security_settings=None)
    return StreamableHTTPASGIApp(manager), manager


def serve_endpoint(engine):
    """`http_endpoint` over a running `faste-mm serve`'s engine (its collection, its model thread,
    its --allow-index roots)."""
    from faste_mm.serving.mcp_paths import IndexRoots
    from faste_mm.serving.mcp_tools import EngineSlot

    return http_endpoint(McpTools(engine.collection, EngineSlot(engine=engine), IndexRoots(engine.config.index_roots)))
