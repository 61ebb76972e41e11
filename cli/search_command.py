"""`faste-mm search`: a query (text, --image, --video) and filters -> the collection's running
server or a local `Retriever.search` (reranked with --rerank or the collection's reranker) -> hits
on stdout as a table, --format json or paths. Every option also reads a FASTE_MM_* variable.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from faste_mm.cli.common import fail, markup_safe, print_json, setup_logging, stdout, usage_error
from faste_mm.cli.options import CollectionOption, Debug, Device, NoServer
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
                                    help="Only items meeting a condition; repeatable (all must hold). On the facts "
                                         "read from the files (quote < and > in a shell): taken>=2024-05-01, taken<2025, camera~pixel (~: "
                                         "contains), rating>=4, place~lisbon, keyword=beach, has:gps (see "
                                         "docs/photos.md); on metadata: KEY=VALUE, VALUE a number, true/false, or "
                                         "text (quote a number to match it as text: year='\"2024\"')."),
    since: Optional[str] = typer.Option(None, "--since", envvar="FASTE_MM_SINCE",
                                        help="Only items taken on or after this date (YYYY, YYYY-MM, YYYY-MM-DD, or "
                                             "an ISO time; UTC unless it has an offset)."),
    until: Optional[str] = typer.Option(None, "--until", envvar="FASTE_MM_UNTIL",
                                        help="Only items taken on or before this date, all of it (--until 2024-05 "
                                             "keeps May)."),
    sort: str = typer.Option("relevance", "--sort", envvar="FASTE_MM_SORT",
                             help="relevance (default) | date (oldest first) | -date (newest first): the k best "
                                  "hits, in this order."),
    min_score: Optional[float] = typer.Option(None, "--min-score", envvar="FASTE_MM_MIN_SCORE",
                                              help="Drop hits whose cosine score is below this, -1..1 (e.g. 0.3). "
                                                   "Default: the collection's (index --min-score), else none."),
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
    no_server: NoServer = False,
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
    conditions, facts, order = _checked_filters(where, since, until, sort, min_score, mode)
    try:
        served = None
        # The server answers plain dense text searches; a reranked, lexical/hybrid, image, video or
        # instruction search runs here (a collection with a default reranker reranks unless --no-rerank).
        local_only = (image is not None or video is not None or instruction is not None
                      or mode != "dense" or rescore is not None or lexical_syntax)
        # (the server's /info says whether the collection records a reranker: no manifest read here;
        # a reranked search goes to the server when it has the reranker this search would load, warm)
        if not no_server and not local_only:
            reranking = None if no_rerank else (rerank, rerank_top, rerank_r_max)
            served = search_through_server(collection, query, k, where, kind, path, reranking, debug, order)
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
                                        where=list(where), type=kind or None, path=path, mode=mode, rescore=rescore,
                                        lexical_syntax=lexical_syntax, rerank=False if reranker is None else reranker,
                                        rerank_top=rerank_top, **order)
                root = retriever.collection
    except FasteError as error:
        fail(error, debug)
    if output is SearchFormat.json:
        payload = {"query": {"text": query, "image": None if image is None else str(image),
                             "video": None if video is None else str(video)},
                   "collection": str(root), "k": k, "mode": mode,
                   "filter": {"where": conditions, "types": list(kind), "path": path,
                              "facts": [str(c) for c in facts], "since": since, "until": until},
                   "sort": sort, "min_score": min_score,
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
        similar = any(hit.similarity is not None for hit in hits)  # hybrid: the cosine beside the fused score
        # photos: the date taken (from the file, not its mtime) and the place, when some hit has one
        dated = any(h.facts is not None and h.facts.taken is not None for h in hits)
        placed = any(h.facts is not None and h.facts.place for h in hits)
        columns = (("rank", "right"), ("score", "right"), *((("similarity", "right"),) if similar else ()),
                   *((("rerank", "right"),) if reranked else ()),
                   ("file", "left"), ("page", "right"), *((("taken", "left"),) if dated else ()),
                   *((("place", "left"),) if placed else ()))
        for column, justify in columns:
            table.add_column(column, justify=justify, overflow="fold")
        for rank, hit in enumerate(hits, 1):
            rerank_cell = () if not reranked else ("-" if hit.rerank_score is None else f"{hit.rerank_score:.4f}",)
            facts_cells = ((_taken_cell(hit),) if dated else ()) + ((markup_safe(hit.facts.place or "")
                                                                     if hit.facts else "",) if placed else ())
            similarity_cell = (f"{hit.similarity:.4f}",) if similar else ()
            table.add_row(str(rank), f"{hit.score:.4f}", *similarity_cell, *rerank_cell, markup_safe(hit.uri),
                          "" if hit.page is None else str(hit.page), *facts_cells)
        stdout.print(table)


def _taken_cell(hit) -> str:
    """The date taken as recorded (local time and offset), or "no date" (none in the file)."""
    if hit.facts is None or hit.facts.taken is None:
        return "no date"
    return hit.facts.taken_iso().replace("T", " ")


def _checked_filters(where: list[str], since: str | None, until: str | None, sort: str,
                     min_score: float | None, mode: str) -> tuple[dict, tuple, dict]:
    """The --where conditions (metadata dict, fact conditions) and the order options, checked here so
    a bad one is a usage error (exit 2) naming the value and the valid form, before any model loads."""
    from faste_mm.errors import ConfigError
    from faste_mm.indexers.filters import parse_where
    from faste_mm.retrieval import result_order

    try:
        conditions, facts = parse_where(where)
        facts += result_order.date_conditions(since, until)
        result_order.check_sort(sort)
        result_order.check_min_score_mode(result_order.check_min_score(min_score), mode)
    except ConfigError as error:
        usage_error(str(error).replace("min_score", "--min-score").replace("use mode ", "use --mode ").replace("search since", "--since")
                    .replace("search until", "--until").replace("search sort", "--sort").replace("where ", "--where ", 1))
    return conditions, facts, {"since": since, "until": until, "sort": sort, "min_score": min_score}
