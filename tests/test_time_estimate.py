"""The time estimate of an index run (`faste_mm.retrieval.estimate`): planned tokens from headers,
each batch's seconds shared among its rows and accumulated per kind, the seconds left per kind
(a kind not measured yet at the others' rate), the ETA it drives, and `index`'s estimate line and
report fields. Seconds are injected (a fixed clock, hand-made traces): nothing here times anything."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from faste_mm.cli import index_command
from faste_mm.cli.app import app
from faste_mm.model.cost import CostTally
from faste_mm.model.runner import BatchTrace
from faste_mm.retrieval.estimate import (KIND_NAMES, KindSeconds, KindWork, RowPlan, RunEstimate, RunMeter, TokenBounds,
                                         batch_by_kind, image_tokens, page_tokens, plan_rows, sample_first, seconds_left,
                                         share_batch, text_tokens)
from faste_mm.retrieval.indexing import _progress_reporter
from faste_mm.retrieval.ingest import IngestWork
from faste_mm.retrieval.ingest_tally import IngestTally
from faste_mm.retrieval.scanning import scan_paths

from tests.helpers.inputs import noise_image, tiny_vl_dir, two_page_pdf

BOUNDS = TokenBounds(min_pixels=4096, max_pixels=65536, max_length=8192)
IMAGE, PDF, TEXT, VIDEO = (KIND_NAMES.index(k) for k in ("image", "pdf", "text", "video"))


def test_a_batch_shares_the_tower_among_its_image_rows_and_the_decoder_among_all_rows_by_tokens():
    # tower 2 s to the image row alone; decoder 4 s by tokens 100 : 300
    seconds = share_batch(np.array([100, 300]), np.array([True, False]), tower_s=2.0, decoder_s=4.0)
    np.testing.assert_allclose(seconds, [2.0 + 4.0 * 0.25, 4.0 * 0.75])


def test_a_batch_adds_up_per_kind_its_seconds_around_the_model_shared_by_pixels():
    rows = RowPlan(np.array([PDF, IMAGE, IMAGE]), np.array([300, 100, 100]), np.array([1000, 3000, 4000]))
    spent, done = batch_by_kind(rows, [1, 0], tower_s=2.0, decoder_s=4.0, other_s=2.0)
    np.testing.assert_allclose(spent.model[[IMAGE, PDF]], [0.5 + 1.0, 1.5 + 3.0])  # all rows have an image
    np.testing.assert_allclose(spent.other[[IMAGE, PDF]], [1.5, 0.5])  # pixels 3000 : 1000
    assert done.items[IMAGE] == 1 and done.tokens[PDF] == 300 and done.pixels[IMAGE] == 3000


def test_seconds_left_are_each_kinds_tokens_at_its_own_rate_and_all_pixels_at_one_rate():
    left = KindWork(items=np.array([10, 4, 5, 0]), tokens=np.array([1000, 2000, 500, 0]),
                    pixels=np.array([5000, 1000, 100, 0]))
    spent = KindSeconds(model=np.array([2.0, 0.0, 1.0, 0.0]), other=np.array([1.0, 0.0, 0.5, 0.0]))
    done = KindWork(items=np.array([5, 0, 2, 0]), tokens=np.array([1000, 0, 1000, 0]), pixels=np.array([10000, 0, 1000, 0]))
    seconds, is_measured = seconds_left(left, spent, done)
    # tokens: image 2 s / 1000, text 1 s / 1000, pdf (unmeasured) all kinds' 3 s / 2000;
    # pixels: (1 + 0.5) s / 11,000 px whatever the kind
    per_pixel = 1.5 / 11000
    np.testing.assert_allclose(seconds, [2.0 + 5000 * per_pixel, 3.0 + 1000 * per_pixel, 0.5 + 100 * per_pixel, 0.0])
    assert is_measured.tolist() == [True, False, True, False]


@pytest.mark.parametrize("size, tokens", [((64, 64), 4 + 20), ((512, 256), 11 * 6 + 20), ((16, 16), 2 * 2 + 20)])
def test_planned_image_tokens_follow_the_pixel_bounds(size, tokens):
    # 512x256 = 131,072 px scaled by sqrt(0.5) to 362x181 -> 11 x 6 tokens of 32x32; 16x16 up to 64x64
    assert image_tokens(*size, BOUNDS) == tokens


def test_planned_page_and_text_tokens():
    assert page_tokens(BOUNDS) == 65536 // 1024 + 20
    assert text_tokens(400, BOUNDS) == 100 + 20
    assert text_tokens(10**9, BOUNDS) == BOUNDS.max_length


def test_rows_of_an_encode_call_are_planned_in_expansion_order(tmp_path):
    pdf = two_page_pdf(tmp_path / "doc.pdf")
    image = noise_image(tmp_path / "a.png", (64, 64), 0)
    rows = plan_rows([image, pdf, "x" * 400], BOUNDS)
    assert rows.kinds.tolist() == [IMAGE, PDF, PDF, TEXT]
    assert rows.tokens.tolist() == [24, 84, 84, 120]
    assert rows.pixels.tolist() == [64 * 64, 65536, 65536, 0]  # a page is rendered at the budget


def test_the_first_files_of_each_kind_come_first_then_the_rest_in_the_kinds_mix():
    files = [SimpleNamespace(kind=k, name=f"{k}{i}") for k, n in (("image", 10), ("pdf", 4), ("text", 4)) for i in range(n)]
    ordered = [f.name for f in sample_first(files, per_kind=2)]
    assert ordered[:6] == ["image0", "image1", "text0", "text1", "pdf0", "pdf1"]  # PDFs last among them
    # the rest: 8 images, 2 PDFs, 2 texts, each kind at (rank + 0.5) / count of the run
    assert ordered[6:] == ["image2", "image3", "pdf2", "text2", "image4", "image5", "image6", "image7",
                           "pdf3", "text3", "image8", "image9"]


def _folder(tmp_path: Path) -> list:
    folder = tmp_path / "mixed"
    folder.mkdir()
    noise_image(folder / "a.png", (64, 64), 0)
    noise_image(folder / "b.png", (64, 64), 1)
    two_page_pdf(folder / "doc.pdf")
    for name in ("n1", "n2", "n3"):
        (folder / f"{name}.txt").write_text(name + "x" * 398, encoding="utf-8")  # 400 bytes, each its own
    return list(scan_paths([folder]).files())  # a.png, b.png, doc.pdf, n1-n3.txt


def _trace(rows: list[int], tower_s: float, decoder_s: float) -> BatchTrace:
    return BatchTrace(batch_size=len(rows), rows=rows, padded_lengths=[], trigger_layer=None,
                      tower_s=tower_s, decoder_s=decoder_s)


def test_the_eta_after_a_batch_is_the_work_left_per_kind_at_its_measured_rate(tmp_path):
    files = _folder(tmp_path)
    assert [f.kind for f in files] == ["image", "image", "pdf", "text", "text", "text"]
    meter = RunMeter(files, BOUNDS)
    now = [0.0]
    flight = SimpleNamespace(values=[files[0].path, files[1].path], rows=2, inputs=2, cost=CostTally())
    encode = SimpleNamespace(in_flight=flight, load_s=0.0, dtype="float32")
    plan = IngestWork(tuple(files), frozenset(), 0, ())
    seen = []
    report = _progress_reporter(seen.append, encode, plan, 3, IngestTally(), 0.0, lambda: 0, meter, lambda: now[0])
    meter.begin(0.0)

    now[0] = 2.0  # the images' batch: 2 model seconds over 2 x 24 tokens, nothing else waited for
    report(_trace([0, 1], tower_s=1.0, decoder_s=1.0))
    estimate = seen[-1].estimate
    assert estimate.kinds == ("pdf", "text") and estimate.items_left == (2, 3)
    assert estimate.is_measured == (False, False) and not estimate.is_settled
    # pages 2 x 84 and texts 3 x 120 tokens, at the images' 2 s / 48 tokens (and no second per pixel)
    np.testing.assert_allclose(estimate.seconds_left, [168 / 24, 360 / 24])
    assert seen[-1].eta_s == pytest.approx(22.0)

    encode.in_flight = SimpleNamespace(values=[files[2].path], rows=2, inputs=1, cost=CostTally())
    now[0] = 3.5  # the PDF's pages: 1 model second, 0.5 s more waited for (rendering)
    report(_trace([0, 1], tower_s=0.5, decoder_s=0.5))
    # texts (3 x 120 tokens, no pixels) at all measured kinds' (2 + 1) s / (48 + 168) tokens
    texts_s = 360 * 3.0 / 216
    assert seen[-1].eta_s == pytest.approx(texts_s)
    meter.commit(3)  # the chunk of the images and the PDF
    report()
    settled = seen[-1].estimate
    assert settled.is_settled and settled is meter.first and settled.total_s == pytest.approx(3.5 + texts_s)

    encode.in_flight = SimpleNamespace(values=["x" * 400] * 2, rows=2, inputs=2, cost=CostTally())
    now[0] = 3.9  # two texts: 0.4 s over 240 tokens; one text (120 tokens) left at that rate
    report(_trace([0, 1], tower_s=0.0, decoder_s=0.4))
    assert seen[-1].estimate.is_measured == (True,) and seen[-1].eta_s == pytest.approx(0.2)


def test_the_estimate_line_names_the_work_left_per_kind_and_the_dtype():
    estimate = RunEstimate(("image", "pdf"), (18214, 2310), (20000.0, 7600.0), (True, False), 30.0, True, "bfloat16")
    line = index_command.estimate_line(estimate)
    assert line.startswith("18,214 images and 2,310 pages: about 7 h 40 min here at bfloat16 (pages not measured yet")
    assert line.endswith("`faste-mm plan` shows faster settings")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(tiny_vl_dir(tmp_path_factory.getbasetemp()))


def test_index_tells_the_estimate_once_its_kinds_are_measured_and_reports_it(model, tmp_path, monkeypatch):
    folder = _folder(tmp_path)[0].path.parent
    runner = CliRunner()
    # two files a chunk: the estimate settles when the first chunk (the two images) commits
    args = ["index", str(folder), "--model", model, "--device", "cpu", "--chunk-files", "2", "--format", "json"]
    env = {"FASTE_MM_PROGRESS_INTERVAL": "0"}
    monkeypatch.setattr(index_command, "ESTIMATE_LINE_S", 1e9)  # no run is long enough to tell
    short = runner.invoke(app, [*args, "-c", str(tmp_path / "short")], env=env)
    assert short.exit_code == 0, short.stderr
    assert "faster settings" not in short.stderr and json.loads(short.stdout)["estimated_s"] > 0
    monkeypatch.setattr(index_command, "ESTIMATE_LINE_S", 1e-9)  # every run with work left is long enough
    result = runner.invoke(app, [*args, "-c", str(tmp_path / "told")], env=env)
    assert result.exit_code == 0, result.stderr
    told = [line for line in result.stderr.splitlines() if "faster settings" in line]
    assert len(told) == 1 and re.match(r"2 pages and 3 texts: about \d+ (s|min) here at float32", told[0])
    report = json.loads(result.stdout)
    assert report["embedded"] == 7
    assert 0 < report["estimated_at_s"] <= report["elapsed_s"] and report["estimated_s"] >= report["estimated_at_s"]


def test_plan_estimates_the_whole_folder_at_each_kinds_seconds_per_item(tmp_path):
    from faste_mm.tools.plan import folder_seconds

    image = noise_image(tmp_path / "a.png", (64, 64), 0)
    # image row: 1 + 1 model s; text row: 1 model s; the call's wall is twice its model seconds
    run = SimpleNamespace(stats=SimpleNamespace(elapsed_s=6.0, batches=[_trace([0], 1.0, 1.0), _trace([1], 0.0, 1.0)]))
    # photos 4 s, texts 2 s each; pages, not in the sample, at the call's 3 s per item
    seconds = folder_seconds([image, "a note"], run, 65536, {"photo": 10, "text": 5, "page": 2, "video": 0})
    assert seconds == pytest.approx(10 * 4.0 + 5 * 2.0 + 2 * 3.0)


def test_plan_counts_the_items_of_all_files_and_states_their_index_time(model, tmp_path):
    from faste_mm.tools.plan import sample_files

    files = _folder(tmp_path)[0].path.parent
    assert sample_files([files], 4).folder == {"photo": 2, "page": 2, "text": 3, "video": 0}
    result = CliRunner().invoke(app, ["plan", str(files), "--model", model, "--device", "cpu", "--sample", "5",
                                      "--visual-tokens", "16", "--r-max", "0", "--dtype", "float32"])
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert re.search(r"all files: indexing all 2 photos, 2 pages, 3 texts found.* the recommendation about \d+",
                     " ".join(result.stdout.split()))
