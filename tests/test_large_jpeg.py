"""A JPEG past Pillow's decompression-bomb limit (a 20000x20000 photo, 400 MP) is decoded at reduced
scale by its DCT (JPEG draft mode), as docs/photos.md says of JPEGs over 67 MP: indexed, its facts
read, never refused; a bomb of another format stays refused from its header
(tests/test_hostile_inputs.py). The photo is written once per session without holding its pixels
(`solid_gray_jpeg`)."""

from __future__ import annotations

import pytest
from PIL import Image

from faste_mm import BatchingConfig, Embedder, Retriever
from faste_mm.errors import InputError
from faste_mm.model.file_decoding import MAX_DECODE_PIXELS, load_image, read_image_size
from faste_mm.model.items import Item
from faste_mm.retrieval.library.photo_metadata import read_facts
from tests.helpers.inputs import tiny_vl_dir
from tests.helpers.photo_fixtures import solid_gray_jpeg


@pytest.fixture(scope="session")
def huge_jpeg(tmp_path_factory):
    return solid_gray_jpeg(tmp_path_factory.mktemp("large") / "panorama.jpg", 20000, 20000)


def test_pillow_alone_refuses_the_photo_as_a_bomb(huge_jpeg):
    with pytest.raises(Image.DecompressionBombError):
        Image.open(huge_jpeg)


def test_a_20000_px_jpeg_is_decoded_at_a_quarter_scale_never_whole(huge_jpeg):
    assert read_image_size(Item(image=huge_jpeg)) == (5000, 5000)  # the planned size is the decoded one
    image = load_image(Item(image=huge_jpeg), max_pixels=1_000_000)
    assert image.size == (5000, 5000) and image.size[0] * image.size[1] <= MAX_DECODE_PIXELS
    assert image.getextrema() == (128, 128)  # the photo's pixels, at 1/4 scale


def test_its_facts_give_the_stored_size(huge_jpeg):
    facts = read_facts(huge_jpeg, "image")
    assert (facts.width, facts.height, facts.issues) == (20000, 20000, ())


def test_index_embeds_it(huge_jpeg, tmp_path):
    embedder = Embedder.from_pretrained(str(tiny_vl_dir(tmp_path.parent)), device="cpu",
                                        batching=BatchingConfig(batch_tokens=1 << 16))
    report = Retriever(embedder, collection=tmp_path / "col").index([huge_jpeg])
    assert (report.embedded, report.failed) == (1, 0), report.failures


def test_a_truncated_huge_jpeg_is_a_failure_naming_the_file(huge_jpeg, tmp_path):
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(huge_jpeg.read_bytes()[:4096])
    with pytest.raises(InputError, match="cut.jpg"):
        load_image(Item(image=cut), max_pixels=1_000_000)
