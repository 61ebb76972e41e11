"""HEIC/HEIF (pillow-heif) and AVIF (Pillow's own) photos: one image kind in faste_mm.kinds, decoded,
their EXIF read, thumbnailed for the page; without the plugin, a message saying what to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, features

from faste_mm.kinds import kind_name
from faste_mm.model.file_decoding import load_image, register_image_plugins
from faste_mm.model.items import Item
from faste_mm.retrieval.library.photo_metadata import read_facts
from faste_mm.serving.thumbnails import thumbnail
from faste_mm.indexers import ItemRecord

from tests.helpers.photo_fixtures import exif_block
from tests.helpers.bounds import HANG_S


def heic_photo(path: Path) -> Path:
    register_image_plugins()
    pixels = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    exif = exif_block("2023:01:02 03:04:05", "-05:00", "Apple", "iPhone 15", gps=(40.7, -74.0, 3.0))
    Image.fromarray(pixels).save(path, "HEIF", exif=exif.tobytes())
    return path


@pytest.mark.parametrize("suffix", [".heic", ".HEIF", ".avif"])
def test_heic_heif_and_avif_are_images_in_the_one_kinds_table(suffix):
    assert kind_name(f"IMG_0001{suffix}") == "image"


def test_a_heic_decodes_and_gives_its_exif(tmp_path):
    path = heic_photo(tmp_path / "IMG_0001.heic")
    assert load_image(Item(image=path), 1 << 20).size == (64, 48)
    facts = read_facts(path, "image")
    assert (facts.camera, facts.taken_offset_min, facts.taken_source, facts.region) == (
        "Apple iPhone 15", -300, "exif", "New York")


def test_a_heic_gets_a_thumbnail_for_the_page(tmp_path):
    path = heic_photo(tmp_path / "IMG_0002.heic")
    data = thumbnail(ItemRecord(uri=str(path), modality="image", id=1), tmp_path / "thumbs")
    assert Image.open(__import__("io").BytesIO(data)).size[0] > 0


@pytest.mark.skipif(not features.check("avif"), reason="this Pillow has no AVIF codec")
def test_an_avif_decodes_with_pillow_alone(tmp_path):
    Image.new("RGB", (40, 30), (10, 200, 30)).save(tmp_path / "a.avif")
    assert load_image(Item(image=tmp_path / "a.avif"), 1 << 20).size == (40, 30)


def test_without_pillow_heif_a_heic_fails_with_what_to_install(tmp_path):
    path = heic_photo(tmp_path / "IMG_0003.heic")
    # A fresh interpreter where the plugin cannot be imported (as on an install without the extra).
    code = ("import sys; sys.modules['pillow_heif'] = None\n"
            "from faste_mm.model.file_decoding import load_image\n"
            "from faste_mm.model.items import Item\n"
            "from faste_mm.errors import InputError\n"
            f"try:\n    load_image(Item(image={str(path)!r}), 1 << 20)\n"
            "except InputError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=HANG_S).stdout
    assert str(path) in out and "pillow_heif" in out and "faste-mm[photos]" in out
