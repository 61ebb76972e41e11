"""Export to Parquet: every live item once with its stored vector and metadata (tombstones left
out), in bounded chunks, from the API and the CLI, without importing torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from faste_mm.cli.app import app
from faste_mm.errors import InputError
from faste_mm.indexers import Collection, ItemRecord, Manifest
from faste_mm.retrieval.export import export_parquet

from tests.helpers.bounds import HANG_S

D = 24


def make_collection(tmp_path, n: int = 300) -> tuple[Collection, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, D)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    col = Collection.create(tmp_path / "c", Manifest(model_id="m", dim=D, vector_dtype="float32"))
    ids = []
    for start in range(0, n, 100):  # three parts
        records = [ItemRecord(uri=f"/docs/f{i}.pdf" if i % 3 else f"item:{i}", modality="page" if i % 3 else "text",
                              page=1 if i % 3 else None, metadata={"n": i} if i % 2 else None)
                   for i in range(start, start + 100)]
        ids.extend(col.add(x[start:start + 100], records).tolist())
    col.delete(ids[::7])
    return col, x, np.array(ids)


def test_export_writes_every_live_item_with_its_vector_in_bounded_row_groups(tmp_path):
    col, x, ids = make_collection(tmp_path)
    col.close()
    report = export_parquet(tmp_path / "c", tmp_path / "out.parquet", chunk_rows=64)
    table = pq.read_table(tmp_path / "out.parquet")
    live = np.setdiff1d(ids, ids[::7])
    assert report.n_items == table.num_rows == len(live) and report.dim == D
    assert table.schema.field("vector").type == pa.list_(pa.float32(), D)
    assert json.loads(table.schema.metadata[b"faste_mm.manifest"])["dim"] == D
    assert pq.ParquetFile(tmp_path / "out.parquet").metadata.row_group(0).num_rows <= 64  # streamed in chunks
    got = table.to_pydict()
    assert sorted(got["id"]) == live.tolist()
    row_of = {int(i): k for k, i in enumerate(ids)}
    vectors = np.array(got["vector"], dtype=np.float32)
    np.testing.assert_array_equal(vectors, x[[row_of[i] for i in got["id"]]])
    with Collection.open(tmp_path / "c") as reader:
        records = reader.get(got["id"])
    assert got["uri"] == [r.uri for r in records] and got["page"] == [r.page for r in records]
    assert got["modality"] == [r.modality for r in records]
    assert [None if m is None else json.loads(m) for m in got["metadata"]] == [r.metadata for r in records]


def test_cli_export_writes_the_file_and_loads_no_torch(tmp_path):
    make_collection(tmp_path)[0].close()
    code = ("import sys; from typer.testing import CliRunner; from faste_mm.cli.app import app; "
            f"r = CliRunner().invoke(app, ['export', '-c', {str(tmp_path / 'c')!r}, '--out', {str(tmp_path / 'o.parquet')!r}]); "
            "assert r.exit_code == 0, r.output; print(r.stdout.strip()); "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "o.parquet")
    assert pq.read_table(tmp_path / "o.parquet").num_rows > 0


def test_export_to_a_folder_or_a_missing_folder_names_it(tmp_path):
    make_collection(tmp_path, n=100)[0].close()
    with pytest.raises(InputError, match="is a folder"):
        export_parquet(tmp_path / "c", tmp_path)
    result = CliRunner().invoke(app, ["export", "-c", str(tmp_path / "c"), "--out", str(tmp_path / "nope" / "x.parquet")])
    assert result.exit_code == 1 and "does not exist" in result.stderr


@pytest.mark.parametrize("vectors,keep", [("float32", "float"), ("int8", "float"), ("binary", "int8")])
def test_export_to_lancedb_answers_a_query_with_the_collections_top_hits(tmp_path, vectors, keep):
    import lancedb

    from faste_mm.retrieval.export import export

    rng = np.random.default_rng(1)
    n, d = 600, 32
    centers = rng.standard_normal((6, d)).astype(np.float32)
    x = centers[rng.integers(0, 6, n)] + 0.5 * rng.standard_normal((n, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=d, vectors=vectors, keep=keep)) as col:
        col.add(x, [ItemRecord(uri=f"/docs/f{i}.txt", modality="text", text=f"word{i}") for i in range(n)])
        queries = x[:5] + 0.05 * rng.standard_normal((5, d)).astype(np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        _, found = col.search(queries, k=5, rescore=0)  # the collection's own (index) order
        stored = col.vectors(range(n))
    report = export(tmp_path / "c", f"lancedb:{tmp_path / 'db'}/photos", index_min_rows=100)  # index this small table
    assert (report.target, report.n_items, report.path) == ("lancedb", n, f"{tmp_path / 'db'}/photos")
    assert report.index == {"float32": "IvfFlat", "int8": "IvfSq", "binary": "IvfFlat"}[vectors]
    table = lancedb.connect(str(tmp_path / "db")).open_table("photos")
    assert table.count_rows() == n
    row = table.search().where("id = 7").limit(1).to_arrow().to_pylist()[0]
    assert (row["uri"], row["text"]) == ("/docs/f7.txt", "word7")
    np.testing.assert_allclose(np.array(row["vector"], dtype=np.float32), stored[7], atol=1e-3)
    for q, want in zip(queries, found):
        if vectors == "binary":
            bits = np.packbits(q > 0)
            hits = table.search(bits, vector_column_name="vector_codes").distance_type("hamming").nprobes(64)
        else:
            hits = table.search(q, vector_column_name="vector").distance_type("dot").nprobes(64)
        got = hits.limit(5).to_arrow()["id"].to_pylist()
        # Same top hit; the top 5 agree but for ties of equal Hamming distance / fp16 rounding.
        assert got[0] == want[0] or vectors == "binary" and len(set(got) & set(want.tolist())) >= 3
        assert len(set(got) & set(want.tolist())) >= 4 or vectors == "binary"


# ---- file names that are not UTF-8 (helper ux) ------------------------------------------------
def test_a_file_name_that_is_not_utf8_is_exported_losslessly_like_the_json_output(tmp_path):
    raw = b"/photos/caf\xe9-\xff.png"  # Latin-1 bytes: not UTF-8
    name = raw.decode("utf-8", "surrogateescape")
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=D, vector_dtype="float32")) as col:
        x = np.eye(D, dtype=np.float32)[:3]
        col.add(x, [ItemRecord(uri=name, modality="image", metadata={"from": name}),
                    ItemRecord(uri="/photos/ok-\u00e9.png", modality="image"),
                    ItemRecord(uri='/photos/a "quoted\\" name.png', modality="image")])
    for out in (tmp_path / "api.parquet", tmp_path / "cli.parquet"):
        if out.name == "api.parquet":
            report = export_parquet(tmp_path / "c", out)
            assert report.n_items == 3
        else:
            result = CliRunner().invoke(app, ["export", "-c", str(tmp_path / "c"), "--out", str(out)])
            assert result.exit_code == 0, result.output
        got = pq.read_table(out).to_pydict()
        restored = {json.loads(f'"{u}"') if "\\udc" in u else u for u in got["uri"]}
        assert restored == {name, "/photos/ok-\u00e9.png", '/photos/a "quoted\\" name.png'}  # valid names as they are
        assert raw in {os.fsencode(u) for u in restored}  # the very bytes
        escaped = next(u for u in got["uri"] if "\\udc" in u)
        assert json.loads(next(m for m in got["metadata"] if m))["from"] == name
        # the same text `--format json` output carries for that name
        assert escaped in json.dumps({"uri": name})


# ---- the facts and the OCR text of photos (issue 46) ------------------------------------------
@pytest.fixture(scope="module")
def photo_export(tmp_path_factory):
    """A real index (tiny model, real OCR) of a plate photo carrying EXIF (date, camera, GPS) and XMP
    (keywords, rating), a photo without facts and a note, exported to Parquet and LanceDB."""
    pytest.importorskip("rapidocr_onnxruntime", reason="needs the ocr extra: pip install 'faste-mm[ocr]'")
    from PIL import Image

    from faste_mm import BatchingConfig, Embedder, Retriever
    from faste_mm.bench.library import plate_photo
    from faste_mm.retrieval.export import export
    from tests.helpers.inputs import tiny_vl_dir
    from tests.helpers.photo_fixtures import exif_block, make_photo, xmp_packet

    base = tmp_path_factory.mktemp("export-photos")
    root = base / "photos"
    root.mkdir()
    plate_photo(base / "plain-car.jpg")
    exif = exif_block("2024:05:01 14:03:00", "+01:00", "Google", "Pixel 8", gps=(38.7223, -9.1393, 12.5))
    Image.open(base / "plain-car.jpg").save(root / "car.jpg", exif=exif,
                                            xmp=xmp_packet("Parking", keywords=("car", "street"), rating=4))
    make_photo(root / "plain.jpg", seed=3)
    (root / "note.txt").write_text("a note about lunch\n")
    embedder = Embedder.from_pretrained(str(tiny_vl_dir(base.parent)), device="cpu",
                                        batching=BatchingConfig(batch_tokens=1 << 16))
    Retriever(embedder, collection=base / "col", r_max=0.0, ocr=True).index([root])
    export(base / "col", f"parquet:{base / 'out.parquet'}")
    export(base / "col", f"lancedb:{base / 'db'}/photos")
    return base


def _by_name(rows) -> dict:
    return {os.path.basename(row["uri"]): row for row in rows}


def test_parquet_export_has_the_facts_as_typed_columns_and_the_ocr_text(photo_export):
    from datetime import datetime, timezone

    table = pq.read_table(photo_export / "out.parquet")
    types = {name: table.schema.field(name).type for name in ("taken", "lat", "lon", "alt", "camera", "place",
                                                             "keywords", "rating", "width", "taken_offset_min")}
    assert types == {"taken": pa.timestamp("us", tz="UTC"), "lat": pa.float64(), "lon": pa.float64(),
                     "alt": pa.float64(), "camera": pa.string(), "place": pa.string(),
                     "keywords": pa.list_(pa.string()), "rating": pa.int32(), "width": pa.int32(),
                     "taken_offset_min": pa.int32()}
    rows = _by_name(table.drop(["vector"]).to_pylist())
    car = rows["car.jpg"]
    assert car["taken"] == datetime(2024, 5, 1, 13, 3, tzinfo=timezone.utc) and car["taken_offset_min"] == 60
    assert (car["camera"], car["keywords"], car["rating"], car["title"]) == ("Google Pixel 8", ["car", "street"], 4,
                                                                             "Parking")
    assert car["lat"] == pytest.approx(38.7223, abs=1e-4) and car["lon"] == pytest.approx(-9.1393, abs=1e-4)
    assert car["place"].endswith("Lisbon, Portugal") and car["taken_source"] == "exif"
    assert "RE16 TGK" in car["text"]  # the text OCR read in the photo
    plain = rows["plain.jpg"]
    assert plain["taken"] is None and plain["camera"] is None and plain["width"] == 64
    assert rows["note.txt"]["text"].startswith("a note about lunch")


def test_lancedb_export_filters_on_the_typed_facts(photo_export):
    import lancedb

    table = lancedb.connect(str(photo_export / "db")).open_table("photos")
    where = ("rating >= 4 AND array_has(keywords, 'car') AND lat > 38 AND camera LIKE '%Pixel%' "
             "AND taken >= timestamp '2024-05-01 00:00:00' AND taken < timestamp '2024-05-02 00:00:00'")
    found = table.search().where(where).to_arrow().to_pylist()
    assert [os.path.basename(row["uri"]) for row in found] == ["car.jpg"]
    assert "RE16 TGK" in found[0]["text"]
