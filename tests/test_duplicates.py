"""Duplicates (faste_mm/retrieval/library/duplicates.py): the range-search groups against a brute-force numpy
reference on controlled vectors, for several index kinds; exact copies found by content hash on real
files (a copy, a resized and a re-encoded JPEG, a crop); the keeper rule; bad thresholds."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from faste_mm.errors import ConfigError
from faste_mm.indexers import Collection, ItemRecord, Manifest, content_hash
from faste_mm.retrieval.library.duplicates import connected_components, find_duplicates

DIM = 16


def _clustered_vectors(seed: int, n_clusters: int = 12, n_single: int = 40) -> np.ndarray:
    """Unit vectors: clusters of 2-5 near copies (small noise around a centre) among singletons."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_clusters):
        centre = rng.normal(size=DIM)
        for _ in range(rng.integers(2, 6)):
            rows.append(centre + rng.normal(scale=0.08, size=DIM))
    rows += list(rng.normal(size=(n_single, DIM)))
    x = np.array(rows, dtype=np.float32)
    x = x[rng.permutation(len(x))]
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _reference_groups(x: np.ndarray, threshold: float) -> set[frozenset[int]]:
    """Brute force: every pair by a full Gram matrix, components by a plain graph walk."""
    sims = x @ x.T
    n = len(x)
    seen, groups = set(), set()
    for start in range(n):
        if start in seen:
            continue
        stack, members = [start], set()
        while stack:
            i = stack.pop()
            if i in members:
                continue
            members.add(i)
            stack.extend(int(j) for j in np.flatnonzero(sims[i] >= threshold) if j not in members)
        seen |= members
        if len(members) > 1:
            groups.add(frozenset(members))
    return groups


def _collection(tmp_path, x: np.ndarray, vectors: str = "float32", index_type: str = "Flat") -> Collection:
    manifest = Manifest(model_id="m", dim=DIM, vectors=vectors, index_type=index_type)
    col = Collection.create(tmp_path / "c", manifest)
    records = [ItemRecord(uri=f"/photos/{i:04d}.jpg", modality="image", mtime=1000.0 + i) for i in range(len(x))]
    for start in range(0, len(x), 25):  # several parts, as an index run makes
        col.add(x[start:start + 25], records[start:start + 25])
    return col


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("vectors,index_type", [("float32", "Flat"), ("float32", "IVF4,Flat"), ("float32", "SQ8"),
                                                ("binary", "BFlat")])
def test_near_duplicate_groups_equal_the_brute_force_reference(tmp_path, seed, vectors, index_type):
    x = _clustered_vectors(seed)
    threshold = 0.9
    with _collection(tmp_path, x, vectors, index_type) as col:
        id_of_row = {r.uri: r.id for r in col.get(range(len(x)))}
        report = find_duplicates(col, threshold)
    got = {frozenset(int(item.uri[8:12]) for item in group.items) for group in report.groups}
    assert got == _reference_groups(x, threshold)
    assert report.n_items == len(x) and len(id_of_row) == len(x)
    sizes = [len(g.items) for g in report.groups]
    assert sizes == sorted(sizes, reverse=True)
    for group in report.groups:
        for item in group.items[1:]:  # each member's score is a real cosine >= the threshold to some member
            assert item.score >= threshold - 1e-6


def test_tombstoned_items_are_never_reported(tmp_path):
    x = _clustered_vectors(3)
    with _collection(tmp_path, x) as col:
        before = find_duplicates(col, 0.9)
        gone = [item.id for item in before.groups[0].items[1:]]
        col.delete(gone)
        after = find_duplicates(col, 0.9)
    reported = {item.id for group in after.groups for item in group.items}
    assert not reported & set(gone)


def test_connected_components_join_chains_and_leave_singletons():
    labels = connected_components(7, np.array([5, 1, 3]), np.array([6, 2, 1]))
    assert labels.tolist() == [0, 1, 1, 1, 4, 5, 5]


def _photo(path, size=(640, 480), seed=0, quality=95):
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)  # smooth blocks: survives resizing
    Image.fromarray(base).resize(size, Image.BILINEAR).save(path, quality=quality)
    return path


