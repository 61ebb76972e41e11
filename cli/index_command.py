"""`faste-mm index`: paths and options -> `Retriever.for_collection(...).index(...)` -> the report on
stdout (a table or --format json), progress and skipped files on stderr; an interrupted run says
what is left. Every option also reads a FASTE_MM_* environment variable.
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn, Optional

import typer
from rich.table import Table

from faste_mm.cli.album_command import print_album_changes
from faste_mm.cli.common import fail, markup_safe, print_json, setup_logging, stderr, stdout, usage_error
from faste_mm.cli.options import (DEFAULT_BATCH_TOKENS, BatchTokens, CollectionOption, Debug, Device, Dtype,
                                  FollowLinks, Format, OutputFormat, Unpadded)
from faste_mm.cli.setting_flags import GivenFlags, on_index, takes_settings
from faste_mm.cli.progress import Progress, format_span
from faste_mm.errors import FasteError
from faste_mm.kinds import ITEM_NOUNS  # plain data: no numpy at start-up


@takes_settings(on_index)
def index_command(
    paths: list[Path] = typer.Argument(..., help="Files and folders to index (folders are walked recursively)."),
    collection: CollectionOption = None,
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
    follow_links: FollowLinks = False,
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
    plan: Optional[str] = typer.Option(None, "--plan", envvar="FASTE_MM_PLAN",
                                       help="plan.json from faste-mm plan (or plan.json:ROW): index with its "
                                            "recommendation (or that row): pixel cap, r_max, theta and dtype; a NEW "
                                            "collection keeps the measured fidelity as its receipt (see info)."),
    debug: Debug = False,
    settings: GivenFlags = GivenFlags({}),
) -> None:
    """Index images, videos (mp4, mov, webm, mkv, avi), PDFs (page by page) and .txt/.md files; only new or
    changed files are embedded."""
    from faste_mm.model.batching import BatchingConfig
    from faste_mm.retrieval.maintenance import collection_path
    from faste_mm.retrieval.results import IndexOptions
    from faste_mm.retrieval.retriever import Retriever, refuse_missing_paths

    setup_logging(debug)
    view, pending = _IndexProgressView(), None
    try:
        refuse_missing_paths(paths)  # a mistyped folder: said before the model loads, nothing created
        root = collection_path(collection)
        options = IndexOptions(exclude=tuple(exclude), include_hidden=include_hidden,
                               follow_links=follow_links, reindex=reindex,
                               index_type=index_type, retry_failed=retry_failed, chunk_files=chunk_files,
                               chunk_pages=chunk_pages)
        executor = None
        if ray is not None:
            from faste_mm.scale import RayExecutor, RayOptions

            executor = RayExecutor(RayOptions(ray, workers, gpus_per_worker, cpus_per_worker, ship_bytes=ship_bytes))
        elif workers is not None or gpus_per_worker is not None or ship_bytes:
            usage_error("--workers, --gpus-per-worker and --ship-bytes need --ray auto (or --ray ADDRESS)")
        # Settings not given are the collection's (so `faste-mm index more/` just works), else the
        # defaults; a given one that differs from the collection's is refused (see CollectionProfile).
        # The flags are the declared settings' (cli/setting_flags.py); resolved once, in for_collection.
        given = settings.settings()
        model, revision = given.pop("model_id", None), given.pop("model_revision", None)
        if plan is not None:
            given, dtype = _plan_settings(plan, root, model, given, dtype)
        retriever = Retriever.for_collection(
            root, model, revision=revision, device=device, dtype=dtype,
            batching=BatchingConfig(batch_tokens=batch_tokens, unpadded=unpadded), reindex=reindex,
            loading=view.loading, **given)
        pending = lambda: retriever.pending(paths, options)  # noqa: E731
        with retriever, view:
            report = retriever.index(paths, options=options, progress=view.report, executor=executor)
    except FasteError as error:
        fail(error, debug)
    except KeyboardInterrupt:
        _interrupted(view, pending, reindex)
    if output is Format.json:
        print_json(report.to_dict())
    else:
        _render_index_report(report)
    for failure in report.failures:
        stderr.print(f"[yellow]skipped[/yellow] {markup_safe(failure.error)}", highlight=False)
    if report.links_skipped:
        stderr.print(links_skipped_line(report.links_skipped), highlight=False)
    print_album_changes(report.albums)
    loaded = retriever.loaded_embedder
    # one line; the kernel choices are debug logs (--debug) and bench's
    runtime = None if loaded is None else loaded.describe_runtime()
    if runtime is not None:
        stderr.print(runtime, highlight=False, markup=False)


def links_skipped_line(n: int) -> str:
    """What index and watch say about the file links they skipped (`IndexReport.links_skipped`)."""
    return (f"[yellow]skipped {n} link{'s' if n != 1 else ''}[/yellow] that lead{'' if n != 1 else 's'} outside the indexed folders; "
            f"--follow-links to include them")


def _plan_settings(plan: str, root, model: Optional[str], given: dict, dtype: str) -> tuple[dict, str]:
    """--plan: the chosen row's collection settings (over the other settings given) and dtype,
    refused when other flags set them too or when the plan was measured with another model than
    this index uses."""
    from faste_mm.retrieval.profile import DEFAULT_MODEL, FAST_E_SETTINGS, existing_profile
    from faste_mm.tools.plan_report import load_plan

    report, row = load_plan(plan)
    chosen = report.settings(row)
    if dtype != "auto" or set(given) & {*chosen, *FAST_E_SETTINGS}:
        usage_error("--plan sets the pixel budget, FastE (--r-max, --threshold, ...), --patch-dedup and --dtype from "
                    "the plan; give --plan or those flags")
    existing = existing_profile(root)
    report.check_model(model or (existing.model_id if existing else DEFAULT_MODEL), f"--plan {plan}")
    return {**given, **chosen}, report.row(row).dtype


def _interrupted(view: "_IndexProgressView", pending, reindex: bool) -> NoReturn:
    """Ctrl-C during index: chunks are committed as they finish, so say how many of this run's
    files were kept (counted in the collection: the last progress report may lag a commit) and
    how to go on; exit 130 like any program stopped by SIGINT."""
    total = None if view.last is None else view.last.files_total
    try:
        left = None if pending is None else pending()
    except FasteError:
        left = None
    if total is None or left is None:
        kept = "the files committed so far are kept" if total is None else (
            f"{view.last.files_done} of {total} files committed")
    else:
        kept = f"{max(total - left, 0)} of {total} files committed"
    again = "run the same command without --reindex to continue" if reindex else "run the same command again to continue"
    stderr.print(f"interrupted: {kept}; {again}", highlight=False)
    raise typer.Exit(130)


# A run predicted to end sooner is not worth a line about its length (its progress has an ETA).
ESTIMATE_LINE_S = 60.0


class _IndexProgressView(Progress):
    """index progress on stderr, advanced per embedded batch: files committed, items/s,
    tokens/s, the share of prefix tokens removed and an ETA from the time left per input kind
    (see `cli.progress.Progress`); once the estimate settles (`retrieval.estimate`: the first
    chunk committed), one line saying how long the rest takes, when that is more than
    ESTIMATE_LINE_S."""

    def __init__(self) -> None:
        super().__init__()
        self.last = None  # the latest IndexProgress: what an interrupted run had committed
        self.has_told = False  # the estimate's line was printed

    def report(self, p) -> None:
        if self.last is None:
            self.start("indexing", p.files_total, unit="files committed")
        self.last = p
        elapsed = max(p.elapsed_s - self.load_s, 1e-9)  # rates of the work, not of loading the model
        items = p.embedded + p.reused
        rates = (f"{items} items  {items / elapsed:.1f} items/s  {p.prefix_tokens / elapsed:.0f} tok/s  "
                 f"removed {p.prefix_removal:.0%}" + (f"  tower {p.tower_share:.0%}" if p.tower_s else ""))
        estimate = p.estimate
        if estimate is not None and estimate.is_settled and not self.has_told:
            self.has_told = True
            if estimate.kinds and estimate.remaining_s >= ESTIMATE_LINE_S:
                self.status(estimate_line(estimate))
        self.update(p.files_done, p.files_total, detail=rates, share=p.fraction, eta_s=p.eta_s)


def estimate_line(estimate) -> str:
    """'18,214 images and 2,310 pages: about 7 h 40 min here at bfloat16; ...': the work left
    per kind and its time at the rates measured on this machine."""
    counts = [f"{n:,} {ITEM_NOUNS[kind]}" for kind, n in zip(estimate.kinds, estimate.items_left)]
    work = counts[0] if len(counts) == 1 else ", ".join(counts[:-1]) + " and " + counts[-1]
    unmeasured = [ITEM_NOUNS[k] for k, m in zip(estimate.kinds, estimate.is_measured) if not m]
    guess = f" ({' and '.join(unmeasured)} not measured yet: at the others' rate)" if unmeasured else ""
    dtype = f" at {estimate.dtype}" if estimate.dtype else ""
    return (f"{work}: about {format_span(estimate.remaining_s)} here{dtype}{guess}; "
            f"`faste-mm plan` shows faster settings")


def _patch_line(report) -> tuple[tuple[str, str], ...]:
    """The report's duplicate-patch removal line ("pages: 48% of patches kept"), where it ran."""
    if report.patches_kept is None:
        return ()
    return (("pages (--patch-dedup)", f"{report.patches_kept:.0%} of patches kept"),)


def _render_index_report(report) -> None:
    table = Table(title="faste-mm index")
    table.add_column("metric")
    table.add_column("value", justify="right", overflow="fold")
    for name, value in (("collection", report.collection), ("files scanned", report.files_scanned), ("items embedded", report.embedded),
                        ("items reused (same content)", report.reused), ("files unchanged", report.unchanged),
                        ("files removed (vanished)", report.removed),
                        ("files skipped (removed earlier)", report.excluded),
                        ("links skipped (lead outside)", report.links_skipped), ("items failed", report.failed),
                        ("prefix tokens removed", f"{report.prefix_removal:.1%}"),
                        *_patch_line(report),
                        ("images read (OCR)", f"{report.ocr_read} in {report.ocr_s:.1f} s"),
                        ("model s: vision tower / decoder", f"{report.tower_s:.1f} / {report.decoder_s:.1f} "
                                                            f"(tower {report.tower_share:.0%})"),
                        ("index", report.index_factory or "-"), ("seconds", f"{report.elapsed_s:.1f}")):
        table.add_row(name, markup_safe(value))
    stdout.print(table)
