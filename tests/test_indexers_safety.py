"""A collection never writes or deletes outside itself, recognises its own leftovers, and turns
damage into CollectionErrors that say what to do (never an erase, never a raw traceback)."""

from __future__ import annotations

import os
import shutil
import stat
import textwrap

import numpy as np
import pytest

from faste_mm.errors import CollectionError
from faste_mm.indexers import Collection, ItemRecord, Manifest
from faste_mm.indexers.crash_points import CRASH_ENV
from tests.helpers.warm_process import run_python

D = 8
MANIFEST = Manifest(model_id="m", dim=D)


def _vectors(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, D)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _filled(root, n: int = 6) -> np.ndarray:
    v = _vectors(n)
    with Collection.create(root, MANIFEST) as col:
        col.add(v, [ItemRecord(uri=f"u{i}", modality="text") for i in range(n)])
    return v


def _crash(step: str, script: str, *args) -> None:
    """`python -c SCRIPT ARGS` in a process of its own, forked from a warm one (the library and
    torch imported: tests/helpers/warm_process.py), SIGKILLed at the crash point `step`."""
    proc = run_python(textwrap.dedent(script), list(args), env={**os.environ, CRASH_ENV: step})
    assert proc.returncode == -9, proc.stderr  # SIGKILLed at the named step


def test_create_killed_before_the_manifest_rename_is_completed_by_the_next_create(tmp_path):
    root = tmp_path / "c"
    _crash("create-before-manifest", """
        import sys
        from faste_mm.indexers import Collection, Manifest
        Collection.create(sys.argv[1], Manifest(model_id="m", dim=8))
    """, root)
    assert (root / "manifest.json.tmp").exists() and not (root / "manifest.json").exists()
    with Collection.create(root, MANIFEST) as col:
        col.add(_vectors(2), [ItemRecord(uri="a", modality="text"), ItemRecord(uri="b", modality="text")])
    assert not list(root.glob("*.tmp"))
    with Collection.open(root) as col:
        assert col.info().n_ok == 2


def test_erase_killed_midway_is_finished_by_the_next_create(tmp_path):
    root = tmp_path / "c"
    _filled(root)
    _crash("erase-after-marker", """
        import sys
        from faste_mm.indexers import Collection
        Collection.erase(sys.argv[1], for_create=True)
    """, root)
    assert not (root / "manifest.json").exists() and list((root / "vectors").iterdir())
    with pytest.raises(CollectionError, match="not a faste-mm collection"):
        Collection.open(root)  # no reader takes a half-erased folder for a collection
    with Collection.create(root, MANIFEST) as col:
        assert col.info().n_ok == 0
    assert [p.name for p in (root / "vectors").iterdir()] == []


def test_a_collection_that_lost_its_database_is_refused_and_kept(tmp_path):
    root = tmp_path / "c"
    _filled(root)
    (root / "meta.sqlite").unlink()
    before = sorted(p.name for p in (root / "vectors").iterdir())
    for writable in (False, True):
        with pytest.raises(CollectionError, match="meta.sqlite is missing.*nothing was changed"):
            Collection.open(root, writable=writable)
    assert sorted(p.name for p in (root / "vectors").iterdir()) == before  # no vector swept
    (root / "manifest.json").unlink()  # and without its manifest it is still not erased by create
    with pytest.raises(CollectionError, match="manifest.json is missing.*vector files"):
        Collection.create(root, MANIFEST)
    assert sorted(p.name for p in (root / "vectors").iterdir()) == before


def test_a_deleted_vectors_folder_is_a_collection_error(tmp_path):
    root = tmp_path / "c"
    _filled(root)
    shutil.rmtree(root / "vectors")
    with pytest.raises(CollectionError, match="vectors folder is missing"):
        Collection.open(root, writable=True)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_database_is_a_collection_error_for_readers_and_writers(tmp_path, damage):
    root = tmp_path / "c"
    _filled(root, n=400)
    db = root / "meta.sqlite"
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 3] if damage == "truncated" else os.urandom(len(data)))
    for writable in (False, True):
        with pytest.raises(CollectionError, match="meta.sqlite"):
            with Collection.open(root, writable=writable) as col:
                col.info()
                col.search(_vectors(1), k=3)


def test_a_symlinked_lock_is_never_written_through(tmp_path):
    root, victim = tmp_path / "c", tmp_path / "victim.txt"
    _filled(root)
    victim.write_text("precious")
    (root / "collection.lock").unlink()
    (root / "collection.lock").symlink_to(victim)
    with pytest.raises(CollectionError, match="symbolic link"):
        Collection.open(root, writable=True)
    assert victim.read_text() == "precious"


