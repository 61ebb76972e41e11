"""`faste-mm plan` and `faste_mm.tools.plan`: the seeded stratified sample, the fidelity metrics
against naive references, the table's order, the reference row, the recommendation against the
rule worked by hand, plan.json round trips, and bad inputs naming the flag or the argument.
Random weights say nothing about quality: these tests check the mechanics only."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from faste_mm import FastEConfig, Item
from faste_mm.cli.app import app
from faste_mm.errors import ConfigError, InputError
from faste_mm.model.serialization import SerializerConfig
from faste_mm.tools.plan import (PlanConfig, neighbour_agreement, plan, query_top_k_agreement, sample_files,
                                 stratified_quotas)
from faste_mm.tools.plan_report import PlanReport, load_plan, pareto_front

from tests.helpers.inputs import noise_image, tiny_vl_dir, two_page_pdf

runner = CliRunner()
SMALL = 16_384  # a cap that shrinks the test photos (their official size is 160x128 and up)


def make_files(root: Path, pdf: bool = False) -> Path:
    """Four photos and two texts (and a two-page PDF: three kinds to stratify). The plan runs
    leave the PDF out: a page renders at the official 1,843,200 px, slow even on a tiny model."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(4):
        noise_image(root / f"photo{i}.png", (160 + 32 * i, 128), seed=i)
    if pdf:
        two_page_pdf(root / "doc.pdf")
    (root / "a.txt").write_text("a red bicycle leaning on a wall", encoding="utf-8")
    (root / "b.md").write_text("minutes of the meeting about the river bridge", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    return make_files(tmp_path_factory.mktemp("plan-files"))


@pytest.fixture(scope="module")
def report(vl_embedder, files) -> PlanReport:
    drawn = sample_files([files], 6)
    config = PlanConfig(max_pixels=(1_843_200, SMALL), r_max=(0.0, 0.5), dtypes=("float32",), target=0.9)
    return plan(vl_embedder, drawn.items, config, queries=["a red bicycle", "a bridge"])


def naive_agreement(reference: np.ndarray, candidate: np.ndarray, k: int) -> float:
    """Per item: the k others with the highest inner product, by a sorted Python list."""
    shares = []
    for i in range(len(reference)):
        def nearest(vectors):
            others = sorted((j for j in range(len(vectors)) if j != i), key=lambda j: (-float(vectors[i] @ vectors[j]), j))
            return set(others[:k])
        shares.append(len(nearest(reference) & nearest(candidate)) / k)
    return sum(shares) / len(shares)


def test_the_sample_is_seeded_stratified_and_one_page_per_pdf(tmp_path):
    files = make_files(tmp_path / "files", pdf=True)
    first, again = sample_files([files], 4, seed=3), sample_files([files], 4, seed=3)
    assert [i.describe() for i in first.items] == [i.describe() for i in again.items]
    assert first.found == {"photo": 4, "page": 1, "text": 2, "video": 0}
    assert sorted(set(first.kinds)) == ["page", "photo", "text"]  # every kind found is drawn
    assert len(first.items) == 4
    page = next(item for item, kind in zip(first.items, first.kinds) if kind == "page")
    assert page.page in (1, 2)
    everything = sample_files([files], 100)
    assert len(everything.items) == 7


@pytest.mark.parametrize("counts, n", [({"photo": 90, "page": 9, "text": 1, "video": 0}, 20),
                                       ({"photo": 5, "page": 5, "text": 5, "video": 5}, 2),
                                       ({"photo": 3, "page": 0, "text": 0, "video": 0}, 10)])
def test_quotas_are_proportional_with_one_per_kind_and_never_exceed_the_files(counts, n):
    quotas = stratified_quotas(counts, n)
    assert sum(quotas.values()) == min(n, sum(counts.values()))
    assert all(0 <= quotas[k] <= counts[k] for k in counts)
    present = [k for k in counts if counts[k]]
    if n >= len(present):
        assert all(quotas[k] >= 1 for k in present)
    if sum(counts.values()) > n:  # proportional within one item, after the one-per-kind floor
        spare = {k: counts[k] - 1 for k in present}
        for k in present:
            assert abs((quotas[k] - 1) - (n - len(present)) * spare[k] / sum(spare.values())) < 1 + 1e-9


def test_neighbour_and_query_agreement_equal_naive_references():
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(12, 8)).astype(np.float32)
    candidate = reference + rng.normal(scale=0.5, size=reference.shape).astype(np.float32)
    for k in (1, 3, 11):
        assert neighbour_agreement(reference, candidate, k) == pytest.approx(naive_agreement(reference, candidate, k))
    assert neighbour_agreement(reference, reference, 11) == 1.0
    queries = rng.normal(size=(3, 8)).astype(np.float32)
    top = lambda q, d: [set(np.argsort(-(q @ d.T)[i])[:4]) for i in range(len(q))]  # noqa: E731
    naive = np.mean([len(a & b) / 4 for a, b in zip(top(queries, reference), top(queries, candidate))])
    assert query_top_k_agreement(queries, reference, queries, candidate, 4) == pytest.approx(naive)


