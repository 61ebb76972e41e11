"""Progress a person can watch: `index` reports after every embedded batch (not only when a
chunk commits), with rates, the share removed and an ETA; when stderr is not a terminal the
commands print plain progress lines (interval from FASTE_MM_PROGRESS_INTERVAL, 0 in tests, so
no test sleeps); model loading is our own status line, never transformers' bar; Ctrl-C during
`index` says what was kept and exits 130."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from faste_mm import BatchingConfig, Embedder
from faste_mm.cli.app import app
from faste_mm.cli.progress import Progress
from faste_mm.indexers import Collection
from faste_mm.indexers.crash_points import CRASH_ENV, SIGNAL_ENV
from faste_mm.retrieval.results import IndexOptions
from faste_mm.retrieval.retriever import Retriever

from tests.helpers.eval_fixtures import eval_data_dir, eval_model_dir  # noqa: F401  (fixtures)
from tests.helpers.cli import committed_items
from tests.helpers.warm_process import run_cli
from tests.helpers.inputs import noise_image, tiny_vl_dir

runner = CliRunner()


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(tiny_vl_dir(tmp_path_factory.getbasetemp()))


def _images(folder: Path, n: int, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        noise_image(folder / f"{i:03d}.png", (64, 64), seed + i)
    return folder


def test_index_progress_advances_per_embedded_batch_before_the_chunk_commits(model, tmp_path):
    folder = _images(tmp_path / "imgs", 6)
    # A token budget below one item: one item per batch, six batches inside the one chunk.
    embedder = Embedder.from_pretrained(model, device="cpu", batching=BatchingConfig(batch_tokens=1))
    seen = []
    report = Retriever(embedder, collection=tmp_path / "col", r_max=0.5).index(
        [folder], options=IndexOptions(chunk_files=64), progress=seen.append)
    in_flight = [p for p in seen if p.files_done == 0 and p.embedded > 0]
    assert len(in_flight) >= 2  # batch by batch, while nothing is committed yet
    shares = [p.fraction for p in seen]
    assert shares == sorted(shares) and 0 < in_flight[0].fraction < 1 and in_flight[0].eta_s is not None
    embedded = [p.embedded for p in in_flight]
    assert embedded == sorted(embedded) and embedded[-1] <= report.embedded
    # The counts in flight agree with the run's totals once it has committed.
    last = seen[-1]
    assert (last.files_done, last.embedded, last.prefix_tokens, last.kept_prefix_tokens, last.fraction) == (
        6, report.embedded, report.prefix_tokens, report.kept_prefix_tokens, 1.0)
    assert 0 < in_flight[0].prefix_tokens < report.prefix_tokens and in_flight[0].prefix_removal > 0


def test_index_prints_plain_progress_lines_and_its_own_model_status_when_stderr_is_a_pipe(model, tmp_path):
    folder = _images(tmp_path / "imgs", 5)
    args = ["index", str(folder), "-c", str(tmp_path / "col"), "--model", model, "--device", "cpu",
            "--batch-tokens", "1", "--format", "json"]
    result = runner.invoke(app, args, env={"FASTE_MM_PROGRESS_INTERVAL": "0"})
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("indexing:")]
    assert len(lines) >= 4  # the start, each batch, the commit
    assert all("items/s" in line and "tok/s" in line and "removed" in line for line in lines)
    assert any("ETA" in line for line in lines) and lines[-1].startswith("indexing: 5/5 files")
    assert f"loading model {Path(model).resolve()}" in result.stderr and "Loading weights" not in result.stderr
    assert json.loads(result.stdout)["embedded"] == 5  # stdout carries the result only


def test_plain_lines_are_printed_at_most_once_per_interval_and_always_at_the_end():
    from io import StringIO

    from rich.console import Console

    out = StringIO()
    progress = Progress(Console(file=out, soft_wrap=True), live=False, interval=3600)
    with progress:
        progress.start("work", 10, unit="items")
        for _ in range(10):
            progress.advance(1, detail="fast")
    lines = out.getvalue().splitlines()
    assert lines == ["work: 1/10 items  fast  elapsed 0:00  ETA 0:00", "work: 10/10 items  fast  elapsed 0:00"]


def test_ctrl_c_during_index_says_what_was_kept_and_exits_130(model, tmp_path):
    """The indexer sends itself SIGINT (Ctrl-C) right after its first chunk commit: a named crash
    point with FASTE_MM_CRASH_SIGNAL, no polling."""
    n_files = 12
    folder = _images(tmp_path / "imgs", n_files, seed=500)
    col = tmp_path / "col"
    args = ["index", str(folder), "-c", str(col), "--model", model, "--device", "cpu", "--chunk-files", "2"]
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    env.update({CRASH_ENV: "add-after-commit#1", SIGNAL_ENV: "SIGINT"})
    # forked from the warm process of tests/helpers/warm_process.py (Ctrl-C raises KeyboardInterrupt there, as in a terminal)
    proc = run_cli(args, env=env, timeout=300)
    err = proc.stderr
    assert proc.returncode == 130, err[-2000:]
    committed = committed_items(col)
    assert 2 <= committed < n_files
    assert f"interrupted: {committed} of {n_files} files committed; run the same command again to continue" in err
    assert "Traceback" not in err
    report = json.loads(runner.invoke(app, ["index", str(folder), "-c", str(col), "--format", "json"]).stdout)
    assert report["embedded"] == n_files - committed
    assert Collection.open(col).info().n_ok == n_files


def _plain(args: list[str], env: dict | None = None):
    result = runner.invoke(app, args, env={"FASTE_MM_PROGRESS_INTERVAL": "0", **(env or {})})
    assert result.exit_code == 0, result.output
    assert "loading model" in result.stderr and "Loading weights" not in result.stderr
    return [line for line in result.stderr.splitlines() if "elapsed" in line]


def test_bench_prints_a_plain_line_per_run_of_each_setting(model_dirs):
    lines = _plain(["bench", "--model", str(model_dirs["qwen3"]), "--inputs", "text:8", "--n", "2", "--r-max", "0,0.5",
                    "--trigger-layer", "2", "--repeats", "2", "--device", "cpu"])
    for name in ("full", "faste r=0.5"):
        runs = [line for line in lines if line.startswith(f"bench {name} (warm-up + 2 runs):")]
        assert [line.split(": ")[1].split()[0] for line in runs] == ["1/3", "2/3", "3/3"], lines


def test_calibrate_prints_plain_lines_up_to_every_document(model_dirs, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"{i}.txt").write_text(f"document number {i} about pages " * (i + 1))
    lines = _plain(["calibrate", str(docs), "--model", str(model_dirs["qwen3"]), "--device", "cpu", "--warmup-layer", "1",
                    "--batch-tokens", "1", "--out", str(tmp_path / "r")])
    counts = [line.split(": ")[1].split()[0] for line in lines if line.startswith("calibrating:")]
    assert counts == ["1/3", "2/3", "3/3"], lines  # one batch per document (a token budget below one)


def test_eval_prints_plain_lines_for_each_phase(eval_model_dir, eval_data_dir, tmp_path):
    lines = _plain(["eval", "nights", "--data", str(eval_data_dir), "--model", str(eval_model_dir), "--device", "cpu",
                    "--r-max", "0", "--limit", "2", "--out", str(tmp_path / "run")])
    phases = {line.split(": ")[0] for line in lines}
    assert any("queries" in phase for phase in phases) and any("candidates" in phase for phase in phases), lines


# ---- what a person sees at 80 columns (helper ux) ---------------------------------------------
def _terminal(width: int = 80):
    import io

    from rich.console import Console

    return Console(file=io.StringIO(), force_terminal=True, width=width, color_system=None, legacy_windows=False)


def _screen(console) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", console.file.getvalue())


def test_the_live_bar_keeps_its_bar_count_elapsed_and_eta_at_80_columns():
    console = _terminal(80)
    rates = "3200 items  41.3 items/s  52310 tok/s  removed 47%"
    with Progress(console, live=True) as progress:
        progress.start("indexing", 159, unit="files committed")
        progress.update(32, detail=rates, share=0.2)
    screen = _screen(console)
    assert "━" in screen  # the bar
    assert "indexing: 32/159 files committed  elapsed 0:00  ETA 0:00" in screen
    assert "…" not in screen and "..." not in screen
    for word in rates.split():  # the rates fold onto the next line, whole
        assert word in screen


@pytest.mark.parametrize("columns", [60, 72, 80, 81, 90, 100])
def test_the_live_bar_never_splits_a_number_from_its_unit(columns):
    # "16 items" once straddled the wrap at 80 columns: "... 16" / "items ...". Each group the line
    # is made of (two spaces apart) must stay on one screen line at every width.
    rates = "16 items  1.3 items/s  205 tok/s  removed 50%  tower 19%"
    console = _terminal(columns)
    with Progress(console, live=True) as progress:
        progress.start("indexing", 21, unit="files committed")
        progress.update(16, detail=rates, share=0.7)
    lines = [line.strip() for line in _screen(console).splitlines()]
    for group in ["16/21 files committed", *rates.split("  ")]:
        assert any(group in line for line in lines), (group, lines)


def test_a_warning_logged_while_the_bar_is_live_prints_above_it_not_into_it():
    import logging

    from faste_mm.cli.common import setup_logging

    console = _terminal(80)
    setup_logging(debug=False)
    try:
        with Progress(console, live=True) as progress:
            progress.start("indexing", 10, unit="files committed")
            progress.update(3)
            logging.getLogger("faste_mm.scale.resources").warning("Ray run stalled: decoding waits for 1 CPU")
            progress.update(4)
    finally:
        logging.getLogger().handlers.clear()
    lines = _screen(console).splitlines()
    assert any(line.strip() == "WARNING: Ray run stalled: decoding waits for 1 CPU" for line in lines), lines


def test_a_piped_table_never_splits_a_path():
    from rich.table import Table

    from faste_mm.cli.common import stdout

    deep = "/data/" + "/".join(f"folder-number-{i}" for i in range(8)) + "/a-long-file-name-0001.png"
    table = Table(title="1 results")
    for column in ("rank", "score", "file", "page"):
        table.add_column(column, overflow="fold")
    table.add_row("1", "0.9876", deep, "")
    with stdout.capture() as captured:
        stdout.print(table)
    assert deep in captured.get()
