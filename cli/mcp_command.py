"""`faste-mm mcp`: an MCP server over stdio for an AI assistant (Claude Desktop, an IDE agent):
tools to search, look at and explain the collection's items, and to index files under the
folders --allow-index names. Thin: options -> the same engine `serve` loads (made on first
need, the model loading in the background from the start) -> `serving.mcp_server.run_stdio`.
stdout carries the protocol only; messages go to stderr.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from faste_mm.cli.common import fail, setup_logging, stderr
from faste_mm.cli.options import RERANK_TOWER_CACHE_MB, CollectionOption, Debug, Device, Dtype, Rerank
from faste_mm.errors import ConfigError, FasteError

MCP_INSTALL = "pip install 'faste-mm[mcp]'"


def mcp_command(
    collection: CollectionOption = None,
    allow_index: Optional[list[Path]] = typer.Option(
        None, "--allow-index", envvar="FASTE_MM_ALLOW_INDEX",
        help="A folder under which the assistant's index tool may add and update files (repeatable; the "
             "variable takes folders separated by spaces). Default: none, the index tool refuses everything."),
    rerank: Rerank = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    debug: Debug = False,
) -> None:
    """Serve the collection to an AI assistant over MCP on stdin/stdout (tools: search,
    more_like_this, get_item, explain, info, index; items as faste-mm://item/ID resources)."""
    try:
        import anyio
        import mcp  # noqa: F401  (the SDK: checked before anything loads)
    except ImportError:
        stderr.print(f"[red]error:[/red] faste-mm mcp needs the MCP SDK (not installed); install the extra: "
                     f"{escape(MCP_INSTALL)}", highlight=False)
        raise typer.Exit(1)
    setup_logging(debug)
    if not debug:  # what the server does (loads, refusals) on stderr; libraries' chatter stays out
        logging.getLogger("faste_mm").setLevel(logging.INFO)
    try:
        tools = _tools(collection, allow_index or [], rerank, device, dtype)
    except FasteError as error:
        fail(error, debug)
    from faste_mm.serving.mcp_server import run_stdio

    tools.slot.warm_up()  # the model loads while the client initializes; a search waits for it
    try:
        anyio.run(run_stdio, tools)
    except KeyboardInterrupt:
        pass
    finally:
        tools.slot.close()


def _tools(collection, allow_index, rerank, device, dtype):
    from faste_mm.cli.collection_commands import load_reranker
    from faste_mm.cli.serve import _load_engine
    from faste_mm.retrieval.maintenance import collection_path
    from faste_mm.retrieval.profile import existing_profile
    from faste_mm.serving import ServeConfig
    from faste_mm.serving.mcp_paths import IndexRoots
    from faste_mm.serving.mcp_tools import EngineSlot, McpTools

    root = collection_path(collection)
    if existing_profile(root) is None:  # refused before any model loads
        which = f"the collection {root}" if collection else f"no -c given and the default collection {root}"
        raise ConfigError(f"{which} does not exist yet; index files into it first (faste-mm index PATH"
                          f"{f' -c {collection}' if collection else ''}), or name another with -c")
    roots = IndexRoots.of(allow_index)

    def load():  # the engine `faste-mm serve -c` loads: the collection's model, its reranker or --rerank
        def reranker_for(where):
            return load_reranker(rerank, where, "0", "none", device, RERANK_TOWER_CACHE_MB)

        return _load_engine(collection=str(root), model=None, revision=None, device=device, dtype=dtype,
                            batch_tokens=None, unpadded="auto", config=ServeConfig(), settings={},
                            reranker_for=reranker_for)

    stderr.print(f"faste-mm mcp: collection {root}; index tool "
                 f"{'allowed under ' + ', '.join(map(str, roots.roots)) if roots.roots else 'refuses all paths'}")
    return McpTools(root, EngineSlot(load), roots)
