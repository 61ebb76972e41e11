"""What `index` and `watch` print: what they did, not how the kernels were chosen. Kernel choices
are debug logs (and `bench`'s), one line says the dtype and threads, transformers' "Loading weights"
bar stays off, and `watch -v` names each file a poll embedded, moved or removed (`--json` too)."""

from __future__ import annotations

import json
import os
import re

import pytest
from typer.testing import CliRunner

from faste_mm.cli.app import app
from tests.helpers.inputs import tiny_vl_dir
from tests.helpers.serve_fixtures import scene_image

runner = CliRunner()
# What a kernel choice's verdict reads like (`kernel_choice.KernelChoice.describe`, `unpadded`).
KERNEL_LINE = re.compile(r"tower attention|tower linear\+GELU|decoder MLP|attention after compression|measured .*x ")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(tiny_vl_dir(tmp_path_factory.getbasetemp()))


@pytest.fixture
def fresh_kernel_cache(tmp_path, monkeypatch):
    """A kernel cache of this test's own: every choice is measured in the run, as on a new machine."""
    monkeypatch.setenv("FASTE_MM_KERNEL_CACHE", str(tmp_path / "kernel_choices.json"))


def _quiet(stderr: str) -> None:
    assert not [line for line in stderr.splitlines() if KERNEL_LINE.search(line)], stderr
    assert "Loading weights" not in stderr and "it/s]" not in stderr, stderr


def test_index_prints_no_kernel_choices_and_one_line_of_dtype_and_threads(model, tmp_path, fresh_kernel_cache):
    folder = tmp_path / "photos"
    folder.mkdir()
    scene_image(folder / "a.png", 1)
    result = runner.invoke(app, ["index", str(folder), "-c", str(tmp_path / "col"), "--model", model, "--device", "cpu",
                                 "--dtype", "float32"])
    assert result.exit_code == 0, (result.stderr, result.exception)
    _quiet(result.stderr)
    runtime = [line for line in result.stderr.splitlines() if "threads:" in line]
    assert len(runtime) == 1 and runtime[0].startswith("float32; threads: torch"), result.stderr
    assert os.path.exists(tmp_path / "kernel_choices.json")  # the choices were measured all the same


def _poll(folder, col, model: str, *flags: str):
    result = runner.invoke(app, ["watch", str(folder), "-c", str(col), "--model", model, "--device", "cpu",
                                 "--settle-polls", "1", "--polls", "1", *flags])
    assert result.exit_code == 0, (result.stderr, result.exception)
    _quiet(result.stderr)
    return result


def test_watch_verbose_names_each_file_embedded_moved_and_removed_and_json_carries_them(model, tmp_path,
                                                                                        fresh_kernel_cache):
    folder, col = tmp_path / "photos", tmp_path / "col"
    folder.mkdir()
    a, b = scene_image(folder / "a.png", 1), scene_image(folder / "b.png", 2)
    first = _poll(folder, col, model, "-v")
    names = {line for line in first.stderr.splitlines() if line.startswith(("embedded ", "moved ", "removed "))}
    assert names == {f"embedded {a.resolve()}", f"embedded {b.resolve()}"}, first.stderr
    os.rename(a, folder / "renamed.png")  # a move keeps size and mtime: its vectors are reused
    b.unlink()
    second = _poll(folder, col, model, "-v")
    assert "synced: 0 embedded, 1 reused, 2 removed" in second.stderr  # counts as before ...
    lines = [line for line in second.stderr.splitlines() if line.startswith(("embedded ", "moved ", "removed "))]
    assert sorted(lines) == [f"moved {a.resolve()} -> {(folder / 'renamed.png').resolve()}",  # ... then each file
                             f"removed {b.resolve()}"], second.stderr
    quiet = _poll(folder, col, model)  # without -v: counts only
    assert not [line for line in quiet.stderr.splitlines() if line.startswith(("embedded ", "moved ", "removed "))]
    scene_image(folder / "c.png", 3)
    (folder / "renamed.png").rename(folder / "again.png")
    report = json.loads(_poll(folder, col, model, "--json").stdout.splitlines()[-1])["index"]
    assert [os.path.basename(uri) for uri in report["embedded_files"]] == ["c.png"]
    assert [(os.path.basename(m["from"]), os.path.basename(m["to"])) for m in report["moved_files"]] == [
        ("renamed.png", "again.png")]
    assert [os.path.basename(uri) for uri in report["removed_files"]] == ["renamed.png"]
