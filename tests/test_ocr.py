"""Text inside images (faste_mm/retrieval/library/ocr.py) with the real OCR engine on REAL rendered text: a
plate-like string in a photo, an invoice number, and a scanned PDF page without a text layer, found by
lexical and hybrid search; off by default; switched on for an existing collection without
re-embedding; identical files read once; a missing engine is a clear error."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from faste_mm import BatchingConfig, Embedder, Retriever
from faste_mm.bench.library import invoice_image, plate_photo, scanned_pdf  # the pictures the library bench reads too
from faste_mm.cli.app import app
from faste_mm.errors import ConfigError
from faste_mm.retrieval.library.ocr import OcrEngine

pytest.importorskip("rapidocr_onnxruntime", reason="needs the ocr extra: pip install 'faste-mm[ocr]'")

from tests.helpers.inputs import tiny_vl_dir  # noqa: E402


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> Embedder:
    return Embedder.from_pretrained(str(tiny_vl_dir(tmp_path_factory.getbasetemp())), device="cpu",
                                    batching=BatchingConfig(batch_tokens=1 << 16))


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ocr") / "docs"
    root.mkdir()
    plate_photo(root / "car.jpg")
    shutil.copy(root / "car.jpg", root / "car copy.jpg")  # identical: read once
    invoice_image(root / "invoice.png")
    scanned_pdf(root / "scan.pdf")
    noise = np.random.default_rng(0).integers(0, 255, (120, 160, 3), dtype=np.uint8)
    Image.fromarray(noise).save(root / "noise.png")  # no text
    return root


@pytest.fixture(scope="module")
def with_ocr(embedder, folder, tmp_path_factory):
    retriever = Retriever(embedder, collection=tmp_path_factory.mktemp("ocr-col") / "col", r_max=0.5, ocr=True)
    report = retriever.index([folder])
    return retriever, report


def _names(hits) -> list[str]:
    return [Path(h.uri).name + ("" if h.page is None else f"#{h.page}") for h in hits]


def test_lexical_search_finds_a_plate_an_invoice_number_and_a_scanned_page(with_ocr):
    retriever, report = with_ocr
    assert report.ocr_read == 4 and report.ocr_s > 0  # car, invoice, scan page, noise; the copy not read again
    assert set(_names(retriever.search("RE16 TGK", mode="lexical", k=5))) == {"car.jpg", "car copy.jpg"}
    assert _names(retriever.search("2024-0815", mode="lexical", k=5)) == ["invoice.png"]
    assert _names(retriever.search("Account 7731", mode="lexical", k=5)) == ["scan.pdf#1"]
    hybrid = retriever.search("TGK", mode="hybrid", k=10)
    assert any(h.found_by in ("lexical", "both") and Path(h.uri).name == "car.jpg" for h in hybrid)


def test_ocr_is_off_by_default(embedder, folder, tmp_path):
    retriever = Retriever(embedder, collection=tmp_path / "col", r_max=0.5)
    report = retriever.index([folder])
    assert report.ocr_read == 0 and retriever.search("TGK", mode="lexical") == []


def test_switching_ocr_on_reads_an_existing_collection_without_re_embedding(embedder, folder, tmp_path):
    one = tmp_path / "one"
    one.mkdir()
    shutil.copy(folder / "invoice.png", one)
    Retriever(embedder, collection=tmp_path / "col", r_max=0.5).index([one])
    switched = Retriever(embedder, collection=tmp_path / "col", ocr=True)
    report = switched.index([one])
    assert (report.embedded, report.reused, report.ocr_read) == (0, 0, 1)
    assert _names(switched.search("2024-0815", mode="lexical")) == ["invoice.png"]
    again = Retriever(embedder, collection=tmp_path / "col").index([one])  # recorded: nothing left to read
    assert again.ocr_read == 0
    from faste_mm.retrieval.profile import read_profile

    assert read_profile(tmp_path / "col").ocr is True


def test_cli_index_ocr_then_lexical_search(embedder, folder, tmp_path):
    runner = CliRunner()
    model = str(tiny_vl_dir(Path(embedder.model_id).parent))
    col = tmp_path / "col"
    one = tmp_path / "one"
    one.mkdir()
    shutil.copy(folder / "invoice.png", one)
    indexed = runner.invoke(app, ["index", str(one), "-c", str(col), "--model", model, "--device", "cpu", "--ocr",
                                  "--format", "json"])
    assert indexed.exit_code == 0, (indexed.stdout, indexed.stderr)
    assert json.loads(indexed.stdout)["ocr_read"] == 1
    hits = json.loads(runner.invoke(app, ["search", "2024-0815", "-c", str(col), "--mode", "lexical",
                                          "--format", "json"]).stdout)["hits"]
    assert [Path(h["uri"]).name for h in hits] == ["invoice.png"]


def test_a_missing_engine_is_a_config_error_saying_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=r"faste-mm\[ocr\]"):
        OcrEngine().read(Image.new("RGB", (32, 32)))


def _boxes(spans, height=50):
    return [[[x0, 0], [x1, 0], [x1, height], [x0, height]] for x0, x1 in spans]


def test_spaced_puts_back_the_space_between_words_the_recogniser_dropped():
    from faste_mm.retrieval.library.ocr import spaced

    letters = [(i * 40, i * 40 + 30) for i in range(4)] + [(200 + i * 40, 230 + i * 40) for i in range(3)]
    assert spaced("ABCD123", _boxes(letters)) == "ABCD 123"
    even = [(i * 40, i * 40 + 30) for i in range(7)]
    assert spaced("ABCD123", _boxes(even)) == "ABCD123"
    assert spaced("AB CD", _boxes(even[:5])) == "AB CD"  # spaces kept as read
    assert spaced("ABCD", _boxes(even[:3])) == "ABCD"  # boxes that do not match: unchanged
