"""The explain tool's picture: the reranker readout's attention over an item's visual tokens
(`model.rerank.explain.VisualMap`, as /explain returns it) laid over the item's preview, so an
assistant sees where the reranker looked (attention, not attribution).

Receives an item record and one visual map as a dict (`grid` [h/2, w/2] weights, `size`);
hands back JPEG bytes.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from faste_mm.serving.thumbnails import jpeg, preview

# Warm overlay: transparent where the readout did not look, opaque orange-red where it looked most.
HEAT_RGB = (255, 64, 0)
HEAT_MAX_ALPHA = 0.65


def heatmap(record, visual: dict, longest_px: int) -> bytes:
    """JPEG of `record`'s preview with `visual["grid"]` blended over it (each cell's weight over
    the grid's largest, spread smoothly over the picture). The grid covers the whole resized
    image the model saw, which has the preview's aspect ratio (both keep the file's)."""
    base = Image.open(io.BytesIO(preview(record, longest_px))).convert("RGB")
    grid = np.asarray(visual["grid"], dtype=np.float32)  # [h/2, w/2]
    if grid.ndim != 2 or grid.size == 0:
        return jpeg(base, longest_px)
    peak = float(grid.max())
    weights = grid / peak if peak > 0 else grid
    alpha = Image.fromarray(np.uint8(np.clip(weights, 0, 1) * 255 * HEAT_MAX_ALPHA), "L")
    alpha = alpha.resize(base.size, Image.Resampling.BILINEAR)
    heat = Image.new("RGB", base.size, HEAT_RGB)
    return jpeg(Image.composite(heat, base, alpha), longest_px)
