"""Index-time reads of stored files (the OCR pass, the lexical backfill of `rebuild-index`) read the
indexed file through `retrieval.stored_files`, as request-time reads do: a writer of the folder who
swaps an indexed file for a link to another file of the same size and mtime gets nothing of that
file into the lexical index. Before, both reopened the path (following the link) after a size and
mtime check the planted twin passed."""

from __future__ import annotations

import os

import numpy as np
from PIL import Image

from faste_mm.indexers import Collection, Manifest
from faste_mm.indexers.records import FileStat, ItemRecord
from faste_mm.retrieval.maintenance import backfill_texts
from faste_mm.retrieval.library.ocr import read_item_image


def _record(path, modality: str, **fields) -> ItemRecord:
    st = FileStat.of(path)
    return ItemRecord(uri=str(path), modality=modality, size=st.size, mtime=st.mtime, dev=st.dev, ino=st.ino,
                      **fields)


def _plant_twin_link(path, twin) -> None:
    """`path` becomes a link to `twin`, a file of the same size given `path`'s mtime."""
    assert os.path.getsize(twin) == os.path.getsize(path)
    mtime = os.stat(path).st_mtime_ns
    os.utime(twin, ns=(mtime, mtime))
    os.remove(path)
    os.symlink(twin, path)


def test_ocr_reads_the_indexed_image_never_a_same_sized_twin_linked_over_it(tmp_path):
    folder, outside = tmp_path / "photos", tmp_path / "private"
    folder.mkdir(), outside.mkdir()
    photo, secret = folder / "scan.bmp", outside / "secret.bmp"
    Image.new("RGB", (40, 30), "white").save(photo)  # BMP: the same dimensions, the same byte size
    Image.new("RGB", (40, 30), "black").save(secret)
    record = _record(photo, "image")
    assert read_item_image(record).getpixel((0, 0)) == (255, 255, 255)  # the indexed file is read
    _plant_twin_link(photo, secret)
    assert read_item_image(record) is None  # not the indexed file: left to the next index run


def test_rebuild_index_backfills_text_from_the_indexed_files_only(tmp_path):
    folder, outside = tmp_path / "notes", tmp_path / "private"
    folder.mkdir(), outside.mkdir()
    kept, swapped, secret = folder / "kept.txt", folder / "swapped.txt", outside / "secret.txt"
    kept.write_text("kept words")
    swapped.write_text("plain words")
    secret.write_text("API_KEY=xyz")  # the same 11 bytes as "plain words"
    root = tmp_path / "c"
    vectors = np.eye(2, 8, dtype=np.float32)
    with Collection.create(root, Manifest(model_id="m", dim=8)) as col:  # stored without text
        col.add(vectors, [_record(kept, "text"), _record(swapped, "text")])
    _plant_twin_link(swapped, secret)
    with Collection.open(root, writable=True) as col:
        assert backfill_texts(col) == 1
        found = [int(i) for i in col.find(2, texts=["xyz"], mode="lexical").ids[0] if i >= 0]
        assert found == [] and [r.id for r in col.read(lambda rows: rows.items_without_text())] == [1]
        assert [int(i) for i in col.find(2, texts=["kept"], mode="lexical").ids[0] if i >= 0] == [0]
