"""Albums (faste_mm/retrieval/library/albums.py, indexers/albums.py): saved searches kept current by
every index run and watch poll, each checked after every step against a fresh `Retriever.search` of
its query (a flat index: exact) with k = its limit; a writer killed at the named step inside a
refresh keeps the last refresh whole and the next run completes it; export to a folder (copies)
and to an .m3u playlist; bad input answered with errors naming the album."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from faste_mm import BatchingConfig, Embedder, Retriever
from faste_mm.errors import ConfigError, InputError
from faste_mm.indexers import Collection
from faste_mm.indexers.crash_points import CRASH_ENV
from faste_mm.indexers.facts import ItemFacts
from faste_mm.retrieval.library import albums as album_library
from faste_mm.retrieval.library.albums import Albums
from faste_mm.retrieval.library.watching import FolderWatcher, WatchOptions
from tests.helpers.cli import invoke
from tests.helpers.inputs import tiny_vl_dir
from tests.helpers.serve_fixtures import scene_image
from tests.helpers.warm_process import run_cli


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_vl_dir(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def embedder(model_dir) -> Embedder:
    return Embedder.from_pretrained(str(model_dir), device="cpu", batching=BatchingConfig(batch_tokens=1 << 16))


@pytest.fixture
def library(embedder, tmp_path):
    """A folder of beach and city pictures and a note, indexed into a flat collection."""
    photos = tmp_path / "photos"
    (photos / "beach").mkdir(parents=True)
    (photos / "city").mkdir()
    for i in range(4):
        scene_image(photos / "beach" / f"b{i}.png", i)
    for i in range(3):
        scene_image(photos / "city" / f"c{i}.png", 10 + i)
    (photos / "note.txt").write_text("waves and sand at the seaside\n", encoding="utf-8")
    retriever = Retriever(embedder, collection=tmp_path / "col", r_max=0.5)
    retriever.index([photos])
    return photos, retriever


def _fresh(retriever: Retriever, album) -> list[tuple[int, float]]:
    options = {key: value for key, value in album.options.items()}
    hits = retriever.search(album.query, k=album.limit, min_score=album.min_score, rerank=False, **options)
    return [(h.id, h.score) for h in hits]


def _check_all_equal_fresh(retriever: Retriever) -> dict[str, list[int]]:
    """Every album equals a fresh search of its query; returns each album's member ids."""
    members = {}
    for listed in retriever.albums().list():
        album = retriever.albums().show(listed.name)
        assert album.unscored == 0
        got = [(h.id, h.score) for h in album.hits]
        want = _fresh(retriever, album)
        assert [i for i, _ in got] == [i for i, _ in want], album.name
        np.testing.assert_allclose([s for _, s in got], [s for _, s in want], atol=1e-5)
        members[album.name] = [i for i, _ in got]
    return members


