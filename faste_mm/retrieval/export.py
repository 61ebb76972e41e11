"""Export a collection to another store: one Parquet file (`parquet:FILE`), or a LanceDB table with
its vector index (`lancedb:DIR[/TABLE]`), so its vectors can go on to LanceDB, Qdrant, Milvus,
pgvector or a dataframe. Streams part by part (bounded memory), needs no model and loads no torch;
receives a collection directory and a target, hands back an `ExportReport`.

Columns (both targets): id (int64), uri (string; a name that is not UTF-8 JSON-escaped, see
`exported_uri`), page (int32, null unless a PDF page), modality
(string), metadata (JSON text, null when none), text (the lexical text: a note's text, a page's
text layer, the text OCR read in a photo; null when none), the item's facts as typed columns
(`FACT_COLUMNS`: taken as a UTC timestamp, GPS as float64, camera and place as strings, keywords as
a list of strings, rating as int32, ...; null when unknown), vector (fixed-size list of the
collection's dim: float32 in Parquet; in LanceDB float32 when the collection stores float32, else
float16), and for collections with 8-bit or binary vectors `vector_codes` (uint8: the 8-bit codes
[dim] or the packed sign bits [dim / 8] the collection's index holds).
The schema metadata carries the collection manifest under "faste_mm.manifest" (with the int8 ranges
that decode the codes).

One writer per target (`_write_parquet`, `_write_lancedb`) over one row source (`_batches`).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from faste_mm.errors import ConfigError, InputError
from faste_mm.indexers import Collection
from faste_mm.indexers.atomic_files import atomic_write
from faste_mm.indexers.crash_points import crash_point
from faste_mm.indexers.quantization import encode, stored_width

log = logging.getLogger(__name__)

# Rows per Parquet row group (and per read from the vector parts): 4096 x 2048 float32 = 32 MiB.
EXPORT_CHUNK_ROWS = 4096
TARGETS = ("parquet", "lancedb")
DEFAULT_LANCEDB_TABLE = "items"
# Below this many rows a LanceDB table gets no vector index: its flat scan is exact and fast, and
# IVF needs enough rows to train its partitions (LanceDB's guidance: index from ~10k-100k rows).
LANCEDB_INDEX_MIN_ROWS = 10_000


@dataclass(frozen=True, slots=True)
class ExportReport:
    """What an export wrote: the file or table, how many items, their vector width, the target kind
    and (LanceDB) the vector index built, None when the table is searched flat."""

    path: str
    n_items: int
    dim: int
    target: str = "parquet"
    index: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ExportTarget:
    """Where `export` writes: kind ("parquet" | "lancedb"), the file or database folder, the table."""

    kind: str
    path: Path
    table: str | None = None

    @classmethod
    def parse(cls, text: str) -> "ExportTarget":
        """"parquet:FILE", "lancedb:DIR/TABLE", or "lancedb:DIR" for an existing folder (table
        "items"); a bare path is a Parquet file."""
        kind, sep, rest = str(text).partition(":")
        if not sep or kind not in TARGETS or not rest:
            if sep and kind.isalpha() and len(kind) > 1:
                raise ConfigError(f"export target {text!r}: unknown kind {kind!r}; use parquet:FILE or "
                                  f"lancedb:DIR[/TABLE]")
            return cls("parquet", Path(text).expanduser())
        path = Path(rest).expanduser()
        if kind == "parquet":
            return cls("parquet", path)
        if path.is_dir() and not path.name.endswith(".lance"):
            return cls("lancedb", path, DEFAULT_LANCEDB_TABLE)
        return cls("lancedb", path.parent, check_table_name(path.name.removesuffix(".lance"), text))


# LanceDB's own rule for table names (letters, digits, _ - .), kept to names that are one plain
# file name: no "..", at most 128 characters.
_TABLE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")


def check_table_name(name: str, target: str) -> str:
    """`name` if LanceDB can name a table so; ConfigError naming the rule otherwise."""
    if _TABLE_NAME.fullmatch(name) and ".." not in name:
        return name
    raise ConfigError(f"export target {target[:200]!r}: {name[:60]!r}{'...' if len(name) > 60 else ''} is not a "
                      f"LanceDB table name; use 1-128 letters, digits, '_', '-' or '.' (not starting with '.' or "
                      f"'-', no '..'), e.g. lancedb:DIR/photos")


def export(root: Path, to: str | ExportTarget, chunk_rows: int = EXPORT_CHUNK_ROWS,
           index_min_rows: int = LANCEDB_INDEX_MIN_ROWS) -> ExportReport:
    """Write every live item of the collection at `root` to `to` (see `ExportTarget.parse`)."""
    target = to if isinstance(to, ExportTarget) else ExportTarget.parse(to)
    if target.kind == "lancedb":
        return export_lancedb(root, target.path, target.table or DEFAULT_LANCEDB_TABLE, chunk_rows, index_min_rows)
    return export_parquet(root, target.path, chunk_rows)


# The facts (`indexers.facts.ItemFacts`) as typed columns: (column, Arrow type name, value of an
# ItemFacts). Filterable in the target store (LanceDB `where`, Qdrant/Milvus payload), so they are
# typed, not JSON: `taken` a UTC timestamp (its recorded offset beside it), GPS floats, a list of
# keywords; `camera` and `place` are the names search shows ("Google Pixel 8", "Lisbon, Portugal").
FACT_COLUMNS: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    ("taken", "timestamp", lambda f: None if f.taken is None else round(f.taken * 1_000_000)),
    ("taken_offset_min", "int32", lambda f: f.taken_offset_min),
    ("taken_source", "string", lambda f: f.taken_source),
    ("camera", "string", lambda f: f.camera), ("make", "string", lambda f: f.make),
    ("model", "string", lambda f: f.model), ("lens", "string", lambda f: f.lens),
    ("lat", "float64", lambda f: f.lat), ("lon", "float64", lambda f: f.lon), ("alt", "float64", lambda f: f.alt),
    ("place", "string", lambda f: f.place), ("city", "string", lambda f: f.city),
    ("region", "string", lambda f: f.region), ("country", "string", lambda f: f.country),
    ("orientation", "int32", lambda f: f.orientation), ("width", "int32", lambda f: f.width),
    ("height", "int32", lambda f: f.height), ("title", "string", lambda f: f.title),
    ("description", "string", lambda f: f.description), ("keywords", "strings", lambda f: list(f.keywords)),
    ("rating", "int32", lambda f: f.rating), ("author", "string", lambda f: f.author),
    ("duration_s", "float64", lambda f: f.duration_s),
)


def _arrow_type(name: str):
    import pyarrow as pa

    return {"timestamp": pa.timestamp("us", tz="UTC"), "int32": pa.int32(), "string": pa.string(),
            "float64": pa.float64(), "strings": pa.list_(pa.string())}[name]


def export_schema(dim: int, manifest_json: str | None = None, vector_type: str = "float32",
                  codes_width: int | None = None):
    """The export's Arrow schema (see the module docstring)."""
    import pyarrow as pa

    fields = [("id", pa.int64()), ("uri", pa.string()), ("page", pa.int32()), ("modality", pa.string()),
              ("metadata", pa.string()), ("text", pa.string()),
              *((name, _arrow_type(kind)) for name, kind, _ in FACT_COLUMNS),
              ("vector", pa.list_(pa.float32() if vector_type == "float32" else pa.float16(), dim))]
    if codes_width is not None:
        fields.append(("vector_codes", pa.list_(pa.uint8(), codes_width)))
    schema = pa.schema(fields)
    return schema if manifest_json is None else schema.with_metadata({"faste_mm.manifest": manifest_json})


