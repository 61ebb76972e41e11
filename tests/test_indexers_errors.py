"""Collection error paths: incompatible manifests, newer schemas, the writer lock, bad factories."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest

from faste_mm.errors import CollectionError, ConfigError
from faste_mm.indexers import Collection, ItemRecord, Manifest

D = 16


def _create(path, **fields) -> None:
    with Collection.create(path, Manifest(model_id="org/model-A", dim=D, **fields)) as col:
        v = np.eye(D, dtype=np.float32)[:2]
        col.add(v, [ItemRecord(uri=f"u{i}", modality="text") for i in range(2)])


def test_compatibility_errors_list_every_differing_stored_field_in_words():
    ours = Manifest(model_id="A", dim=2048)
    theirs = Manifest(model_id="B", dim=1024, vectors="float16", vector_dtype="float32",
                      settings={"serializer": {"max_pixels": 100_000}, "fast_e": {"r_max": 0.5}})
    assert ours.compatibility_errors(theirs) == [
        "model_id: collection has 'A', request has 'B'",
        "dim: collection has 2048, request has 1024",
        "vectors: collection has 'float32', request has 'float16'",
    ]  # the storage dtype does not make vectors incomparable; embedding settings are the profile's to compare
    assert ours.compatibility_errors(ours.replace(index_type="HNSW32")) == []


def test_manifest_round_trips_through_dict_keeping_the_settings_it_does_not_name():
    m = Manifest(model_id="A", dim=8, index_type="HNSW32", settings={
        "model_revision": "abc", "fast_e": {"r_max": 0.5, "warmup_layer": 8, "threshold": 0.7}})
    again = Manifest.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again == m and again.settings["fast_e"]["threshold"] == 0.7


@pytest.mark.parametrize("field,value,needle", [
    ("dim", 0, "dim"), ("vector_dtype", "int8", "vector_dtype"), ("metric", "l2", "metric"),
    ("memory_budget_bytes", 5, "memory_budget_bytes"), ("model_id", " ", "model_id"),
])
def test_invalid_manifest_field_is_a_config_error_naming_it(field, value, needle):
    with pytest.raises(ConfigError, match=needle):
        Manifest(**{"model_id": "A", "dim": 8, field: value})
    with pytest.raises(ConfigError, match=r"settings holds \['dim', 'vectors.keep'\]"):
        Manifest(model_id="A", dim=8, settings={"dim": 4, "vectors": {"keep": "none"}, "ocr": True})


def test_opening_with_an_incompatible_manifest_names_fields_and_what_to_do(tmp_path):
    _create(tmp_path / "c")
    request = Manifest(model_id="org/model-B", dim=D, vectors="float16")
    with pytest.raises(CollectionError) as e:
        Collection.open(tmp_path / "c", writable=True, expect=request)
    msg = str(e.value)
    assert str(tmp_path / "c") in msg
    assert "model_id: collection has 'org/model-A', request has 'org/model-B'" in msg
    assert "vectors" in msg and "--reindex" in msg and "new collection" in msg
    with pytest.raises(CollectionError, match="model_id"):
        Collection.create(tmp_path / "c", request, exist_ok=True)
    # The failed opens released the lock: a compatible writer can still open.
    Collection.open(tmp_path / "c", writable=True).close()


def test_create_refuses_existing_collection_and_foreign_directories(tmp_path):
    _create(tmp_path / "c")
    with pytest.raises(CollectionError, match="already exists") as e:
        Collection.create(tmp_path / "c", Manifest(model_id="org/model-A", dim=D))
    assert str(tmp_path / "c") in str(e.value)
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"x")
    with pytest.raises(CollectionError, match="cat.jpg"):
        Collection.create(tmp_path / "photos", Manifest(model_id="m", dim=D))


def test_opening_a_directory_without_manifest_names_it(tmp_path):
    with pytest.raises(CollectionError, match="not a faste-mm collection") as e:
        Collection.open(tmp_path)
    assert str(tmp_path) in str(e.value)


def test_newer_schema_is_refused_with_upgrade_advice(tmp_path):
    _create(tmp_path / "c")
    db = sqlite3.connect(tmp_path / "c" / "meta.sqlite")
    db.execute("UPDATE schema_version SET version = ?", (99,))
    db.commit()
    db.close()
    for writable in (False, True):
        with pytest.raises(CollectionError, match=r"schema version 99 is newer") as e:
            Collection.open(tmp_path / "c", writable=writable)
        assert "meta.sqlite" in str(e.value) and "upgrade faste-mm" in str(e.value)


def test_newer_manifest_format_is_refused(tmp_path):
    _create(tmp_path / "c")
    path = tmp_path / "c" / "manifest.json"
    raw = json.loads(path.read_text())
    raw["format_version"] = 7
    path.write_text(json.dumps(raw))
    with pytest.raises(CollectionError, match="format_version 7 is newer.*upgrade"):
        Collection.open(tmp_path / "c")


@pytest.mark.parametrize("raw", [[1, 2], {"format_version": "2"}, {"model_id": "m", "dim": 16, "index": "x"}])
def test_a_manifest_of_the_wrong_shape_is_a_collection_error_naming_the_file(tmp_path, raw):
    _create(tmp_path / "c")
    (tmp_path / "c" / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(CollectionError, match="invalid manifest") as e:
        Collection.open(tmp_path / "c")
    assert "manifest.json" in str(e.value) and "re-index" in str(e.value)


def test_creating_a_collection_over_a_file_names_it(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(CollectionError, match="is a file"):
        Collection.create(tmp_path / "notes.txt", Manifest(model_id="m", dim=D))
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_second_writer_fails_fast_naming_the_collection(tmp_path):
    _create(tmp_path / "c")
    with Collection.open(tmp_path / "c", writable=True):
        with pytest.raises(CollectionError) as e:
            Collection.open(tmp_path / "c", writable=True)
        assert str(tmp_path / "c") in str(e.value)
        assert "another faste-mm process" in str(e.value) and "is writing" in str(e.value)
        with Collection.open(tmp_path / "c") as reader:  # readers need no lock
            assert reader.info().n_ok == 2
    Collection.open(tmp_path / "c", writable=True).close()  # released on close


@pytest.mark.parametrize("factory", ["Bogus12", "IVF,Flat", "IDMap,Flat"])
def test_invalid_factory_string_is_a_config_error_naming_it(tmp_path, factory):
    with pytest.raises(ConfigError, match="index_type") as e:
        Collection.create(tmp_path / "c", Manifest(model_id="m", dim=D, index_type=factory))
    assert factory in str(e.value)
    _create(tmp_path / "d")
    with Collection.open(tmp_path / "d", writable=True) as col:
        with pytest.raises(ConfigError, match="index_type"):
            col.rebuild_index(factory)
        assert col.rebuild_index() == "Flat"  # the failed switch changed nothing
