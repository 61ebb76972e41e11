"""The HTTP API (FastAPI): OpenAI-compatible /v1/embeddings with vLLM's chat extension, /search,
/search/options, /thumbnails/{id}, /duplicates, /albums, /health, /info, /info/collection (`faste-mm
info`'s report), /metrics, and the search page at / with its local assets.

Receives HTTP requests; hands their items to the `ServeEngine` and renders its answers as
JSON. Errors are JSON in OpenAI's shape, {"error": {"message", "type", "code"}}: 400 bad input,
401 missing or wrong API key, 404 unknown id or route, 409 the collection was re-indexed with another model
(restart the server), 413 over a limit, 503 queue full.
"""
# Size: ~460 lines: one route each for the whole HTTP surface (embeddings, search, duplicates, watch, rerank,
# thumbnails) with its error mapping; request parsing lives in serving/inputs.

from __future__ import annotations

import hmac
import logging
import time
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from faste_mm.errors import ConfigError, FasteError, InputError
from faste_mm.retrieval.maintenance import collection_report
from faste_mm.retrieval.result_order import search_filter
from faste_mm.retrieval.search_request import SearchRequest
from faste_mm.indexers.filters import INT64_MAX
from faste_mm.kinds import kind_name
from faste_mm.serving.batcher import QueueFullError
from faste_mm.serving.albums_route import add_albums_route
from faste_mm.serving.duplicates_route import add_duplicates_route
from faste_mm.serving.engine import (CollectionChangedError, ModelStalledError, NoCollectionError,
                                     RequestTooLargeError, ServeEngine, UnknownItemError)
from faste_mm.serving.inputs import (EmbeddingRequest, decode_image_bytes, decode_image_url, embedding_items,
                                     encode_vector, form_values, request_model, to_request)
from faste_mm.serving.metrics import LATENCY_BUCKETS_S
from faste_mm.serving.options_route import add_options_route
from faste_mm.serving.reindex_watch import CollectionReindexingError
from faste_mm.serving.previews import add_preview_routes, note_snippets
from faste_mm.serving.rerank import add_rerank_routes, with_search_top
from faste_mm.serving.security import is_allowed_host, is_cross_site
from faste_mm.retrieval.stored_files import GoneFileError, ReplacedFileError
from faste_mm.serving.thumbnails import NoThumbnailError, default_cache_dir, has_thumbnail, thumbnail

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
SEARCH_BODY = request_model("http", "SearchBody")  # POST /search's JSON body: the options' declarations
PUBLIC_PATHS = ("/", "/health", "/favicon.ico", "/search/options")  # and /static/*: the page holds no data
# The page loads only its own script, style and images (thumbnails; blob: for uploads and keyed
# fetches), talks only to this server, and may not be framed; every other answer is data.
PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
            "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