def _codes_precision(col: Collection) -> str | None:
    """"int8" or "binary" when the collection's index holds codes (exported as `vector_codes`)."""
    return col.manifest.vectors if col.manifest.vectors in ("int8", "binary") else None


def _batches(col: Collection, schema, chunk_rows: int) -> Iterator:
    """The live items as Arrow record batches of `schema`, `chunk_rows` at a time."""
    import pyarrow as pa

    dim, manifest = col.manifest.dim, col.manifest
    vector_type = schema.field("vector").type.value_type
    codes = _codes_precision(col)
    for records, vectors in col.iter_live(chunk_rows):
        texts = col.texts(r.id for r in records)
        facts = [r.facts for r in col.get(r.id for r in records)]  # None: an item without facts
        columns = {
            "id": [r.id for r in records], "uri": [exported_uri(r.uri) for r in records],
            "page": [r.page for r in records], "modality": [r.modality for r in records],
            "metadata": [None if r.metadata is None else json.dumps(dict(r.metadata)) for r in records],
            "text": [texts.get(r.id) or None for r in records],
            **{name: [None if f is None else value(f) for f in facts] for name, _, value in FACT_COLUMNS},
            # One flat buffer viewed as fixed-size lists: no per-row Python objects.
            "vector": pa.FixedSizeListArray.from_arrays(
                pa.array(vectors.astype(vector_type.to_pandas_dtype(), copy=False).reshape(-1)), dim),
        }
        if codes is not None:
            # Decoded stored vectors re-encode to exactly the index's codes (fixed ranges, sign bits).
            coded = encode(vectors, codes, manifest.int8_ranges)
            columns["vector_codes"] = pa.FixedSizeListArray.from_arrays(pa.array(coded.reshape(-1)), coded.shape[1])
        yield pa.RecordBatch.from_pydict(columns, schema=schema)
        crash_point("export-after-batch")


