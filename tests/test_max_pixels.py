"""Resolution as a budget: a pixel cap (or the same in visual tokens) changes each image's and
page's grid exactly as qwen-vl-utils' smart_resize says, and the two spellings agree."""

from __future__ import annotations

import pytest
from PIL import Image
from qwen_vl_utils import smart_resize

from faste_mm import Item
from faste_mm.errors import ConfigError
from faste_mm.model.serialization import PIXELS_PER_VISUAL_TOKEN, SerializerConfig, pixel_budget

PATCH = 16  # image_grid_thw counts 16x16 patches; smart_resize rounds to 32 (patch x merge 2)


@pytest.mark.parametrize("size", [(1280, 960), (640, 480), (300, 2000)])
@pytest.mark.parametrize("max_pixels", [1_843_200, 501_760, 65_536, 8_192])
def test_the_grid_follows_smart_resize_at_the_budget(vl_embedder, tmp_path, size, max_pixels):
    path = tmp_path / "photo.png"
    Image.new("RGB", size, (40, 90, 160)).save(path)
    capped = vl_embedder.with_serializer(SerializerConfig(max_pixels=max_pixels))
    serialized = capped.serializer(Item(image=path), None)
    height, width = smart_resize(size[1], size[0], factor=32, min_pixels=4096, max_pixels=max_pixels)
    assert serialized.image_grid_thw.tolist() == [[1, height // PATCH, width // PATCH]]
    assert height * width <= max_pixels
    assert capped.serializer.resized_size(Item(image=path)) == (width, height)


def test_a_page_renders_within_the_budget(vl_embedder, image_dir):
    for max_pixels in (1_843_200, 65_536):
        capped = vl_embedder.with_serializer(SerializerConfig(max_pixels=max_pixels))
        serialized = capped.serializer(Item(image=image_dir / "doc.pdf", page=1), None)
        t, h, w = serialized.image_grid_thw[0].tolist()
        assert h * w * PATCH * PATCH <= max_pixels and t == 1


def test_visual_tokens_are_32_by_32_pixels_and_exclusive_with_max_pixels():
    assert PIXELS_PER_VISUAL_TOKEN == 32 * 32
    assert pixel_budget(visual_tokens=980) == 980 * 1024 == 1_003_520
    assert pixel_budget(max_pixels=501_760) == 501_760
    assert pixel_budget() is None
    with pytest.raises(ConfigError, match="--max-pixels or --visual-tokens, not both"):
        pixel_budget(501_760, 490, names=("--max-pixels", "--visual-tokens"))
    with pytest.raises(ConfigError, match="visual_tokens must be a positive whole number"):
        pixel_budget(visual_tokens=0)
    with pytest.raises(ConfigError, match="min_pixels <= max_pixels"):
        SerializerConfig(max_pixels=1024)
