"""`faste-mm export`: write a collection's items and vectors to a Parquet file (no model, no torch).
The file's path goes to stdout, the count to stderr."""

from __future__ import annotations

from pathlib import Path

import typer

from faste_mm.cli.common import fail, setup_logging, stderr, stdout
from faste_mm.cli.options import CollectionOption, Debug
from faste_mm.errors import FasteError


def export_command(
    out: Path = typer.Option(..., "--out", "-o", envvar="FASTE_MM_OUT",
                             help="Parquet file to write (columns id, uri, page, modality, metadata as JSON "
                                  "text, vector as fixed-size float32 lists); replaced if it exists."),
    collection: CollectionOption = None,
    debug: Debug = False,
) -> None:
    """Export a collection to Parquet, e.g. to load it into LanceDB, Qdrant or pgvector."""
    from faste_mm.retrieval.export import export_parquet
    from faste_mm.retrieval.maintenance import collection_path

    setup_logging(debug)
    try:
        report = export_parquet(collection_path(collection), out)
    except FasteError as error:
        fail(error, debug)
    stdout.print(report.path, highlight=False, markup=False)
    stderr.print(f"exported {report.n_items} items (dim {report.dim})")
