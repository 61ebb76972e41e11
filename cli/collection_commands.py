"""`faste-mm info | remove | compact | rebuild-index`: thin commands over a collection (no model
loads), and the reranker `search` and `serve` load (--rerank, else the collection's). Results go to
stdout; warnings and errors to stderr. `index` and `search` live in `cli/index_command.py` and
`cli/search_command.py`. Every option also reads a FASTE_MM_* environment variable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from faste_mm.cli.common import fail, markup_safe, print_json, setup_logging, shown, stderr, stdout
from faste_mm.cli.options import (RERANK_TOWER_CACHE_MB, CollectionOption, Debug, Format, NoServer, OutputFormat,
                                  one_ratio)
from faste_mm.cli.progress import Progress
from faste_mm.errors import FasteError


def info_command(
    collection: CollectionOption = None,
    output: OutputFormat = Format.table,
    no_server: NoServer = False,
    debug: Debug = False,
) -> None:
    """Model, settings, counts, failures, index type and size on disk of a collection.
    The collection's running `faste-mm serve`, if any, answers (nothing heavy loads here)."""
    from faste_mm.cli.server_search import info_through_server
    from faste_mm.retrieval.locations import collection_path
    from faste_mm.retrieval.profile import CollectionProfile
    from faste_mm.retrieval.library.watch_status import describe_watch

    setup_logging(debug)
    try:
        root = collection_path(collection)
        payload = None if no_server else info_through_server(root, debug)
        if payload is None:
            from faste_mm.retrieval.maintenance import collection_report  # FAISS: only for a local read

            payload = collection_report(root)
        payload["path"] = str(root)  # as this shell names it (the server may spell the same folder otherwise)
        # the table reads the settings back from the report, whichever process wrote it
        profile = CollectionProfile.from_stored(payload["settings"])
    except FasteError as error:
        fail(error, debug)
    if output is Format.json:
        print_json(payload)
        return
    table = Table(title=f"collection {markup_safe(payload['path'])}")
    table.add_column("field")
    table.add_column("value", overflow="fold")
    dim = payload["dim"]
    theta = "-" if profile.r_max == 0 else f"{profile.threshold} ({profile.threshold_source or 'backbone default'})"
    for name, value in (("model", profile.model_id), ("revision", profile.model_revision or "-"),
                        ("dim", f"{dim} (Matryoshka: first {dim} of {profile.model_dim})"
                                if profile.is_matryoshka else dim), ("FastE r_max (documents)", profile.r_max),
                        ("FastE theta (documents)", theta),
                        ("vectors", f"{profile.vectors} index, {profile.keep} kept on disk for rescoring"
                                    if profile.keep != "none" else f"{profile.vectors} index, no rescoring copy"),
                        ("pixels", f"{profile.min_pixels}..{profile.max_pixels}"),
                        ("plan (measured)", payload["plan"]),
                        ("video", "{fps:g} fps, at most {max_frames} frames of {max_pixels} px, "
                                  "{total_pixels} px in all".format(**profile.video.to_dict())),
                        ("items", payload["n_ok"]), ("failed", payload["n_failed"]),
                        ("deleted (until compact)", payload["n_deleted"]),
                        ("index type", payload["index_type"]), ("index", payload["index_factory"] or "-"),
                        ("reranker (search)", profile.reranker or "-"),
                        ("watch (faste-mm watch)", describe_watch(payload["watch"])),
                        ("min score (search)", "-" if profile.min_score is None else profile.min_score),
                        ("photo facts", _facts_summary(payload["facts"])),
                        ("size on disk", f"{payload['size_bytes'] / 2**20:.2f} MiB")):
        table.add_row(name, markup_safe(value))
    stdout.print(table)
    if payload["failures"]:
        failures = Table(title=f"{len(payload['failures'])} failures")
        failures.add_column("file", overflow="fold")
        failures.add_column("page", justify="right")
        failures.add_column("error", overflow="fold")
        for record in payload["failures"]:
            failures.add_row(markup_safe(record["uri"]), "" if record["page"] is None else str(record["page"]),
                             markup_safe(record["error"] or ""))
        stdout.print(failures)
    if payload["exclusions"]:
        exclusions = Table(title=f"{len(payload['exclusions'])} removed paths skipped by index",
                           caption="name one on `faste-mm index` to include it again")
        exclusions.add_column("path", overflow="fold")
        for uri in payload["exclusions"]:
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


def load_reranker(model: str | None, root: Path, r_max: str, protect: str, device: str,
                  tower_cache_mb: int = RERANK_TOWER_CACHE_MB):
    """The reranker of `search` and `serve`: --rerank, else the collection's (index --reranker), else None;
    its tower cache bounded by --rerank-tower-cache-mb."""
    from faste_mm.retrieval.profile import read_profile

    model = model or (read_profile(root).reranker if root is not None else None)
    if model is None:
        return None
    from faste_mm.model.rerank.reranker import Reranker

    with Progress().loading(model):
        return Reranker.from_pretrained(model, r_max=one_ratio(r_max) or 0.0, protect=protect, device=device,
                                        tower_cache_bytes=tower_cache_mb << 20)


def _facts_summary(facts: dict) -> str:
    """`info`'s line on the items' facts (docs/photos.md)."""
    if not facts:
        return "- (index the folders again to read them)"
    dated = f"{facts['dated']} dated" + (f" ({facts['taken_first'][:10]} .. {facts['taken_last'][:10]})"
                                         if facts["taken_first"] else "")
    return f"{facts['items']} items: {dated}, {facts['with_gps']} with GPS, {facts['with_keywords']} with keywords"