def test_exact_copies_of_real_files_are_grouped_by_content_hash_with_the_largest_as_keeper(tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    original = _photo(photos / "IMG_0001.jpg")
    shutil.copy(original, photos / "IMG_0001 (copy).jpg")
    with Image.open(original) as image:
        image.resize((320, 240)).save(photos / "IMG_0001_small.jpg", quality=90)  # resized
        image.save(photos / "IMG_0001_q60.jpg", quality=60)  # re-encoded
        image.crop((10, 10, 630, 470)).save(photos / "IMG_0001_crop.jpg", quality=95)  # cropped
    other = _photo(photos / "IMG_0002.jpg", seed=5)
    files = sorted(photos.iterdir())
    rng = np.random.default_rng(0)
    # controlled vectors: the copies of IMG_0001 close together, IMG_0002 far (a tiny random model's
    # vectors say nothing about visual similarity, so the vector path is tested with these)
    centre = rng.normal(size=DIM)
    rows = [rng.normal(size=DIM) if f == other else centre + rng.normal(scale=0.02, size=DIM) for f in files]
    x = np.array(rows, dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    os.utime(photos / "IMG_0001 (copy).jpg", (1000, 1000))  # the oldest: wins among equal sizes
    records = [ItemRecord(uri=str(f), modality="image", mtime=f.stat().st_mtime, content_hash=content_hash(f))
               for f in files]
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=DIM)) as col:
        col.add(x, records)
        exact = find_duplicates(col, 1.0, near=False)
        near = find_duplicates(col, 0.95)
    assert [(g.kind, sorted(i.uri for i in g.items)) for g in exact.groups] == [
        ("exact", sorted([str(photos / "IMG_0001 (copy).jpg"), str(original)]))]
    # exact copies are equal in size: the earlier date keeps
    assert exact.groups[0].keeper.uri == str(photos / "IMG_0001 (copy).jpg")
    assert exact.groups[0].keeper.date_source == "mtime"
    [group] = near.groups
    assert group.kind == "near" and len(group.items) == 5 and other not in {i.uri for i in group.items}
    assert (group.keeper.width, group.keeper.height) == (640, 480)
    assert group.keeper.uri == str(photos / "IMG_0001 (copy).jpg")  # 640x480, oldest
    by_uri = {i.uri: i for i in group.items}
    assert (by_uri[str(photos / "IMG_0001_small.jpg")].width, by_uri[str(photos / "IMG_0001_small.jpg")].height) == (320, 240)
    assert by_uri[str(original)].score == 1.0  # an exact copy of the keeper
    # the byte-identical pair is labelled exact inside the near group, the others near
    assert {Path(u).name: i.match for u, i in by_uri.items()} == {
        "IMG_0001.jpg": "exact", "IMG_0001 (copy).jpg": "exact", "IMG_0001_small.jpg": "near",
        "IMG_0001_q60.jpg": "near", "IMG_0001_crop.jpg": "near"}
    assert all(f.exists() for f in files)  # never deletes
    payload = json.loads(json.dumps(near.to_dict()))
    assert payload["n_groups"] == 1 and payload["n_redundant"] == 4
    assert payload["groups"][0]["keeper_reason"].startswith("earliest file date (mtime; no date taken) (1970-01-01")
    assert exact.to_dict()["groups"][0]["items"][1]["match"] == "exact"


@pytest.mark.parametrize("uri, spare", [
    ("/p/backup/zebras.jpg", True), ("/p/Backups/2023/zebras.jpg", True), ("/p/Photos (copy)/z.jpg", True),
    ("/p/Copies/z.jpg", True), ("/p/duplicates_old/z.jpg", True), ("/p/BAK/z.jpg", True),
    ("/p/photos/zebras.jpg", False), ("/p/photos/backup.jpg", False), ("/p/copyright/z.jpg", False),
    ("/p/Old Town/z.jpg", False),
])
def test_spare_folders_are_named_like_a_backup_copy_or_duplicates(uri, spare):
    from faste_mm.retrieval.library.duplicates import is_in_spare_folder

    assert is_in_spare_folder(uri) is spare


def test_the_keeper_of_an_identical_pair_is_the_copy_outside_a_backup_folder_and_says_why(tmp_path):
    photos, backup = tmp_path / "my photos", tmp_path / "backup"
    photos.mkdir(), backup.mkdir()
    original = _photo(photos / "zebras.jpg")
    shutil.copy(original, backup / "zebras.jpg")  # the shorter path: kept before, by path length
    with Image.open(original) as image:
        for i in range(4):  # a larger group of near copies, all smaller than the pair
            image.resize((320 - 20 * i, 240 - 15 * i)).save(photos / f"zebras_{i}.jpg", quality=85)
    files = sorted(p for p in tmp_path.rglob("*.jpg"))
    assert len(str(backup / "zebras.jpg")) < len(str(original))
    rng = np.random.default_rng(0)
    centre = rng.normal(size=DIM)
    x = np.array([centre + rng.normal(scale=0.02, size=DIM) for _ in files], dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    for f in files:
        os.utime(f, (5000, 5000))  # one mtime: nothing but the folder tells the pair apart
    records = [ItemRecord(uri=str(f), modality="image", mtime=f.stat().st_mtime, content_hash=content_hash(f))
               for f in files]
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=DIM)) as col:
        col.add(x, records)
        [group] = find_duplicates(col, 0.95).groups
        [pair] = find_duplicates(col, 1.0, near=False).groups
    assert group.kind == "near" and len(group.items) == 6
    assert group.keeper.uri == str(original) and pair.keeper.uri == str(original)
    matches = {i.uri: i.match for i in group.items}
    assert matches[str(original)] == matches[str(backup / "zebras.jpg")] == "exact"
    assert sorted(matches.values()) == ["exact"] * 2 + ["near"] * 4
    assert pair.keeper_reason == f"not in a backup, copy or duplicates folder (unlike {backup / 'zebras.jpg'})"
    assert pair.to_dict()["keeper_reason"] == pair.keeper_reason
    assert group.keeper_reason == f"not in a backup, copy or duplicates folder (unlike {backup / 'zebras.jpg'})"


