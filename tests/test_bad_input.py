"""Bad input: a clear FasteError naming the item; with on_error="skip" everything else embeds."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from faste_mm import ConfigError, FasteError, InputError, Item, ModelLoadError


def _encrypted_pdf(path):
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(width=200, height=200)
    writer.encrypt("secret", algorithm="RC4-128")
    with open(path, "wb") as f:
        writer.write(f)


@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg" * 10)
    (tmp_path / "notes.txt").write_text("plain text, not an image")
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.7\n garbage without xref")
    _encrypted_pdf(tmp_path / "locked.pdf")
    return {
        "missing": (tmp_path / "missing.png", "file not found"),
        "empty": (tmp_path / "empty.png", "empty"),
        "corrupt": (tmp_path / "corrupt.jpg", "corrupt"),
        "unsupported": (tmp_path / "notes.txt", "not a readable image"),
        "broken_pdf": (tmp_path / "broken.pdf", "not a readable PDF"),
        "encrypted_pdf": (tmp_path / "locked.pdf", "encrypted"),
    }


@pytest.mark.parametrize("kind", ["missing", "empty", "corrupt", "unsupported", "broken_pdf", "encrypted_pdf"])
def test_bad_file_raises_input_error_naming_the_file(vl_embedder, bad_files, kind):
    path, why = bad_files[kind]
    with pytest.raises(InputError) as error:
        vl_embedder.encode(["fine text", Item(image=path)])
    assert str(path) in str(error.value) and why in str(error.value)
    assert "input 1" in str(error.value)


def test_skip_embeds_the_good_items_and_reports_every_failure(vl_embedder, bad_files, image_dir):
    good = ["fine text", Item(image=image_dir / "red.png")]
    inputs = [good[0], *[Item(image=p) for p, _ in bad_files.values()], good[1]]
    done = []
    res = vl_embedder.encode(inputs, on_error="skip", progress=done.append)
    assert sum(done) == len(inputs)  # every row reported once, failures included
    assert res.ok.tolist() == [True] + [False] * len(bad_files) + [True]
    assert [f.source for f in res.failures] == list(range(1, 1 + len(bad_files)))
    for failure, (path, why) in zip(res.failures, bad_files.values()):
        assert str(path) in failure.reason and why in failure.reason
    assert np.all(res.embeddings[~res.ok] == 0)
    np.testing.assert_allclose(res.embeddings[[0, -1]], vl_embedder.encode(good).embeddings, atol=1e-5)
    assert res.stats.n_failed == len(bad_files)


def test_tiny_and_huge_images_are_resized_into_the_pixel_bounds(vl_embedder, tmp_path):
    Image.new("RGB", (1, 1), (1, 2, 3)).save(tmp_path / "dot.png")
    Image.new("RGB", (4000, 3000), (9, 9, 9)).save(tmp_path / "huge.png")
    for name in ("dot.png", "huge.png"):
        image = vl_embedder.serializer.prepare_image(Item(image=tmp_path / name))
        assert 4096 <= image.size[0] * image.size[1] <= 1_843_200
        assert image.size[0] % 32 == 0 and image.size[1] % 32 == 0
    res = vl_embedder.encode([Item(image=tmp_path / "dot.png"), Item(image=tmp_path / "huge.png")])
    assert res.ok.all() and np.allclose(np.linalg.norm(res.embeddings, axis=1), 1.0)


def test_extreme_aspect_ratio_is_an_input_error(vl_embedder, tmp_path):
    Image.new("RGB", (6400, 10), (0, 0, 0)).save(tmp_path / "strip.png")
    with pytest.raises(InputError, match="strip.png"):
        vl_embedder.encode([Item(image=tmp_path / "strip.png")])


def test_unsupported_python_object_is_an_input_error(vl_embedder):
    with pytest.raises(InputError, match="input 1: cannot embed a int"):
        vl_embedder.encode(["ok", 42])


def test_images_are_refused_by_text_models(text_embedders, image_dir):
    with pytest.raises(InputError, match="text-only model"):
        text_embedders["qwen3"].encode([Item(image=image_dir / "red.png")])


def test_on_error_value_is_validated(vl_embedder):
    with pytest.raises(ConfigError, match="on_error"):
        vl_embedder.encode(["x"], on_error="ignore")


def test_unsupported_model_type_is_a_model_load_error(tmp_path):
    from transformers import BertConfig

    from faste_mm import Embedder

    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError) as error:
        Embedder.from_pretrained(str(tmp_path), device="cpu")
    assert "'bert' is not supported" in str(error.value) and str(tmp_path) in str(error.value)


def test_missing_model_directory_is_a_model_load_error(tmp_path):
    from faste_mm import Embedder

    with pytest.raises(ModelLoadError, match="no-such-model"):
        Embedder.from_pretrained(str(tmp_path / "no-such-model"), device="cpu")


def test_every_error_is_a_faste_error():
    for error in (ConfigError, InputError, ModelLoadError):
        assert issubclass(error, FasteError)


def test_pdfium_is_only_called_under_its_lock_from_concurrent_workers(image_dir, monkeypatch):
    """PDFium crashes when two threads call it at once; worker threads render pages, so every
    document must be opened (and used, and closed) under the one lock."""
    from concurrent.futures import ThreadPoolExecutor

    from faste_mm.model import file_decoding as decoding

    opened_unlocked = []
    original = decoding._pdfium_document  # faste-mm's one call that opens a PDFium document

    def checked(source):
        opened_unlocked.append(not decoding._PDFIUM_LOCK.locked())
        return original(source)

    monkeypatch.setattr(decoding, "_pdfium_document", checked)
    pages = [Item(image=image_dir / "doc.pdf", page=1 + i % 2) for i in range(12)]
    sequential = [np.asarray(decoding.load_image(page, 50_000)) for page in pages]
    with ThreadPoolExecutor(4) as pool:
        concurrent = [np.asarray(image) for image in pool.map(lambda page: decoding.load_image(page, 50_000), pages)]
    assert len(opened_unlocked) == 24 and not any(opened_unlocked)
    assert all(np.array_equal(a, b) for a, b in zip(sequential, concurrent))
    assert not decoding._PDFIUM_LOCK.locked()
    # the photo-facts reader (a PDF's title and date, read while other threads render pages) too
    from faste_mm.retrieval.library.photo_metadata import read_facts

    read_facts(image_dir / "doc.pdf", "pdf")
    assert len(opened_unlocked) == 25 and not any(opened_unlocked)
