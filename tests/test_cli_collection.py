"""`faste-mm index/search/info/remove/compact/rebuild-index` on generated fixtures: JSON shapes,
incremental re-runs, environment variables, the default collection, concurrent writers, and a
writer killed with SIGKILL that resumes without embedding anything twice."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from faste_mm.indexers import Collection
from faste_mm.retrieval.profile import CollectionProfile
from faste_mm.indexers.crash_points import CRASH_ENV

from tests.helpers.cli import committed_items, invoke
from tests.helpers.warm_process import run_cli
from tests.helpers.inputs import CORPUS_EMBEDDED, CORPUS_FAILED, CORPUS_REUSED, make_corpus, noise_image, tiny_vl_dir



@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(tiny_vl_dir(tmp_path_factory.getbasetemp()))


def test_index_of_a_path_that_does_not_exist_fails_naming_it_and_creates_nothing(model, tmp_path):
    (tmp_path / "photos").mkdir()
    result = invoke("index", tmp_path / "images", tmp_path / "photos", "-c", tmp_path / "col", "--model", model,
                    "--device", "cpu", code=1)
    message = " ".join(result.stderr.split())
    assert f"{tmp_path / 'images'}: no such file or folder; check the path" in message, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "col").exists()


def test_index_search_info_json_and_paths(model, tmp_path):
    root = make_corpus(tmp_path / "corpus")
    col = tmp_path / "col"
    report = json.loads(invoke("index", root, "-c", col, "--model", model, "--device", "cpu", "--format", "json").stdout)
    assert (report["embedded"], report["reused"], report["failed"]) == (CORPUS_EMBEDDED, CORPUS_REUSED, CORPUS_FAILED)
    assert {"collection", "unchanged", "removed", "failures", "prefix_removal", "seconds"} <= report.keys()
    hits = json.loads(invoke("search", "a red bicycle", "-c", col, "-k", "20", "--format", "json").stdout)
    understood = hits["query"].pop("understood")  # nothing in "a red bicycle" is a filter: all of it is meaning
    assert understood["parts"] == [] and understood["text"] == "a red bicycle"
    assert hits["query"] == {"text": "a red bicycle", "image": None, "video": None, "like": None, "crop": None}
    assert hits["k"] == 20
    assert [h["rank"] for h in hits["hits"]] == list(range(1, CORPUS_EMBEDDED + CORPUS_REUSED + 1))
    assert hits["hits"][0].keys() == {"rank", "id", "score", "uri", "page", "metadata", "found_by", "facts"}
    assert sorted(h["page"] for h in hits["hits"] if h["uri"].endswith("doc.pdf")) == [1, 2]
    by_image = invoke("search", "--image", root / "gray.jpg", "-c", col, "-k", "3", "--format", "paths").stdout
    lines = by_image.splitlines()
    assert len(lines) == 3 and lines[0] == str((root / "gray.jpg").resolve())
    info = json.loads(invoke("info", "-c", col, "--format", "json").stdout)
    assert (info["n_ok"], info["n_failed"]) == (CORPUS_EMBEDDED + CORPUS_REUSED, CORPUS_FAILED)
    assert info["settings"]["model_id"] == model and info["settings"]["fast_e"]["r_max"] == 0.5
    assert {Path(f["uri"]).name for f in info["failures"]} == {"corrupt.png", "empty.jpg"}
    table = invoke("info", "-c", col).stdout
    assert "corrupt.png" in table and "Flat" in table
    again = json.loads(invoke("index", root, "-c", col, "--format", "json").stdout)  # the collection's model
    assert (again["embedded"], again["reused"], again["failed"]) == (0, 0, 0)


def test_options_come_from_environment_and_the_default_collection_lives_in_user_data(model, tmp_path):
    root = tmp_path / "imgs"
    root.mkdir()
    noise_image(root / "a.png", (64, 64), 7)
    noise_image(root / "b.gif", (64, 64), 8)
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "FASTE_MM_MODEL": model, "FASTE_MM_DEVICE": "cpu",
           "FASTE_MM_R_MAX": "0.25", "FASTE_MM_BATCH_TOKENS": "4096", "FASTE_MM_EXCLUDE": "*.gif *.tif"}
    invoke("index", root, env=env)
    default = tmp_path / "data" / "faste-mm" / "collections" / "default"
    with Collection.open(default) as col:
        assert CollectionProfile.from_manifest(col.manifest).r_max == 0.25 and col.info().n_ok == 1  # b.gif excluded
    assert invoke("search", "--image", root / "a.png", "--format", "paths", env=env).stdout.strip() == str(
        (root / "a.png").resolve())
    env["FASTE_MM_COLLECTION"] = "photos"
    invoke("index", root, env=env)
    assert (tmp_path / "data" / "faste-mm" / "collections" / "photos" / "manifest.json").exists()


def test_errors_exit_1_with_a_message_and_usage_errors_exit_2(model, tmp_path):
    root = make_corpus(tmp_path / "corpus")
    col = tmp_path / "col"
    invoke("index", root / "red.png", "-c", col, "--model", model, "--device", "cpu", "--r-max", "0")
    other = shutil.copytree(model, tmp_path / "other-model")
    mismatch = invoke("index", root / "gray.jpg", "-c", col, "--model", other, "--device", "cpu", code=1)
    assert "model_id" in mismatch.stderr and "--reindex" in mismatch.stderr and "Traceback" not in mismatch.stderr
    with Collection.open(col, writable=True):
        locked = invoke("index", root / "gray.jpg", "-c", col, code=1)
    assert "another faste-mm process" in locked.stderr
    assert "not a faste-mm collection" in invoke("search", "x", "-c", tmp_path / "nowhere", code=1).stderr
    invoke("search", "-c", col, code=2)  # neither QUERY nor --image
    invoke("index", root, "--no-such-option", code=2)
    reindexed = json.loads(invoke("index", root / "gray.jpg", "-c", col, "--model", other, "--device", "cpu",
                                  "--reindex", "--format", "json").stdout)
    assert reindexed["embedded"] == 1 and Collection.open(col).info().n_ok == 1


def test_remove_compact_and_rebuild_index_keep_search_results(model, tmp_path):
    root = tmp_path / "imgs"
    (root / "sub").mkdir(parents=True)
    for i in range(8):
        noise_image(root / ("sub" if i < 3 else ".") / f"{i}.png", (48, 48), 200 + i)
    col = tmp_path / "col"
    invoke("index", root, "-c", col, "--model", model, "--device", "cpu", "--index-type", "HNSW16")
    assert Collection.open(col).info().index_factory == "HNSW16"
    removed = invoke("remove", root / "sub", "-c", col).stdout.splitlines()
    assert sorted(Path(u).name for u in removed) == ["0.png", "1.png", "2.png"]
    assert invoke("compact", "-c", col).stdout.strip() == "dropped 3 vectors"
    query = ["search", "--image", root / "5.png", "-c", col, "-k", "5", "--format", "json"]
    before = json.loads(invoke(*query).stdout)["hits"]
    assert Path(before[0]["uri"]).name == "5.png" and len(before) == 5
    assert invoke("rebuild-index", "--index-type", "IVF4,Flat", "-c", col).stdout.strip() == "IVF4,Flat"
    assert json.loads(invoke(*query).stdout)["hits"][0]["uri"] == before[0]["uri"]
    invoke("rebuild-index", "--index-type", "HNSW16", "-c", col)
    assert json.loads(invoke(*query).stdout)["hits"] == before


def test_remove_warns_naming_the_targets_that_matched_nothing_and_exits_0(model, tmp_path):
    root = tmp_path / "imgs"
    root.mkdir()
    for i, name in enumerate(("a.png", "b.png")):
        noise_image(root / name, (48, 48), 400 + i)
    col = tmp_path / "col"
    invoke("index", root, "-c", col, "--model", model, "--device", "cpu")
    result = invoke("remove", root / "a.png", root / "typo.png", "424242", "-c", col)
    assert [Path(u).name for u in result.stdout.splitlines()] == ["a.png"]
    warning = result.stderr[result.stderr.index("warning"):]
    assert str(root / "typo.png") in warning and "424242" in warning and "a.png" not in warning
    nothing = invoke("remove", root / "typo.png", "-c", col)  # a warning, not an error (README exit codes)
    assert nothing.stdout == "" and "typo.png" in nothing.stderr
    assert Collection.open(col).info().n_ok == 1


def test_a_writer_killed_with_sigkill_resumes_without_embedding_anything_twice(model, tmp_path):
    """The indexer SIGKILLs itself right after its first chunk commit (a named crash point)."""
    root = tmp_path / "imgs"
    root.mkdir()
    n_files = 16
    for i in range(n_files):
        noise_image(root / f"{i:03d}.png", (64, 64), 1000 + i)
    col = tmp_path / "col"
    args = ["index", str(root), "-c", str(col), "--model", model, "--device", "cpu", "--chunk-files", "2"]
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    env[CRASH_ENV] = "add-after-commit#1"
    proc = run_cli(args, env=env, timeout=300)  # a process of its own, forked warm (tests/helpers/warm_process.py)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    committed = committed_items(col)
    assert committed == 2  # the first chunk, whole
    report = json.loads(invoke("index", root, "-c", col, "--format", "json").stdout)
    assert report["embedded"] == n_files - committed and report["reused"] == 0
    info = Collection.open(col).info()
    assert (info.n_ok, info.n_failed, info.n_deleted, info.index_is_current) == (n_files, 0, 0, True)
    hits = json.loads(invoke("search", "--image", root / "007.png", "-c", col, "-k", "1", "--format", "json").stdout)
    assert Path(hits["hits"][0]["uri"]).name == "007.png"





def test_relative_collection_and_model_paths_work_from_another_folder(model, tmp_path, monkeypatch):
    root = tmp_path / "imgs"
    root.mkdir()
    noise_image(root / "a.png", (64, 48), seed=1)
    shutil.copytree(model, tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    invoke("index", "imgs", "-c", "./col", "--model", "model", "--device", "cpu")
    monkeypatch.chdir(root)  # elsewhere: the manifest must not depend on the first cwd
    hits = json.loads(invoke("search", "anything", "-c", "../col", "--format", "json").stdout)
    assert [Path(h["uri"]).name for h in hits["hits"]] == ["a.png"]
    assert json.loads(invoke("info", "-c", "../col", "--format", "json").stdout)["model_id"] == str(tmp_path / "model")


def test_remove_with_an_empty_target_exits_1_and_removes_nothing(model, tmp_path):
    root = tmp_path / "imgs"
    root.mkdir()
    noise_image(root / "a.png", (48, 48), 500)
    col = tmp_path / "col"
    invoke("index", root, "-c", col, "--model", model, "--device", "cpu")
    result = invoke("remove", "", "-c", col, code=1)
    assert "would match every file" in result.stderr and "Traceback" not in result.stderr and result.stdout == ""
    assert Collection.open(col).info().n_ok == 1
