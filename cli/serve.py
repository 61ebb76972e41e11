"""`faste-mm serve`: one process, one model load, an HTTP API (OpenAI-compatible embeddings,
search, thumbnails, metrics) and a search page. Thin: options -> ServeConfig -> engine -> uvicorn.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Optional

import typer

from rich.markup import escape

from faste_mm.cli.common import fail, setup_logging, stderr
from faste_mm.cli.options import (DEFAULT_BATCH_TOKENS, DEFAULT_MODEL, SERVE_MERGE_TOKENS, BatchTokens, CollectionOption, Debug, Device, Dtype,
                                  Unpadded, fast_e_config)
from faste_mm.cli.setting_flags import FLAG_OF_FIELD, GivenFlags, on_serve, takes_settings
from faste_mm.cli.options import RERANK_TOWER_CACHE_MB, Rerank, RerankProtect, RerankRMax, RerankTowerCacheMb
from faste_mm.errors import ConfigError, FasteError
from faste_mm.retrieval.profile import CollectionProfile

SERVE_INSTALL = "pip install 'faste-mm[serve]'"


@takes_settings(on_serve)
def serve_command(
    collection: CollectionOption = None,
    host: str = typer.Option("127.0.0.1", "--host", envvar="FASTE_MM_HOST",
                             help="Address to bind (default 127.0.0.1). Any non-loopback address needs "
                                  "--api-key or --insecure."),
    port: int = typer.Option(8000, "--port", envvar="FASTE_MM_PORT", min=0, max=65535,
                             help="TCP port (default 8000; 0 picks a free one)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="FASTE_MM_API_KEY",
                                          help="Require 'Authorization: Bearer KEY' on every data route "
                                               "(the page and /health stay public)."),
    insecure: bool = typer.Option(False, "--insecure", help="Allow a non-loopback --host without --api-key."),
    allowed_host: Optional[list[str]] = typer.Option(
        None, "--allowed-host", envvar="FASTE_MM_ALLOWED_HOSTS",
        help="Another name clients reach the server by (repeatable; the variable takes names separated by "
             "spaces). Requests naming any other Host get 403 (DNS rebinding). Always answered: localhost, "
             "127.0.0.1, [::1] and --host. '*' answers any name (behind a proxy that checks it)."),
    allow_index: Optional[list[Path]] = typer.Option(
        None, "--allow-index", envvar="FASTE_MM_ALLOW_INDEX",
        help="A folder under which the MCP index tool (/mcp) may add and update files (repeatable). Default: "
             "none, the index tool refuses everything."),
    batch_tokens: BatchTokens = DEFAULT_BATCH_TOKENS,
    max_wait_ms: float = typer.Option(5.0, "--max-wait-ms", envvar="FASTE_MM_MAX_WAIT_MS", min=0,
                                      help="Longest a request waits for others to join its batch, in ms (default 5)."),
    max_queue: int = typer.Option(256, "--max-queue", envvar="FASTE_MM_MAX_QUEUE", min=1,
                                  help="Requests that may wait per kind (query, document, search) before new "
                                       "ones get 503 (default 256)."),
    max_request_tokens: int = typer.Option(65536, "--max-request-tokens", envvar="FASTE_MM_MAX_REQUEST_TOKENS",
                                           min=1, help="Prompt tokens one request may carry; 413 above (default 65536)."),
    max_body_bytes: int = typer.Option(16 << 20, "--max-body-bytes", envvar="FASTE_MM_MAX_BODY_BYTES", min=1,
                                       help="Largest request body in bytes; 413 above (default 16 MiB)."),
    allow_remote_images: bool = typer.Option(False, "--allow-remote-images", envvar="FASTE_MM_ALLOW_REMOTE_IMAGES",
                                             help="Fetch http(s) image URLs (off by default: SSRF risk); data: "
                                                  "URLs and uploads always work."),
    device: Device = "auto",
    dtype: Dtype = "auto",
    threads: Optional[int] = typer.Option(None, "--threads", envvar="FASTE_MM_THREADS", min=1,
                                          help="CPU threads of the model (torch.set_num_threads); default: "
                                               "torch's (one per core). On a busy shared CPU, 1 avoids threads "
                                               "waiting on each other."),
    unpadded: Unpadded = "auto",
    rerank: Rerank = None,
    rerank_r_max: RerankRMax = "0",
    rerank_protect: RerankProtect = "none",
    rerank_tower_cache_mb: RerankTowerCacheMb = RERANK_TOWER_CACHE_MB,
    watch: Optional[list[Path]] = typer.Option(
        None, "--watch", envvar="FASTE_MM_WATCH", show_default=False,
        help="Keep the collection in sync with this folder while serving (repeatable): new and changed files "
             "indexed, deleted ones removed, as `faste-mm watch` does; a few files per poll on the model "
             "thread, so searches are answered meanwhile. Needs -c or the default collection."),
    watch_interval: float = typer.Option(5.0, "--watch-interval", envvar="FASTE_MM_WATCH_INTERVAL", min=0.01,
                                         help="Seconds between polls of --watch folders (default 5)."),
    debug: Debug = False,
    settings: GivenFlags = GivenFlags({}),
) -> None:
    """Serve embeddings (OpenAI-compatible /v1/embeddings), search and a search page at / (the
    default collection unless -c names another; --model alone: embeddings only)."""
    _require_serve_extra()  # before anything loads: a missing package must not cost a model load
    try:
        from faste_mm.serving import BatcherConfig, ServeConfig, check_bind
        from faste_mm.serving.security import host_names

        check_bind(host, api_key, insecure)  # before anything else: a refused bind changes nothing
        setup_logging(debug, logging.INFO)
        # FastE for an embeddings-only server's documents (default: the full forward); with -c the
        # collection's own settings, and a given one that differs is refused
        given = settings.settings()
        model, revision = given.pop("model_id", None), given.pop("model_revision", None)
        CollectionProfile.resolve(None, **given)  # checks each value (named by its flag) before anything loads
        trigger_layer = given.get("trigger_layer")
        fast_e = fast_e_config(given.get("r_max") or 0.0, given.get("warmup_layer"), given.get("threshold"),
                               trigger_layer)
        config = ServeConfig(api_key=api_key, batching=BatcherConfig(batch_tokens or SERVE_MERGE_TOKENS, max_wait_ms, max_queue),
                             max_body_bytes=max_body_bytes, max_request_tokens=max_request_tokens,
                             allow_remote_images=allow_remote_images,
                             fast_e=None if fast_e.r_max == 0 and trigger_layer is None else fast_e,
                             allowed_hosts=host_names(host, allowed_host or ()), index_roots=tuple(allow_index or ()))
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        from faste_mm.cli.collection_commands import load_reranker

        def reranker_for(root):  # --rerank, else the collection's; /v1/rerank and /explain share the model thread
            return load_reranker(rerank, root, rerank_r_max, rerank_protect, device, rerank_tower_cache_mb)

        engine = _load_engine(collection, model, revision, device, dtype, batch_tokens, unpadded, config, given,
                              reranker_for, (watch or [], watch_interval))
        loop = _watch_loop(engine, watch or [], watch_interval)
    except FasteError as error:
        fail(error, debug)
    _run(engine, host, port, api_key, loop)


# The `serve` extra's packages, by import name (python-multipart imports as python_multipart,
# older releases as multipart).
_SERVE_MODULES = (("fastapi",), ("uvicorn",), ("python_multipart", "multipart"))


def _require_serve_extra() -> None:
    """Exit 1 saying what to install when a package of the `serve` extra is missing."""
    import importlib

    missing = []
    for names in _SERVE_MODULES:
        for name in names:
            try:
                importlib.import_module(name)
                break
            except ImportError:
                continue
        else:
            missing.append(names[0].replace("_", "-"))
    if missing:
        stderr.print(f"[red]error:[/red] faste-mm serve needs {', '.join(missing)} (not installed); install the "
                     f"server extra: {escape(SERVE_INSTALL)}", highlight=False)
        raise typer.Exit(1)


def _load_engine(collection, model, revision, device, dtype, batch_tokens, unpadded, config, settings, reranker_for,
                 watch=((), 5.0)):
    from faste_mm import BatchingConfig, Embedder
    from faste_mm.cli.progress import quiet_transformers
    from faste_mm.model.serialization import SerializerConfig
    from faste_mm.retrieval.maintenance import collection_path
    from faste_mm.retrieval.retriever import Retriever
    from faste_mm.serving import ServeEngine

    quiet_transformers()  # our "loading ..." line instead of transformers' per-weight bar
    batching = BatchingConfig(batch_tokens=batch_tokens, unpadded=unpadded)
    if collection is None and model is not None:
        if watch[0]:
            raise ConfigError("--watch keeps a collection in sync: give -c NAME|DIR (not --model alone)")
        serializer = _embeddings_only_serializer(settings)
        stderr.print(f"loading {model} (embeddings only: --model without -c)")
        return ServeEngine(Embedder.from_pretrained(model, device=device, dtype=dtype, revision=revision,
                                                    batching=batching, serializer=serializer), None, config,
                           reranker=reranker_for(None))
    from faste_mm.retrieval.profile import existing_profile

    root = collection_path(collection)
    if existing_profile(root) is None:  # refused before any model loads
        which = f"the collection {root}" if collection else f"no -c given and the default collection {root}"
        raise ConfigError(f"{which} does not exist yet; index files into it first (faste-mm index PATH"
                          f"{f' -c {collection}' if collection else ''}), name another with -c, or serve "
                          f"embeddings only with --model MODEL")
    # the collection's profile names the model, pixel budget and FastE; a different one given is refused
    retriever = Retriever.for_collection(root, model, revision=revision, device=device, dtype=dtype,
                                         batching=batching, **settings)
    stderr.print(f"loading {retriever.model_id} for collection {root}")
    retriever.embedder  # load now: the first request must not wait for it
    return ServeEngine(retriever.embedder, retriever, config, reranker=reranker_for(root))


def _watch_loop(engine, paths, interval_s: float):
    """serve --watch: a loop polling a FolderWatcher over the served collection, with the loaded model,
    on the engine's model thread (None without --watch); `_run` starts and stops it."""
    if not paths:
        return None
    from faste_mm.retrieval.retriever import Retriever
    from faste_mm.retrieval.library.watching import FolderWatcher, WatchOptions
    from faste_mm.serving.folder_sync import SERVE_SYNC_FILES, WatchLoop

    stderr.print(f"watching {', '.join(str(p) for p in paths)} every {interval_s:g} s", highlight=False)
    watcher = FolderWatcher(Retriever(engine.embedder, collection=engine.collection), paths,
                            WatchOptions(interval_s=interval_s, max_files=SERVE_SYNC_FILES))
    return WatchLoop(watcher, engine.batcher)


