"""`faste-mm search`, `info` and `explain` through the collection's running `faste-mm serve` (see
`faste_mm.serving.discovery`): the same hits, report and explanation as a local run, without
loading the model (or, for `info`, FAISS). Every module imported here is light: no torch,
transformers, FAISS or numpy."""

from __future__ import annotations

from pathlib import Path

from faste_mm.cli.common import stderr


def search_through_server(collection: str | None, request, rerank: str | None, rerank_r_max: str,
                          debug: bool) -> tuple[Path, list, object] | None:
    """(collection root, hits, the UnderstoodQuery or None) from the server announced in the collection, or None (no live
    server for it, it could not answer, the request has an input the wire cannot carry (an image,
    a video, an instruction), or it reranks with another reranker than the server's: the caller
    runs it here). With --debug, says which. `request`: the `SearchRequest`, sent in its wire form
    (`SearchRequest.wire`: the server parses it as this search would); `rerank`: --rerank MODEL
    (None: the collection's), `rerank_r_max` as given.

    The thin client: every module imported here is light (no torch, transformers, FAISS or
    numpy), so a search answered by the server costs a Python start-up and one HTTP round trip.
    """
    from faste_mm.errors import ConfigError
    from faste_mm.indexers.facts import facts_from_dict
    from faste_mm.indexers.filters import SearchFilter
    from faste_mm.retrieval.hits import Hit
    from faste_mm.retrieval.locations import collection_path
    from faste_mm.retrieval.query_understanding import UnderstoodQuery
    from faste_mm.serving.discovery import RerankAsk, find_server, search_answer

    root = collection_path(collection)
    try:
        body = request.wire("client")
    except ConfigError:  # an image, a video or an instruction: embedded here
        _say("search", None, False, "loading the model here (the request has an input only a local search takes)",
             debug, always=True)
        return None
    if request.path is not None:  # a relative glob is made absolute against this shell's folder, not the server's
        body["path"] = SearchFilter(path=request.path).path
    address = find_server(root)
    ask = None if request.rerank is False or request.is_like else RerankAsk(rerank, request.rerank_top, _ratio(rerank_r_max))
    answer = None if address is None else search_answer(address, root, body, rerank=ask)
    _say("search", address, answer is not None, "loading the model here", debug,
         otherwise_why="did not answer for it, or it has not loaded the reranker this search uses")
    if answer is None:
        return None
    understood = None if answer["understood"] is None else UnderstoodQuery.from_dict(answer["understood"])
    return root, [Hit(**{**row, "facts": facts_from_dict(row.get("facts"))}) for row in answer["hits"]], understood


def _ratio(text: str) -> float:
    """--rerank-r-max as a number; -1 for anything else (the local search names the error)."""
    try:
        return float(text)
    except ValueError:
        return -1.0


def info_through_server(root: Path, debug: bool) -> dict | None:
    """`info --format json`'s report on `root` from its server, or None (no live server for it, or
    it could not answer: the caller reads the collection). With --debug, says which."""
    from faste_mm.serving.discovery import find_server, info_via_server

    address = find_server(root)
    report = None if address is None else info_via_server(address, root)
    _say("info", address, report is not None, "reading the collection here", debug)
    return report


def explain_through_server(root: Path, query: str, item_id: int, layer: int | None, reranker: str | None,
                           debug: bool) -> tuple[dict, str] | None:
    """(the explanation, the reranker's model id) from the server of `root`, or None (no live server
    for it, no reranker or another one there, or it could not answer: the caller loads the reranker)."""
    from faste_mm.serving.discovery import explain_via_server, find_server

    address = find_server(root)
    answer = None if address is None else explain_via_server(address, root, query, item_id, layer, reranker)
    _say("explain", address, answer is not None, "loading the reranker here", debug)
    return answer


def _say(command: str, address, answered: bool, otherwise: str, debug: bool, always: bool = False,
         otherwise_why: str = "could not answer it") -> None:
    """--debug's line on stderr: which way the command went, and why not through a server."""
    if not debug:
        return
    if always:
        line = f"{command}: {otherwise}"
    elif answered:
        line = f"{command}: through the server at {address.url} (pid {address.pid})"
    elif address is None:
        line = f"{command}: {otherwise} (no running faste-mm serve for this collection)"
    else:
        line = f"{command}: {otherwise} (the server at {address.url} {otherwise_why})"
    stderr.print(line, highlight=False, markup=False)