def test_pareto_front_keeps_only_undominated_points():
    assert pareto_front([1.0, 2.0, 3.0, 2.0], [0.5, 0.9, 0.8, 0.9]) == [True, True, False, True]


def test_rows_are_ordered_by_measured_cost_and_the_reference_keeps_everything(report):
    costs = [row.seconds_per_item for row in report.candidates]
    assert costs == sorted(costs)
    assert len(report.candidates) == 4 and report.sample_size == 6 and report.k == 5
    ref = report.reference
    assert (ref.max_pixels, ref.r_max, ref.dtype) == (1_843_200, 0.0, "float32")
    assert ref.agreement == 1.0 and ref.query_agreement == 1.0
    assert ref.mean_cos == pytest.approx(1.0, abs=1e-6) and ref.p5_cos == pytest.approx(1.0, abs=1e-6)
    assert ref.speedup == 1.0
    for row in report.candidates:
        assert row.speedup == pytest.approx(ref.seconds_per_item / row.seconds_per_item)
        assert row.vision_flops_per_item > 0
        # the model's seconds split by stage: both stages ran, and they are part of the forward
        assert row.tower_s_per_item > 0 and row.decoder_s_per_item > 0
        assert row.tower_s_per_item + row.decoder_s_per_item <= row.forward_s_per_item * 1.001 + 1e-6
    small = [row for row in report.candidates if row.max_pixels == SMALL]
    assert all(row.vision_flops_per_item < ref.vision_flops_per_item for row in small)  # fewer patches


def test_recommendation_is_the_cheapest_row_meeting_the_rule(report):
    floor = 1 - 3 * (1 - report.target)
    assert report.p5_floor == pytest.approx(floor)
    meeting = [i for i, row in enumerate(report.candidates) if row.agreement >= report.target and row.p5_cos >= floor]
    assert [row.meets_target for row in report.candidates] == [i in meeting for i in range(len(report.candidates))]
    assert report.recommended == min(meeting, key=lambda i: report.candidates[i].seconds_per_item)
    costs = [row.seconds_per_item for row in report.candidates]
    assert [row.pareto for row in report.candidates] == pareto_front(costs, [row.agreement for row in report.candidates])


def test_a_row_equals_the_same_setting_embedded_on_its_own(vl_embedder, files, report):
    """The row's fidelity is that of `encode` with the row's pixels and FastE, against the
    official full forward (a reference computed without the planner)."""
    items = list(sample_files([files], 6).items)
    ref = vl_embedder.encode_documents(items).embeddings
    row = next(r for r in report.candidates if r.max_pixels == SMALL and r.r_max == 0.5)
    small = vl_embedder.with_serializer(SerializerConfig(max_pixels=SMALL))
    got = small.encode_documents(items, fast_e=FastEConfig(r_max=0.5)).embeddings
    cosines = np.sum(ref * got, axis=1)
    assert row.mean_cos == pytest.approx(float(cosines.mean()), abs=1e-5)
    assert row.p5_cos == pytest.approx(float(np.percentile(cosines, 5)), abs=1e-5)
    assert row.agreement == pytest.approx(naive_agreement(ref, got, report.k))


def test_a_plan_survives_json_and_a_row_is_chosen_by_path_colon_row(report, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(report.to_dict()))
    loaded, row = load_plan(path)
    assert loaded == report and row is None
    loaded, row = load_plan(f"{path}:2")
    assert row == 2 and loaded.receipt(row).max_pixels == report.candidates[2].max_pixels
    with pytest.raises(ConfigError, match="row 9 does not exist"):
        load_plan(f"{path}:9")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    with pytest.raises(ConfigError, match="not a faste-mm plan"):
        load_plan(tmp_path / "other.json")


def test_another_dtype_runs_on_a_cast_copy_and_leaves_the_embedder_alone(vl_embedder, files):
    import torch

    items = [Item(text="a red bicycle"), Item(text="a blue boat"), Item(image=files / "photo0.png")]
    report = plan(vl_embedder, items, PlanConfig(max_pixels=(1_843_200,), r_max=(0.0,), dtypes=("bfloat16",)))
    assert [row.dtype for row in report.candidates if not row.is_reference] == ["bfloat16"]
    assert set(report.dtype_prepare_s) == {"bfloat16"}
    assert vl_embedder.backbone.dtype == torch.float32
    cast = next(row for row in report.candidates if not row.is_reference)
    assert 0.9 < cast.mean_cos < 1.0  # rounded weights: close, not equal