def test_the_keeper_has_the_largest_size_then_the_earliest_date_taken_read_from_exif_before_mtimes(tmp_path):
    from datetime import datetime, timezone

    from faste_mm.retrieval.library.photo_metadata import read_facts
    from tests.helpers.photo_fixtures import exif_block, make_photo

    photos = tmp_path / "photos"
    photos.mkdir()
    files = {  # name: (pixel size, EXIF date taken, mtime)
        "IMG_2015.jpg": ((64, 48), "2015:06:01 10:00:00", datetime(2024, 1, 1)),  # copied off a phone in 2024
        "export.jpg": ((64, 48), None, datetime(2020, 1, 1)),  # no date in the file: its mtime stands in
        "big.jpg": ((128, 96), "2019:01:01 09:00:00", datetime(2019, 1, 2)),
        "small_old.jpg": ((64, 48), "2012:01:01 09:00:00", datetime(2012, 1, 2)),
    }
    records = []
    for name, (size, taken, mtime) in files.items():
        path = make_photo(photos / name, seed=1, size=size, exif=exif_block(taken, "+00:00") if taken else None)
        os.utime(path, (mtime.timestamp(), mtime.timestamp()))
        stamp = path.stat().st_mtime
        records.append(ItemRecord(uri=str(path), modality="image", mtime=stamp, facts=read_facts(path, "image")))
    rng = np.random.default_rng(0)
    groups = [0, 0, 1, 1]  # the first two files one photo, the last two another
    x = np.eye(DIM, dtype=np.float32)[groups] + rng.normal(scale=0.01, size=(4, DIM)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=DIM)) as col:
        col.add(x, records)
        report = find_duplicates(col, 0.95)
    keepers = {Path(g.keeper.uri).name: g for g in report.groups}
    assert set(keepers) == {"IMG_2015.jpg", "big.jpg"}  # mtimes alone would keep export.jpg and small_old.jpg
    first = keepers["IMG_2015.jpg"]
    assert first.keeper.date == datetime(2015, 6, 1, 10, tzinfo=timezone.utc).timestamp()
    assert first.keeper.date_source == "exif" and first.items[1].date_source == "mtime"
    assert (keepers["big.jpg"].keeper.width, keepers["big.jpg"].keeper.height) == (128, 96)


def test_pages_of_one_file_alone_are_not_a_group(tmp_path):
    x = np.tile(np.eye(DIM, dtype=np.float32)[:1], (2, 1))
    records = [ItemRecord(uri="/docs/a.pdf", modality="page", page=p) for p in (1, 2)]
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=DIM)) as col:
        col.add(x, records)
        assert find_duplicates(col, 0.9).groups == ()


@pytest.mark.parametrize("threshold", [0, -0.5, 1.5, float("nan"), "high", True])
def test_a_bad_threshold_is_a_config_error_naming_the_value(tmp_path, threshold):
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=DIM)) as col:
        with pytest.raises(ConfigError, match="threshold"):
            find_duplicates(col, threshold)


def test_a_member_replaced_by_a_link_since_indexing_is_not_opened_for_its_size(tmp_path):
    # the keeper's pixel size is read from the file at request time (/duplicates): only while it is
    # the file indexed (retrieval.stored_files), never through a link planted since
    from PIL import Image

    from faste_mm.indexers import ItemRecord
    from faste_mm.retrieval.library.duplicates import _image_size

    Image.new("RGB", (40, 30)).save(tmp_path / "private.png")
    (tmp_path / "shared").mkdir()
    Image.new("RGB", (20, 10)).save(tmp_path / "shared" / "own.png")
    (tmp_path / "shared" / "planted.png").symlink_to(tmp_path / "private.png")
    assert _image_size(ItemRecord(uri=str(tmp_path / "shared" / "own.png"), modality="image")) == (20, 10)
    assert _image_size(ItemRecord(uri=str(tmp_path / "shared" / "planted.png"), modality="image")) == (None, None)
