"""Duplicate-patch removal before the vision tower (faste_mm.model.patch_dedup): bit-identical
vectors when nothing repeats; kept units and their positions on a page with blank margins; the
decoder sees only kept visual tokens; and Full and FastE against a naive reference built by hand
from transformers' own tower (reduced inputs with their original grid places) and decoder layers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import Qwen3VLModel

from faste_mm import FastEConfig, Item
from faste_mm.errors import ConfigError
from faste_mm.model.patch_dedup import PatchDedupConfig, PixelNorm, applies_to, drop_repeated_units

from tests.helpers.reference import _Sample, naive_embed

EXACT = PatchDedupConfig("exact")
NEAR = PatchDedupConfig("near")


def noise_image(width: int, height: int, seed: int) -> Image.Image:
    """Every 32 x 32 unit different from every other: nothing repeats."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def margin_page(seed: int = 0) -> tuple[Image.Image, set[tuple[int, int]]]:
    """A 256 x 192 white page (8 x 6 units of 32 px) with content in the unit cells returned
    ((row, column)); each content cell's pixels differ from every other cell's."""
    rng = np.random.default_rng(seed)
    page = np.full((192, 256, 3), 255, dtype=np.uint8)
    cells = {(1, 2), (1, 3), (2, 2), (3, 5), (4, 1)}
    for row, column in cells:
        page[row * 32:(row + 1) * 32, column * 32:(column + 1) * 32] = rng.integers(0, 200, (32, 32, 3), dtype=np.uint8)
    return Image.fromarray(page), cells


def serialize(embedder, item: Item, instruction: str | None = None):
    return embedder.backbone.with_positions(embedder.serializer(item, instruction))


def dedup(embedder, serialized, config=EXACT):
    norm = PixelNorm.of(embedder.loaded.preprocessor.image_processor)
    return drop_repeated_units(serialized, config, norm, embedder.backbone.image_token_id)


@pytest.mark.parametrize("mode", ["exact", "near"])
def test_a_page_without_repeated_units_embeds_bit_identical(vl_embedder, mode):
    items = [Item(image=noise_image(160, 96, seed)) for seed in range(2)] + ["a caption without pixels"]
    off = vl_embedder.encode(items)
    on = vl_embedder.encode(items, patch_dedup=PatchDedupConfig(mode))
    assert float(np.abs(on.embeddings - off.embeddings).max()) == 0.0
    assert on.stats.patch_shares() == {0: 1.0, 1: 1.0}


def test_blank_margins_drop_all_but_the_first_blank_unit_and_kept_tokens_keep_their_positions(vl_embedder):
    page, cells = margin_page()
    full = serialize(vl_embedder, Item(image=page, text="text after the page"))
    reduced = dedup(vl_embedder, full)
    # units row-major over the 6 x 8 grid of merge units; the first blank one is unit 0
    expected = sorted({0} | {row * 8 + column for row, column in cells})
    assert reduced.kept_units.tolist() == expected
    assert reduced.patch_units == (len(expected), 48)
    image_id = vl_embedder.backbone.image_token_id
    assert int((reduced.input_ids == image_id).sum()) == len(expected)
    # every kept token (image or text) sits at its position in the full sequence
    image_at = (full.input_ids == image_id).nonzero()[:, 0]
    keep = torch.ones(full.length, dtype=torch.bool)
    keep[image_at] = False
    keep[image_at[expected]] = True
    assert torch.equal(reduced.input_ids, full.input_ids[keep])
    assert torch.equal(reduced.position_ids, full.position_ids[:, keep])
    # the text after the image keeps the positions it has without dedup
    after = full.length - int(image_at[-1]) - 1
    assert torch.equal(reduced.position_ids[:, -after:], full.position_ids[:, -after:])
    patches = torch.tensor([[u * 4 + k for k in range(4)] for u in expected]).reshape(-1)
    assert torch.equal(reduced.pixel_values, full.pixel_values[patches])


def test_near_drops_units_within_the_tolerance_and_keeps_those_beyond(vl_embedder):
    page = np.full((64, 128, 3), 240, dtype=np.uint8)  # 2 x 4 units
    page[0:32, 32:64] = 241  # within a bucket of 4 levels (240-243): a near duplicate of unit 0
    page[0:32, 64:96] = 236  # another bucket: kept
    full = serialize(vl_embedder, Item(image=Image.fromarray(page)))
    assert dedup(vl_embedder, full, NEAR).kept_units.tolist() == [0, 2]
    assert dedup(vl_embedder, full, EXACT).kept_units.tolist() == [0, 1, 2]


