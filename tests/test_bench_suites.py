"""The one benchmark tool (faste_mm.bench, issue 34): every suite runs at a toy size through the
entry point and writes the one result schema (commit, command, device, CPU flags, dtype, torch,
threads, load at start and end, params, machine, rows), to --out and --format json alike. No
figure is asserted: these check that each suite still runs and reports, not how fast it is.

The suites that start processes or servers (a model import each: 15-75 s a test on a loaded
2-core machine), and the cpu suite and the library's OCR part (GEMM rates, the OCR engine), run
only with FASTE_MM_BENCH_SMOKE=all; the other in-process ones always run."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from faste_mm.bench import SUITES
from faste_mm.bench.entry import run_suite
from faste_mm.bench.schema import RECORDED_CPU_FLAGS, SCHEMA, BenchResult
from faste_mm.cli.app import app
from tests.helpers.tiny_models import tiny_model_dir

SCHEMA_FIELDS = {f.name for f in fields(BenchResult)}
processes = pytest.mark.skipif(os.environ.get("FASTE_MM_BENCH_SMOKE") != "all",
                               reason="starts processes or servers (slow): set FASTE_MM_BENCH_SMOKE=all")
slow = pytest.mark.skipif(os.environ.get("FASTE_MM_BENCH_SMOKE") != "all",
                          reason="GEMM rates or the OCR engine (30-70 s on a loaded 2-core machine): set FASTE_MM_BENCH_SMOKE=all")


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Suites set torch's threads (--threads): the next test gets this process's own back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory.getbasetemp(), "qwen3_vl_reranker", num_layers=4)


def _run(suite: str, args: list[str], tmp_path: Path, capsys) -> dict:
    out = tmp_path / f"{suite}.json"
    run_suite(suite, [*args, "--out", str(out), "--format", "json"])
    printed = json.loads(capsys.readouterr().out)
    written = json.loads(out.read_text())
    assert printed == written
    assert set(written) == SCHEMA_FIELDS and written["schema"] == SCHEMA and written["suite"] == suite
    assert set(written["cpu_flags"]) == set(RECORDED_CPU_FLAGS) and all(isinstance(v, bool) for v in written["cpu_flags"].values())
    assert len(written["load_start"]) == len(written["load_end"]) == 3 and written["cores"] >= 1
    assert written["command"].startswith(f"faste-mm bench {suite}") and written["rows"]
    assert isinstance(written["machine"], dict) and isinstance(written["params"], dict)
    return written


def test_every_suite_has_a_smoke_test_here():
    tested = {name.removeprefix("test_").removesuffix("_suite").replace("_", "-")
              for name in globals() if name.startswith("test_") and name.endswith("_suite")}
    assert set(SUITES) - {"model"} == tested  # the model suite: tests/test_bench.py


def test_search_suite(tmp_path, capsys):
    result = _run("search", ["--n", "300", "--d", "16", "--queries", "4", "--k", "3"], tmp_path, capsys)
    assert result["rows"][0]["n"] == 300 and 0 <= result["rows"][0]["recall_at_k"] <= 1


def test_scale_suite(tmp_path, capsys):
    args = ["--n", "400", "--dim", "16", "--queries", "40", "--filtered-queries", "4", "--configs", "float,binary",
            "--no-lancedb", "--workdir", str(tmp_path / "work")]
    result = _run("scale", args, tmp_path, capsys)
    configs = {row["config"] for row in result["rows"]}
    assert {"float", "binary", "binary rescore 0", "raw-faiss float"} <= configs


def test_tower_attention_suite(tmp_path, capsys):
    args = ["--tokens", "64", "--heads", "2", "--head-dim", "8", "--block", "32", "--threads", "1", "--repeats", "1",
            "--tower-depth", "1"]
    result = _run("tower-attention", args, tmp_path, capsys)
    assert {row["piece"] for row in result["rows"]} >= {"SDPA float32", "whole tower"}


def test_pixels_suite(tmp_path, capsys, model_dirs):
    args = ["--model", str(model_dirs["qwen3_vl"]), "--n", "1", "--photo", "64x48", "--page", "100x140",
            "--max-pixels", "50176,12544", "--dtypes", "float32", "--repeats", "1"]
    result = _run("pixels", args, tmp_path, capsys)
    assert {(row["kind"], row["max_pixels"]) for row in result["rows"]} == {
        (kind, cap) for kind in ("photo", "page") for cap in (50176, 12544)}


def test_batch_tokens_suite(tmp_path, capsys, model_dirs):
    args = ["--model", str(model_dirs["qwen3_vl"]), "--inputs", "text:16", "--n", "2", "--budgets", "256,128",
            "--repeats", "1", "--dtype", "float32"]
    result = _run("batch-tokens", args, tmp_path, capsys)
    assert [row["batch_tokens"] for row in result["rows"]] == [256, 128] and result["dtype"] == "float32"


def test_patch_dedup_suite(tmp_path, capsys, model_dirs):
    args = ["--model", str(model_dirs["qwen3_vl"]), "--dtype", "float32", "--max-pixels", "65536", "--repeats", "1",
            "--kinds", "text-page,slide", "--workdir", str(tmp_path / "work")]
    result = _run("patch-dedup", args, tmp_path, capsys)
    assert [row["kind"] for row in result["rows"]] == ["text-page", "slide", "all"]
    for row in result["rows"]:
        assert set(row["pages_per_s"]) == {"neither", "dedup", "faste", "both", "hf"} and 0 < row["patches_kept"] < 1
    assert result["rows"][-1]["patch_units"] == [sum(row["patch_units"][i] for row in result["rows"][:2]) for i in (0, 1)]


def test_rerank_suite(tmp_path, capsys, reranker_dir):
    args = ["--model", str(reranker_dir), "--inputs", "text:16", "--top", "2", "--r-max", "0.5", "--protect", "none",
            "--prefix-reuse", "off", "--repeats", "1", "--dtype", "float32"]
    result = _run("rerank", args, tmp_path, capsys)
    assert [row["setting"] for row in result["rows"]][:2] == ["official (HF forward, padded)", "faste-mm full"]


@processes
def test_rerank_e2e_suite(tmp_path, capsys, reranker_dir):
    args = ["--model", str(reranker_dir), "--device", "cpu", "--dtype", "float32", "--pages", "1", "--page", "100x140",
            "--repeats", "1"]
    result = _run("rerank-e2e", args, tmp_path, capsys)
    assert len(result["rows"]) == 4 and result["rows"][0]["x_official"] == pytest.approx(1.0)


def test_rerank_warm_suite(tmp_path, capsys, reranker_dir):
    args = ["--model", str(reranker_dir), "--inputs", "image:64x48", "--n", "2", "--repeats", "1", "--dtype", "float32"]
    result = _run("rerank-warm", args, tmp_path, capsys)
    assert [row["contender"] for row in result["rows"]] == ["tails off", "tails on"]


def test_video_suite(tmp_path, capsys, model_dirs):
    args = ["--model", str(model_dirs["qwen3_vl"]), "--seconds", "1", "--repeats", "1", "--trigger-layer", "2"]
    result = _run("video", args, tmp_path, capsys)
    assert {row["setting"] for row in result["rows"]} == {"full", "faste r=0.5", "faste r=0.7"}


def test_query_tokens_suite(tmp_path, capsys, model_dirs):
    result = _run("query-tokens", ["--model", str(model_dirs["qwen3_vl"]), "--mib", "0.01"], tmp_path, capsys)
    assert result["rows"][0]["same_tokens"] is True


@processes
def test_peers_suite(tmp_path, capsys):
    args = ["--scale-hidden", "0.0625", "--photos", "1", "--pages", "0", "--texts", "1", "--text-tokens", "16",
            "--repeats", "1", "--peers", "faste-mm,official", "--threads", "1"]
    result = _run("peers", args, tmp_path, capsys)
    assert {row["peer"] for row in result["rows"]} == {"faste-mm", "official"}


def test_startup_suite(tmp_path, capsys):
    result = _run("startup", ["--repeats", "1"], tmp_path, capsys)
    assert [row["command"] for row in result["rows"]] == ["--help", "--version", "info"]


@processes
def test_pdf_memory_suite(tmp_path, capsys):
    result = _run("pdf-memory", ["--pages", "1", "--max-pixels", "4096"], tmp_path, capsys)
    assert result["rows"][0]["pages"] == 1 and result["rows"][0]["peak_rss_mb"] > 0


@processes
def test_time_estimate_suite(tmp_path, capsys):
    result = _run("time-estimate", ["--items", "10", "--runs", "1", "--max-pixels", "4096"], tmp_path, capsys)
    row = result["rows"][0]
    assert row["embedded"] == row["items"] == 10
    assert row["error"] == pytest.approx(row["estimated_s"] / row["measured_s"] - 1, abs=0.01)


@processes
def test_serve_suite(tmp_path, capsys, model_dirs):
    args = ["--model", str(model_dirs["qwen3_vl"]), "--concurrency", "1", "--requests", "1", "--words", "5",
            "--warmup", "0", "--threads", "1"]
    result = _run("serve", args, tmp_path, capsys)
    assert result["rows"][0]["requests"] == 1


@processes
def test_serve_load_suite(tmp_path, capsys, model_dirs):
    args = ["--model", str(model_dirs["qwen3_vl"]), "--images", "2", "--clients", "2", "--seconds", "1", "--max-requests", "4"]
    result = _run("serve-load", args, tmp_path, capsys)
    assert 1 <= result["rows"][0]["requests"] <= 4


@processes
def test_ray_suite(tmp_path, capsys, model_dirs):
    pytest.importorskip("ray")
    args = ["--model", str(model_dirs["qwen3_vl"]), "--n", "2", "--size", "32", "--repeats", "1", "--runs", "plain",
            "--ray-cpus", "1", "--work", str(tmp_path / "work")]
    result = _run("ray", args, tmp_path, capsys)
    assert result["rows"][0]["run"] == "plain" and result["rows"][0]["items"] == 2


@processes
def test_client_suite(tmp_path, capsys):
    pytest.importorskip("fastapi", reason="needs the serve extra")
    result = _run("client", ["--images", "3", "--repeats", "1", "-k", "2"], tmp_path, capsys)
    rows = {row["contender"]: row for row in result["rows"]}
    assert set(rows) == {f"{command}: {path}" for command in ("search", "info", "explain")
                         for path in ("server", "no-server")} | {"search: http only (this process)"}
    assert all(row["same_as_no_server"] for row in rows.values())


@slow
def test_cpu_suite(tmp_path, capsys, model_dirs):
    args = ["--model", str(model_dirs["qwen3_vl"]), "--kinds", "image:64x48:1,text:16:1", "--settings", "float32,bfloat16,hf",
            "--repeats", "1", "--workdir", str(tmp_path / "work")]
    result = _run("cpu", args, tmp_path, capsys)
    assert [row["kind"] for row in result["rows"]] == ["image", "text"] and result["machine"]["matmul_rates"]
    assert all(set(row["forward_s"]) == {"float32", "bfloat16", "hf"} and row["speedup_vs_float32"]["float32"] == 1.0
               and row["check_cost_bfloat16"] for row in result["rows"])
    image = result["rows"][0]  # each contender's tower seconds, transformers' by hooks on its tower
    assert image["tower_s"]["hf"] > 0 and image["tower_s"]["bfloat16"] > 0 and set(image["matmul_rates"]["bfloat16"]) == {"before", "after"}


def test_threads_suite(tmp_path, capsys, model_dirs, monkeypatch):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    args = ["--model", str(model_dirs["qwen3_vl"]), "--dtype", "float32", "--kinds", "text:20:2", "--rounds", "1",
            "--threads", "1", "--workers", "0", "--budgets", "512"]
    result = _run("threads", args, tmp_path, capsys)
    row = result["rows"][0]
    assert row["plan"] == result["params"]["settings"][0] and row["winner"] in row["seconds"]
    assert result["params"]["machine_plan"]["cores"] == result["cores"]
    assert not list(temporary.iterdir())  # without --workdir its folder (inputs, a model) went with the run


def test_cpu_suite_leaves_int8_out_where_the_cpu_refuses_it_and_says_why(tmp_path, capsys, model_dirs, monkeypatch):
    from faste_mm.tools import roofline

    monkeypatch.setattr("faste_mm.model.backbones.loading.read_cpu_flags", lambda: frozenset({"avx2", "fma"}))
    small = roofline.measure_rates
    monkeypatch.setattr(roofline, "measure_rates", lambda device, dtypes: small(device, dtypes, size=64, budget_s=0.01))
    args = ["--model", str(model_dirs["qwen3_vl"]), "--kinds", "text:16:1", "--settings", "float32,int8", "--repeats", "1",
            "--workdir", str(tmp_path / "work")]
    result = _run("cpu", args, tmp_path, capsys)
    # only the dtypes the contenders that ran are read against
    assert set(result["rows"][0]["forward_s"]) == {"float32"} and set(result["machine"]["matmul_rates"]) == {"float32"}
    assert "needs an x86 CPU with int8 dot products" in result["params"]["not_run"]["int8"]


def test_cpu_suite_refuses_settings_without_the_float32_baseline(capsys):
    with pytest.raises(SystemExit) as exit_:
        run_suite("cpu", ["--model", "unused", "--settings", "bfloat16,hf"])
    assert exit_.value.code == 1 and "must include float32" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_suite("cpu", ["--model", "unused", "--settings", "float32,fp8"])
    assert "--settings fp8: unknown" in capsys.readouterr().err


def test_library_suite(tmp_path, capsys):
    args = ["--parts", "duplicates,watch", "--n", "300", "--dim", "8", "--files", "10", "--idle-s", "0.05", "--interval-s", "0.01"]
    result = _run("library", args, tmp_path, capsys)
    rows = {row["part"]: row for row in result["rows"]}
    assert set(rows) == {"duplicates", "watch"} and rows["duplicates"]["n"] == 300 and rows["watch"]["n_files"] == 10


@slow
def test_library_ocr_part(tmp_path, capsys):
    pytest.importorskip("rapidocr_onnxruntime", reason="needs the ocr extra")
    result = _run("library", ["--parts", "ocr", "--photos", "1", "--pages", "1", "--repeats", "1"], tmp_path, capsys)
    assert result["rows"][0]["n_photos"] == 3 and result["rows"][0]["page_s"] > 0


def test_library_suite_names_an_unknown_part(capsys):
    with pytest.raises(SystemExit) as exit_:
        run_suite("library", ["--parts", "ocr,speed"])
    assert exit_.value.code == 1 and "--parts speed: unknown" in capsys.readouterr().err


def test_photos_suite(tmp_path, capsys):
    args = ["--photos", "2", "--photo-size", "64x48", "--n", "300", "--dim", "8", "--queries", "2", "--repeats", "1"]
    result = _run("photos", args, tmp_path, capsys)
    cases = [row["case"] for row in result["rows"]]
    assert cases[:2] == ["per photo: facts", "per photo: sha256"] and len(cases) == 2 + 1 + 3


def test_album_refresh_suite(tmp_path, capsys):
    result = _run("album-refresh", ["--n", "300", "--new", "40", "--dim", "16", "--rounds", "2"], tmp_path, capsys)
    (row,) = result["rows"]
    assert (row["n"], row["albums"], row["new"]) == (300, 3, 40)
    assert 0 < row["refresh_min_ms"] <= row["refresh_ms"] <= row["refresh_max_ms"]
    assert row["ms_per_item"] == pytest.approx(row["refresh_ms"] / 40)


def test_query_words_suite(tmp_path, capsys):
    result = _run("query-words", ["--rounds", "2"], tmp_path, capsys)
    rows = {row["query"]: row for row in result["rows"]}
    assert rows["beach in Lisbon last summer"]["understood"] == "understood: place Lisbon · taken 2024-06..2024-08 · 'beach'"
    assert rows["china plates"]["understood"] == "(meaning) 'china plates'" and result["params"]["rounds"] == 2


def test_photos_suite_refuses_a_bad_photo_size(capsys):
    with pytest.raises(SystemExit) as exit_:
        run_suite("photos", ["--photo-size", "big"])
    assert exit_.value.code == 1 and "--photo-size big" in capsys.readouterr().err


def test_a_bad_option_is_a_usage_error_naming_it(capsys):
    with pytest.raises(SystemExit) as exit_:
        run_suite("search", ["--n", "10", "--frobnicate"])
    assert exit_.value.code == 2 and "--frobnicate" in capsys.readouterr().err


def test_a_missing_out_folder_is_refused_before_the_suite_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_suite("search", ["--n", "10", "--out", str(tmp_path / "missing" / "r.json")])
    assert exit_.value.code == 2 and "does not exist" in capsys.readouterr().err


def test_a_suite_error_exits_1_with_the_message(capsys):
    with pytest.raises(SystemExit) as exit_:
        run_suite("serve-load", ["--clients", "0"])
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and "--clients" in err and "Traceback" not in err


def test_faste_mm_bench_runs_a_suite_and_lists_them_all():
    listed = CliRunner().invoke(app, ["bench", "--help"])
    assert listed.exit_code == 0 and all(suite in listed.stdout for suite in SUITES)
    helped = CliRunner().invoke(app, ["bench", "search", "--help"])
    assert helped.exit_code == 0 and "--index-type" in helped.stdout and "--out" in helped.stdout


def test_the_plots_draw_from_committed_results_and_refuse_other_json(tmp_path):
    from faste_mm.bench.plots import speedup_plot
    from faste_mm.errors import ConfigError

    committed = Path(__file__).resolve().parents[1] / "docs" / "bench" / "archive" / "cpu_qwen3-embedding-0.6b_scale0.5_text1000.json"
    assert speedup_plot([committed], tmp_path / "speedup.png").read_bytes()[:4] == b"\x89PNG"
    other = tmp_path / "other.json"
    other.write_text('{"hits": []}')
    with pytest.raises(ConfigError, match="other.json: neither a faste-mm bench result"):
        speedup_plot([other], tmp_path / "no.png")