def _threshold(retriever: Retriever, query: str) -> float:
    """A minimum score between the collection's scores for `query` (some items pass, some do not)."""
    scores = sorted(h.score for h in retriever.search(query, k=50, rerank=False))
    return float((scores[len(scores) // 2 - 1] + scores[len(scores) // 2]) / 2)


def _changes(report) -> dict[str, tuple[set, set]]:
    return {c.name: (set(c.added), set(c.removed)) for c in report.albums}


def _diff(before: dict[str, list[int]], after: dict[str, list[int]]) -> dict[str, tuple[set, set]]:
    return {name: (set(after[name]) - set(before[name]), set(before[name]) - set(after[name])) for name in after
            if set(after[name]) != set(before[name])}


def test_an_album_equals_a_fresh_search_after_every_index_and_watch_step(library):
    photos, retriever = library
    albums = retriever.albums()
    made = albums.add("all", "waves on the sand", limit=3)
    assert [h.id for h in made.hits] == [i for i, _ in _fresh(retriever, made)]
    albums.add("beach", "waves on the sand", limit=2, path="*/beach/*")
    albums.add("strict", "a street at night", limit=10, min_score=_threshold(retriever, "a street at night"))
    albums.add("pictures", "the seaside", limit=4, type="image")
    members = _check_all_equal_fresh(retriever)

    # new files, in and out of the beach folder; a note no picture album may take
    for i in range(4, 8):
        scene_image(photos / "beach" / f"b{i}.png", i)
    scene_image(photos / "city" / "c9.png", 99)
    (photos / "more.txt").write_text("sand, sea and waves\n", encoding="utf-8")
    report = retriever.index([photos])
    after = _check_all_equal_fresh(retriever)
    assert _changes(report) == _diff(members, after)
    with Collection.open(retriever.collection) as col:
        newest_member = max(max(m) for m in members.values())
        new_ids = {r.id for r in col.read(lambda rows: rows.live_records_after(newest_member, 1 << 20))}
    assert all(set(ids) - new_ids <= set(members[name]) for name, ids in after.items())  # nothing old entered

    # a member changed (a new id, the old one gone) and one deleted: the next best enter
    changed = next(Path(h.uri) for h in albums.show("beach").hits)
    scene_image(changed, 123)
    gone = Path(albums.show("all").hits[0].uri)
    gone.unlink()
    report = retriever.index([photos])
    members, after = after, _check_all_equal_fresh(retriever)
    assert _changes(report) == _diff(members, after) and _changes(report)

    # a watch poll: a file added, a member removed
    watcher = FolderWatcher(retriever, [photos], WatchOptions(settle_polls=1))
    scene_image(photos / "beach" / "late.png", 77)
    Path(albums.show("pictures").hits[-1].uri).unlink()
    sync = watcher.sync_once()
    assert sync.index is not None and sync.index.embedded == 1
    members, after = after, _check_all_equal_fresh(retriever)
    assert _changes(sync.index) == _diff(members, after)
    assert all(c.summary == f"album {c.name!r}: +{len(c.added)}, -{len(c.removed)}" for c in sync.index.albums)


def test_a_refresh_killed_before_its_commit_is_redone_by_the_next_run(library, model_dir):
    photos, retriever = library
    albums = retriever.albums()
    albums.add("all", "waves on the sand", limit=5)
    albums.add("city", "a street at night", limit=2, path="*/city/*")
    before = {a.name: [h.id for h in albums.show(a.name).hits] for a in albums.list()}
    for i in range(4, 7):
        scene_image(photos / "city" / f"c{i}.png", 40 + i)
    index = ["index", str(photos), "-c", str(retriever.collection), "--model", str(model_dir), "--device", "cpu"]
    killed = run_cli(index, env={**os.environ, CRASH_ENV: "album-refresh-before-commit"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    # the items were committed; the albums still hold the last refresh and know what they have not scored
    for name, ids in before.items():
        album = albums.show(name)
        assert [h.id for h in album.hits] == ids and album.unscored == 3
    done = invoke(*index)
    assert "album 'city': +" in done.stderr
    _check_all_equal_fresh(retriever)


def test_album_refresh_scores_items_added_without_an_index_run(library, embedder):
    photos, retriever = library
    albums = retriever.albums()
    albums.add("all", "waves on the sand", limit=20)  # more than the items: every new one enters
    retriever.add(["waves on the sand"], uris=["item:the-query-itself"])
    assert albums.show("all").unscored == 1
    changes = Albums(retriever.collection).refresh()  # no model needed
    assert [c.name for c in changes] == ["all"] and len(changes[0].added) == 1
    _check_all_equal_fresh(retriever)


def test_an_album_follows_words_and_facts_changed_in_place(library):
    """OCR text added later and facts filled or changed by a re-scan keep the item's id and vector:
    the albums whose filter reads them check those items again at the next refresh."""
    photos, retriever = library
    albums = retriever.albums()
    albums.add("portugal", "waves on the sand", limit=10, where="country=Portugal")
    albums.add("harbour", '"harbour lights" at night', limit=10)  # a quoted phrase: the item's words
    assert _check_all_equal_fresh(retriever) == {"harbour": [], "portugal": []}
    with Collection.open(retriever.collection, writable=True) as col:
        first, second = col.read(lambda rows: rows.live_records_after(-1, 2))
        col.set_facts([(first, ItemFacts(country="Portugal", city="Lisbon"))])  # as a re-scan fills them
        col.set_texts([(second.id, "the harbour lights at night")])  # as `index --ocr` adds a picture's text
    changes = Albums(retriever.collection).refresh()
    assert {c.name: (c.added, c.removed) for c in changes} == {"portugal": ((first.id,), ()),
                                                                "harbour": ((second.id,), ())}
    _check_all_equal_fresh(retriever)
    with Collection.open(retriever.collection, writable=True) as col:
        col.set_facts([(first, ItemFacts(country="Spain", city="Madrid"))])
    changes = Albums(retriever.collection).refresh()
    assert {c.name: (c.added, c.removed) for c in changes} == {"portugal": ((), (first.id,))}
    assert _check_all_equal_fresh(retriever) == {"harbour": [second.id], "portugal": []}


def test_an_album_is_exported_as_copies_and_as_a_playlist(library, tmp_path):
    photos, retriever = library
    albums = retriever.albums()
    albums.add("beach", "waves on the sand", limit=3, path="*/beach/*")
    hits = albums.show("beach").hits
    out = tmp_path / "out"
    report = albums.export("beach", out)
    assert report.files == tuple(Path(h.uri).name for h in hits)
    for hit in hits:
        copy = out / Path(hit.uri).name
        assert copy.is_file() and not copy.is_symlink() and copy.read_bytes() == Path(hit.uri).read_bytes()
    # the album changes: exported again into the same folder, the file that left is removed, others untouched
    (out / "mine.txt").write_text("the user's own file\n")
    Path(hits[0].uri).unlink()
    retriever.index([photos])
    again = albums.export("beach", out)
    assert Path(hits[0].uri).name in again.removed and (out / "mine.txt").exists()
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == \
        sorted([*again.files, "mine.txt"])
    playlist = albums.export("beach", tmp_path / "beach.m3u")
    lines = (tmp_path / "beach.m3u").read_text().splitlines()
    assert lines[0] == "#EXTM3U" and [ln for ln in lines if not ln.startswith("#")] == \
        [h.uri for h in albums.show("beach").hits] == list(playlist.files)
    # a folder holding other files, or another album's export, is refused untouched
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "x.jpg").write_bytes(b"x")
    with pytest.raises(InputError, match="holds other files"):
        albums.export("beach", foreign)
    albums.add("city", "a street at night", limit=2, path="*/city/*")
    with pytest.raises(InputError, match="holds an export of album 'beach'"):
        albums.export("city", out)


def test_bad_album_input_gets_errors_naming_it(library):
    photos, retriever = library
    albums = retriever.albums()
    albums.add("beach", "waves on the sand", limit=2)
    with pytest.raises(InputError, match="no album 'nope'; the albums are beach"):
        albums.show("nope")
    with pytest.raises(InputError, match="no album 'nope'"):
        albums.remove("nope")
    with pytest.raises(InputError, match="album 'beach' exists already"):
        albums.add("beach", "anything")
    for bad in ("bad name", "", "-x", "a/b", "x" * 65):
        with pytest.raises(InputError, match="album name"):
            albums.add(bad, "waves")
    with pytest.raises(InputError, match="album 'empty': the query is empty"):
        albums.add("empty", "   ")
    with pytest.raises(ConfigError, match="mode cannot be kept in an album"):
        albums.add("words", "waves", mode="lexical")
    with pytest.raises(ConfigError, match="rerank cannot be kept"):
        albums.add("reranked", "waves", rerank=True)
    with pytest.raises(ConfigError, match="album limit must be an integer"):
        albums.add("zero", "waves", limit=0)
    with pytest.raises(ConfigError, match="min_score 2"):
        albums.add("high", "waves", min_score=2)
    with pytest.raises(InputError, match="only filters were read"):
        albums.add("dates", "photos from 2023")
    with pytest.raises(ConfigError, match="use Retriever.albums"):
        Albums(retriever.collection).add("nomodel", "waves")
    assert [a.name for a in albums.list()] == ["beach"]  # nothing else was made
    failed = invoke("album", "show", "nope", "-c", retriever.collection, code=1)
    assert "no album 'nope'" in failed.stderr and "Traceback" not in failed.stderr
    assert "album name 'a b'" in invoke("album", "remove", "a b", "-c", retriever.collection, code=1).stderr


def test_album_commands_show_list_and_remove(library):
    photos, retriever = library
    retriever.albums().add("beach", "waves on the sand", limit=2)
    shown = invoke("album", "show", "beach", "-c", retriever.collection, "--format", "paths")
    assert shown.stdout.split() == [h.uri for h in retriever.albums().show("beach").hits]
    assert "beach" in invoke("album", "list", "-c", retriever.collection).stdout
    invoke("album", "remove", "beach", "-c", retriever.collection)
    assert retriever.albums().list() == []
    db = sqlite3.connect(Path(retriever.collection) / "meta.sqlite")
    assert db.execute("SELECT count(*) FROM album_scores").fetchone()[0] == 0


def test_the_command_line_and_the_library_agree_on_album_options():
    from faste_mm.cli import album_command

    assert album_command.ALBUM_FLAGS == album_library.ALBUM_OPTIONS
    assert album_command.DEFAULT_LIMIT == album_library.DEFAULT_LIMIT
