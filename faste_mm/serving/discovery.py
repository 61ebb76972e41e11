"""A running `faste-mm serve` announces itself in the collection it serves, so `faste-mm search`
can ask it instead of loading the model again (seconds per query, more with real weights).

The server writes `server.json` into the collection directory (mode 0600, owner only): its URL,
a token (its API key when it has one: clients send `Authorization: Bearer TOKEN`), its process
id and model; it removes the file when it stops. A reader ignores a file that is not its own
user's, is readable by others, names a process that is gone, or a server that answers for
another collection: a stale file never sends a search astray. Standard library only (no torch,
no HTTP client package), so a CLI search through the server imports no model code.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import stat
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from faste_mm.indexers.file_names import SERVER_FILE
from faste_mm.retrieval.search_request import DEFAULTS

log = logging.getLogger(__name__)

_TIMEOUT_S = 30.0  # a search the server has queued may wait behind others' batches


@dataclass(frozen=True, slots=True)
class ServerAddress:
    """Where the server of a collection listens: `url` (ends with "/"), the bearer `token`
    clients send, the server's `pid` and `model`."""

    url: str
    token: str
    pid: int
    model: str


def announce(root: str | os.PathLike, url: str, model: str, api_key: str | None) -> ServerAddress:
    """Write `root/server.json` for this process (owner-only from its creation: the token is
    the API key when there is one, else a random one) and return what it holds."""
    address = ServerAddress(url if url.endswith("/") else url + "/", api_key or secrets.token_urlsafe(24),
                            os.getpid(), model)
    path = Path(root) / SERVER_FILE
    temporary = path.with_name(f".{SERVER_FILE}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(descriptor, 0o600)  # whatever the umask or an older file left
        os.write(descriptor, json.dumps({"url": address.url, "token": address.token, "pid": address.pid,
                                         "model": address.model}).encode())
    finally:
        os.close(descriptor)
    os.replace(temporary, path)
    return address


def withdraw(root: str | os.PathLike) -> None:
    """Remove `root/server.json` if this process wrote it (another server may have replaced it)."""
    path = Path(root) / SERVER_FILE
    found = _read(path)
    if found is not None and found.pid == os.getpid():
        path.unlink(missing_ok=True)


@contextmanager
def announced(root: str | os.PathLike, url: str, model: str, api_key: str | None) -> Iterator[ServerAddress]:
    """`announce` for the duration of the block (the server's lifetime), then `withdraw`."""
    address = announce(root, url, model, api_key)
    try:
        yield address
    finally:
        withdraw(root)


def find_server(root: str | os.PathLike) -> ServerAddress | None:
    """The live server announced in `root`, or None (no file, or a file to ignore: see the
    module docstring; the reason is logged at DEBUG)."""
    path = Path(root) / SERVER_FILE
    try:
        info = path.stat()
    except OSError:
        return None
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.debug("%s: ignored: not owned by this user with mode 0600", path)
        return None
    found = _read(path)
    if found is None:
        log.debug("%s: ignored: not a server file", path)
        return None
    try:
        os.kill(found.pid, 0)
    except ProcessLookupError:
        log.debug("%s: ignored: the server (pid %d) is gone", path, found.pid)
        return None
    except PermissionError:  # alive, another user's process: not ours to trust
        return None
    return found


def _read(path: Path) -> ServerAddress | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return ServerAddress(str(data["url"]), str(data["token"]), int(data["pid"]), str(data["model"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True, slots=True)
class RerankAsk:
    """How the caller's own search would rerank: `model` (--rerank; None: the collection's
    reranker, when it records one), `top` hits re-scored, and FastE's `r_max` on the reranker
    (0: the exact score)."""

    model: str | None = None
    top: int = DEFAULTS["rerank_top"]
    r_max: float = 0.0


def search_via_server(address: ServerAddress, root: str | os.PathLike, body: Mapping[str, Any], *,
                      rerank: RerankAsk | None = RerankAsk()) -> list[dict] | None:
    """The hits of `search_answer` (None as there)."""
    answer = search_answer(address, root, body, rerank=rerank)
    return None if answer is None else answer["hits"]


def search_answer(address: ServerAddress, root: str | os.PathLike, body: Mapping[str, Any], *,
                  rerank: RerankAsk | None = RerankAsk()) -> dict | None:
    """The answer of a search by the server: its hits (`Hit.to_dict()` fields, `rerank_score`
    included when reranked) and what it understood of the query (`UnderstoodQuery.to_dict()`), or None when it cannot answer for `root` (not reachable, another collection, an
    error). body: the request's wire form (`SearchRequest.wire`). `rerank`: how the caller's
    search would rerank (None: not at all, --no-rerank); the server reranks with its loaded
    (warm) reranker when that is the reranker the caller's search would load and the score is
    the exact one (`_serves_rerank`), else None: the caller searches itself. The server's /info
    says which reranker, so the client reads no manifest here."""
    info = _serving(address, root)
    if info is None:
        return None
    collection = info["collection"]
    wanted = None if rerank is None else (rerank.model or collection.get("reranker"))
    if wanted is not None and not _serves_rerank(info, wanted, rerank):
        log.debug("%s reranks with %s here: the server's reranker is %s", root, wanted, (info or {}).get("reranker"))
        return None
    # rerank exactly as the caller would: with the server's (the caller's) reranker, or not at all
    answer = _request(address, "search", {**body, "rerank": wanted is not None})
    if answer is None:
        return None
    fields = ("id", "score", "uri", "page", "metadata", "found_by", "facts", "rerank_score", "similarity")
    return {"hits": [{name: hit[name] for name in fields if name in hit} for hit in answer["hits"]],
            "understood": (answer.get("query") or {}).get("understood")}


def _serves_rerank(info: dict, wanted: str, ask: RerankAsk) -> bool:
    """Whether the server's loaded reranker gives what the caller's search would: the same model
    (a folder compared by its real path, as the loader names it) scoring exactly (no FastE on
    either side), and a `top` the server takes (1..1000)."""
    loaded = info.get("reranker") or {}
    model = loaded.get("model")
    if model is None or loaded.get("fast_e") is not None or ask.r_max != 0 or not 1 <= ask.top <= 1000:
        return False
    return _same_model(wanted, model)


def _same_model(wanted: str, model: str) -> bool:
    """Whether a reranker named `wanted` is the server's `model` (a folder by its real path, as the
    loader names it; a hub id as written)."""
    if os.path.isdir(wanted) or os.path.isdir(model):
        return os.path.realpath(wanted) == os.path.realpath(model)
    return wanted == model


def info_via_server(address: ServerAddress, root: str | os.PathLike) -> dict | None:
    """`faste-mm info --format json`'s report on `root` by the server (GET /info/collection,
    `retrieval.maintenance.collection_report`), or None when it cannot answer for `root` (not
    reachable, another collection, an older server without the route): the caller reads it itself.
    One request: the report names the collection it describes."""
    report = _request(address, "info/collection")
    served = None if report is None else report.get("path")
    if served is None or os.path.realpath(served) != os.path.realpath(root):
        log.debug("server %s does not report on %s (it serves %s)", address.url, root, served)
        return None
    return report


def explain_via_server(address: ServerAddress, root: str | os.PathLike, query: str, item_id: int,
                       layer: int | None, reranker: str | None) -> tuple[dict, str] | None:
    """(POST /explain's answer for item `item_id` of `root`, the reranker's model id), or None when
    the server cannot answer it: not reachable, another collection, no reranker, another
    reranker than `reranker` (the one the caller would load: --rerank, else the collection's;
    None and the collection records none = the server's own), or an error (an unknown id; the
    caller's own run names it). Explain runs the full forward: the server's FastE does not matter."""
    info = _serving(address, root)
    if info is None:
        return None
    wanted = reranker or info["collection"].get("reranker")
    served = (info.get("reranker") or {}).get("model")
    if served is None or wanted is not None and not _same_model(wanted, served):
        log.debug("server %s reranks with %s, not %s: the explanation runs here", address.url, served, wanted)
        return None
    answer = _request(address, "explain", {"query": query, "document_id": item_id, "layer": layer})
    return None if answer is None else (answer, served)


def _serving(address: ServerAddress, root: str | os.PathLike) -> dict | None:
    """The server's /info when it serves the collection at `root`, else None."""
    info = _request(address, "info")
    collection = {} if info is None else (info.get("collection") or {})
    served = collection.get("path")
    if served is None or os.path.realpath(served) != os.path.realpath(root):
        log.debug("server %s does not serve %s (it serves %s)", address.url, root, served)
        return None
    return info


def _request(address: ServerAddress, route: str, body: dict | None = None) -> dict | None:
    """GET (body None) or POST JSON to the server; its JSON answer, or None on any failure."""
    request = urllib.request.Request(
        address.url + route, method="GET" if body is None else "POST",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {address.token}", "Content-Type": "application/json"})
    try:
        with _NO_PROXY.open(request, timeout=_TIMEOUT_S) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        log.debug("server %s%s answered %d: %s", address.url, route, error.code, error.read()[:300])
    except (OSError, ValueError) as error:
        log.debug("server %s%s: %s", address.url, route, error)
    return None


# The server is on this machine: never route its requests through an HTTP(S)_PROXY.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
