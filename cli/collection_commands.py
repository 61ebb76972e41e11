"""`faste-mm index | search | info | remove | compact | rebuild-index`: thin commands over
`faste_mm.retrieval.retriever.Retriever`. Results (tables, --format json, paths) go to stdout; progress,
warnings and errors go to stderr. Every option also reads a FASTE_MM_* environment variable.
"""

from __future__ import annotations

import json
import os
import sys
from enum import Enum
from pathlib import Path
from typing import NoReturn, Optional

import typer
from rich.table import Table

from faste_mm.cli.common import fail, markup_safe, print_json, setup_logging, shown, stderr, stdout
from faste_mm.cli.options import (DEFAULT_BATCH_TOKENS, BatchTokens, CollectionOption, Debug, Device, Dtype, Format,
                                  MaxPixels, Model, OutputFormat, RMax, Threshold, TriggerLayer, Unpadded, VisualTokens,
                                  WarmupLayer, one_ratio)
from faste_mm.cli.options import Rerank, RerankProtect, RerankRMax, RerankTop
from faste_mm.cli.progress import Progress, quiet_transformers
from faste_mm.errors import FasteError


class SearchFormat(str, Enum):
    """search's stdout: --format's table and json, and paths (one per line, for scripts)."""

    table = "table"
    json = "json"
    paths = "paths"


def _usage(message: str) -> NoReturn:
    stderr.print(f"[red]usage error:[/red] {message}")
    raise typer.Exit(2)