def test_the_decoder_sees_one_visual_token_per_kept_unit(vl_embedder):
    page, cells = margin_page(seed=3)
    batch = next(iter(vl_embedder.prepare_batches([Item(image=page)], [0], patch_dedup=EXACT)))
    assert batch.patch_units == ((len(cells) + 1, 48),) and batch.tower_units == (len(cells) + 1,)
    vision = vl_embedder.backbone.encode_vision(batch)
    assert vision.sizes == [len(cells) + 1] and vision.merged.shape[0] == len(cells) + 1
    state = vl_embedder.backbone.embed(batch, vision)
    assert int(state.visual_mask.sum()) == len(cells) + 1


def test_photos_stay_whole_and_pages_screenshots_and_in_memory_images_are_deduplicated(tmp_path):
    assert applies_to(Item(image=tmp_path / "scan.png")) and applies_to(Item(image=tmp_path / "doc.pdf", page=1))
    assert applies_to(Item(image=Image.new("RGB", (64, 64))))
    assert not applies_to(Item(image=tmp_path / "holiday.jpg")) and not applies_to(Item(image=tmp_path / "a.heic"))
    assert not applies_to(Item(text="text only"))


def test_an_unknown_mode_or_tolerance_is_a_config_error_naming_the_valid_ones():
    with pytest.raises(ConfigError, match="off, exact, near"):
        PatchDedupConfig("fuzzy")
    with pytest.raises(ConfigError, match="tolerance"):
        PatchDedupConfig("near", tolerance=0)


# ---- the naive reference: transformers' tower and decoder layers, reduced inputs built by hand ----

def reference_sample(model, full, kept_units: list[int]) -> _Sample:
    """One item's decoder input as the official code would build it if the repeated units were
    never there: transformers' own `visual` on the kept patches with their full-grid learned
    positions and 2-D RoPE ids passed in (its `interp_*`, `position_ids`, `cu_seqlens` kwargs),
    the kept placeholder tokens scattered in order, MRoPE from `get_rope_index` on the FULL ids."""
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights, get_vision_position_ids

    visual, text = model.visual, model.language_model
    grid = full.image_grid_thw
    rows = torch.tensor([u * 4 + k for u in kept_units for k in range(4)])
    indices, weights = get_vision_interpolation_indices_and_weights(
        grid, num_grid_per_side=visual.num_grid_per_side, mode=visual.interpolation_mode,
        align_corners=visual.interpolation_align_corners, spatial_merge_size=2)
    out = visual(full.pixel_values[rows], grid_thw=grid, interp_indices=indices[rows], interp_weights=weights[rows],
                 position_ids=get_vision_position_ids(grid, 2)[rows],
                 cu_seqlens=torch.tensor([0, len(rows)], dtype=torch.int32), return_dict=True)
    image_id = model.config.image_token_id
    image_at = (full.input_ids == image_id).nonzero()[:, 0].tolist()
    dropped = {image_at[u] for u in range(len(image_at)) if u not in set(kept_units)}
    keep = [p for p in range(full.length) if p not in dropped]
    ids = full.input_ids[keep][None]
    hidden = text.embed_tokens(ids)
    visual_mask = ids[0] == image_id
    hidden = hidden.masked_scatter(visual_mask[None, :, None], out.pooler_output)
    positions, _ = model.get_rope_index(full.input_ids[None], mm_token_type_ids=full.mm_token_type_ids[None],
                                        image_grid_thw=grid)
    cos, sin = text.rotary_emb(hidden, positions[:, :, keep])
    return _Sample(hidden, cos, sin, visual_mask.tolist(), list(out.deepstack_features))


@pytest.mark.parametrize("fast_e", [None, FastEConfig(r_max=0.5, trigger_layer=3)],
                         ids=["full", "faste"])
def test_dedup_matches_a_reference_built_from_transformers_pieces(vl_embedder, model_dirs, fast_e):
    pages = [margin_page(seed)[0] for seed in (1, 2)]
    items = [Item(image=pages[0], text="first page"), Item(image=pages[1])]
    got = vl_embedder.encode(items, patch_dedup=EXACT, fast_e=fast_e)
    model = Qwen3VLModel.from_pretrained(str(model_dirs["qwen3_vl"])).eval()
    with torch.no_grad():
        samples = []
        for item in items:
            full = serialize(vl_embedder, item)
            samples.append(reference_sample(model, full, dedup(vl_embedder, full).kept_units.tolist()))
        faste = {} if fast_e is None else dict(r_max=0.5, trigger_layer=3)
        expected, trigger, _ = naive_embed(list(model.language_model.layers), model.language_model.norm, samples, **faste)
    np.testing.assert_allclose(got.embeddings, expected.numpy(), atol=1e-5)
    if fast_e is not None:
        assert got.stats.batches[0].trigger_layer == trigger
    assert (got.stats.kept_image_units, got.stats.image_units) == (12, 96) and got.stats.patches_kept == 0.125


