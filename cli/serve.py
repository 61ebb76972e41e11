"""`faste-mm serve`: one process, one model load, an HTTP API (OpenAI-compatible embeddings,
search, thumbnails, metrics) and a search page. Thin: options -> ServeConfig -> engine -> uvicorn.
"""

from __future__ import annotations

import logging
import sys
from typing import Optional

import typer

from faste_mm.cli.common import (DEFAULT_MODEL, debug_option, device_option, fail, rerank_option, rerank_protect_option,
                                 setup_logging, stderr, unpadded_option)
from faste_mm.errors import FasteError


def serve_command(
    collection: Optional[str] = typer.Option(
        None, "--collection", "-c", envvar="FASTE_MM_COLLECTION",
        help="Collection to search: a NAME under the user data directory or a DIR. Its manifest names the "
             "model. Without it (and with --model) the server only embeds."),
    model: Optional[str] = typer.Option(None, "--model", envvar="FASTE_MM_MODEL",
                                        help=f"Hub id or local model directory. Default: the collection's model, "
                                             f"else {DEFAULT_MODEL}."),
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
    batch_tokens: int = typer.Option(16384, "--batch-tokens", envvar="FASTE_MM_BATCH_TOKENS", min=1,
                                     help="Prompt tokens merged into one model call (default 16384)."),
    max_wait_ms: float = typer.Option(5.0, "--max-wait-ms", envvar="FASTE_MM_MAX_WAIT_MS", min=0,
                                      help="Longest a request waits for others to join its batch, in ms (default 5)."),
    max_queue: int = typer.Option(256, "--max-queue", envvar="FASTE_MM_MAX_QUEUE", min=1,
                                  help="Requests that may wait per kind (query, document, search) before new "
                                       "ones get 503 (default 256)."),
    max_request_tokens: int = typer.Option(65536, "--max-request-tokens", envvar="FASTE_MM_MAX_REQUEST_TOKENS",
                                           min=1, help="Prompt tokens one request may carry; 413 above (default 65536)."),
    max_body_bytes: int = typer.Option(16 << 20, "--max-body-bytes", envvar="FASTE_MM_MAX_BODY_BYTES", min=1,
                                       help="Largest request body in bytes; 413 above (default 16 MiB)."),
    r_max: float = typer.Option(0.0, "--r-max", envvar="FASTE_MM_R_MAX",
                                help="FastE for documents of an embeddings-only server, 0 <= r < 1 (default 0: "
                                     "full forward). With -c the collection's own FastE is used."),
    allow_remote_images: bool = typer.Option(False, "--allow-remote-images", envvar="FASTE_MM_ALLOW_REMOTE_IMAGES",
                                             help="Fetch http(s) image URLs (off by default: SSRF risk); data: "
                                                  "URLs and uploads always work."),
    device: str = device_option(),
    threads: Optional[int] = typer.Option(None, "--threads", envvar="FASTE_MM_THREADS", min=1,
                                          help="CPU threads of the model (torch.set_num_threads); default: "
                                               "torch's (one per core). On a busy shared CPU, 1 avoids threads "
                                               "waiting on each other."),
    unpadded: str = unpadded_option(),
    rerank: Optional[str] = rerank_option("Also serve POST /v1/rerank and /explain with this reranker (hub id or folder, "
                                          "e.g. Qwen/Qwen3-VL-Reranker-2B). Default: the collection's reranker "
                                          "(index --reranker), else none."),
    rerank_r_max: float = typer.Option(0.0, "--rerank-r-max", envvar="FASTE_MM_RERANK_R_MAX",
                                       help="FastE on the reranker, 0 <= r < 1. Default 0 (the exact score)."),
    rerank_protect: str = rerank_protect_option(),
    debug: bool = debug_option(),
) -> None:
    """Serve embeddings (OpenAI-compatible /v1/embeddings) and, with -c, search and a search page at /."""
    try:
        from faste_mm.serving import BatcherConfig, ServeConfig, check_bind
        from faste_mm.serving.security import host_names

        check_bind(host, api_key, insecure)  # before anything else: a refused bind changes nothing
        setup_logging(debug, logging.INFO)
        config = ServeConfig(api_key=api_key, batching=BatcherConfig(batch_tokens, max_wait_ms, max_queue),
                             max_body_bytes=max_body_bytes, max_request_tokens=max_request_tokens,
                             allow_remote_images=allow_remote_images, r_max=r_max,
                             allowed_hosts=host_names(host, allowed_host or ()))
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        engine = _load_engine(collection, model, device, batch_tokens, unpadded, config,
                              (rerank, rerank_r_max, rerank_protect))
    except FasteError as error:
        fail(error, debug)
    except ImportError as error:  # fastapi / uvicorn missing
        stderr.print(f"[red]error:[/red] {error}; install the server extra: pip install 'faste-mm[serve]'")
        raise typer.Exit(1)
    _run(engine, host, port)


def _load_reranker(model: str | None, root, r_max: float, protect: str, device: str):
    """--rerank, else the collection's reranker (index --reranker), else None."""
    if model is None and root is not None:
        from faste_mm.retrieval.profile import read_profile

        model = read_profile(root).reranker
    if model is None:
        return None
    from faste_mm import Reranker

    stderr.print(f"loading reranker {model}")
    return Reranker.from_pretrained(model, r_max=r_max, protect=protect, device=device)


def _load_engine(collection, model, device, batch_tokens, unpadded, config, rerank=(None, 0.0, "none")):
    from faste_mm import BatchingConfig, Embedder
    from faste_mm.retrieval.maintenance import collection_path
    from faste_mm.retrieval.retriever import Retriever
    from faste_mm.serving import ServeEngine

    batching = BatchingConfig(batch_tokens=batch_tokens, unpadded=unpadded)
    if collection is None:
        stderr.print(f"loading {model or DEFAULT_MODEL} (embeddings only: no -c collection)")
        return ServeEngine(Embedder.from_pretrained(model or DEFAULT_MODEL, device=device, batching=batching),
                           None, config, reranker=_load_reranker(rerank[0], None, rerank[1], rerank[2], device))
    root = collection_path(collection)
    # the collection's profile names the model; a different --model is refused, naming both
    retriever = Retriever.for_collection(root, model, device=device, batching=batching)
    stderr.print(f"loading {retriever.model_id} for collection {root}")
    retriever.embedder  # load now: the first request must not wait for it
    return ServeEngine(retriever.embedder, retriever, config,
                       reranker=_load_reranker(rerank[0], root, rerank[1], rerank[2], device))


def _run(engine, host: str, port: int) -> None:
    import socket

    import uvicorn

    from faste_mm.serving import create_app

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
    # stdout: scripts and tests read the URL from here; everything else is on stderr.
    sys.stdout.write(f"serving on http://{shown}:{bound}/\n")
    sys.stdout.flush()
    server = uvicorn.Server(uvicorn.Config(create_app(engine), log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=5))
    server.run(sockets=[sock])
