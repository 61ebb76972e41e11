"""Every public function that takes a path takes `str | os.PathLike`: a str, a Path, or any other
os.PathLike (issue 22: a Path once crashed `Embedder.from_pretrained`). Model-free: collections
of seeded random vectors."""

from __future__ import annotations

import os

import numpy as np
import pytest

from faste_mm.indexers import Collection, ItemRecord, Manifest
from faste_mm.retrieval.maintenance import compact, rebuild_index, remove_items
from faste_mm.retrieval.scanning import scan_paths


class _Location(os.PathLike):
    """An os.PathLike that is neither a str nor a Path (str() of it is not the path)."""

    def __init__(self, path) -> None:
        self._path = os.fspath(path)

    def __fspath__(self) -> str:
        return self._path

    def __repr__(self) -> str:
        return "<a location>"


@pytest.mark.parametrize("kind", [str, _Location])
def test_collections_and_their_maintenance_take_any_path_like(tmp_path, kind):
    files = tmp_path / "files"
    files.mkdir()
    (files / "a.txt").write_text("a")
    root = kind(tmp_path / "col")
    vectors = np.eye(4, dtype=np.float32)[:2]
    with Collection.create(root, Manifest(model_id="m", dim=4)) as col:
        col.add(vectors, [ItemRecord(uri=str(files / "a.txt"), modality="text"),
                          ItemRecord(uri=str(files / "b.txt"), modality="text")])
    with Collection.open(root) as col:
        assert col.info().n_ok == 2
    report = remove_items(root, [kind(files / "a.txt")])
    assert report.uris == (str(files / "a.txt"),) and report.unmatched == ()
    assert compact(root) == 1 and rebuild_index(root)
    assert [f.uri for f in scan_paths([kind(files)]).files()] == [str((files / "a.txt").resolve())]
