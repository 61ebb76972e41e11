"""`faste-mm watch`: keep a collection in sync with folders (faste_mm.retrieval.library.watching): poll,
wait for files still being written, index what changed. One JSON line per poll that changed
something goes to stdout (or every poll with --format json); progress and warnings to stderr. The
collection's own settings apply (it is indexed as `faste-mm index` would); Ctrl-C stops between
commits, losing nothing.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Optional

import typer

from faste_mm.cli.album_command import print_album_changes
from faste_mm.cli.common import fail, setup_logging, shown, stderr
from faste_mm.cli.index_command import links_skipped_line
from faste_mm.cli.options import CollectionOption, Debug, Device, Dtype, FollowLinks, Model
from faste_mm.errors import FasteError

DEFAULT_INTERVAL_S = 5.0  # = WatchOptions.interval_s (tested), a literal so --help imports no library code


def watch_command(
    paths: list[Path] = typer.Argument(..., help="Folders (walked recursively) and files to keep in sync."),
    collection: CollectionOption = None,
    model: Model = None,
    interval: float = typer.Option(DEFAULT_INTERVAL_S, "--interval", envvar="FASTE_MM_WATCH_INTERVAL", min=0.01,
                                   help=f"Seconds between polls. Default {DEFAULT_INTERVAL_S:g}."),
    settle_polls: int = typer.Option(2, "--settle-polls", envvar="FASTE_MM_WATCH_SETTLE_POLLS", min=1,
                                     help="A new or changed file is indexed once its size and mtime stayed the same "
                                          "for this many polls (1: at once). Default 2."),
    polls: Optional[int] = typer.Option(None, "--polls", envvar="FASTE_MM_WATCH_POLLS", min=1,
                                        help="Stop after this many polls (scripts, cron). Default: run until Ctrl-C."),
    events: bool = typer.Option(False, "--events", envvar="FASTE_MM_WATCH_EVENTS",
                                help="Also wake on native file events (needs watchdog: pip install "
                                     "'faste-mm[watch]'); polling stays the truth (NFS/SMB, inotify limits)."),
    exclude: list[str] = typer.Option([], "--exclude", envvar="FASTE_MM_EXCLUDE",
                                      help="Glob (fnmatch) on the path relative to a watched folder or on any name "
                                           "in it, e.g. '*.tmp', '.sync/*'; repeatable."),
    include_hidden: bool = typer.Option(False, "--include-hidden", envvar="FASTE_MM_INCLUDE_HIDDEN",
                                        help="Also index files and folders whose name starts with '.'."),
    follow_links: FollowLinks = False,
    chunk_files: int = typer.Option(64, "--chunk-files", envvar="FASTE_MM_CHUNK_FILES", min=1,
                                    help="Files embedded and committed together (default 64)."),
    device: Device = "auto",
    dtype: Dtype = "auto",
    json_lines: bool = typer.Option(False, "--json", envvar="FASTE_MM_WATCH_JSON",
                                    help="Print every poll as a JSON line (default: only polls that changed "
                                         "something, as a short line on stderr); it names the files embedded, "
                                         "reused, moved and removed."),
    verbose: bool = typer.Option(False, "--verbose", "-v", envvar="FASTE_MM_WATCH_VERBOSE",
                                 help="Also name each file a poll embedded, moved or removed, one line each on "
                                      "stderr (as rsync -v does). Default: counts only."),
    debug: Debug = False,
) -> None:
    """Keep a collection in sync with folders: new and changed files indexed, deleted ones removed, moved ones kept."""
    from faste_mm.retrieval.maintenance import collection_path
    from faste_mm.retrieval.results import IndexOptions
    from faste_mm.retrieval.retriever import Retriever
    from faste_mm.retrieval.library.watching import FolderWatcher, WatchOptions

    setup_logging(debug)
    stop = threading.Event()
    try:
        options = WatchOptions(interval_s=interval, settle_polls=settle_polls, events=events,
                               index=IndexOptions(exclude=tuple(exclude), include_hidden=include_hidden,
                                                  follow_links=follow_links,
                                                  chunk_files=chunk_files))
        retriever = Retriever.for_collection(collection_path(collection), model, device=device, dtype=dtype)
        watcher = FolderWatcher(retriever, paths, options)
        stderr.print(f"watching {', '.join(str(p) for p in watcher.paths)} for {retriever.collection} every "
                     f"{interval:g} s (Ctrl-C stops)", highlight=False)

        def on_sync(report) -> None:
            _show(report, json_lines, verbose)
            if polls is not None and watcher.polls >= polls:
                stop.set()

        with retriever:
            watcher.run(stop, on_sync)
    except FasteError as error:
        fail(error, debug)
    except KeyboardInterrupt:
        stderr.print("stopped: every committed change is kept; run watch again to go on", highlight=False)
        raise typer.Exit(130)


def _show(report, json_lines: bool, verbose: bool) -> None:
    if json_lines:
        typer.echo(json.dumps(report.to_dict()))
    if report.error:
        stderr.print(f"[yellow]not synced[/yellow]: {report.error}; trying again next poll", highlight=False)
    for root in report.empty_roots:
        stderr.print(f"[yellow]{root} holds no files[/yellow] (unmounted?): nothing under it was removed; "
                     f"`faste-mm remove` it if you emptied it on purpose", highlight=False)
    index = report.index
    if index is not None and (index.embedded or index.reused or index.removed or index.failed):
        stderr.print(f"synced: {index.embedded} embedded, {index.reused} reused, {index.removed} removed, "
                     f"{index.failed} failed" + (f"; {report.waiting} still being written" if report.waiting else ""),
                     highlight=False)
        if verbose:
            _name_files(index)
        for failure in index.failures:
            stderr.print(f"[yellow]skipped[/yellow] {failure.error}", highlight=False)
        if index.links_skipped:
            stderr.print(links_skipped_line(index.links_skipped), highlight=False)
    if index is not None:
        print_album_changes(index.albums)


def _name_files(index) -> None:
    """One line per file a poll changed, rsync -v's way: what happened, then the path."""
    moved = index.moved_files
    moved_from = {old for old, _ in moved}
    lines = [f"embedded {uri}" for uri in index.embedded_files]
    lines += [f"moved {old} -> {new}" for old, new in moved]
    lines += [f"reused {uri} (same content as {donor})" for uri, donor in index.reused_files if donor not in moved_from]
    lines += [f"removed {uri}" for uri in index.removed_files if uri not in moved_from]
    for line in lines:
        stderr.print(shown(line), highlight=False, markup=False)