def index_command(
    paths: list[Path] = typer.Argument(..., help="Files and folders to index (folders are walked recursively)."),
    collection: CollectionOption = None,
    model: Model = None,
    r_max: RMax = None,
    warmup_layer: WarmupLayer = None,
    threshold: Threshold = None,
    trigger_layer: TriggerLayer = None,
    reranker: Optional[str] = typer.Option(None, "--reranker", envvar="FASTE_MM_RERANKER", show_default=False,
                                           help="Record a default reranker (hub id or folder, e.g. Qwen/Qwen3-VL-Reranker-2B) "
                                                "that search and serve use for a second stage; set when the collection is "
                                                "created or re-indexed. Default: none."),
    dim: Optional[int] = typer.Option(None, "--dim", envvar="FASTE_MM_DIM", min=1,
                                      help="Matryoshka: store only the first DIM dimensions of each vector, "
                                           "re-normalised (e.g. 512: 4x smaller index, faster search, some "
                                           "quality lost); queries are truncated the same way. Default: the "
                                           "collection's, the model's full width for a new one."),
    vectors: Optional[str] = typer.Option(None, "--vectors", envvar="FASTE_MM_VECTORS",
                                          help="Precision of the index in RAM: float32 | float16 | int8 (8-bit "
                                               "codes, 1/4 the RAM) | binary (sign bits, 1/32; dim a multiple of "
                                               "8); searches rescore candidates from the copy kept on disk. "
                                               "Default: the collection's, float32 for a new one."),
    keep: Optional[str] = typer.Option(None, "--keep", envvar="FASTE_MM_KEEP",
                                       help="Copy kept on disk to rescore with: float (default) | int8 (8-bit "
                                            "codes, with --vectors binary) | none (smallest; results "
                                            "unrescored). Default: the collection's, float for a new one."),
    batch_tokens: BatchTokens = DEFAULT_BATCH_TOKENS,
    unpadded: Unpadded = "auto",
    chunk_files: int = typer.Option(64, "--chunk-files", envvar="FASTE_MM_CHUNK_FILES",
                                    help="Files embedded and committed together; an interrupted run "
                                         "loses at most one chunk (default 64)."),
    chunk_pages: int = typer.Option(64, "--chunk-pages", envvar="FASTE_MM_CHUNK_PAGES",
                                    help="A longer PDF is embedded and committed this many pages at a time; "
                                         "an interrupted run resumes after the last committed pages (default 64)."),
    device: Device = "auto",
    dtype: Dtype = "auto",
    exclude: list[str] = typer.Option([], "--exclude", envvar="FASTE_MM_EXCLUDE",
                                      help="Glob (fnmatch) on the path relative to a walked folder or on any "
                                           "name in it, e.g. '*.gif', 'drafts/*'; repeatable."),
    include_hidden: bool = typer.Option(False, "--include-hidden", envvar="FASTE_MM_INCLUDE_HIDDEN",
                                        help="Also index files and folders whose name starts with '.'."),
    index_type: Optional[str] = typer.Option(None, "--index-type", envvar="FASTE_MM_INDEX_TYPE",
                                             help="auto, or a FAISS factory string such as 'HNSW32' or "
                                                  "'IVF1024,Flat'. Default: the collection's (auto when new)."),
    reindex: bool = typer.Option(False, "--reindex",
                                 help="Erase the collection and rebuild it with the given settings "
                                      "(no environment variable: it deletes vectors)."),
    retry_failed: bool = typer.Option(False, "--retry-failed", envvar="FASTE_MM_RETRY_FAILED",
                                      help="Embed unchanged files that failed last time again."),
    output: OutputFormat = Format.table,
    ray: Optional[str] = typer.Option(None, "--ray", envvar="FASTE_MM_RAY",
                                      help="Embed on Ray Data: 'auto' (a local Ray with every GPU and core) "
                                           "or a cluster address (host:6379). Needs faste-mm[ray]."),
    workers: Optional[int] = typer.Option(None, "--workers", envvar="FASTE_MM_RAY_WORKERS", min=1,
                                          help="With --ray: embedding actors, one model each "
                                               "(default: one per GPU, else 1)."),
    gpus_per_worker: Optional[float] = typer.Option(None, "--gpus-per-worker", envvar="FASTE_MM_RAY_GPUS_PER_WORKER",
                                                    min=0, help="With --ray: GPUs per actor (default 1 when the "
                                                                "cluster has GPUs, else 0 = CPU actors)."),
    cpus_per_worker: float = typer.Option(1.0, "--cpus-per-worker", envvar="FASTE_MM_RAY_CPUS_PER_WORKER",
                                          help="With --ray: CPUs each actor reserves (default 1)."),
    ship_bytes: bool = typer.Option(False, "--ship-bytes", envvar="FASTE_MM_RAY_SHIP_BYTES",
                                    help="With --ray: read files on this machine and ship their bytes through "
                                         "Ray's object store (nodes without shared storage)."),
    video_fps: Optional[float] = typer.Option(None, "--video-fps", envvar="FASTE_MM_VIDEO_FPS",
                                              help="Video frames sampled per second. Default: the collection's, "
                                                   "1 (the official embedder's) for a new one."),
    video_max_frames: Optional[int] = typer.Option(None, "--video-max-frames", envvar="FASTE_MM_VIDEO_MAX_FRAMES",
                                                   help="At most this many frames per video. Default: the "
                                                        "collection's, 64 for a new one."),
    video_max_pixels: Optional[int] = typer.Option(None, "--video-max-pixels", envvar="FASTE_MM_VIDEO_MAX_PIXELS",
                                                   help="Pixels per video frame at most (32x32 px = one visual "
                                                        "token per frame pair). Default: the collection's, "
                                                        "786432 for a new one."),
    max_pixels: MaxPixels = None,
    visual_tokens: VisualTokens = None,
    plan: Optional[str] = typer.Option(None, "--plan", envvar="FASTE_MM_PLAN",
                                       help="plan.json from faste-mm plan (or plan.json:ROW): index with its "
                                            "recommendation (or that row): pixel cap, r_max, theta and dtype; a NEW "
                                            "collection keeps the measured fidelity as its receipt (see info)."),
    debug: Debug = False,
) -> None:
    """Index images, videos (mp4, mov, webm, mkv, avi), PDFs (page by page) and .txt/.md files; only new or
    changed files are embedded."""
    from faste_mm.model.batching import BatchingConfig
    from faste_mm.model.serialization import pixel_budget
    from faste_mm.retrieval.retriever import IndexOptions, Retriever, collection_path

    from faste_mm.indexers.quantization import KEEPS, PRECISIONS

    setup_logging(debug)
    if vectors is not None and vectors not in PRECISIONS:
        _usage(f"--vectors must be one of {', '.join(PRECISIONS)}, got {vectors!r}")
    if keep is not None and keep not in KEEPS:
        _usage(f"--keep must be one of {', '.join(KEEPS)}, got {keep!r}")
    watch, pending = _IndexWatch(), None
    try:
        root = collection_path(collection)
        options = IndexOptions(exclude=tuple(exclude), include_hidden=include_hidden, reindex=reindex,
                               index_type=index_type, retry_failed=retry_failed, chunk_files=chunk_files,
                               chunk_pages=chunk_pages)
        executor = None
        if ray is not None:
            from faste_mm.scale import RayExecutor, RayOptions

            executor = RayExecutor(RayOptions(ray, workers, gpus_per_worker, cpus_per_worker, ship_bytes=ship_bytes))
        elif workers is not None or gpus_per_worker is not None or ship_bytes:
            _usage("--workers, --gpus-per-worker and --ship-bytes need --ray auto (or --ray ADDRESS)")
        # Settings not given are the collection's (so `faste-mm index more/` just works), else the
        # defaults; a given one that differs from the collection's is refused (see CollectionProfile).
        video = {"fps": video_fps, "max_frames": video_max_frames, "max_pixels": video_max_pixels}
        budget = pixel_budget(max_pixels, visual_tokens, names=("--max-pixels", "--visual-tokens"))
        settings = dict(r_max=one_ratio(r_max), warmup_layer=warmup_layer, threshold=threshold, max_pixels=budget)
        if plan is not None:
            settings, dtype = _plan_settings(plan, root, model, {**settings, "trigger_layer": trigger_layer}, dtype)
        retriever = Retriever.for_collection(
            root, model, device=device, dtype=dtype, batching=BatchingConfig(batch_tokens=batch_tokens, unpadded=unpadded),
            reindex=reindex, loading=watch.loading, trigger_layer=trigger_layer, dim=dim, vectors=vectors, keep=keep,
            reranker=reranker, **settings,
            video={name: value for name, value in video.items() if value is not None} or None)
        pending = lambda: retriever.pending(paths, options)  # noqa: E731
        with retriever, watch:
            report = retriever.index(paths, options=options, progress=watch.report, executor=executor)
    except FasteError as error:
        fail(error, debug)
    except KeyboardInterrupt:
        _interrupted(watch, pending, reindex)
    if output is Format.json:
        print_json(report.to_dict())
    else:
        _render_index_report(report)
    for failure in report.failures:
        stderr.print(f"[yellow]skipped[/yellow] {markup_safe(failure.error)}", highlight=False)


