"""Named crash points: each CLI writer is SIGKILLed at each step it names (FASTE_MM_CRASH_AT);
the next run completes, nothing is lost or duplicated, no orphan or temp file stays, and
index.faiss holds exactly the stored vectors (its manifest checksum matches)."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import faiss
import numpy as np
import pytest
from typer.testing import CliRunner

from faste_mm.cli.app import app
from faste_mm.indexers.crash_points import CRASH_ENV, CRASH_POINTS
from faste_mm.indexers.faiss_index import file_sha256

from tests.helpers.warm_process import run_cli
from tests.helpers.inputs import noise_image, tiny_vl_dir

runner = CliRunner()

# (what runs, the step it is killed at, the command that completes the job afterwards).
# "fresh": index into a new collection; "more": index a folder with two new files into an
# existing collection (add); the others run on an indexed collection. Each step is tested once
# per command that reaches it through a different path (an index run's add steps are those of
# "more"), since every killed run costs a process (forked from a warm one, not a fresh interpreter).
SCENARIOS = [
    ("fresh", "create-before-manifest", "index"),
    ("fresh", "create-before-manifest", "reindex"),
    ("more", "add-after-part-written", "index"),
    ("more", "add-after-commit", "index"),
    ("more", "index-after-replace", "index"),
    ("reindex", "erase-after-marker", "reindex"),
    ("remove", "delete-after-commit", "remove"),
    ("compact", "compact-after-new-parts", "compact"),
    ("compact", "compact-after-commit", "compact"),
    ("compact", "index-after-replace", "compact"),
    ("rebuild-index", "index-after-replace", "rebuild-index"),
]


# Steps with a test of their own elsewhere (what they need is not one of the scenarios above).
EXERCISED_ELSEWHERE = {"index-after-page-range": "tests/test_long_pdfs.py",
                       "export-after-batch": "tests/test_security_data.py",
                       "album-refresh-before-commit": "tests/test_albums.py"}


def test_every_crash_point_is_exercised():
    assert {step for _, step, _ in SCENARIOS} | set(EXERCISED_ELSEWHERE) == set(CRASH_POINTS)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(tiny_vl_dir(tmp_path_factory.getbasetemp()))


def _args(kind: str, imgs: Path, col: Path, model: str) -> list[str]:
    index = ["index", str(imgs), "-c", str(col), "--model", model, "--device", "cpu", "--chunk-files", "2"]
    return {"fresh": index, "more": index, "index": index, "reindex": [*index, "--reindex"],
            "remove": ["remove", str(imgs / "b.png"), "-c", str(col)],
            "compact": ["compact", "-c", str(col)],
            "rebuild-index": ["rebuild-index", "-c", str(col)]}[kind]


def _invoke(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (result.stderr[-2000:], result.exception)


@pytest.mark.parametrize("kind, step, then", SCENARIOS, ids=lambda x: x)
def test_a_writer_killed_at_a_named_step_is_completed_by_the_next_run(model, tmp_path, kind, step, then):
    imgs, col = tmp_path / "imgs", tmp_path / "col"
    imgs.mkdir()
    for seed, name in enumerate("abcd"):
        noise_image(imgs / f"{name}.png", (32, 32), seed)
    if kind != "fresh":
        _invoke(_args("index", imgs, col, model))
    if kind == "more":
        for seed, name in enumerate("ef", start=10):
            noise_image(imgs / f"{name}.png", (32, 32), seed)
    if kind == "compact":
        _invoke(_args("remove", imgs, col, model))
    # a process of its own, forked warm (tests/helpers/warm_process.py): the SIGKILL ends it alone
    proc = run_cli(_args(kind, imgs, col, model), env={**os.environ, CRASH_ENV: step})
    assert proc.returncode == -9, f"never reached {step}: {proc.stderr[-2000:]}"
    _invoke(_args(then, imgs, col, model))
    removed = {"b.png"} if kind in ("remove", "compact") else set()
    _check_complete(col, {str(p.resolve()) for p in imgs.iterdir() if p.name not in removed})


def _check_complete(col: Path, want_uris: set[str]) -> None:
    db = sqlite3.connect(col / "meta.sqlite")
    rows = db.execute("SELECT id, uri, status, part, row FROM items").fetchall()
    parts = dict(db.execute("SELECT part, n_rows FROM parts").fetchall())
    lexical = [i for (i,) in db.execute("SELECT rowid FROM items_fts ORDER BY rowid")]
    db.close()
    live = [uri for _, uri, status, _, _ in rows if status == "ok"]
    assert lexical == sorted(i for i, _, status, _, _ in rows if status == "ok")  # lexical index in step
    assert sorted(live) == sorted(want_uris)  # nothing lost, nothing twice
    assert not [r for r in rows if r[2] == "failed"]
    on_disk = sorted(p.name for p in (col / "vectors").iterdir())
    assert on_disk == sorted(f"part-{p:06d}{ext}" for p in parts for ext in (".ids.npy", ".npy"))  # no orphans
    assert not list(col.rglob("*.tmp"))
    stored = np.concatenate([np.load(col / "vectors" / f"part-{p:06d}.ids.npy") for p in sorted(parts)])
    with_vector = sorted(i for i, _, _, part, _ in rows if part is not None)
    assert sorted(stored.tolist()) == with_vector  # every row's vector is stored once
    manifest = json.loads((col / "manifest.json").read_text())
    assert manifest["index"]["sha256"] == file_sha256(col / "index.faiss")
    index = faiss.read_index(str(col / "index.faiss"))
    assert faiss.vector_to_array(index.id_map).tolist() == stored.tolist()  # the index equals the rows
