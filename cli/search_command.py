"""`faste-mm search`: a query (text, --image, --video) and filters -> the collection's running
server or a local `Retriever.search` (reranked with --rerank or the collection's reranker) -> hits
on stdout as a table, --format json or paths. Every option also reads a FASTE_MM_* variable.
"""

from __future__ import annotations

import json
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from faste_mm.cli.common import fail, markup_safe, print_json, setup_logging, stdout, usage_error
from faste_mm.cli.options import CollectionOption, Debug, Device
from faste_mm.cli.options import RERANK_TOWER_CACHE_MB, Rerank, RerankProtect, RerankRMax, RerankTop, RerankTowerCacheMb
from faste_mm.cli.collection_commands import load_reranker
from faste_mm.cli.progress import quiet_transformers
from faste_mm.errors import FasteError


class SearchFormat(str, Enum):
    """search's stdout: --format's table and json, and paths (one per line, for scripts)."""

    table = "table"
    json = "json"
    paths = "paths"


def search_command(
    query: Optional[str] = typer.Argument(None, help="Query text (optional with --image or --video)."),
    image: Optional[Path] = typer.Option(None, "--image", envvar="FASTE_MM_IMAGE",
                                         help="Query image; alone it finds visually similar items."),
    video: Optional[Path] = typer.Option(None, "--video", envvar="FASTE_MM_VIDEO",
                                         help="Query video, sampled like the collection's videos; alone it "
                                              "finds similar items."),
    collection: CollectionOption = None,
    k: int = typer.Option(10, "-k", envvar="FASTE_MM_K", min=1, help="Number of results (default 10)."),
    output: SearchFormat = typer.Option(SearchFormat.table, "--format", envvar="FASTE_MM_FORMAT", show_default=False,
                                        help="table | json (documented schema) | paths (one per line). Default table."),
    instruction: Optional[str] = typer.Option(None, "--instruction", envvar="FASTE_MM_QUERY_INSTRUCTION",
                                              help="Query instruction. Default: 'Retrieve images or text "
                                                   "relevant to the user's query.' for text queries."),
    where: list[str] = typer.Option([], "--where", envvar="FASTE_MM_WHERE",
                                    help="Only items whose metadata has KEY equal to VALUE, as KEY=VALUE; "
                                         "repeatable (all must hold). VALUE is a number, true/false, or text "
                                         "(quote a number to match it as text: year='\"2024\"')."),
    kind: list[str] = typer.Option([], "--type", envvar="FASTE_MM_TYPE",
                                   help="Only items of this kind: image | pdf | text | video; repeatable (any of them)."),
    path: Optional[str] = typer.Option(None, "--path", envvar="FASTE_MM_PATH",
                                       help="Only files whose path matches this glob ('*' also matches '/'), "
                                            "e.g. '*/invoices/*', '*.pdf', './photos/*'."),
    mode: str = typer.Option("dense", "--mode", envvar="FASTE_MM_SEARCH_MODE",
                             help="dense (by meaning, default) | lexical (by words: file names, text, PDF text "
                                  "layers, metadata; loads no model) | hybrid (both, reciprocal-rank fused)."),
    rescore: Optional[int] = typer.Option(None, "--rescore", envvar="FASTE_MM_RESCORE", min=0,
                                          help="Candidates per result that an int8/binary/PQ index returns to be "
                                               "rescored exactly from the copy on disk (0 = none). Default: "
                                               "20 for binary, 2 for int8, 4 for PQ."),
    lexical_syntax: bool = typer.Option(False, "--lexical-syntax", envvar="FASTE_MM_LEXICAL_SYNTAX",
                                        help="Read the query as SQLite FTS5 syntax (AND OR NOT \"phrase\" prefix*) "
                                             "in lexical and hybrid modes; default: plain words."),
    rerank: Rerank = None,
    rerank_top: RerankTop = 50,
    rerank_r_max: RerankRMax = "0",
    rerank_protect: RerankProtect = "none",
    rerank_tower_cache_mb: RerankTowerCacheMb = RERANK_TOWER_CACHE_MB,
    no_rerank: bool = typer.Option(False, "--no-rerank", envvar="FASTE_MM_NO_RERANK",
                                   help="Do not rerank, even with a collection reranker."),
    no_server: bool = typer.Option(False, "--no-server", envvar="FASTE_MM_NO_SERVER",
                                   help="Load the model here even when a faste-mm serve is serving the "
                                        "collection (default: a text search asks that server)."),
    device: Device = "auto",
    debug: Debug = False,
) -> None:
    """Search a collection by text, image and/or video; the model is the one the collection was built with.
    A text search asks the collection's running `faste-mm serve`, if any, instead of loading the model."""
    # The thin client: up to the server's answer this path imports no torch, transformers or FAISS
    # (the Retriever and the search modes' module load only for a search run here).
    from faste_mm.cli.server_search import search_through_server

    setup_logging(debug)
    if query is None and image is None and video is None:
        usage_error("give a QUERY text, --image PATH, --video PATH, or a combination")
    if mode != "dense":  # only a dense search may go to the server: the others check here
        from faste_mm.indexers.search import MODES

        if mode not in MODES:
            usage_error(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    conditions = _parse_where(where)
    try:
        served = None
        # The server answers plain dense text searches; a reranked, lexical/hybrid, image, video or
        # instruction search runs here (a collection with a default reranker reranks unless --no-rerank).
        local_only = (image is not None or video is not None or instruction is not None or rerank is not None
                      or mode != "dense" or rescore is not None or lexical_syntax)
        # (the server's /info says whether the collection records a reranker: no manifest read here)
        if not no_server and not local_only:
            served = search_through_server(collection, query, k, conditions, kind, path, not no_rerank, debug)
        if served is not None:
            root, hits = served
        else:
            from faste_mm.retrieval.retriever import Retriever

            with Retriever.open(collection, device=device) as retriever:
                if mode != "lexical":  # lexical search loads no model
                    quiet_transformers()  # the model loads in search(): no per-weight bar on stderr
                reranker = None if no_rerank else load_reranker(rerank, retriever.collection, rerank_r_max,
                                                                 rerank_protect, device, rerank_tower_cache_mb)
                hits = retriever.search(query, image=image, video=video, k=k, instruction=instruction,
                                        where=conditions, type=kind or None, path=path, mode=mode, rescore=rescore,
                                        lexical_syntax=lexical_syntax, rerank=False if reranker is None else reranker,
                                        rerank_top=rerank_top)
                root = retriever.collection
    except FasteError as error:
        fail(error, debug)
    if output is SearchFormat.json:
        payload = {"query": {"text": query, "image": None if image is None else str(image),
                             "video": None if video is None else str(video)},
                   "collection": str(root), "k": k, "mode": mode,
                   "filter": {"where": conditions, "types": list(kind), "path": path},
                   "hits": [{"rank": rank, **hit.to_dict()} for rank, hit in enumerate(hits, 1)]}
        print_json(payload)
    elif output is SearchFormat.paths:
        sys.stdout.flush()
        for hit in hits:
            # Plain bytes: rich would wrap long paths or interpret brackets in file names, and
            # a name that is not UTF-8 goes out as the very bytes a script can open.
            sys.stdout.buffer.write(os.fsencode(hit.uri) + b"\n")
        sys.stdout.buffer.flush()
    else:
        table = Table(title=f"{len(hits)} results")
        reranked = any(hit.rerank_score is not None for hit in hits)
        columns = (("rank", "right"), ("score", "right"), *((("rerank", "right"),) if reranked else ()),
                   ("file", "left"), ("page", "right"))
        for column, justify in columns:
            table.add_column(column, justify=justify, overflow="fold")
        for rank, hit in enumerate(hits, 1):
            rerank_cell = () if not reranked else ("-" if hit.rerank_score is None else f"{hit.rerank_score:.4f}",)
            table.add_row(str(rank), f"{hit.score:.4f}", *rerank_cell, markup_safe(hit.uri),
                          "" if hit.page is None else str(hit.page))
        stdout.print(table)


def _parse_where(conditions: list[str]) -> dict:
    """--where KEY=VALUE options -> {key: value}: VALUE read as JSON when it is a number, true or
    false, or a quoted string; any other text as itself (so tag=invoice needs no quotes)."""
    parsed = {}
    for condition in conditions:
        key, sep, text = condition.partition("=")
        if not sep or not key.strip():
            usage_error(f"--where takes KEY=VALUE, e.g. --where tag=invoice; got {condition!r}")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        parsed[key.strip()] = value if isinstance(value, (str, int, float, bool)) else text
    return parsed
