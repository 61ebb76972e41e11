"""`faste-mm search`: a query (text, --image, --video, or --like an item) and filters -> one
`SearchRequest` (its options are the flags, made from their declarations) -> the collection's running
server or the library's executor here (reranked with --rerank or the collection's reranker; a
lexical search that reranks nothing loads no model and no torch) -> hits on stdout as a table,
--format json or paths. Every option also reads a FASTE_MM_* variable.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, get_type_hints

import typer
from rich.table import Table

from faste_mm.cli.common import fail, markup_safe, print_json, setup_logging, stderr, stdout, usage_error
from faste_mm.cli.options import CollectionOption, Debug, Device, NoServer
from faste_mm.cli.options import RERANK_TOWER_CACHE_MB, Rerank, RerankProtect, RerankRMax, RerankTowerCacheMb
from faste_mm.cli.collection_commands import load_reranker
from faste_mm.cli.progress import quiet_transformers
from faste_mm.errors import ConfigError, FasteError, InputError
from faste_mm.retrieval.search_request import DEFAULTS, OPTIONS, Option, SearchRequest, options_for


class SearchFormat(str, Enum):
    """search's stdout: --format's table and json, and paths (one per line, for scripts)."""

    table = "table"
    json = "json"
    paths = "paths"


def _cli_type(declared: Option) -> Any:
    """The Python type typer parses an option's flag as (None = not given)."""
    return {"int": Optional[int], "float": Optional[float], "bool": bool, "texts": list[str], "where": list[str],
            "image": Optional[Path]}.get(declared.kind, Optional[str])


def _cli_default(name: str) -> Any:
    default = DEFAULTS[name]
    return [] if OPTIONS[name].kind in ("texts", "where") else default


def _cli_help(name: str, declared: Option) -> str:
    default = DEFAULTS[name]
    repeat = " Repeatable." if declared.kind in ("texts", "where") else ""
    shown = "" if default is None or declared.kind == "bool" or "Default" in declared.help else f" Default {default}."
    return declared.help + repeat + shown


def takes_search_options(command: Callable[..., Any], names: tuple[str, ...] | None = None) -> Callable[..., Any]:
    """`command` taking every search option the command line shows (`SearchRequest`'s declarations:
    flag, FASTE_MM_* variable, bounds, help), or those of `names`, after its own parameters; it
    receives their values as `options` (by option name)."""
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != "options"]
    declared = {name: option for name, option in options_for("cli").items()
                if option.flag is not None and (names is None or name in names)}
    added = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=_cli_default(name),
                               annotation=Annotated[_cli_type(option), typer.Option(
                                   option.flag, envvar=option.envvar, help=_cli_help(name, option),
                                   show_default=False, **option.bounds,
                                   **({"metavar": "X,Y,W,H"} if option.kind == "box" else {}))])
             for name, option in declared.items()]
    hints = get_type_hints(command, include_extras=True)

    @functools.wraps(command)
    def run(**values: Any) -> Any:
        options = {name: values.pop(name) for name in declared}
        return command(options=options, **values)

    run.__signature__ = signature.replace(parameters=[*own, *added])
    run.__annotations__ = {**{p.name: hints[p.name] for p in own if p.name in hints},
                           **{p.name: p.annotation for p in added}}
    return run