def test_a_lock_that_is_a_directory_is_a_collection_error(tmp_path):
    root = tmp_path / "c"
    _filled(root)
    (root / "collection.lock").unlink()
    (root / "collection.lock").mkdir()
    with pytest.raises(CollectionError, match="is a directory"):
        Collection.open(root, writable=True)


def test_a_symlinked_vectors_folder_is_refused_and_its_target_untouched(tmp_path):
    root, elsewhere = tmp_path / "c", tmp_path / "elsewhere"
    _filled(root)
    shutil.move(root / "vectors", elsewhere)
    (elsewhere / "part-000099.npy").write_bytes(b"someone else's")  # an 'orphan' by name
    (elsewhere / "notes.tmp").write_bytes(b"someone else's")
    (root / "vectors").symlink_to(elsewhere)
    before = sorted(p.name for p in elsewhere.iterdir())
    with pytest.raises(CollectionError, match="symbolic link"):
        Collection.open(root, writable=True)
    with pytest.raises(CollectionError, match="symbolic link"):
        Collection.erase(root, for_create=True)
    assert sorted(p.name for p in elsewhere.iterdir()) == before


def test_the_orphan_sweep_deletes_only_regular_part_files_it_wrote(tmp_path):
    root, outside = tmp_path / "c", tmp_path / "outside.npy"
    _filled(root)
    outside.write_bytes(b"x")
    (root / "vectors" / "part-000077.npy").symlink_to(outside)  # an orphan name, but a link
    (root / "vectors" / "readme.txt").write_text("mine")
    (root / "vectors" / "part-000078.ids.npy").write_bytes(b"orphan")  # a real orphan
    with Collection.open(root, writable=True):
        pass
    names = sorted(p.name for p in (root / "vectors").iterdir())
    assert "part-000077.npy" in names and "readme.txt" in names and "part-000078.ids.npy" not in names
    assert outside.exists()


def test_a_foreign_index_file_with_the_right_size_is_rebuilt(tmp_path):
    root = tmp_path / "c"
    v = _filled(root)
    with Collection.open(root) as col:
        _, want = col.search(v, k=1)
    assert want[:, 0].tolist() == list(range(len(v)))
    import faiss  # the same vectors under ids shifted by one: same size, wrong answers

    shifted = faiss.IndexIDMap2(faiss.IndexFlatIP(D))
    shifted.add_with_ids(v, np.arange(1, len(v) + 1, dtype=np.int64))
    faiss.write_index(shifted, str(root / "index.faiss"))
    with Collection.open(root) as col:
        scores, found = col.search(v, k=1)
    assert found[:, 0].tolist() == list(range(len(v)))


def test_atomic_rewrites_keep_the_users_file_mode(tmp_path):
    root = tmp_path / "c"
    _filled(root)
    for name in ("manifest.json", "index.faiss"):
        os.chmod(root / name, 0o600)
    with Collection.open(root, writable=True) as col:
        col.add(_vectors(1, seed=5), [ItemRecord(uri="new", modality="text")])  # close rewrites both
    for name in ("manifest.json", "index.faiss"):
        assert stat.S_IMODE(os.stat(root / name).st_mode) == 0o600
    with Collection.open(root, writable=True) as col:
        col.delete([0])
        col.compact()  # new parts follow the manifest's mode
    for path in (root / "vectors").iterdir():
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path.name


def test_a_strangers_tmp_file_is_neither_deleted_nor_taken_for_ours(tmp_path):
    root = tmp_path / "c"
    _filled(root)
    (root / "notes.tmp").write_text("mine")
    (root / "index.faiss.tmp").write_bytes(b"torn")  # ours: a torn index write
    with Collection.open(root, writable=True):
        pass
    assert (root / "notes.tmp").read_text() == "mine" and not (root / "index.faiss.tmp").exists()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "notes.tmp").write_text("mine")
    with pytest.raises(CollectionError, match="not empty and not a collection"):
        Collection.create(fresh, MANIFEST)


def _emptied_database(root, how: str) -> None:
    """Replace meta.sqlite by a database without our schema (the collection keeps its parts)."""
    import sqlite3

    for suffix in ("", "-wal", "-shm"):
        (root / f"meta.sqlite{suffix}").unlink(missing_ok=True)
    if how == "zero-bytes":
        (root / "meta.sqlite").write_bytes(b"")
    else:  # a valid SQLite file, but not ours (a stranger's table, no schema_version)
        db = sqlite3.connect(root / "meta.sqlite")
        db.execute("CREATE TABLE notes (x TEXT)")
        db.commit()
        db.close()


def _files(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "collection.lock"}