DATA_CSP = "default-src 'none'; frame-ancestors 'none'; sandbox"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def create_app(engine: ServeEngine) -> FastAPI:
    """The FastAPI app over an engine (already holding a loaded model). The app starts the
    engine's model thread on startup and stops it on shutdown.

    Example:
        >>> engine = ServeEngine(Embedder.from_pretrained(path), retriever, ServeConfig())
        >>> uvicorn.run(create_app(engine), host="127.0.0.1", port=8000)
    """
    from contextlib import asynccontextmanager

    mcp_manager = _mcp_endpoint(engine)  # /mcp: the MCP tools over this engine (serving/mcp_server.py)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        try:
            if mcp_manager is None:
                yield
            else:
                async with mcp_manager[1].run():
                    yield
        finally:
            engine.close()

    # No /docs: FastAPI's Swagger UI loads its scripts from a CDN. The schema is at /openapi.json.
    app = FastAPI(title="faste-mm", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine = engine
    app.add_middleware(_UnexpectedErrorMiddleware)
    app.add_middleware(_BodyLimitMiddleware, limit=engine.config.max_body_bytes)
    app.add_middleware(_GuardMiddleware, allowed=engine.config.allowed_hosts, has_key=engine.config.api_key is not None)
    app.add_middleware(_MetricsMiddleware, engine=engine)  # added last = outermost: counts 403s and 413s too
    _add_error_handlers(app)
    auth = Depends(_require_key(engine.config.api_key))

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    add_options_route(app)  # GET /search/options: the declared options the page builds its controls from

    @app.get("/health")
    async def health() -> dict:  # on the event loop: never waits for a worker thread or the model
        return {"status": "ok"}

    @app.get("/info", dependencies=[auth])
    def info() -> dict:
        return with_search_top(engine.info())

    @app.get("/info/collection", dependencies=[auth])
    def collection_info() -> dict:
        # `faste-mm info --format json` of the served collection: a CLI `info` prints it, importing no FAISS
        if engine.collection is None:
            raise NoCollectionError("this server serves no collection; start it with -c COLLECTION")
        return collection_report(engine.collection)

    @app.get("/metrics", dependencies=[auth])
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(engine.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", dependencies=[auth])
    def models() -> dict:
        return {"object": "list", "data": [{"id": engine.embedder.model_id, "object": "model", "owned_by": "faste-mm"}]}

    @app.post("/v1/embeddings", dependencies=[auth])
    def embeddings(body: EmbeddingRequest) -> dict:
        _check_model(body.model, engine)
        items, instruction = embedding_items(body, engine.config.allow_remote_images)
        result = engine.embed(items, body.input_type, instruction, body.dimensions, body.truncate)
        data = [{"object": "embedding", "index": i, "embedding": encode_vector(vector, body.encoding_format),
                 "truncated": truncated} for i, (vector, truncated) in enumerate(zip(result.vectors, result.truncated))]
        usage = {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}
        return {"object": "list", "data": data, "model": engine.embedder.model_id, "usage": usage}

    @app.post("/search", dependencies=[auth])
    async def search(request: Request) -> dict:
        asked = await _search_request(request, engine)
        started = time.perf_counter()
        reranker = engine.search_reranker(asked)
        hits = await run_in_threadpool(engine.search, asked)
        snippets = await run_in_threadpool(note_snippets, engine, hits)
        understood = await run_in_threadpool(engine.understood, asked)
        where = search_filter(asked.where, asked.type, asked.path, asked.since, asked.until)
        return {
            "query": {"text": asked.query, "image": asked.image is not None,
                      "id": asked.like if isinstance(asked.like, int) else None, "like": asked.like,
                      "crop": None if asked.crop is None else list(asked.crop),
                      "understood": None if understood is None else understood.to_dict()},
            "k": asked.k, "mode": asked.mode, "sort": asked.sort, "min_score": asked.min_score,
            "filter": {"where": where.where, "types": list(where.types), "path": where.path,
                       "facts": [str(c) for c in where.facts]},
            "rerank": None if reranker is None else {"model": reranker.model_id, "top": max(asked.k, asked.rerank_top)},
            "took_ms": round(1000 * (time.perf_counter() - started), 1),
            "hits": [{**_hit_json(rank, hit), "snippet": snippets.get(hit.id)} for rank, hit in enumerate(hits, 1)],
        }

    add_duplicates_route(app, engine, auth)  # GET /duplicates (serving/duplicates_route.py)
    add_albums_route(app, engine, auth, _hit_json)  # GET /albums, /albums/{name} (serving/albums_route.py)
    add_rerank_routes(app, engine, auth)  # /v1/rerank, /rerank, /explain (serving/rerank.py)
    add_preview_routes(app, engine, auth)  # /previews/{id}: the page's larger look (serving/previews.py)
    if mcp_manager is not None:  # an ASGI app of its own: the key is checked here, the Host by _GuardMiddleware
        app.add_route("/mcp", _KeyRequired(mcp_manager[0], engine.config.api_key), methods=["GET", "POST", "DELETE"],
                      include_in_schema=False)

    @app.get("/thumbnails/{item_id}", dependencies=[auth])
    def thumbnails(item_id: str) -> Response:
        # ids only (ASCII digits of a 64-bit id): nothing from the request ever becomes a path
        if not (item_id.isascii() and item_id.isdigit() and len(item_id) <= 19 and int(item_id) <= INT64_MAX):
            raise UnknownItemError(f"{item_id[:40]!r} is not an item id; thumbnails are served by numeric id")
        record = engine.record(int(item_id))
        cache = engine.config.thumbnail_dir or default_cache_dir(engine.collection)
        return Response(thumbnail(record, cache), media_type="image/jpeg",
                        headers={"Cache-Control": "private, max-age=3600"})

    return app


def _mcp_endpoint(engine: ServeEngine):
    """/mcp's (ASGI app, session manager), or None without a collection or the `mcp` extra."""
    try:
        from faste_mm.serving.mcp_server import serve_endpoint
    except ImportError:
        return None
    return None if engine.collection is None else serve_endpoint(engine)


class _KeyRequired:
    """The API key check of the data routes (`_require_key`) for a mounted ASGI app (/mcp)."""

    def __init__(self, app, api_key: str | None) -> None:
        self.app = app
        self.check = _require_key(api_key)

    async def __call__(self, scope, receive, send):
        try:
            self.check(Request(scope))
        except HTTPException as error:
            return await _error_response(error.status_code, error.detail)(scope, receive, send)
        return await self.app(scope, receive, send)


# ---- request pieces --------------------------------------------------------------------------
def _check_model(model: str | None, engine: ServeEngine) -> None:
    served = engine.embedder.model_id
    if model is None or model in (served, Path(served).name, "faste-mm"):
        return
    raise InputError(f"`model` is {model!r}, but this server serves {served!r}; pass that id "
                     f"(or {Path(served).name!r}), or leave `model` out")


async def _search_request(request: Request, engine: ServeEngine) -> SearchRequest:
    """The `SearchRequest` of a JSON body (`SEARCH_BODY`, made from the options' declarations) or
    a multipart / urlencoded form (`inputs.form_values`: q, k, id, mode, ... and an `image` file,
    as curl -F sends them); InputError (400) naming a bad field."""
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data") or content_type.startswith("application/x-www-form-urlencoded"):
        form = await request.form()
        values = form_values(form)
        image = None
        upload = form.get("image")
        if upload is not None and not isinstance(upload, str):
            raw = await upload.read()
            if raw:  # decoding is CPU work: off the event loop
                image = await run_in_threadpool(decode_image_bytes, raw, f"image ({upload.filename or 'upload'})")
        return to_request(values, "POST /search", image=image)
    try:
        body = SEARCH_BODY.model_validate(await request.json())
    except RecursionError:
        raise InputError("the search body is JSON nested too deeply; send a flat object "
                         "({\"query\": ..., \"k\": ...})") from None
    except ValueError as error:
        raise InputError(f"the search body must be JSON ({{\"query\": ..., \"k\": ...}}) or a multipart form: "
                         f"{_validation_message(error)}") from None
    image = None
    if body.image is not None:
        image = await run_in_threadpool(decode_image_url, body.image, "image", engine.config.allow_remote_images)
    return to_request(body.model_dump(), "POST /search", image=image)


def _hit_json(rank: int, hit) -> dict:
    return {"rank": rank, **hit.to_dict(), "name": Path(hit.uri).name, "kind": kind_name(hit.uri),
            "thumbnail": f"/thumbnails/{hit.id}" if has_thumbnail(hit.uri, hit.page) else None}


# ---- auth, limits, metrics, errors -----------------------------------------------------------
def _require_key(api_key: str | None):
    expected = None if api_key is None else f"Bearer {api_key}".encode()

    def check(request: Request) -> None:
        if expected is None:
            return
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):  # constant time: no key guessing by timing
            raise HTTPException(401, "missing or wrong API key; send the header 'Authorization: Bearer KEY'"
                                if given else "this server needs an API key; send 'Authorization: Bearer KEY'")

    return check


class _UnexpectedErrorMiddleware:
    """Answer an exception no handler took with a JSON 500 here, inside the app. Starlette's
    outermost error middleware would answer too, but then re-raise, and uvicorn closes the
    connection of a request whose app raised: a client's keep-alive connection would be reset."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def send_tracked(event):
            nonlocal started
            started = started or event["type"] == "http.response.start"
            await send(event)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception as error:
            if started:  # too late for an answer: let the server end the connection
                raise
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            await _error_response(500, f"internal error ({type(error).__name__}: {error}); see the server log")(
                scope, receive, send)


class _GuardMiddleware:
    """Refuse (403) a Host this server does not answer to (DNS rebinding), and a cross-site POST
    when no API key guards the server (a page on another site submitting a form to us); add
    nosniff, no framing and a content security policy to every answer."""

    def __init__(self, app, allowed: tuple[str, ...], has_key: bool) -> None:
        self.app = app
        self.allowed = allowed
        self.has_key = has_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        host = headers.get("host")
        if not is_allowed_host(host, self.allowed):
            shown = (host or "")[:80]
            log.warning("refused a request for host %r (not one of %s)", shown, ", ".join(self.allowed))
            return await _error_response(403, f"this server does not answer to the host {shown!r}; it answers to "
                                              f"{', '.join(self.allowed)}. Start it with --allowed-host NAME to "
                                              f"reach it by that name")(scope, receive, self._secured(send, scope))
        if scope["method"] not in _SAFE_METHODS and not self.has_key and is_cross_site(headers, self.allowed):
            return await _error_response(403, "a page on another site may not send requests to this server; "
                                              "open its own page, or start the server with --api-key")(
                scope, receive, self._secured(send, scope))
        return await self.app(scope, receive, self._secured(send, scope))

    @staticmethod
    def _secured(send, scope):
        policy = (PAGE_CSP if scope["path"] == "/" else DATA_CSP).encode()

        async def send_secured(event):
            if event["type"] == "http.response.start":
                event = {**event, "headers": [*event.get("headers", []), (b"x-content-type-options", b"nosniff"),
                                              (b"x-frame-options", b"DENY"), (b"content-security-policy", policy),
                                              (b"referrer-policy", b"same-origin")]}
            await send(event)

        return send_secured


class _BodyLimitMiddleware:
    """413 for bodies over `limit` bytes: at once from Content-Length, else while streaming."""

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        message = (f"the request body is larger than the server's limit of {self.limit} bytes "
                   f"(--max-body-bytes); send fewer or smaller inputs")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            response = _error_response(413, message)
            return await response(scope, receive, send)
        seen = 0

        async def limited_receive():
            nonlocal seen
            event = await receive()
            if event["type"] == "http.request":
                seen += len(event.get("body", b""))
                if seen > self.limit:
                    raise HTTPException(413, message)  # FastAPI re-raises HTTPExceptions from body reads
            return event

        return await self.app(scope, limited_receive, send)


class _MetricsMiddleware:
    """Requests and latency per route template (never the raw path: ids would explode the labels)."""

    def __init__(self, app, engine: ServeEngine) -> None:
        self.app = app
        self.metrics = engine.metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = {"code": 500}

        async def send_status(event):
            if event["type"] == "http.response.start":
                status["code"] = event["status"]
            await send(event)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or ("/static" if scope["path"].startswith("/static/")
                                                                    else "other")
            self.metrics.inc("faste_mm_requests_total", route=route, method=scope["method"], code=str(status["code"]))
            self.metrics.observe("faste_mm_request_seconds", time.perf_counter() - started, LATENCY_BUCKETS_S,
                                 route=route)


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                409: "conflict", 413: "request_too_large", 503: "server_busy", 500: "server_error"}


def _error_response(status: int, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else ({"Retry-After": "1"} if status == 503 else None)
    return JSONResponse({"error": {"message": message, "type": _ERROR_TYPES.get(status, "error"), "code": status}},
                        status_code=status, headers=headers)


def _validation_message(error) -> str:
    errors = error.errors() if hasattr(error, "errors") else []
    parts = []
    for e in errors[:5]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return "; ".join(parts) or str(error)


def _add_error_handlers(app: FastAPI) -> None:
    status_of = ((UnknownItemError, 404), (NoThumbnailError, 404), (NoCollectionError, 404), (CollectionChangedError, 409),
                 (CollectionReindexingError, 503), (ModelStalledError, 503),
                 (GoneFileError, 404), (ReplacedFileError, 409),
                 (RequestTooLargeError, 413), (QueueFullError, 503), (InputError, 400), (ConfigError, 400))

    @app.exception_handler(FasteError)
    async def faste_error(request: Request, error: FasteError) -> JSONResponse:
        status = next((code for cls, code in status_of if isinstance(error, cls)), 500)
        if status == 500:
            log.error("%s %s: %s", request.method, request.url.path, error)
        return _error_response(status, str(error))

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, error: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return _error_response(500, f"internal error ({type(error).__name__}: {error}); see the server log")

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        return _error_response(400, f"bad request body: {_validation_message(error)}")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        message = error.detail if isinstance(error.detail, str) else str(error.detail)
        if error.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path}; the API is described at GET /openapi.json"
        return _error_response(error.status_code, message)
