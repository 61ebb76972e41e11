"""Export a collection to one Parquet file, so its vectors can be loaded into LanceDB, Qdrant,
pgvector or a dataframe. Streams part by part (bounded memory), needs no model and loads no
torch; receives a collection directory, hands back an `ExportReport`.

Columns: id (int64), uri (string; a name that is not UTF-8 JSON-escaped, see `exported_uri`), page (int32, null unless a PDF page), modality (string),
metadata (JSON text, null when none), vector (fixed-size list of float32, the collection's dim).
The file's schema metadata carries the collection manifest under "faste_mm.manifest".
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from faste_mm.errors import InputError
from faste_mm.indexers import Collection
from faste_mm.indexers.atomic_files import atomic_write

log = logging.getLogger(__name__)

# Rows per Parquet row group (and per read from the vector parts): 4096 x 2048 float32 = 32 MiB.
EXPORT_CHUNK_ROWS = 4096


@dataclass(frozen=True, slots=True)
class ExportReport:
    """What `export_parquet` wrote: the file, how many items, and their vector width."""

    path: str
    n_items: int
    dim: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parquet_schema(dim: int, manifest_json: str | None = None):
    """The export's Arrow schema (see the module docstring)."""
    import pyarrow as pa

    schema = pa.schema([
        ("id", pa.int64()), ("uri", pa.string()), ("page", pa.int32()), ("modality", pa.string()),
        ("metadata", pa.string()), ("vector", pa.list_(pa.float32(), dim)),
    ])
    return schema if manifest_json is None else schema.with_metadata({"faste_mm.manifest": manifest_json})


def exported_uri(uri: str) -> str:
    """The uri as the file's UTF-8 string column holds it. A name whose bytes are not UTF-8
    (Python keeps them as lone surrogates, U+DC80..U+DCFF) is written JSON-escaped, as
    `--format json` prints it: `json.loads('"' + uri + '"')` gives the str back, `os.fsencode`
    the original bytes. Every other name is written as it is."""
    try:
        uri.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(uri)[1:-1]  # ASCII: \udcXX for each byte that is not UTF-8
    return uri


def export_parquet(root: Path, out: str | Path, chunk_rows: int = EXPORT_CHUNK_ROWS) -> ExportReport:
    """Write every live item of the collection at `root` with its vector to `out` (.parquet).

    The file appears complete or not at all (written to a temp file, then renamed). Opens the
    collection read-only, so a search or an index run may go on meanwhile.
    Raises CollectionError (not a collection), InputError (`out` is a folder or inside a missing one).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out).expanduser()
    if out.is_dir():
        raise InputError(f"export: {out} is a folder; give a file name such as {out / 'collection.parquet'}")
    if not out.parent.is_dir():
        raise InputError(f"export: the folder {out.parent} does not exist; create it or choose another --out")
    n_items = 0
    with Collection.open(root) as col:
        dim = col.manifest.dim
        schema = parquet_schema(dim, json.dumps(col.manifest.to_dict()))

        def write(f) -> None:
            nonlocal n_items
            with pq.ParquetWriter(f, schema) as writer:
                for records, vectors in col.iter_live(chunk_rows):
                    columns = {
                        "id": [r.id for r in records], "uri": [exported_uri(r.uri) for r in records],
                        "page": [r.page for r in records], "modality": [r.modality for r in records],
                        "metadata": [None if r.metadata is None else json.dumps(dict(r.metadata)) for r in records],
                        # One flat float32 buffer viewed as fixed-size lists: no per-row Python objects.
                        "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim),
                    }
                    writer.write_table(pa.Table.from_pydict(columns, schema=schema))
                    n_items += len(records)

        atomic_write(out, write)
    log.info("%s: exported %d items (dim %d) to %s", root, n_items, dim, out)
    return ExportReport(str(out), n_items, dim)
