"""Messages instead of tracebacks, in CLI words; failures that stay per file; lossless names."""

from __future__ import annotations

import os
import shutil
import sqlite3

import numpy as np
import pytest
from typer.testing import CliRunner

from faste_mm.cli.app import app
from faste_mm.errors import InputError, ModelLoadError
from faste_mm.indexers import Collection, ItemRecord, Manifest

from tests.helpers.old_schemas import downgrade
from tests.helpers.inputs import noise_image, tiny_vl_dir

runner = CliRunner()


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(tiny_vl_dir(tmp_path_factory.getbasetemp()))


@pytest.mark.parametrize("option, value, flag", [("--r-max", "1.5", "--r-max"), ("--chunk-files", "0", "--chunk-files"),
                                                 ("--batch-tokens", "0", "--batch-tokens")])
def test_bad_index_options_are_named_by_their_flag(model, tmp_path, option, value, flag):
    noise_image(tmp_path / "a.png", (32, 32), 1)
    result = runner.invoke(app, ["index", str(tmp_path / "a.png"), "-c", str(tmp_path / "col"), "--model", model,
                                 "--device", "cpu", option, value])
    assert result.exit_code in (1, 2), result.stderr  # 2: a range the option itself declares (usage)
    assert flag in result.stderr and "Config." not in result.stderr and "IndexOptions" not in result.stderr


def test_an_unparsable_index_type_is_refused_before_the_model_loads(tmp_path):
    noise_image(tmp_path / "a.png", (32, 32), 1)
    result = runner.invoke(app, ["index", str(tmp_path / "a.png"), "-c", str(tmp_path / "col"),
                                 "--model", str(tmp_path / "no-such-model"), "--index-type", "Bogus123"])
    assert result.exit_code == 1
    assert "--index-type 'Bogus123' is not a valid FAISS factory string" in result.stderr
    assert ".cpp" not in result.stderr and "no-such-model" not in result.stderr  # the model was never loaded
    assert not (tmp_path / "col").exists()


def test_damaged_weights_are_a_one_line_model_load_error(model, tmp_path):
    from faste_mm import Embedder

    broken = tmp_path / "broken-model"
    shutil.copytree(model, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"\x80\x04not a checkpoint" * 10)
    with pytest.raises(ModelLoadError, match="cannot load weights.*download the model again") as error:
        Embedder.from_pretrained(str(broken), device="cpu")
    assert "\n" not in str(error.value)


def test_a_chunks_rows_and_failures_commit_together_or_not_at_all(tmp_path):
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=4)) as col:
        v = np.eye(4, dtype=np.float32)[:1]
        bad = ItemRecord(uri="p.pdf", modality="page", page=2, error="page 2 is broken", metadata={"x": object()})
        with pytest.raises(TypeError):  # the failure row cannot be written ...
            col.commit(v, [ItemRecord(uri="p.pdf", modality="page", page=1)], [bad])
        assert col.info().n_ok == 0 and col.info().n_failed == 0  # ... so neither is its good page
        assert list((tmp_path / "c" / "vectors").iterdir()) == []
        col.commit(v, [ItemRecord(uri="p.pdf", modality="page", page=1)],
                   [ItemRecord(uri="p.pdf", modality="page", page=2, error="page 2 is broken")])
        assert (col.info().n_ok, col.info().n_failed) == (1, 1)


def test_names_that_are_not_utf8_are_stored_losslessly(tmp_path):
    odd = "/p/" + os.fsdecode(b"\xff\xfe.png")
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=4)) as col:
        col.add(np.eye(4, dtype=np.float32)[:1], [ItemRecord(uri=odd, modality="image")])
        col.add_failures([ItemRecord(uri=odd + "2", modality="image", error=f"{odd}2: bad")])
    with Collection.open(tmp_path / "c", writable=True) as col:
        assert col.read(lambda rows: rows.live_uris()) == sorted([odd, odd + "2"]) == col.read(
            lambda rows: rows.live_uris("/p"))
        assert [r.error for r in col.info().failures] == [f"{odd}2: bad"]
        col.delete(uris=[odd])
        assert col.read(lambda rows: rows.live_uris()) == [odd + "2"]


def test_the_schema_migration_keeps_existing_names(tmp_path):
    from faste_mm.indexers.schema import ESC

    literal = "/p/" + ESC + "ff.png"  # a name that holds the escape character itself
    root = tmp_path / "c"
    with Collection.create(root, Manifest(model_id="m", dim=4)):
        pass
    db = sqlite3.connect(root / "meta.sqlite")  # as schema 1 stored it: raw
    db.execute("INSERT INTO items (id, uri, modality, status, error, added_at) VALUES (9, ?, 'image', 'failed', 'x', 0)",
               (literal,))
    downgrade(root, 1, db)
    with Collection.open(root, writable=True) as col:
        assert col.read(lambda rows: rows.live_uris()) == [literal]


def test_an_unexpected_exception_on_one_file_is_that_files_failure(model, tmp_path, monkeypatch):
    from faste_mm.retrieval import ingest

    for seed, name in enumerate("abc"):
        noise_image(tmp_path / f"{name}.png", (32, 32), seed)
    real = ingest.content_hash

    def flaky(path):
        if path.name == "b.png":
            raise KeyError("a bug in a library")
        return real(path)

    monkeypatch.setattr(ingest, "content_hash", flaky)
    col = tmp_path / "col"
    result = runner.invoke(app, ["index", str(tmp_path), "-c", str(col), "--model", model, "--device", "cpu"])
    assert result.exit_code == 0, result.stderr
    with Collection.open(col) as c:
        failures = c.info().failures
        assert c.info().n_ok == 2
    assert [f.uri for f in failures] == [str(tmp_path / "b.png")]
    assert "unexpected KeyError" in failures[0].error and "--debug" in failures[0].error


def test_named_paths_that_are_not_files_get_their_own_reason(tmp_path):
    from faste_mm.retrieval.scanning import scan_paths

    os.symlink("b.png", tmp_path / "a.png")
    os.symlink("a.png", tmp_path / "b.png")
    os.symlink("gone.png", tmp_path / "dangling.png")
    os.mkfifo(tmp_path / "pipe.png")
    scan = scan_paths([tmp_path / "a.png", tmp_path / "dangling.png", tmp_path / "pipe.png", tmp_path / "typo.png"])
    reasons = dict(scan.missing)
    assert "symbolic link loop" in reasons[str(tmp_path / "a.png")]
    assert "broken symbolic link" in reasons[str(tmp_path / "dangling.png")]
    assert "FIFO" in reasons[str(tmp_path / "pipe.png")]
    assert "file not found" in reasons[str(tmp_path / "typo.png")]
