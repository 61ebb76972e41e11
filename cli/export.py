"""`faste-mm export`: write a collection's items and vectors to a Parquet file or a LanceDB table (no
model, no torch). The file's or table's path goes to stdout, the count to stderr."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from faste_mm.cli.common import fail, setup_logging, stderr, stdout
from faste_mm.cli.options import CollectionOption, Debug
from faste_mm.errors import FasteError


def export_command(
    out: Optional[Path] = typer.Option(None, "--out", "-o", envvar="FASTE_MM_OUT",
                                       help="Parquet file to write (columns id, uri, page, modality, metadata as "
                                            "JSON text, text, vector as fixed-size float32 lists, vector_codes for "
                                            "int8/binary collections); replaced if it exists. = --to parquet:FILE."),
    to: Optional[str] = typer.Option(None, "--to", envvar="FASTE_MM_EXPORT_TO",
                                     help="Where to write: parquet:FILE, or lancedb:DIR/TABLE (a LanceDB table, "
                                          "replaced if it exists, with a vector index matching the collection's "
                                          "quantization; needs faste-mm[lancedb]). Default: --out."),
    collection: CollectionOption = None,
    debug: Debug = False,
) -> None:
    """Export a collection to Parquet or LanceDB, e.g. to go on to Qdrant, Milvus or pgvector."""
    from faste_mm.retrieval.export import export
    from faste_mm.retrieval.maintenance import collection_path

    setup_logging(debug)
    if (out is None) == (to is None):
        raise typer.BadParameter("give exactly one of --out FILE and --to parquet:FILE|lancedb:DIR/TABLE", param_hint="--to")
    try:
        report = export(collection_path(collection), to if to is not None else f"parquet:{out}")
    except FasteError as error:
        fail(error, debug)
    stdout.print(report.path, highlight=False, markup=False)
    stderr.print(f"exported {report.n_items} items (dim {report.dim})")
