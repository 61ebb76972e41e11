"""The downscaling baseline on the tiny model: a per-item max_pixels embeds exactly like a serializer
with that max_pixels, the whole side is one `encode` call, the plan reads image headers only
(and gives the caps the decoded images give), pixels per token come from the processor, and a
text-only side (DocVQA answers) reuses the Full vectors instead of recomputing them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from faste_mm import BatchingConfig, Embedder, Item
from faste_mm.datasets import EvalConfig, Setting, evaluate, evaluate_task, load_task
from faste_mm.datasets import protocol
from faste_mm.datasets.encoding import DEFAULT_TOKEN_PIXELS, downscale_pixels, encode_downscaled, fingerprint, token_pixels
from faste_mm.errors import ConfigError, InputError
from faste_mm.model.items import expand_items
from faste_mm.model.serialization import VLSerializer

from tests.helpers.eval_fixtures import eval_data_dir, eval_model_dir  # noqa: F401  (fixtures)
from tests.helpers.processors import processor_with


@pytest.fixture(scope="module")
def embedder(eval_model_dir) -> Embedder:
    return Embedder.from_pretrained(str(eval_model_dir), device="cpu", batching=BatchingConfig(batch_tokens=1 << 20))


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Item]:
    """Images whose sizes give different caps: not multiples of 32, one above max_pixels, RGBA,
    palette and grayscale files, and one in-memory PIL image."""
    root = tmp_path_factory.mktemp("downscale_images")
    specs = [("a.png", "RGB", (128, 96)), ("b.png", "RGBA", (300, 200)), ("c.png", "P", (100, 70)),
             ("d.jpg", "L", (500, 120)), ("e.png", "RGB", (2000, 1500)), ("f.png", "RGB", (1, 1))]
    items = []
    for k, (name, mode, size) in enumerate(specs):
        image = Image.new("RGB", size, (40 * k, 200 - 30 * k, 90))
        image.paste((250, 10 * k, 30), (0, 0, max(1, size[0] // 2), max(1, size[1] // 3)))
        image.convert(mode).save(root / name)
        items.append(Item(image=root / name))
    items.append(Item(image=Image.new("RGB", (160, 90), (10, 120, 200)), text="an in-memory image with a caption"))
    return items


def _per_call_reference(embedder: Embedder, items: list[Item], caps: list[int | None]) -> np.ndarray:
    """The old way: one serializer (and one encode call) per distinct max_pixels."""
    vectors = np.zeros((len(items), embedder.dim), dtype=np.float32)
    for cap in set(caps):
        rows = [i for i, c in enumerate(caps) if c == cap]
        runner = embedder if cap is None else embedder.with_serializer(replace(embedder.serializer.config, max_pixels=cap))
        vectors[rows] = runner.encode_documents([items[i] for i in rows]).embeddings
    return vectors


def _reference_caps(embedder: Embedder, items: list[Item], r_max: float) -> list[int]:
    """Caps from the decoded, resized images (what the plan must reproduce without decoding)."""
    per_token = token_pixels(embedder)
    sizes = [embedder.serializer.prepare_image(item).size for item in items]
    return [max(4096, int(w * h // per_token * (1 - r_max)) * per_token) for w, h in sizes]


def test_item_max_pixels_embeds_like_a_serializer_with_that_max_pixels(embedder, images):
    caps = [4096, 6 * 1024, None, 20 * 1024, 60 * 1024, 4096, 8 * 1024]
    capped = [item if cap is None else replace(item, max_pixels=cap) for item, cap in zip(images, caps)]
    result = embedder.encode_documents(capped)
    np.testing.assert_allclose(result.embeddings, _per_call_reference(embedder, images, caps), atol=1e-5)
    for item, cap in zip(capped, caps):
        expected = embedder.with_serializer(replace(embedder.serializer.config, max_pixels=cap or 1_843_200))
        assert embedder.serializer(item, None).input_ids.tolist() == expected.serializer(item, None).input_ids.tolist()
    # The caps do change the vectors: the comparison above is not between two default runs.
    uncapped = embedder.encode_documents(images).embeddings
    assert not np.allclose(result.embeddings[1], uncapped[1], atol=1e-3)


def _count_encode_calls(monkeypatch) -> list[int]:
    """Inputs per `Embedder.encode` call from now on (the list fills as calls are made)."""
    calls = []
    original = Embedder.encode

    def counting(self, inputs, **kwargs):
        calls.append(len(inputs))
        return original(self, inputs, **kwargs)

    monkeypatch.setattr(Embedder, "encode", counting)
    return calls


def test_downscaling_a_side_is_one_encode_call_equal_to_one_call_per_cap(embedder, images, monkeypatch):
    caps = downscale_pixels(embedder, images, 0.5)
    assert len(set(caps)) >= 4  # several caps: the old way needed one call each
    calls = _count_encode_calls(monkeypatch)
    vectors, stats = encode_downscaled(embedder, images, 0.5)
    assert calls == [len(images)]
    monkeypatch.undo()
    np.testing.assert_allclose(vectors, _per_call_reference(embedder, images, caps), atol=1e-5)
    assert stats.n_items == len(images) and stats.n_failed == 0


def _cut_in_its_pixels(source: Path, target: Path) -> None:
    """`source` cut halfway through its compressed pixels (PNG: the first IDAT chunk; JPEG: the
    scan after SOS): the header is whole, so PIL opens it and reads its size, but decoding it
    fails for real ("image file is truncated")."""
    data = source.read_bytes()
    if data.startswith(b"\x89PNG"):
        at = 8
        while data[at + 4:at + 8] != b"IDAT":
            at += 12 + int.from_bytes(data[at:at + 4], "big")  # length, type, data, CRC
        cut = at + 8 + int.from_bytes(data[at:at + 4], "big") // 2
    else:
        at = 2  # after SOI: segments of marker (2 bytes) + length (2 bytes, counting itself)
        while data[at:at + 2] != b"\xff\xda":
            at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
        cut = at + (len(data) - at) // 2
    target.write_bytes(data[:cut])


@pytest.mark.parametrize("r_max", [0.3, 0.5, 0.9])
def test_downscale_plan_reads_headers_only_and_matches_the_decoded_sizes(embedder, images, r_max, tmp_path, monkeypatch):
    expected = _reference_caps(embedder, images, r_max)
    headers_only = []
    for item in images:  # the same files cut in their pixel data: a plan that decodes one fails
        if isinstance(item.image, Path):
            _cut_in_its_pixels(item.image, tmp_path / item.image.name)
            with Image.open(tmp_path / item.image.name) as opened, pytest.raises(OSError, match="truncated"):
                opened.load()
            item = replace(item, image=tmp_path / item.image.name)
        headers_only.append(item)

    def no_resizing(*args, **kwargs):
        raise AssertionError("the downscale plan decoded or resized an image")

    monkeypatch.setattr(VLSerializer, "prepare_image", no_resizing)  # the in-memory image too
    assert downscale_pixels(embedder, headers_only, r_max) == expected


def test_resized_size_of_a_pdf_page_is_the_rendered_size(embedder, image_dir):
    page = Item(image=image_dir / "doc.pdf", page=2, max_pixels=64 * 1024)
    assert embedder.serializer.resized_size(page) == embedder.serializer.prepare_image(page).size


def test_an_unreadable_image_gets_no_cap_and_is_reported_by_the_encode(embedder, images, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image")
    items = [images[0], Item(image=broken)]
    assert downscale_pixels(embedder, items, 0.5)[1] is None
    vectors, stats = encode_downscaled(embedder, items, 0.5)
    assert stats.n_failed == 1 and not vectors[1].any() and vectors[0].any()


def test_downscale_caps_use_the_processors_pixels_per_token(embedder, images, eval_model_dir):
    # 8 px patches merged 2x2 -> 256 px per token: 128x96 = 48 tokens, half = 24 -> 6144 px.
    processor = embedder.serializer.processor
    eight = type(processor.image_processor).from_pretrained(str(eval_model_dir), patch_size=8)
    loaded = replace(embedder.loaded, preprocessor=processor_with(processor, image_processor=eight))
    small_patches = Embedder(loaded, embedder.batching).with_serializer(embedder.serializer.config)
    assert token_pixels(small_patches) == 256
    assert downscale_pixels(small_patches, images[:1], 0.5) == [24 * 256]


def test_token_pixels_from_processor_then_model_config_then_the_qwen3_vl_default(embedder):
    processor = embedder.serializer.processor.image_processor
    assert token_pixels(embedder) == (processor.patch_size * processor.merge_size) ** 2 == DEFAULT_TOKEN_PIXELS

    def fake(image_processor=None, vision_config=None):
        serializer = SimpleNamespace(processor=SimpleNamespace(image_processor=image_processor))
        backbone = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(vision_config=vision_config)))
        return SimpleNamespace(serializer=serializer, backbone=backbone)

    assert token_pixels(fake(SimpleNamespace(patch_size=14, merge_size=2))) == 28 * 28
    assert token_pixels(fake(None, SimpleNamespace(patch_size=14, spatial_merge_size=2))) == 28 * 28
    assert token_pixels(fake(None, None)) == DEFAULT_TOKEN_PIXELS == 32 * 32


def test_item_max_pixels_is_validated_and_kept_by_pdf_expansion(embedder, image_dir):
    with pytest.raises(InputError, match="Item.max_pixels must be a positive number of pixels"):
        Item(image=image_dir / "red.png", max_pixels=0)
    with pytest.raises(InputError, match=r"red\.png: Item\.max_pixels 1000 is below min_pixels 4096"):
        embedder.encode([Item(image=image_dir / "red.png", max_pixels=1000)])
    pages, _, _ = expand_items([Item(image=image_dir / "doc.pdf", max_pixels=8192)])
    assert [(page.page, page.max_pixels) for page in pages] == [(1, 8192), (2, 8192)]


def test_a_per_item_cap_is_part_of_the_cache_fingerprint(images):
    plain = fingerprint("m", {"method": "full"}, images[:1])
    assert fingerprint("m", {"method": "full"}, [replace(images[0], max_pixels=None)]) == plain
    capped = {fingerprint("m", {"method": "full"}, [replace(images[0], max_pixels=cap)]) for cap in (4096, 8192)}
    assert len(capped) == 2 and plain not in capped


def test_docvqa_downscale_reuses_the_full_vectors_instead_of_recomputing_them(embedder, eval_data_dir, monkeypatch):
    docvqa = load_task("docvqa", eval_data_dir)

    def no_downscale(*args, **kwargs):
        raise AssertionError("downscaling text-only candidates re-ran the full forward")

    calls = _count_encode_calls(monkeypatch)
    monkeypatch.setattr(protocol, "encode_downscaled", no_downscale)
    results = evaluate(embedder, [docvqa], EvalConfig(r_max=(0.3, 0.5), methods=("downscale",)))
    # queries, the warm-up, Full: nothing for either downscale setting.
    assert calls == [len(docvqa.queries), protocol.WARMUP_ITEMS, len(docvqa.candidates)]
    task = results.tasks[0]
    full = task.setting("full", 0.0)
    for r in (0.3, 0.5):
        row = task.setting("downscale", r)
        assert row.scores == full.scores and row.stats == full.stats
        assert (row.prefix_removal, row.flops_reduction, row.forward_speedup, row.total_speedup) == (0.0, 0.0, 1.0, 1.0)


def test_image_candidates_are_still_downscaled(embedder, eval_data_dir, monkeypatch):
    nights = load_task("nights", eval_data_dir, limit=2)
    used = []
    monkeypatch.setattr(protocol, "encode_downscaled", lambda *a, **k: used.append(a[2]) or encode_downscaled(*a, **k))
    evaluate(embedder, [nights], EvalConfig(r_max=(0.5,), methods=("downscale",)))
    assert used == [0.5]


def test_evaluate_task_refuses_settings_without_full_first(embedder, eval_data_dir):
    nights = load_task("nights", eval_data_dir, limit=1)
    with pytest.raises(ConfigError, match=r"Full setting first.*downscale-r0\.50"):
        evaluate_task(embedder, nights, [Setting("downscale", 0.5)], None)