def _embeddings_only_serializer(settings: dict):
    """The serializer of an embeddings-only server (--model without -c) with the pixel and video
    settings given (None: the model's defaults); a setting of a collection's stored vectors (--dim,
    --vectors, ...) given without -c is a ConfigError naming it."""
    from dataclasses import replace

    from faste_mm.model.serialization import SerializerConfig
    from faste_mm.retrieval.profile import CollectionProfile, setting_of

    stored = sorted(FLAG_OF_FIELD[f"CollectionProfile.{name}"] for name in settings
                    if not setting_of(name).key.startswith(("serializer.", "fast_e.")))
    if stored:
        raise ConfigError(f"{', '.join(stored)} describe a collection's vectors; serve a collection with -c, or "
                          f"leave them out for an embeddings-only server")
    pixels = {name: settings[name] for name in settings if setting_of(name).key.startswith("serializer.")}
    if not pixels:
        return None
    profile = CollectionProfile.resolve(None, **pixels)  # checks the values and fills a partial video
    return replace(SerializerConfig(), min_pixels=profile.min_pixels, max_pixels=profile.max_pixels,
                   video=profile.video)


def _exit_on_signal(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


def _run(engine, host: str, port: int, api_key: str | None, watch_loop=None) -> None:
    import socket
    from contextlib import nullcontext

    import uvicorn

    from faste_mm.serving import create_app
    from faste_mm.serving.discovery import announced

    # Bind here, so the address printed (and a port 0 choice) is the real one before serving.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        stderr.print(f"[red]error:[/red] cannot bind {host}:{port} ({error}); choose another --port")
        raise typer.Exit(1)
    sock.listen(2048)  # connections made as soon as the URL is printed wait in the backlog
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    server = uvicorn.Server(uvicorn.Config(create_app(engine), log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=5))
    # `faste-mm search` on this collection asks this server (through its address on this machine)
    # while it runs; announced before the URL is printed, removed when the server stops.
    local = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(host, shown)
    announcement = (nullcontext() if engine.collection is None else
                    announced(engine.collection, f"http://{local}:{bound}/", engine.embedder.model_id, api_key))
    # uvicorn re-raises the SIGTERM that stopped it once it has shut down; as an exception here
    # (not the default handler's instant death) it leaves through `announcement`, which withdraws.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    with announcement:
        # stdout: scripts and tests read the URL from here; everything else is on stderr.
        sys.stdout.write(f"serving on http://{shown}:{bound}/\n")
        sys.stdout.flush()
        if watch_loop is not None:  # serve --watch: polls run as tasks of the model thread
            watch_loop.start()
        try:
            server.run(sockets=[sock])
        finally:
            if watch_loop is not None:
                watch_loop.stop(timeout_s=5.0)
