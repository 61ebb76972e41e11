"""`faste-mm album`: saved searches that stay current (faste_mm.retrieval.library.albums). `add` loads
the collection's model once to embed the album's query; `list`, `show`, `remove`, `export` and
`refresh` load none. Results go to stdout (a table, --format json, or paths), messages to stderr.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from faste_mm.cli.common import fail, markup_safe, print_json, setup_logging, stderr, stdout
from faste_mm.cli.options import CollectionOption, Debug, Device
from faste_mm.cli.search_command import takes_search_options
from faste_mm.errors import FasteError

# The search options an album keeps (`faste_mm.retrieval.library.albums.ALBUM_OPTIONS`, a test keeps
# them equal; listed here so that --help imports no numpy or FAISS), and its minimum score.
ALBUM_FLAGS = ("literal", "where", "type", "path", "since", "until", "instruction")
DEFAULT_LIMIT = 100  # the library's DEFAULT_LIMIT (a test keeps them equal)


class AlbumFormat(str, Enum):
    """What `album show` and `album list` print: a table, JSON, or one path per line (show)."""

    table = "table"
    json = "json"
    paths = "paths"


Format = typer.Option(AlbumFormat.table, "--format", envvar="FASTE_MM_FORMAT", show_default=False,
                      help="table | json | paths (show: one file per line). Default table.")
Name = typer.Argument(..., help="The album's name: letters, digits, '.', '_' or '-' (e.g. beach, trip-2024).")


def _albums(collection: Optional[str]):
    from faste_mm.retrieval.library.albums import Albums
    from faste_mm.retrieval.locations import collection_path
    from faste_mm.retrieval.profile import read_profile

    root = collection_path(collection)
    return Albums(root, default_min_score=lambda: read_profile(root).min_score)


def add_command(
    name: str = Name,
    query: str = typer.Argument(..., help="What the album holds, in words (read as meaning and filters, as "
                                          "`faste-mm search` reads a query: dates, places, kinds, \"phrases\")."),
    limit: int = typer.Option(DEFAULT_LIMIT, "--limit", envvar="FASTE_MM_ALBUM_LIMIT", min=1, max=10_000,
                              help=f"The most items the album holds, best first. Default {DEFAULT_LIMIT}."),
    collection: CollectionOption = None,
    device: Device = "auto",
    output: AlbumFormat = Format,
    debug: Debug = False,
    options: dict | None = None,
) -> None:
    """Save a search as an album: the best items for QUERY now, kept current by every index, watch and serve --watch run."""
    from faste_mm.retrieval.retriever import Retriever

    setup_logging(debug)
    given = {key: value for key, value in (options or {}).items() if value not in (None, [], False)}
    min_score = given.pop("min_score", None)
    try:
        with Retriever.open(collection, device=device) as retriever:
            album = retriever.albums().add(name, query, limit=limit, min_score=min_score, **given)
    except FasteError as error:
        fail(error, debug)
    stderr.print(f"album {album.name!r}: {len(album.hits)} items" +
                 (f" ({markup_safe(album.understood)})" if album.understood else ""), highlight=False)
    _show(album, output)


def list_command(collection: CollectionOption = None, output: AlbumFormat = Format, debug: Debug = False) -> None:
    """List the collection's albums."""
    setup_logging(debug)
    try:
        albums = _albums(collection).list()
    except FasteError as error:
        fail(error, debug)
    if output is AlbumFormat.json:
        print_json([a.to_dict(hits=False) for a in albums])
        return
    if output is AlbumFormat.paths:
        for album in albums:
            typer.echo(album.name)
        return
    table = Table(title="albums")
    for column in ("name", "query", "limit", "min score", "not yet scored"):
        table.add_column(column, overflow="fold" if column == "query" else None)
    for a in albums:
        table.add_row(a.name, markup_safe(a.query), str(a.limit), "-" if a.min_score is None else f"{a.min_score:g}",
                      str(a.unscored))
    stdout.print(table)


def show_command(name: str = Name, collection: CollectionOption = None, output: AlbumFormat = Format,
                 debug: Debug = False) -> None:
    """Show an album's items, best first."""
    setup_logging(debug)
    try:
        album = _albums(collection).show(name)
    except FasteError as error:
        fail(error, debug)
    if album.unscored:
        stderr.print(f"{album.unscored} items stored since the album's last refresh are not in it yet: "
                     f"`faste-mm album refresh` (or the next index run) scores them", highlight=False)
    _show(album, output)


def remove_command(name: str = Name, collection: CollectionOption = None, debug: Debug = False) -> None:
    """Delete an album (its files stay in the collection)."""
    setup_logging(debug)
    try:
        _albums(collection).remove(name)
    except FasteError as error:
        fail(error, debug)
    stderr.print(f"removed album {name!r}; its files stay in the collection", highlight=False)


def export_command(
    name: str = Name,
    to: Path = typer.Option(..., "--to", help="A folder (new, empty, or this album's earlier export: the files are "
                                              "copied, as photo managers export) or a playlist FILE.m3u / .m3u8 "
                                              "(absolute paths, best first)."),
    collection: CollectionOption = None,
    output: AlbumFormat = Format,
    debug: Debug = False,
) -> None:
    """Copy an album's files to a folder, or list them in an .m3u playlist."""
    setup_logging(debug)
    try:
        report = _albums(collection).export(name, to)
    except FasteError as error:
        fail(error, debug)
    for why in report.skipped:
        stderr.print(f"[yellow]left out[/yellow] {markup_safe(why)}", highlight=False)
    stderr.print(f"album {name!r}: {len(report.files)} files to {markup_safe(report.to)}" +
                 (f", {len(report.removed)} files of the earlier export removed" if report.removed else ""),
                 highlight=False)
    if output is AlbumFormat.json:
        print_json(report.to_dict())


def refresh_command(collection: CollectionOption = None, debug: Debug = False) -> None:
    """Score the items stored since the albums' last refresh (index, watch and serve --watch do it themselves)."""
    setup_logging(debug)
    try:
        changes = _albums(collection).refresh()
    except FasteError as error:
        fail(error, debug)
    print_album_changes(changes)
    if not changes:
        stderr.print("albums: no change", highlight=False)


def print_album_changes(changes) -> None:
    """One stderr line per album a run changed: album 'beach': +3, -1."""
    for change in changes:
        stderr.print(markup_safe(change.summary), highlight=False)


def _show(album, output: AlbumFormat) -> None:
    if output is AlbumFormat.json:
        print_json(album.to_dict())
    elif output is AlbumFormat.paths:
        for hit in album.hits:
            typer.echo(hit.uri if hit.page is None else f"{hit.uri}#page={hit.page}")
    else:
        table = Table(title=f"album {album.name}: {album.query}")
        for column, justify in (("#", "right"), ("score", "right"), ("id", "right"), ("path", "left")):
            table.add_column(column, justify=justify, overflow="fold" if column == "path" else None)
        for rank, hit in enumerate(album.hits, 1):
            path = hit.uri if hit.page is None else f"{hit.uri} (page {hit.page})"
            table.add_row(str(rank), f"{hit.score:.4f}", str(hit.id), markup_safe(path))
        stdout.print(table)


def album_app() -> typer.Typer:
    """`faste-mm album`: add, list, show, remove, export, refresh."""
    group = typer.Typer(add_completion=False, no_args_is_help=True)
    names = (*ALBUM_FLAGS, "min_score")
    for command, function in (("add", takes_search_options(add_command, names)), ("list", list_command),
                              ("show", show_command), ("remove", remove_command), ("export", export_command),
                              ("refresh", refresh_command)):
        group.command(command)(function)
    return group