@pytest.mark.parametrize("how", ["zero-bytes", "schema-less"])
def test_a_database_without_our_schema_beside_parts_is_damage_and_nothing_is_swept(tmp_path, how):
    from typer.testing import CliRunner

    from faste_mm.cli.app import app

    root = tmp_path / "c"
    _filled(root)
    _emptied_database(root, how)
    before = _files(root)
    for writable in (False, True):
        with pytest.raises(CollectionError, match="meta.sqlite") as caught:
            Collection.open(root, writable=writable)
        message = str(caught.value)
        assert "holds no faste-mm tables" in message and "nothing was changed" in message
        assert "--reindex" not in message and "upgrade" not in message
    for command in (["info", "-c", str(root)], ["compact", "-c", str(root)]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 1 and "holds no faste-mm tables" in result.stderr, result.stderr
        assert "--reindex" not in result.stderr and "Traceback" not in result.stderr
    assert _files(root) == before  # no migration, no sweep: the vectors can still be rescued


def test_a_database_behind_its_manifest_is_damage_and_its_parts_are_kept(tmp_path):
    root = tmp_path / "c"
    _filled(root)
    saved = (root / "meta.sqlite").read_bytes()
    with Collection.open(root, writable=True) as col:  # a later add the old database never saw
        col.add(_vectors(2, seed=3), [ItemRecord(uri="late0", modality="text"), ItemRecord(uri="late1", modality="text")])
    for suffix in ("-wal", "-shm"):
        (root / f"meta.sqlite{suffix}").unlink(missing_ok=True)
    (root / "meta.sqlite").write_bytes(saved)  # an older copy put back: it lists only part 0
    before = _files(root)
    with pytest.raises(CollectionError, match="meta.sqlite.*older than manifest.json.*part 1"):
        Collection.open(root, writable=True)
    assert _files(root) == before


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tests.helpers.inputs import tiny_vl_dir

    return tiny_vl_dir(tmp_path_factory.getbasetemp())


def test_retriever_add_items_survive_an_emptied_database(tmp_path, tiny_model):
    from typer.testing import CliRunner

    from faste_mm import Embedder, Retriever
    from faste_mm.cli.app import app

    vl_embedder = Embedder.from_pretrained(str(tiny_model), device="cpu")
    root, docs = tmp_path / "c", tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("a red bicycle")
    retriever = Retriever(vl_embedder, collection=root, r_max=0.0)
    retriever.add(["a cat on a mat", "a dog in the snow"])
    good = (root / "meta.sqlite").read_bytes()
    _emptied_database(root, "zero-bytes")
    before = _files(root)
    with pytest.raises(CollectionError, match="holds no faste-mm tables"):
        retriever.add(["a third text"])
    result = CliRunner().invoke(app, ["index", str(docs), "-c", str(root), "--model", str(tiny_model),
                                      "--device", "cpu", "--r-max", "0"])
    assert result.exit_code == 1 and "holds no faste-mm tables" in result.stderr, (result.stderr, result.exception)
    assert _files(root) == before
    (root / "meta.sqlite").write_bytes(good)  # the backup the message asks for brings everything back
    with Collection.open(root) as col:
        assert col.info().n_ok == 2
        assert len(col.vectors([0, 1])) == 2


def test_an_open_reader_follows_a_reindex_instead_of_returning_erased_items(tmp_path):
    root = tmp_path / "c"
    old = _filled(root, n=4)
    with Collection.open(root) as reader, Collection.open(root) as other:
        assert reader.get([0])[0].uri == "u0"
        Collection.erase(root, for_create=True)  # what `index --reindex` does, then indexes anew
        new = _vectors(3, seed=9)
        with Collection.create(root, MANIFEST) as col:
            col.add(new, [ItemRecord(uri=f"new{i}", modality="text") for i in range(3)])
        found = reader.find(2, queries=old)
        ids, records = found.ids, found.records
        assert {r.uri for r in records.values()} <= {"new0", "new1", "new2"}  # no erased item comes back
        with Collection.open(root) as fresh:
            want = fresh.search(old, k=2)
        np.testing.assert_array_equal(ids, want[1])
        assert reader.get([0])[0].uri == "new0"  # id 0 names the new file, as a new reader says
        assert other.info().n_ok == 3
        Collection.erase(root)
        with pytest.raises(CollectionError):
            reader.search(old, k=1)  # erased for good: said, not answered from the old files


def test_retriever_add_skip_commits_rows_and_failures_in_one_transaction(tmp_path, tiny_model):
    root = tmp_path / "c"
    _crash("add-after-commit", """
        import sys
        from pathlib import Path
        from faste_mm import Embedder, Retriever
        embedder = Embedder.from_pretrained(sys.argv[1], device="cpu")
        Retriever(embedder, collection=sys.argv[2], r_max=0.0).add(["a text", Path(sys.argv[3])], on_error="skip")
    """, tiny_model, root, tmp_path / "gone.png")
    with Collection.open(root) as col:  # killed after the first commit: it held both
        info = col.info()
    assert (info.n_ok, info.n_failed) == (1, 1), info
    assert "gone.png" in info.failures[0].uri


def _cli(*args: str):
    from typer.testing import CliRunner

    from faste_mm.cli.app import app

    return CliRunner().invoke(app, list(args))


def test_random_manifests_and_bogus_index_types_are_named_errors_not_tracebacks(tmp_path):
    import json

    root = tmp_path / "c"
    _filled(root)
    good = (root / "manifest.json").read_text()
    (root / "manifest.json").write_bytes(os.urandom(400))
    for command in ("info", "compact"):
        result = _cli(command, "-c", str(root))
        assert result.exit_code == 1 and "manifest.json: cannot read the manifest" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and "damaged" in result.stderr
    bogus = json.loads(good)
    bogus["index"]["type"] = "Bogus99,Flat"
    (root / "manifest.json").write_text(json.dumps(bogus))
    for command in ("info", "compact", "rebuild-index"):
        result = _cli(command, "-c", str(root))
        assert result.exit_code == 1 and "'Bogus99,Flat' is not a valid FAISS factory string" in result.stderr, (
            command, result.stderr, result.exception)


def test_a_garbage_part_is_damage_in_our_words_not_numpys_pickle_advice(tmp_path):
    root = tmp_path / "c"
    v = _filled(root)
    (root / "vectors" / "part-000000.npy").write_bytes(os.urandom(512))
    (root / "index.faiss").unlink()  # the search must read the part to rebuild it
    with pytest.raises(CollectionError, match="part-000000.npy: cannot read vector part 0") as caught:
        with Collection.open(root) as col:
            col.search(v, k=1)
    assert "pickle" not in str(caught.value) and "garbage" in str(caught.value)


def test_disk_full_and_read_only_are_said_as_such_not_called_damage():
    import errno
    import sqlite3
    from pathlib import Path

    from faste_mm.indexers.atomic_files import atomic_write
    from faste_mm.indexers.database_file import damaged_database

    def full(f):
        raise OSError(errno.ENOSPC, "No space left on device")

    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        with pytest.raises(CollectionError, match="disk is full.*collection is intact. Free some space") as caught:
            atomic_write(Path(folder) / "index.faiss", full)
        assert os.listdir(folder) == []  # no temp file left behind
    for error, words in ((sqlite3.OperationalError("attempt to write a readonly database"), "read-only"),
                         (sqlite3.OperationalError("database or disk is full"), "disk is full"),
                         (sqlite3.OperationalError("unable to open database file"), "permission denied")):
        message = str(damaged_database(Path("c/meta.sqlite"), error))
        assert words in message and "damaged" not in message and "--reindex" not in message, message
    assert "--reindex" not in str(caught.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes whatever the permissions")
def test_a_read_only_collection_opens_for_search_and_a_writer_is_told_why(tmp_path):
    root = tmp_path / "c"
    v = _filled(root)
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)
    try:
        with Collection.open(root) as col:
            assert col.search(v, k=1)[1][:, 0].tolist() == list(range(len(v)))
        result = _cli("compact", "-c", str(root))
        assert result.exit_code == 1 and "ermission denied" in result.stderr and "Traceback" not in result.stderr
    finally:
        for path in [root, *root.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)


def test_an_unlisted_part_older_than_the_last_commit_is_kept_not_swept(tmp_path):
    import sqlite3

    root = tmp_path / "c"
    _filled(root)  # part 0
    with Collection.open(root, writable=True) as col:
        col.add(_vectors(2, seed=4), [ItemRecord(uri="x", modality="text"), ItemRecord(uri="y", modality="text")])
    db = sqlite3.connect(root / "meta.sqlite")  # a database that lost part 0's rows, not a compact
    db.execute("DELETE FROM items WHERE part = 0")
    db.execute("DELETE FROM parts WHERE part = 0")
    db.commit()
    db.close()
    (root / "vectors" / "part-000009.npy").write_bytes(b"torn")  # written after the last commit: an orphan
    with Collection.open(root, writable=True) as col:
        assert col.info().n_ok == 2
    names = sorted(p.name for p in (root / "vectors").iterdir())
    assert names == ["part-000000.ids.npy", "part-000000.npy", "part-000001.ids.npy", "part-000001.npy"]
