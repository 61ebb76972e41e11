"""`faste-mm duplicates`, `Retriever.duplicates` and HTTP GET /duplicates on a real folder indexed with
the tiny model: a photo, its byte copy and another photo (exact copies are found by content hash; a
tiny random model's vectors say nothing about near copies, see tests/test_duplicates.py); bad
thresholds are clear errors on each front end."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from faste_mm import BatchingConfig, Embedder, Retriever
from faste_mm.cli.app import app
from faste_mm.cli.duplicates_command import DEFAULT_THRESHOLD as CLI_DEFAULT
from faste_mm.retrieval.library.duplicates import DEFAULT_THRESHOLD
from tests.helpers.serve_fixtures import scene_image
from tests.helpers.inputs import tiny_vl_dir

runner = CliRunner()


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> Embedder:
    return Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu",
                                    batching=BatchingConfig(batch_tokens=1 << 16))


@pytest.fixture(scope="module")
def indexed(embedder, tmp_path_factory):
    base = tmp_path_factory.mktemp("dups")
    photos = base / "photos"
    photos.mkdir()
    scene_image(photos / "beach.png", 1, size=(320, 240))
    shutil.copy(photos / "beach.png", photos / "beach copy.png")
    scene_image(photos / "forest.png", 2)
    retriever = Retriever(embedder, collection=base / "col", r_max=0.5)
    retriever.index([photos])
    return retriever, photos


def test_the_cli_default_threshold_is_the_library_default():
    assert CLI_DEFAULT == DEFAULT_THRESHOLD


def test_retriever_reports_the_byte_copy_and_keeps_every_file(indexed):
    retriever, photos = indexed
    report = retriever.duplicates(near=False)
    [group] = report.groups
    assert group.kind == "exact"
    assert sorted(item.uri for item in group.items) == sorted(str(photos / n) for n in ("beach.png", "beach copy.png"))
    assert all((photos / n).exists() for n in ("beach.png", "beach copy.png", "forest.png"))


def test_cli_formats_paths_json_and_table(indexed):
    retriever, photos = indexed
    paths = runner.invoke(app, ["duplicates", "-c", str(retriever.collection), "--exact", "--format", "paths"])
    assert paths.exit_code == 0, paths.stderr
    assert sorted(paths.stdout.split("\n")[:2]) == sorted(str(photos / n) for n in ("beach.png", "beach copy.png"))
    assert "nothing was deleted" in paths.stderr
    payload = json.loads(runner.invoke(app, ["duplicates", "-c", str(retriever.collection), "--exact",
                                             "--format", "json"]).stdout)
    assert payload["n_groups"] == 1 and payload["groups"][0]["kind"] == "exact"
    assert payload["groups"][0]["items"][0]["width"] == 320
    table = runner.invoke(app, ["duplicates", "-c", str(retriever.collection), "--exact"])
    assert table.exit_code == 0 and "keep" in table.stdout and "320x240" in table.stdout


def test_cli_refuses_a_bad_threshold_naming_it(indexed):
    retriever, _ = indexed
    result = runner.invoke(app, ["duplicates", "-c", str(retriever.collection), "--threshold", "1.5"])
    assert result.exit_code == 2 and "--threshold" in result.stderr and "1.5" in result.stderr


def test_http_duplicates_and_a_bad_threshold(embedder, indexed):
    pytest.importorskip("fastapi", reason="needs the serve extra")
    from fastapi.testclient import TestClient

    from faste_mm.serving import ServeConfig, ServeEngine, create_app

    retriever, photos = indexed
    engine = ServeEngine(embedder, Retriever(embedder, collection=retriever.collection), ServeConfig())
    with TestClient(create_app(engine), base_url="http://127.0.0.1:8000") as client:
        body = client.get("/duplicates", params={"exact": "true"}).json()
        assert body["n_groups"] == 1 and body["groups"][0]["keeper"] in {str(photos / "beach.png"),
                                                                        str(photos / "beach copy.png")}
        bad = client.get("/duplicates", params={"threshold": 0})
        assert bad.status_code == 400 and "threshold" in bad.json()["error"]["message"]