def test_a_fixed_trigger_layer_is_measured_and_handed_on_to_index(vl_embedder, files, tmp_path):
    drawn = sample_files([files], 4)
    config = PlanConfig(max_pixels=(1_843_200,), r_max=(0.0, 0.5), dtypes=("float32",),
                        fast_e=FastEConfig(r_max=0.0, trigger_layer=2))
    report = plan(vl_embedder, drawn.items, config)
    row = next(i for i, c in enumerate(report.candidates) if c.r_max == 0.5)
    assert report.candidates[row].trigger_layer == 2
    assert report.settings(row)["trigger_layer"] == 2
    reference = next(c for c in report.candidates if c.is_reference)
    assert reference.trigger_layer is None  # the full forward compresses nowhere
    info = _index_with_plan(vl_embedder, report, row, files, tmp_path / "col")
    assert info["settings"]["fast_e"]["trigger_layer"] == 2


def _index_with_plan(vl_embedder, report, row: int, files, col) -> dict:
    """`faste-mm index --plan plan.json:ROW` into `col` (the report written beside it); its `info --format json`."""
    plan_file = col.parent / "plan.json"
    plan_file.write_text(json.dumps(report.to_dict()))
    result = runner.invoke(app, ["index", str(files), "-c", str(col), "--model", vl_embedder.model_id,
                                 "--device", "cpu", "--plan", f"{plan_file}:{row}"])
    assert result.exit_code == 0, (result.stderr, result.exception)
    return json.loads(runner.invoke(app, ["info", "-c", str(col), "--format", "json"]).stdout)


def test_a_plan_without_a_fast_e_config_is_refused():
    with pytest.raises(ConfigError, match="PlanConfig.fast_e"):
        PlanConfig(fast_e=0.5)


@pytest.mark.parametrize("kwargs, field", [({"dtypes": ("fp8",)}, "PlanConfig.dtypes"),
                                           ({"target": 0.0}, "PlanConfig.target"),
                                           ({"target": 1.5}, "PlanConfig.target"),
                                           ({"max_pixels": (1000,)}, "PlanConfig.max_pixels"),
                                           ({"r_max": (1.0,)}, "r_max")])
def test_bad_settings_name_the_argument(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        PlanConfig(**kwargs)


def test_an_empty_sample_is_refused(vl_embedder, tmp_path):
    with pytest.raises(InputError, match="items holds 0"):
        plan(vl_embedder, [], PlanConfig())
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="the sample is empty"):
        sample_files([tmp_path / "empty"])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(tiny_vl_dir(tmp_path_factory.getbasetemp()))


@pytest.mark.parametrize("args, flag", [(["--dtype", "fp8"], "--dtype"), (["--target", "1.5"], "--target"),
                                        (["--max-pixels", "501760", "--visual-tokens", "490"], "--visual-tokens"),
                                        (["--sample", "1"], "--sample")])
def test_cli_bad_inputs_name_the_flag(model_dir, files, args, flag):
    result = runner.invoke(app, ["plan", str(files), "--model", model_dir, *args])
    assert result.exit_code == 1 and flag in result.stderr, result.stderr


def test_cli_empty_folder_is_an_error_naming_it(model_dir, tmp_path):
    (tmp_path / "nothing").mkdir()
    result = runner.invoke(app, ["plan", str(tmp_path / "nothing"), "--model", model_dir])
    assert result.exit_code == 1 and "nothing" in result.stderr and "empty" in result.stderr


def test_cli_writes_the_plan_the_plot_and_json(model_dir, files, tmp_path):
    out, picture = tmp_path / "plan.json", tmp_path / "plan.png"
    result = runner.invoke(app, ["plan", str(files), "--model", model_dir, "--device", "cpu", "--sample", "4",
                                 "--visual-tokens", "1800,16", "--r-max", "0,0.5", "--dtype", "float32",
                                 "--out", str(out), "--plot", str(picture), "--format", "json"])
    assert result.exit_code == 0, (result.stderr, result.exception)
    payload = json.loads(result.stdout)
    assert payload == json.loads(out.read_text())
    assert {row["max_pixels"] for row in payload["candidates"]} == {1_843_200, 16 * 1024}
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert replace(PlanReport.from_dict(payload)).recommendation.meets_target