@takes_search_options
def search_command(
    query: Optional[str] = typer.Argument(None, help=OPTIONS["query"].help + " Optional with --image, --video or "
                                                                             "--like."),
    collection: CollectionOption = None,
    output: SearchFormat = typer.Option(SearchFormat.table, "--format", envvar="FASTE_MM_FORMAT", show_default=False,
                                        help="table | json (documented schema) | paths (one per line). Default table."),
    rerank: Rerank = None,
    rerank_r_max: RerankRMax = "0",
    rerank_protect: RerankProtect = "none",
    rerank_tower_cache_mb: RerankTowerCacheMb = RERANK_TOWER_CACHE_MB,
    no_rerank: bool = typer.Option(False, "--no-rerank", envvar="FASTE_MM_NO_RERANK",
                                   help="Do not rerank, even with a collection reranker."),
    no_server: NoServer = False,
    device: Device = "auto",
    debug: Debug = False,
    options: dict | None = None,
) -> None:
    """Search a collection by text, image and/or video, or for items like one (--like ID|PATH); the model is
    the one the collection was built with. A search the collection's running `faste-mm serve` can answer goes
    to it instead of loading the model."""
    # The thin client: up to the server's answer this path imports no torch, transformers or FAISS
    # (the Retriever and the search modes' module load only for a search run here).
    from faste_mm.cli.server_search import search_through_server

    setup_logging(debug)
    request = _request(query, options, no_rerank)
    try:
        served = None if no_server else search_through_server(collection, request, rerank, rerank_r_max, debug)
        if served is not None:
            root, hits, asked = served
        elif request.mode == "lexical" and rerank is None and _reranks_nothing(collection, request):
            from faste_mm.retrieval.locations import collection_path
            from faste_mm.retrieval.search_executor import search_words

            root = collection_path(collection)  # words only: no model, no torch (issue 46)
            hits = search_words(root, replace(request, rerank=False))
        else:
            from faste_mm.retrieval.retriever import Retriever

            with Retriever.open(collection, device=device) as retriever:
                if request.mode != "lexical":  # lexical search loads no model
                    quiet_transformers()  # the model loads in search(): no per-weight bar on stderr
                # --rerank MODEL, else the collection's, with the --rerank-* settings (more like this: only if named)
                if request.rerank is not False and (not request.is_like or rerank is not None):
                    request = replace(request, rerank=load_reranker(rerank, retriever.collection, rerank_r_max,
                                                                    rerank_protect, device, rerank_tower_cache_mb)
                                      or False)
                hits = retriever.execute([request])[0]
                if isinstance(hits, Exception):
                    raise hits
                root = retriever.collection
        if served is None:  # what a server read, it says in its answer
            asked = _understood(root, request)
    except FasteError as error:
        fail(error, debug)
    if asked is not None and asked.summary():  # what was read as filters, so a surprise can be undone (--literal)
        stderr.print(asked.summary(), highlight=False, markup=False)
    _render(output, request, root, hits, asked)


def _understood(root: Path, request: SearchRequest):
    """What a search run here read from the query text (None: no text, or more like this)."""
    from faste_mm.retrieval.search_executor import understood_in

    return understood_in(root, request)


def _request(query: str | None, options: dict, no_rerank: bool) -> SearchRequest:
    """The search request of the command line; a bad option is a usage error (exit 2) naming its
    flag and the valid form, before any model loads."""
    from faste_mm.indexers.filters import parse_where
    from faste_mm.retrieval import result_order

    given = {name: (None if value == [] else tuple(value) if isinstance(value, list) else value)
             for name, value in options.items()}
    like = given.get("like")
    if isinstance(like, str) and not like.isdigit():
        given["like"] = str(Path(like).expanduser().absolute())  # this shell's folder, whoever answers
    elif isinstance(like, str):
        given["like"] = int(like)
    try:
        request = SearchRequest.of("search", query=query, rerank=False if no_rerank else None, **given)
        parse_where(list(request.where or ()))  # the condition's own message, before anything loads
        result_order.date_conditions(request.since, request.until)
        result_order.check_min_score_mode(request.min_score, request.mode)
    except (ConfigError, InputError) as error:
        usage_error(_in_flag_words(str(error)))
    return request


def _in_flag_words(message: str) -> str:
    """A request's message with option names as the flags that set them ("search k" -> "-k")."""
    for name, declared in OPTIONS.items():
        flag = declared.flag or ("QUERY" if name == "query" else "--no-rerank")
        message = message.replace(f"search {name} ", f"{flag} ").replace(f"search {name}:", f"{flag}:")
        message = message.replace(f"`{name}`", flag)
    message = message.replace("min_score", "--min-score").replace("use mode ", "use --mode ")
    return message.replace("where ", "--where ", 1) if message.startswith("where ") else message


def _reranks_nothing(collection: str | None, request: SearchRequest) -> bool:
    """Whether the request reranks nothing: --no-rerank, or a collection without a reranker."""
    from faste_mm.retrieval.locations import collection_path
    from faste_mm.retrieval.profile import read_profile

    return request.rerank is False or read_profile(collection_path(collection)).reranker is None


def _render(output: SearchFormat, request: SearchRequest, root: Path, hits: list, asked=None) -> None:
    """The hits on stdout: the table, --format json (documented schema) or paths."""
    if output is SearchFormat.json:
        from faste_mm.retrieval import result_order

        where = result_order.search_filter(request.where, request.type, request.path)
        conditions, facts = where.where, where.facts
        payload = {"query": {"text": request.query, "image": None if request.image is None else str(request.image),
                             "video": None if request.video is None else str(request.video), "like": request.like,
                             "crop": None if request.crop is None else list(request.crop),
                             "understood": None if asked is None else asked.to_dict()},
                   "collection": str(root), "k": request.k, "mode": request.mode,
                   "filter": {"where": conditions, "types": list(request.type or ()), "path": request.path,
                              "facts": [str(c) for c in facts + result_order.date_conditions(request.since,
                                                                                                 request.until)],
                              "since": request.since, "until": request.until},
                   "sort": request.sort, "min_score": request.min_score,
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
