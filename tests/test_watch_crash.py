"""`faste-mm watch` killed (SIGKILL at named crash points, in a subprocess) in the middle of a sync
that adds files, and of one that renames, deletes and adds: the next poll finishes the work, and the
collection then holds every file of the folder exactly once, nothing lost, nothing duplicated."""

from __future__ import annotations

import json
import os
import signal

import pytest
from typer.testing import CliRunner

from faste_mm.cli.app import app
from faste_mm.indexers import Collection
from faste_mm.indexers.crash_points import CRASH_ENV
from tests.helpers.warm_process import run_cli
from tests.helpers.inputs import noise_image, tiny_vl_dir

runner = CliRunner()


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(tiny_vl_dir(tmp_path_factory.getbasetemp()))


def _watch_killed_at(crash_at: str, folder, col, model: str) -> None:
    args = ["watch", str(folder), "-c", str(col), "--model", model, "--device", "cpu", "--settle-polls", "1",
            "--polls", "1", "--chunk-files", "2"]
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    env[CRASH_ENV] = crash_at
    proc = run_cli(args, env=env, timeout=300)  # a process of its own, forked warm (tests/helpers/warm_process.py)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]


def _live_names(col) -> list[str]:
    with Collection.open(col) as c:
        return sorted(os.path.basename(r.uri) for records, _ in c.iter_live() for r in records)


def _poll_once(folder, col) -> dict:
    result = runner.invoke(app, ["watch", str(folder), "-c", str(col), "--settle-polls", "1", "--polls", "1", "--json"])
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return json.loads(result.stdout.splitlines()[-1])


def test_a_sync_killed_at_a_commit_or_a_removal_loses_and_duplicates_nothing(model, tmp_path):
    folder, col = tmp_path / "photos", tmp_path / "col"
    folder.mkdir()
    for i in range(5):
        noise_image(folder / f"{i}.png", (64, 48), seed=i)
    _watch_killed_at("add-after-commit#1", folder, col, model)  # the first chunk of 2 committed
    assert _live_names(col) == ["0.png", "1.png"]
    os.rename(folder / "0.png", folder / "moved.png")
    (folder / "4.png").unlink()
    noise_image(folder / "5.png", (64, 48), seed=5)
    # killed right after the vanished files' removal committed, before index.faiss was saved
    _watch_killed_at("delete-after-commit#1", folder, col, model)
    assert "0.png" not in _live_names(col) and "moved.png" in _live_names(col)
    report = _poll_once(folder, col)
    assert report["error"] is None
    names = _live_names(col)
    assert names == sorted(p.name for p in folder.iterdir())  # each file once: none lost, none twice
    with Collection.open(col) as c:
        info = c.info()
    assert (info.n_ok, info.n_failed) == (len(names), 0)
    assert _poll_once(folder, col)["index"]["embedded"] == 0  # a new watcher's first poll: nothing left to do


def test_watch_cli_polls_then_info_shows_the_last_sync(model, tmp_path):
    from faste_mm.cli.watch_command import DEFAULT_INTERVAL_S
    from faste_mm.retrieval.library.watching import WatchOptions

    assert DEFAULT_INTERVAL_S == WatchOptions().interval_s
    folder, col = tmp_path / "photos", tmp_path / "col"
    folder.mkdir()
    noise_image(folder / "a.png", (64, 48), seed=1)
    result = runner.invoke(app, ["watch", str(folder), "-c", str(col), "--model", model, "--device", "cpu",
                                 "--polls", "2", "--interval", "0.01", "--json"])
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    first, second = (json.loads(line) for line in result.stdout.splitlines())
    assert (first["waiting"], second["index"]["embedded"]) == (1, 1)
    info = json.loads(runner.invoke(app, ["info", "-c", str(col), "--format", "json"]).stdout)
    assert info["watch"]["in_sync"] and info["watch"]["paths"] == [str(folder)]
    assert "in sync" in runner.invoke(app, ["info", "-c", str(col)]).stdout


def test_watch_cli_refuses_a_missing_model_or_bad_interval_clearly(tmp_path):
    result = runner.invoke(app, ["watch", str(tmp_path), "-c", str(tmp_path / "col"), "--interval", "0"])
    assert result.exit_code == 2 and "--interval" in result.stderr
