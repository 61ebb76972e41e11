"""Removal sticks: a removed file or folder is skipped by later scans of the folders above it
until it is named on `index` again; `info` lists the exclusions; the schema migration that adds
them keeps older collections readable."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest
from typer.testing import CliRunner

from faste_mm import BatchingConfig, Embedder
from faste_mm.cli.app import app
from faste_mm.indexers import Collection, ItemRecord, Manifest
from faste_mm.indexers.schema import SCHEMA_VERSION
from faste_mm.retrieval.retriever import Retriever

from tests.helpers.old_schemas import downgrade
from tests.helpers.inputs import noise_image, tiny_vl_dir


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> Embedder:
    return Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu",
                                    batching=BatchingConfig(batch_tokens=1 << 16))


def photos(root):
    for day, seeds in (("day1", (1, 2)), ("day2", (3, 4, 5))):
        (root / day).mkdir(parents=True)
        for seed in seeds:
            noise_image(root / day / f"p{seed}.png", (48, 48), seed)
    noise_image(root / "cover.png", (48, 48), 9)
    return root


def uris(r: Retriever) -> list[str]:
    with Collection.open(r.collection) as col:
        return col.read(lambda rows: rows.live_uris())


def test_a_removed_folder_is_not_re_embedded_by_the_next_scan_of_its_parent(embedder, tmp_path):
    root = photos(tmp_path / "photos").resolve()
    r = Retriever(embedder, collection=tmp_path / "c", r_max=0.0)
    assert r.index([root]).embedded == 6
    removed = r.remove([root / "day2"])
    assert removed.excluded == (str(root / "day2"),) and len(removed.uris) == 3
    again = r.index([root])
    assert (again.embedded, again.reused, again.excluded) == (0, 0, 3)
    assert not any("/day2/" in u for u in uris(r))
    assert r.info().exclusions == (str(root / "day2"),)
    # A file named inside the removed folder is indexed, and a later parent scan keeps it.
    assert r.index([root / "day2" / "p3.png"]).embedded == 1
    assert r.index([root]).removed == 0 and str(root / "day2" / "p3.png") in uris(r)
    assert r.info().exclusions == (str(root / "day2"),)  # naming a file inside does not clear the folder
    # Naming the removed folder itself includes it again.
    back = r.index([root / "day2"])
    assert back.embedded + back.reused == 2 and r.info().exclusions == ()
    assert r.index([root]).embedded == 0 and sum("/day2/" in u for u in uris(r)) == 3


def test_a_removed_file_stays_out_and_comes_back_when_named(embedder, tmp_path):
    root = photos(tmp_path / "photos").resolve()
    r = Retriever(embedder, collection=tmp_path / "c", r_max=0.0)
    r.index([root])
    r.remove([root / "cover.png"])
    assert r.index([root]).excluded == 1 and str(root / "cover.png") not in uris(r)
    r.index([root / "cover.png"])
    assert str(root / "cover.png") in uris(r)
    assert r.info().exclusions == ()


def test_cli_remove_then_index_skips_it_and_info_lists_the_exclusion(embedder, tmp_path):
    root = photos(tmp_path / "photos").resolve()
    col = str(tmp_path / "col")
    runner = CliRunner()

    def run(*args: str):
        result = runner.invoke(app, [*args])
        assert result.exit_code == 0, (result.stdout, result.stderr)
        return result

    run("index", str(root), "-c", col, "--model", embedder.model_id, "--r-max", "0")
    removed = run("remove", str(root / "day2"), "-c", col)
    assert "name a path on `faste-mm index` to include it again" in removed.stderr
    report = json.loads(run("index", str(root), "-c", col, "--format", "json").stdout)
    assert (report["embedded"], report["excluded"]) == (0, 3)
    info = json.loads(run("info", "-c", col, "--format", "json").stdout)
    assert info["exclusions"] == [str(root / "day2")] and info["n_ok"] == 3
    assert "1 removed paths skipped by index" in run("info", "-c", col).stdout  # the table (paths may fold)


def test_schema_1_collections_stay_readable_and_migrate_on_the_next_write(tmp_path):
    with Collection.create(tmp_path / "c", Manifest(model_id="m", dim=4)) as col:
        col.add(np.eye(4, dtype=np.float32)[:1], [ItemRecord(uri="/a/x.png", modality="image")])
    downgrade(tmp_path / "c", 1)
    with Collection.open(tmp_path / "c") as reader:  # read-only: no migration, no exclusions
        assert reader.exclusions() == [] and reader.info().n_ok == 1
    with Collection.open(tmp_path / "c", writable=True) as writer:
        writer.exclude(["/a"])
    version = sqlite3.connect(tmp_path / "c" / "meta.sqlite").execute("SELECT version FROM schema_version").fetchone()[0]
    assert version == SCHEMA_VERSION == 9  # 1 -> 2 (escaped names) -> 3 (exclusions) -> 4 (lexical index) -> 5 (metadata
    # index) -> 6 (file identities) -> 7 (item facts) -> 8 (the neighbourhood fact) -> 9 (albums)
    with Collection.open(tmp_path / "c") as reader:
        assert reader.exclusions() == ["/a"]
