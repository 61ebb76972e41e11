"""Duplicate-patch removal before the vision tower (PixelPrune, arXiv 2604.00886): on document
pages and screenshots most 32 x 32 px merge units are blank margin or repeated background. A unit
equal (or, "near", close) to an earlier unit of the same frame is dropped before the tower.

Receives one serialized image item whose MRoPE positions are already computed on the FULL token
sequence (`Backbone.with_positions`); hands on the same item with the repeated units' patches and
placeholder tokens removed and `kept_units` set. Kept tokens keep their original positions, so
the text after the image sits where it sits without dedup (the official `get_rope_index` places
it after max(h, w) / merge of the grid, not after the token count). The tower gives kept patches
their original 2-D RoPE and learned positions (`vision_tower.KeptPatches`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from faste_mm.errors import ConfigError
from faste_mm.kinds import dedups_patches
from faste_mm.model.opened_files import file_name

if TYPE_CHECKING:  # torch and numpy are imported where patches are compared: the profile reads the modes cheaply
    import numpy as np
    import torch

PATCH_DEDUP_MODES = ("off", "exact", "near")
# near: a unit is dropped when every one of its pixel values lies in the same bucket of this many
# 8-bit levels as the earlier unit's (so no value differs by more than 3 of 255): JPEG ringing and
# scanner noise on a blank margin stay within it, the antialiased edge of a glyph does not.
NEAR_TOLERANCE = 4


@dataclass(frozen=True, slots=True)
class PatchDedupConfig:
    """Which repeated merge units are dropped before the vision tower.

    mode: "off", "exact" (a unit whose pixels are identical to an earlier unit of the same frame)
        or "near" (every pixel value within the same `tolerance`-level bucket as an earlier unit's).
    tolerance: near only: bucket width in 8-bit levels (0-255); values of one bucket differ by at
        most tolerance - 1.
    """

    mode: str = "off"
    tolerance: int = NEAR_TOLERANCE

    def __post_init__(self) -> None:
        if self.mode not in PATCH_DEDUP_MODES:
            raise ConfigError(f"PatchDedupConfig.mode must be one of {', '.join(PATCH_DEDUP_MODES)}, got {self.mode!r}")
        if isinstance(self.tolerance, bool) or not isinstance(self.tolerance, int) or not 1 <= self.tolerance <= 64:
            raise ConfigError(f"PatchDedupConfig.tolerance must be an int from 1 to 64 (8-bit levels), "
                              f"got {self.tolerance!r}")

    @property
    def is_on(self) -> bool:
        return self.mode != "off"


def dedup_config(mode: str) -> PatchDedupConfig | None:
    """A mode as the config `Embedder.encode(patch_dedup=...)` takes: None for "off" (a
    collection's `patch_dedup` setting, a command's flag); ConfigError naming the valid modes."""
    return None if mode == "off" else PatchDedupConfig(mode)


@dataclass(frozen=True, slots=True)
class PixelNorm:
    """The processor's per-channel normalisation (`image_mean`, `image_std`), to read a patch's
    normalised values back as 8-bit levels (a patch row is laid out channel-major: C x T_p x P x P)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def of(cls, image_processor) -> "PixelNorm":
        return cls(tuple(float(m) for m in image_processor.image_mean), tuple(float(s) for s in image_processor.image_std))


def repeated_units(pixel_values: torch.Tensor, grid_thw: torch.Tensor, merge: int, config: PatchDedupConfig,
                   norm: PixelNorm) -> torch.Tensor:
    """[U] bool, True for each merge unit that repeats an earlier unit of its frame.

    pixel_values [t x h x w, C x T_p x P x P] of ONE image in the processor's order (the merge x
    merge patches of a unit are consecutive rows, units row-major per frame); grid_thw [1, 3].
    """
    import numpy as np
    import torch

    t, h, w = (int(x) for x in grid_thw[0])
    per_unit = merge * merge
    units = pixel_values.reshape(t, h * w // per_unit, per_unit * pixel_values.shape[-1]).numpy()  # [t, U_f, V]
    if config.mode == "near":
        units = _levels(units, norm, pixel_values.shape[-1]) // config.tolerance
    repeated = np.zeros(units.shape[:2], dtype=bool)
    for frame in range(t):
        first: dict[bytes, int] = {}
        for unit, values in enumerate(units[frame]):
            repeated[frame, unit] = first.setdefault(values.tobytes(), unit) != unit
    return torch.from_numpy(repeated.reshape(-1))


def _levels(units: np.ndarray, norm: PixelNorm, row: int) -> np.ndarray:
    """Normalised patch values [..., V] (rows of `row` values, channel-major) as 8-bit levels (int16)."""
    import numpy as np

    channels = len(norm.mean)
    scale = np.repeat(np.asarray(norm.std, np.float32) * 255, row // channels)  # [row]
    shift = np.repeat(np.asarray(norm.mean, np.float32) * 255, row // channels)
    values = units.reshape(*units.shape[:-1], -1, row)
    return np.rint(values * scale + shift).astype(np.int16).reshape(units.shape)


def drop_repeated_units(item, config: PatchDedupConfig, norm: PixelNorm, image_token_id: int, merge: int = 2):
    """`item` (a `Serialized` with one image and its MRoPE positions) without the image's repeated
    merge units: their patch rows, placeholder tokens, token types and positions go; the kept
    units' indices (into the full grid's units, in order) are recorded in `kept_units`, and
    (units kept, units of the image) in `patch_units`. Where nothing repeats, only `patch_units`
    is set (kept_units None: the tower runs exactly as without removal); without an image, nothing.
    """
    import torch

    if not config.is_on or item.pixel_values is None:
        return item
    if item.position_ids is None:  # positions come from the full sequence; without them, dropping would renumber
        raise RuntimeError("drop_repeated_units needs the item's MRoPE positions (Backbone.with_positions) first")
    repeated = repeated_units(item.pixel_values, item.image_grid_thw, merge, config, norm)  # [U]
    units = int(repeated.shape[0])
    if not bool(repeated.any()):
        return replace(item, patch_units=(units, units))
    kept_units = (~repeated).nonzero()[:, 0]  # [U_kept]
    per_unit = merge * merge
    rows = (kept_units[:, None] * per_unit + torch.arange(per_unit)).reshape(-1)  # [P_kept]
    image_tokens = (item.input_ids == image_token_id).nonzero()[:, 0]  # [U]: one per unit, in unit order
    keep = torch.ones(item.length, dtype=torch.bool)
    keep[image_tokens[repeated]] = False
    return replace(
        item,
        input_ids=item.input_ids[keep],
        mm_token_type_ids=item.mm_token_type_ids[keep],
        position_ids=item.position_ids[:, keep],
        pixel_values=item.pixel_values[rows],
        kept_units=kept_units,
        patch_units=(int(kept_units.shape[0]), units),
    )


def applies_to(item) -> bool:
    """Whether duplicate-patch removal runs on `item` (an `Item`): a PDF page or an image file of a
    kind that pays (faste_mm.kinds' `patch_dedup` suffixes: pages, screenshots, slides, scans; not
    photos), or an in-memory PIL image (the caller chose to set it). Never videos."""
    from PIL import Image

    if item.image is None or item.video is not None:
        return False
    if isinstance(item.image, Image.Image):
        return True
    return dedups_patches(file_name(item.image))