def test_index_with_a_plan_applies_the_row_and_info_shows_the_receipt(vl_embedder, report, files, tmp_path):
    row = next(i for i, r in enumerate(report.candidates) if r.max_pixels == SMALL and r.r_max == 0.5)
    col = tmp_path / "col"
    info = _index_with_plan(vl_embedder, report, row, files, col)
    chosen = report.candidates[row]
    assert info["settings"]["serializer"]["max_pixels"] == chosen.max_pixels
    assert info["settings"]["fast_e"]["r_max"] == chosen.r_max
    assert info["settings"]["receipt"] == report.receipt(row).to_dict()
    assert info["plan"] == report.receipt(row).summary()
    assert f"{chosen.agreement:.0%} of neighbours kept" in info["plan"] and f"{chosen.max_pixels:,} px" in info["plan"]
    assert "plan (measured)" in runner.invoke(app, ["info", "-c", str(col)]).stdout
    plain = tmp_path / "plain"
    assert runner.invoke(app, ["index", str(files), "-c", str(plain), "--model", vl_embedder.model_id,
                               "--device", "cpu", "--r-max", "0"]).exit_code == 0
    assert "not measured" in json.loads(runner.invoke(app, ["info", "-c", str(plain), "--format", "json"]).stdout)["plan"]


def test_a_plan_from_another_model_is_refused_naming_both(vl_embedder, report, files, tmp_path):
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps({**report.to_dict(), "model_id": "someone/else"}))
    result = runner.invoke(app, ["index", str(files), "-c", str(tmp_path / "col"), "--model", vl_embedder.model_id,
                                 "--plan", str(plan_file)])
    assert result.exit_code == 1 and "--plan" in result.stderr and "someone/else" in result.stderr
    assert not (tmp_path / "col").exists()


def test_the_python_api_applies_a_row_and_keeps_its_receipt(vl_embedder, report, tmp_path):
    from faste_mm.retrieval.profile import read_profile
    from faste_mm.retrieval.retriever import Retriever

    row = next(i for i, r in enumerate(report.candidates) if r.max_pixels == SMALL and r.r_max == 0.5)
    retriever = Retriever(vl_embedder, collection=tmp_path / "col", **report.settings(row))
    retriever.add(["a red bicycle", "a blue boat"])
    profile = read_profile(tmp_path / "col")
    assert (profile.max_pixels, profile.r_max, profile.threshold) == (SMALL, 0.5, report.candidates[row].threshold)
    assert profile.receipt == report.receipt(row) and "faste-mm plan" in profile.threshold_source
    # theta is the backbone's default the plan measured, not a value the plan found (it says so)
    planned = report.candidates[row].threshold_source
    assert planned.startswith("backbone default") and profile.threshold_source.startswith(planned)
    with pytest.raises(ConfigError, match="measured with someone/else"):
        replace(report, model_id="someone/else").check_model(vl_embedder.model_id)


# ---- hostile plan files (issue 38 item 8): a clear ConfigError, never a hang or a traceback ------
def _hostile(report, change) -> dict:
    data = json.loads(json.dumps(report.to_dict()))
    change(data)
    return data


@pytest.mark.parametrize("change, named", [
    (lambda d: d["candidates"][0].update(agreement=float("nan")), "NaN is not a number"),
    (lambda d: d["candidates"][0].update(max_pixels="many"), "max_pixels"),
    (lambda d: d["candidates"][0].update(is_reference=1), "is_reference"),
    (lambda d: d.update(k=[3]), "PlanReport.k"),
    (lambda d: d.update(target=float("inf")), "Infinity is not a number"),
    (lambda d: d.update(candidates=[1, 2]), "damaged plan"),
    (lambda d: d.update(recommended=99), "damaged plan|does not exist"),
], ids=["nan", "str-int", "int-bool", "list-int", "inf", "rows-not-objects", "no-such-row"])
def test_a_hostile_plan_is_refused_naming_the_value(report, tmp_path, change, named):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_hostile(report, change)))  # json writes NaN / Infinity as bare words
    with pytest.raises(ConfigError, match=named):
        load_plan(path)


def test_a_plan_path_that_is_not_a_small_regular_file_is_refused_without_reading_it(tmp_path):
    import os

    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)  # no writer: a plain read would wait forever
    with pytest.raises(ConfigError, match="FIFO"):
        load_plan(fifo)
    with pytest.raises(ConfigError, match="device"):
        load_plan("/dev/zero")
    with pytest.raises(ConfigError, match="folder"):
        load_plan(tmp_path)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (2 << 20))
    with pytest.raises(ConfigError, match="not a plan"):
        load_plan(big)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="nested too deeply|cannot read"):
        load_plan(deep)
    result = runner.invoke(app, ["index", str(tmp_path), "-c", str(tmp_path / "col"), "--plan", str(fifo)])
    assert result.exit_code != 0 and "FIFO" in result.stderr and "Traceback" not in result.stderr