def _plan_settings(plan: str, root, model: Optional[str], given: dict, dtype: str) -> tuple[dict, str]:
    """--plan: the chosen row's collection settings and dtype, refused when other flags set them
    too or when the plan was measured with another model than this index uses."""
    from faste_mm.retrieval.profile import DEFAULT_MODEL, existing_profile
    from faste_mm.tools.plan_report import load_plan

    if any(value is not None for value in given.values()) or dtype != "auto":
        _usage("--plan sets the pixel budget, FastE (--r-max, --threshold, ...) and --dtype from the plan; "
               "give --plan or those flags")
    report, row = load_plan(plan)
    existing = existing_profile(root)
    report.check_model(model or (existing.model_id if existing else DEFAULT_MODEL), f"--plan {plan}")
    return report.settings(row), report.row(row).dtype


def _interrupted(watch: "_IndexWatch", pending, reindex: bool) -> NoReturn:
    """Ctrl-C during index: chunks are committed as they finish, so say how many of this run's
    files were kept (counted in the collection: the last progress report may lag a commit) and
    how to go on; exit 130 like any program stopped by SIGINT."""
    total = None if watch.last is None else watch.last.files_total
    try:
        left = None if pending is None else pending()
    except FasteError:
        left = None
    if total is None or left is None:
        kept = "the files committed so far are kept" if total is None else (
            f"{watch.last.files_done} of {total} files committed")
    else:
        kept = f"{max(total - left, 0)} of {total} files committed"
    again = "run the same command without --reindex to continue" if reindex else "run the same command again to continue"
    stderr.print(f"interrupted: {kept}; {again}", highlight=False)
    raise typer.Exit(130)


class _IndexWatch(Progress):
    """index progress on stderr, advanced per embedded batch: files committed, items/s,
    tokens/s, the share of prefix tokens removed and an ETA (see `cli.progress.Progress`)."""

    def __init__(self) -> None:
        super().__init__()
        self.last = None  # the latest IndexProgress: what an interrupted run had committed

    def report(self, p) -> None:
        if self.last is None:
            self.start("indexing", p.files_total, unit="files committed")
        self.last = p
        elapsed = max(p.elapsed_s - self.load_s, 1e-9)  # rates of the work, not of loading the model
        items = p.embedded + p.reused
        rates = (f"{items} items  {items / elapsed:.1f} items/s  {p.prefix_tokens / elapsed:.0f} tok/s  "
                 f"removed {p.prefix_removal:.0%}" + (f"  tower {p.tower_share:.0%}" if p.tower_s else ""))
        self.update(p.files_done, p.files_total, detail=rates, share=p.fraction)