# ---- the front ends: embed --format json, index's report line, the collection setting ----

def _page_files(folder, seeds=(5, 6)):
    folder.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        margin_page(seed)[0].save(folder / f"page-{seed}.png")
    noise_image(96, 64, seed=9).save(folder / "photo.jpg")  # a photo: never deduplicated
    return folder


def test_embed_json_reports_the_kept_patch_share_per_item(model_dirs, tmp_path):
    from typer.testing import CliRunner

    from faste_mm.cli.app import app

    folder = _page_files(tmp_path / "in")
    args = ["embed", str(folder), "--model", str(model_dirs["qwen3_vl"]), "--device", "cpu", "--r-max", "0",
            "--patch-dedup", "exact", "--format", "json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    shares = {Path(item["item"]).name: item["patches_kept"] for item in summary["items"]}
    assert shares == {"page-5.png": 6 / 48, "page-6.png": 6 / 48, "photo.jpg": None}
    assert summary["stats"]["patches_kept"] == 12 / 96
    bad = CliRunner().invoke(app, [*args[:-4], "--patch-dedup", "fuzzy"])
    assert bad.exit_code == 1 and "--patch-dedup 'fuzzy'" in bad.output


def test_index_reports_the_kept_share_records_the_setting_and_refuses_another(model_dirs, tmp_path):
    from typer.testing import CliRunner

    from faste_mm.cli.app import app
    from faste_mm.retrieval.profile import read_profile

    folder, col = _page_files(tmp_path / "in"), tmp_path / "col"
    base = ["index", str(folder), "-c", str(col), "--model", str(model_dirs["qwen3_vl"]), "--device", "cpu",
            "--r-max", "0"]
    table = CliRunner().invoke(app, [*base, "--patch-dedup", "exact"])
    assert table.exit_code == 0, table.output
    assert "pages (--patch-dedup)" in table.stdout and "12% of patches kept" in table.stdout
    assert read_profile(col).patch_dedup == "exact"
    refused = CliRunner().invoke(app, [*base, "--patch-dedup", "near"])
    assert refused.exit_code == 1
    assert "patch_dedup (--patch-dedup): collection has 'exact', request has 'near'" in refused.output
    more = _page_files(tmp_path / "in", seeds=(7,))  # a new page: the collection's setting, without the flag
    report = json.loads(CliRunner().invoke(app, ["index", str(more), "-c", str(col), "--format", "json"]).stdout)
    assert report["embedded"] == 1 and report["patches_kept"] == 6 / 48


def test_plan_measures_dedup_against_every_patch_kept_and_its_receipt_says_the_kept_share(vl_embedder, tmp_path):
    from faste_mm.tools.plan import PlanConfig, plan

    folder = _page_files(tmp_path / "in", seeds=(10, 11, 12))
    items = sorted(folder.iterdir())
    config = PlanConfig(max_pixels=(1_843_200,), r_max=(0.0,), dtypes=("float32",), patch_dedup=("off", "exact"))
    report = plan(vl_embedder, items, config)
    assert sorted(row.patch_dedup for row in report.candidates) == ["exact", "off"]
    row = next(i for i, r in enumerate(report.candidates) if r.patch_dedup == "exact")
    chosen = report.candidates[row]
    off = vl_embedder.encode_documents(items).embeddings
    on = vl_embedder.encode_documents(items, patch_dedup=EXACT)
    np.testing.assert_allclose(chosen.mean_cos, float(np.mean(np.sum(off * on.embeddings, axis=1))), atol=1e-6)
    assert chosen.patches_kept == on.stats.patches_kept == 18 / 144  # the photo is never looked at
    assert report.settings(row)["patch_dedup"] == "exact"
    receipt = report.receipt(row)
    assert "duplicate patches dropped (exact, 12% of page patches kept" in receipt.summary()
    assert f"cosine {chosen.mean_cos:.3f}" in receipt.summary()
