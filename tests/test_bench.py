"""`faste-mm bench`: arithmetic, shape presets against published sizes, and a tiny end-to-end run."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from faste_mm.bench.model import BenchConfig, SettingResult, Timing, _relative_to, flops_implied_speedup
from faste_mm.tools.shapes import SHAPES, build_config
from faste_mm.cli.app import app
from faste_mm.errors import ConfigError
from faste_mm.model.backbones.loading import read_cpu_flags
from faste_mm.model.cpu.int8 import CPU_INT8_FLAGS


def test_flops_implied_speedup_and_timing_summary():
    assert flops_implied_speedup(0.0) == 1.0
    assert flops_implied_speedup(0.5) == 2.0
    assert flops_implied_speedup(0.75) == 4.0
    assert Timing.of([3.0, 1.0, 2.0, 10.0]) == Timing(median=2.5, min=1.0, max=10.0)


def test_speedups_and_realisation_are_relative_to_the_full_forward():
    full = SettingResult("full", 0.0, 10, 1000, Timing(2.0, 2.0, 2.0), Timing(4.0, 4.0, 4.0), 100)
    fast = SettingResult("faste", 0.5, 10, 1000, Timing(1.25, 1.0, 1.5), Timing(2.5, 2.0, 3.0), 90, flops_implied_speedup=2.0)
    result = _relative_to(fast, full, 0.01)
    assert result.forward_speedup == 1.6 and result.e2e_speedup == 1.6
    assert result.realisation == 0.8  # 1.6 measured of 2.0 implied
    assert result.e2e_over_forward == 1.0
    assert result.items_per_s == 4.0 and result.tokens_per_s == 400.0
    with_vision = _relative_to(replace(fast, flops_implied_speedup_with_vision=1.25), full, 0.01)
    assert with_vision.realisation_with_vision == 1.28  # 1.6 measured of 1.25 implied for the whole forward


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_shape_presets_match_published_parameter_counts_within_2_percent(name):
    import torch
    from transformers import AutoModel

    preset = SHAPES[name]
    with torch.device("meta"):  # counted without memory
        model = AutoModel.from_config(build_config(preset))
    n_params = sum(p.numel() for p in model.parameters())
    assert abs(n_params - preset.published_params) / preset.published_params < 0.02


def test_scale_hidden_keeps_layers_and_head_structure():
    config = build_config(SHAPES["qwen3-vl-embedding-2b"], 0.25).text_config
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (28, 16, 8)
    assert config.head_dim == 32 and config.hidden_size == 512
    assert sum(config.rope_parameters["mrope_section"]) == config.head_dim // 2


def test_bench_config_validation_names_the_field():
    with pytest.raises(ConfigError, match="compare"):
        BenchConfig(compare=("onnx",))
    with pytest.raises(ConfigError, match="r_max"):
        BenchConfig(r_max=(0.5, 1.2))


def test_tiny_bench_run_writes_valid_json(tmp_path):
    pytest.importorskip("sentence_transformers")
    out = tmp_path / "bench.json"
    args = ["bench", "--shape", "qwen3-embedding-0.6b", "--scale-hidden", "0.0625", "--inputs", "text:48", "--n", "4"]
    # float32: an exactness check (auto is bfloat16 on a CPU with native bf16, where paths round apart)
    args += ["--r-max", "0.5", "--trigger-layer", "6", "--repeats", "1", "--device", "cpu", "--dtype", "float32",
             "--compare", "hf,sentence-transformers"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    names = [s["name"] for s in report["rows"]]
    assert names == ["full", "faste r=0.5", "hf", "sentence-transformers"]
    full, fast, hf, st = report["rows"]
    assert fast["mean_trigger_layer"] == 6 and abs(fast["prefix_removal"] - 0.5) < 0.05
    assert fast["flops_implied_speedup"] == pytest.approx(1 / (1 - fast["flops_reduction"]))
    assert fast["realisation"] == pytest.approx(fast["forward_speedup"] / fast["flops_implied_speedup"])
    assert hf["max_abs_diff_vs_full"] < 1e-5 and st["max_abs_diff_vs_full"] < 1e-5  # same vectors
    assert all(s["items"] == 4 and s["peak_memory_bytes"] > 0 for s in report["rows"])
    assert report["params"]["memory_kind"] in ("heap_allocated", "rss") and report["device"].startswith("CPU")
    assert report["schema"] == "faste-mm-bench/1" and report["suite"] == "model" and report["dtype"] == "float32"
    assert set(report["cpu_flags"]) >= {"avx2", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8"}
    assert len(report["load_start"]) == len(report["load_end"]) == 3 and report["threads"] >= 1


def test_bench_on_images_of_a_local_model(model_dirs, tmp_path):
    args = ["bench", "--model", str(model_dirs["qwen3_vl"]), "--inputs", "image:96x64", "--n", "3", "--r-max", "0.3"]
    result = CliRunner().invoke(app, [*args, "--trigger-layer", "2", "--repeats", "1", "--device", "cpu", "--compare", "hf", "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["rows"][2]["max_abs_diff_vs_full"] < 1e-5
    full, fast = report["rows"][:2]
    # the roofline: GEMM rates per dtype, each stage's FLOPs over its seconds against the rate
    rates = report["params"]["matmul_rates"]
    assert set(rates) == {report["dtype"]}  # only the dtype the stages are read against is calibrated
    assert all(r["tflops"] > 0 for r in rates.values())
    for stage in ("tower", "decoder"):
        rate = full["roofline"][stage]
        assert rate["tflops"] == pytest.approx(rate["flops"] / rate["seconds"] / 1e12)
        assert rate["fraction"] == pytest.approx(rate["tflops"] / rates[report["dtype"]]["tflops"])
    assert 0 < report["params"]["check_cost"]["share"] == pytest.approx(
        report["params"]["check_cost"]["check_s"] / report["params"]["check_cost"]["layer_s"])
    assert fast["prefix_removal"] == pytest.approx(0.3, abs=0.05)
    # images: the whole forward's implied speedup counts the vision tower FastE leaves alone
    assert 0 < full["vision_flops_share"] == fast["vision_flops_share"] < 1
    assert 1 < fast["flops_implied_speedup_with_vision"] < fast["flops_implied_speedup"]
    assert fast["realisation_with_vision"] == pytest.approx(fast["forward_speedup"] / fast["flops_implied_speedup_with_vision"])
    table = CliRunner().invoke(app, args + ["--trigger-layer", "2", "--repeats", "1", "--device", "cpu"])
    assert table.exit_code == 0 and "realisation, with vision" in table.stdout
    assert "GEMM rate: float32" in table.stdout and "of the measured GEMM rate" in table.stdout
    assert "FastE check (not firing)" in table.stdout


def test_bench_needs_exactly_one_model_source():
    result = CliRunner().invoke(app, ["bench"])
    assert result.exit_code == 1 and "exactly one of --model" in result.output


def test_bench_compares_unpadded_layouts_on_variable_length_texts(model_dirs, tmp_path):
    args = ["bench", "--model", str(model_dirs["qwen3"]), "--inputs", "text:20-60", "--n", "5", "--r-max", "0.5"]
    args += ["--trigger-layer", "2", "--unpadded", "off,segments", "--workers", "1", "--repeats", "1", "--device", "cpu",
             "--format", "json", "--out", str(tmp_path / "bench.json")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "bench.json").read_text())
    assert result.stdout.lstrip().startswith("{"), f"stdout is not the JSON report alone: {result.stdout[:500]!r}"
    assert json.loads(result.stdout).keys() == report.keys()  # stdout carries the same report, nothing else
    full, padded, packed = report["rows"]
    assert [s["name"] for s in report["rows"]] == ["full", "faste r=0.5 [off]", "faste r=0.5 [segments]"]
    assert padded["attention"] == {"padded": 1} and packed["attention"] == {"segments": 1}
    assert (padded["unpadded"], packed["unpadded"]) == ("off", "segments")
    assert abs(padded["max_abs_diff_vs_full"] - packed["max_abs_diff_vs_full"]) < 1e-5  # same vectors
    assert report["params"]["batching"]["unpadded"] == "auto" and report["params"]["batching"]["worker_threads"] == 1


def test_text_length_ranges_are_drawn_within_the_bounds(tmp_path):
    from transformers import AutoTokenizer

    from faste_mm.bench.inputs import make_inputs
    from faste_mm.testing import qwen_tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    texts = make_inputs("text:20-40", 12, tmp_path, tokenizer)
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    assert all(18 <= n <= 42 for n in lengths) and len(set(lengths)) > 3  # decode/re-encode may shift by a token
    with pytest.raises(ConfigError, match="MIN <= MAX"):
        make_inputs("text:40-20", 2, tmp_path, tokenizer)


def test_bench_refuses_bad_comparisons_specs_and_paths_before_any_timed_run(model_dirs, tmp_path, monkeypatch):
    from faste_mm.bench import model as bench

    measured = []
    monkeypatch.setattr(bench, "_measure", lambda *a, **k: measured.append(a[0]) or (_ for _ in ()).throw(AssertionError))
    base = ["bench", "--model", str(model_dirs["qwen3_vl"]), "--n", "2", "--repeats", "1", "--device", "cpu"]
    cases = [
        (["--inputs", "image:64x64", "--compare", "sentence-transformers"], "text models and text inputs"),
        (["--inputs", "image:64x64x3"], "expected image:WIDTHxHEIGHT"),
        (["--inputs", "text:20", "--unpadded", "off,xformers"], "unpadded must be one of"),
    ]
    for extra, message in cases:
        result = CliRunner().invoke(app, [*base, *extra])
        output = " ".join(result.output.split())  # the console wraps long messages
        assert result.exit_code == 1 and message in output and "Traceback" not in output, result.output
    assert measured == []
    missing_folder = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "missing" / "out.json")])
    assert missing_folder.exit_code == 2 and "does not exist" in missing_folder.output  # a usage error, as in every suite