def _open_schema(col: Collection, vector_type: str):
    codes = _codes_precision(col)
    width = stored_width(codes, col.manifest.dim) if codes else None
    return export_schema(col.manifest.dim, json.dumps(col.manifest.to_dict()), vector_type, width)


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
    out = Path(out).expanduser()
    if out.is_dir():
        raise InputError(f"export: {out} is a folder; give a file name such as {out / 'collection.parquet'}")
    if not out.parent.is_dir():
        raise InputError(f"export: the folder {out.parent} does not exist; create it or choose another --out")
    with Collection.open(root) as col:
        n_items = _write_parquet(col, out, chunk_rows)
        dim = col.manifest.dim
    log.info("%s: exported %d items (dim %d) to %s", root, n_items, dim, out)
    return ExportReport(str(out), n_items, dim)


def _write_parquet(col: Collection, out: Path, chunk_rows: int) -> int:
    import pyarrow.parquet as pq

    schema = _open_schema(col, "float32")
    n_items = 0

    def write(f) -> None:
        nonlocal n_items
        with pq.ParquetWriter(f, schema) as writer:
            for batch in _batches(col, schema, chunk_rows):
                writer.write_batch(batch)
                n_items += batch.num_rows

    atomic_write(out, write)
    return n_items


def export_lancedb(root: Path, directory: str | Path, table: str = DEFAULT_LANCEDB_TABLE,
                   chunk_rows: int = EXPORT_CHUNK_ROWS, index_min_rows: int = LANCEDB_INDEX_MIN_ROWS) -> ExportReport:
    """Write the live items of the collection at `root` to LanceDB table `table` in the database
    folder `directory` (created; a table of that name is replaced by a new version written in one
    commit, so an interrupted export keeps the previous table), then build its vector index
    with the collection's quantization (`lancedb_index`) when it has at least `index_min_rows` rows.
    Needs `pip install faste-mm[lancedb]`."""
    try:
        import lancedb
        import pyarrow as pa
    except ImportError:
        raise ConfigError("export to LanceDB needs the lancedb package; pip install 'faste-mm[lancedb]'") from None
    directory = Path(directory).expanduser()
    if directory.exists() and not directory.is_dir():
        raise InputError(f"export: {directory} is a file; give a folder for the LanceDB database")
    with Collection.open(root) as col:
        manifest = col.manifest
        schema = _open_schema(col, "float32" if manifest.stored_precision == "float32" else "float16")
        db = lancedb.connect(str(directory))
        # All rows in ONE write: LanceDB commits a new version of the table when the stream ends,
        # so an export killed part-way leaves the previous version (the old table, whole) current
        # (LanceDB OSS cannot rename a table, so a temporary table cannot be swapped in). LanceDB
        # reads the stream in a thread of its own; the read-only collection allows that.
        rows = pa.RecordBatchReader.from_batches(schema, _batches(col, schema, chunk_rows))
        lance_table = db.create_table(table, data=rows, schema=schema, mode="overwrite")
        n_items = lance_table.count_rows()
        index = lancedb_index(manifest.vectors, n_items) if n_items >= index_min_rows else None
        if index is not None:
            column, config = index
            lance_table.create_index(column, config=config)
    built = None if index is None else type(index[1]).__name__
    log.info("%s: exported %d items (dim %d) to LanceDB %s table %s (index %s)", root, n_items, manifest.dim,
             directory, table, built)
    return ExportReport(f"{directory}/{table}", n_items, manifest.dim, "lancedb", built)


def lancedb_index(vectors: str, n_rows: int):
    """(column, LanceDB index config) matching the collection's quantization: float32/float16 -> IVF_FLAT on `vector` (no
    quantization, like the collection's), int8 -> IVF_SQ (8-bit scalar codes) on `vector`, binary ->
    IVF_FLAT with Hamming distance on the sign bits `vector_codes`. Partitions ~ sqrt(n)."""
    from lancedb.index import IvfFlat, IvfSq

    partitions = int(2 ** round(np.log2(max(np.sqrt(n_rows), 16))))
    if vectors == "binary":
        return "vector_codes", IvfFlat(distance_type="hamming", num_partitions=partitions)
    if vectors == "int8":
        return "vector", IvfSq(distance_type="dot", num_partitions=partitions)
    return "vector", IvfFlat(distance_type="dot", num_partitions=partitions)
