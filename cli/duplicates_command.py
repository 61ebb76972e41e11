"""`faste-mm duplicates`: groups of exact and near-duplicate items of a collection, each with a
suggested keeper (faste_mm.retrieval.library.duplicates; no model loads, nothing is deleted). The groups go
to stdout (paths, a table or JSON); the summary to stderr.
"""

from __future__ import annotations

from enum import Enum

import typer
from rich.table import Table

from faste_mm.cli.common import fail, markup_safe, print_json, setup_logging, stderr, stdout, usage_error
from faste_mm.cli.options import CollectionOption, Debug
from faste_mm.errors import FasteError

# The default threshold, here as a literal so `--help` imports no FAISS (tested equal to the library's).
DEFAULT_THRESHOLD = 0.95


class DuplicatesFormat(str, Enum):
    """What `duplicates` prints: one path per line (groups separated by a blank line, keeper first), a
    table, or JSON."""

    paths = "paths"
    table = "table"
    json = "json"


def duplicates_command(
    collection: CollectionOption = None,
    threshold: float = typer.Option(
        DEFAULT_THRESHOLD, "--threshold", "-t", envvar="FASTE_MM_DUPLICATE_THRESHOLD", show_default=False,
        help=f"Cosine in (0, 1] at or above which two items are near-duplicates (1 = identical vectors). "
             f"Default {DEFAULT_THRESHOLD}."),
    exact: bool = typer.Option(False, "--exact", envvar="FASTE_MM_DUPLICATES_EXACT",
                               help="Report exact copies (same content) only, not near-duplicates."),
    output: DuplicatesFormat = typer.Option(
        DuplicatesFormat.table, "--format", envvar="FASTE_MM_FORMAT", show_default=False,
        help="paths (keeper first, a blank line between groups) | table | json. Default table."),
    debug: Debug = False,
) -> None:
    """Find duplicate and near-duplicate items (copies, resized or re-encoded photos, bursts). Never deletes a file."""
    from faste_mm.retrieval.library.duplicates import collection_duplicates
    from faste_mm.retrieval.maintenance import collection_path

    setup_logging(debug)
    if not 0.0 < threshold <= 1.0:  # the library says the same in Python words
        usage_error(f"--threshold is a cosine in (0, 1] (1 = identical vectors only), got {threshold:g}")
    try:
        report = collection_duplicates(collection_path(collection), threshold, near=not exact)
    except FasteError as error:
        fail(error, debug)
    stderr.print(f"{len(report.groups)} groups, {report.n_redundant} redundant items among {report.n_items} "
                 f"(threshold {report.threshold:g}, {report.elapsed_s:.2f} s); nothing was deleted")
    if output is DuplicatesFormat.json:
        print_json(report.to_dict())
    elif output is DuplicatesFormat.paths:
        blocks = ["\n".join(_name(item) for item in group.items) for group in report.groups]
        if blocks:
            typer.echo("\n\n".join(blocks))
    else:
        _print_table(report)


def _name(item) -> str:
    return item.uri if item.page is None else f"{item.uri}#page={item.page}"


def _print_table(report) -> None:
    table = Table(title="duplicates (keeper first)")
    for name, justify in (("group", "right"), ("kind", "left"), ("keep", "left"), ("path", "left"),
                          ("pixels", "right"), ("score", "right")):
        table.add_column(name, justify=justify, overflow="fold" if name == "path" else None)
    for number, group in enumerate(report.groups, 1):
        for position, item in enumerate(group.items):
            size = f"{item.width}x{item.height}" if item.width else "-"
            # a member's own kind: a byte-identical copy is "exact" inside a near group too
            kind = group.kind if position == 0 else item.match
            table.add_row(str(number) if position == 0 else "", kind,
                          "keep" if position == 0 else "", markup_safe(_name(item)), size, f"{item.score:.4f}")
    stdout.print(table)