def _render_index_report(report) -> None:
    table = Table(title="faste-mm index")
    table.add_column("metric")
    table.add_column("value", justify="right", overflow="fold")
    for name, value in (("collection", report.collection), ("files scanned", report.files_scanned), ("items embedded", report.embedded),
                        ("items reused (same content)", report.reused), ("files unchanged", report.unchanged),
                        ("files removed (vanished)", report.removed),
                        ("files skipped (removed earlier)", report.excluded), ("items failed", report.failed),
                        ("prefix tokens removed", f"{report.prefix_removal:.1%}"),
                        ("model s: vision tower / decoder", f"{report.tower_s:.1f} / {report.decoder_s:.1f} "
                                                            f"(tower {report.tower_share:.0%})"),
                        ("index", report.index_factory or "-"), ("seconds", f"{report.seconds:.1f}")):
        table.add_row(name, markup_safe(value))
    stdout.print(table)


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
    from faste_mm.cli.server_search import search_through_server
    from faste_mm.retrieval.retriever import Retriever

    from faste_mm.indexers.search import MODES

    setup_logging(debug)
    if query is None and image is None and video is None:
        _usage("give a QUERY text, --image PATH, --video PATH, or a combination")
    if mode not in MODES:
        _usage(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    conditions = _parse_where(where)
    try:
        served = None
        # The server answers plain dense text searches; a reranked, lexical/hybrid, image, video or
        # instruction search runs here (a collection with a default reranker reranks unless --no-rerank).
        local_only = (image is not None or video is not None or instruction is not None or rerank is not None
                      or mode != "dense" or rescore is not None or lexical_syntax)
        if not no_server and not local_only and (no_rerank or _collection_reranker(collection) is None):
            served = search_through_server(collection, query, k, conditions, kind, path, debug)
        if served is not None:
            root, hits = served
        else:
            with Retriever.open(collection, device=device) as retriever:
                if mode != "lexical":  # lexical search loads no model
                    quiet_transformers()  # the model loads in search(): no per-weight bar on stderr
                reranker = None if no_rerank else _load_reranker(rerank, retriever.collection, rerank_r_max,
                                                                 rerank_protect, device)
                hits = retriever.search(query, image=image, video=video, k=k, instruction=instruction,
                                        where=conditions, type=kind or None, path=path, mode=mode, rescore=rescore,
                                        lexical_syntax=lexical_syntax, rerank=reranker, rerank_top=rerank_top)
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
            _usage(f"--where takes KEY=VALUE, e.g. --where tag=invoice; got {condition!r}")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        parsed[key.strip()] = value if isinstance(value, (str, int, float, bool)) else text
    return parsed


def info_command(
    collection: CollectionOption = None,
    output: OutputFormat = Format.table,
    debug: Debug = False,
) -> None:
    """Model, settings, counts, failures, index type and size on disk of a collection."""
    from faste_mm.indexers import Collection
    from faste_mm.retrieval.maintenance import collection_path
    from faste_mm.retrieval.profile import CollectionProfile
    from faste_mm.retrieval.receipt import receipt_summary

    setup_logging(debug)
    try:
        with Collection.open(collection_path(collection)) as col:
            info, profile = col.info(), CollectionProfile.from_manifest(col.manifest)
            # the stored settings as the profile reads them (defaults filled in for older collections)
            settings = profile.to_manifest(base=col.manifest).to_dict()
            settings["vectors"]["int8_ranges"] = "calibrated" if col.manifest.int8_ranges is not None else None
    except FasteError as error:
        fail(error, debug)
    payload = {**info.to_dict(), "settings": settings, "plan": receipt_summary(profile.receipt)}
    if output is Format.json:
        print_json(payload)
        return
    table = Table(title=f"collection {markup_safe(info.path)}")
    table.add_column("field")
    table.add_column("value", overflow="fold")
    theta = "-" if profile.r_max == 0 else f"{profile.threshold} ({profile.threshold_source or 'backbone default'})"
    for name, value in (("model", profile.model_id), ("revision", profile.model_revision or "-"),
                        ("dim", f"{info.dim} (Matryoshka: first {info.dim} of {profile.model_dim})"
                                if profile.is_matryoshka else info.dim), ("FastE r_max (documents)", profile.r_max),
                        ("FastE theta (documents)", theta),
                        ("vectors", f"{profile.vectors} index, {profile.keep} kept on disk for rescoring"
                                    if profile.keep != "none" else f"{profile.vectors} index, no rescoring copy"),
                        ("pixels", f"{profile.min_pixels}..{profile.max_pixels}"),
                        ("plan (measured)", receipt_summary(profile.receipt)),
                        ("video", "{fps:g} fps, at most {max_frames} frames of {max_pixels} px, "
                                  "{total_pixels} px in all".format(**profile.video.to_dict())),
                        ("items", info.n_ok), ("failed", info.n_failed), ("deleted (until compact)", info.n_deleted),
                        ("index type", info.index_type), ("index", info.index_factory or "-"),
                        ("reranker (search)", profile.reranker or "-"),
                        ("size on disk", f"{info.size_bytes / 2**20:.2f} MiB")):
        table.add_row(name, markup_safe(value))
    stdout.print(table)
    if info.failures:
        failures = Table(title=f"{len(info.failures)} failures")
        failures.add_column("file", overflow="fold")
        failures.add_column("page", justify="right")
        failures.add_column("error", overflow="fold")
        for record in info.failures:
            failures.add_row(markup_safe(record.uri), "" if record.page is None else str(record.page),
                             markup_safe(record.error or ""))
        stdout.print(failures)
    if info.exclusions:
        exclusions = Table(title=f"{len(info.exclusions)} removed paths skipped by index",
                           caption="name one on `faste-mm index` to include it again")
        exclusions.add_column("path", overflow="fold")
        for uri in info.exclusions:
            exclusions.add_row(uri)
        stdout.print(exclusions)


def remove_command(
    targets: list[str] = typer.Argument(..., help="Item ids, files, or folders (everything below them)."),
    collection: CollectionOption = None,
    debug: Debug = False,
) -> None:
    """Remove items by id or by file/folder (tombstoned until `compact`). Prints the removed files;
    targets that match nothing are named in a warning (exit code 0, like skipped files)."""
    from faste_mm.retrieval.maintenance import collection_path, remove_items

    setup_logging(debug)
    ids = [int(t) for t in targets if t.isdigit() and not Path(t).exists()]
    paths = [t for t in targets if not (t.isdigit() and not Path(t).exists())]
    try:
        report = remove_items(collection_path(collection), paths, ids=ids)
    except FasteError as error:
        fail(error, debug)
    for uri in report.uris:
        stdout.print(shown(uri), highlight=False, markup=False)
    stderr.print(f"removed {len(report.ids)} items by id and {len(report.uris)} files")
    if report.excluded:
        stderr.print(f"later `faste-mm index` runs of their folders skip {markup_safe(', '.join(report.excluded))}; "
                     f"name a path on `faste-mm index` to include it again", highlight=False)
    if report.unmatched:
        stderr.print(f"[yellow]warning:[/yellow] nothing in the collection matched "
                     f"{markup_safe(', '.join(report.unmatched))}; check the ids and paths (`faste-mm info`, "
                     f"`faste-mm search`)", highlight=False, soft_wrap=True)


def compact_command(
    collection: CollectionOption = None,
    debug: Debug = False,
) -> None:
    """Drop removed items' vectors from disk and rebuild the index."""
    from faste_mm.retrieval.maintenance import collection_path, compact

    setup_logging(debug)
    try:
        dropped = compact(collection_path(collection))
    except FasteError as error:
        fail(error, debug)
    stdout.print(f"dropped {dropped} vectors")


def rebuild_index_command(
    index_type: Optional[str] = typer.Option(None, "--index-type", envvar="FASTE_MM_INDEX_TYPE",
                                             help="auto or a FAISS factory string; default: keep the current type."),
    collection: CollectionOption = None,
    debug: Debug = False,
) -> None:
    """Rebuild the FAISS index from the stored vectors (no re-embedding)."""
    from faste_mm.retrieval.maintenance import collection_path, rebuild_index

    setup_logging(debug)
    try:
        factory = rebuild_index(collection_path(collection), index_type)
    except FasteError as error:
        fail(error, debug)
    stdout.print(factory, highlight=False)


def _collection_reranker(collection: str | None) -> str | None:
    """The collection's default reranker (index --reranker), None when it has none or cannot be read
    here (the local search then says why)."""
    from faste_mm.retrieval.maintenance import collection_path
    from faste_mm.retrieval.profile import read_profile

    try:
        return read_profile(collection_path(collection)).reranker
    except FasteError:
        return None


def _load_reranker(model: str | None, root: Path, r_max: str, protect: str, device: str):
    """The reranker of `search` and `serve`: --rerank, else the collection's (index --reranker), else None."""
    from faste_mm.retrieval.profile import read_profile

    model = model or (read_profile(root).reranker if root is not None else None)
    if model is None:
        return None
    from faste_mm.model.reranker import Reranker

    with Progress().loading(model):
        return Reranker.from_pretrained(model, r_max=one_ratio(r_max) or 0.0, protect=protect, device=device)
