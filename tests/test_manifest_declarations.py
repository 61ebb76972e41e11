"""The manifest reads the same declarations as the profile (issue 45 item 4): manifests written
by earlier versions still open with the same values, a setting declared once in
`CollectionProfile` round-trips through manifest.json without any change to `Manifest`, the few
fields both need are declared once (by the storage layer), and the official pixel cap is written
as a number in one module only."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import tokenize
from pathlib import Path

import numpy as np
import pytest

from faste_mm.errors import CollectionError
from faste_mm.indexers import Collection, ItemRecord
from faste_mm.indexers.manifest import Manifest
from faste_mm.model.official import OFFICIAL_MAX_PIXELS
from faste_mm.model.video import VideoConfig
from faste_mm.retrieval.profile import CollectionProfile, read_profile
from faste_mm.retrieval.setting import setting, settings_of

D = 8
# manifest.json exactly as faste-mm wrote it before the manifest read the profile's declarations
# (the hand-written Manifest.to_dict of 37fa857), for a FastE collection with every section filled.
OLD_MANIFEST = {
    "format_version": 1, "faste_mm_version": "0.1.0", "model_id": "org/model-A", "model_revision": "abc123",
    "dim": D, "model_dim": 16, "vector_dtype": "float32", "normalized": True, "metric": "ip",
    "document_instruction": "Represent the user's input.",
    "serializer": {"min_pixels": 4096, "max_pixels": 501760,
                   "video": {"fps": 2.0, "max_frames": 8, "min_frames": 4, "min_pixels": 131072,
                             "max_pixels": 786432, "total_pixels": 7864320}},
    "fast_e": {"r_max": 0.3, "warmup_layer": 2, "threshold": 0.6, "threshold_source": "given (--threshold)",
               "trigger_layer": None},
    "index": {"type": "auto", "memory_budget_bytes": 4 * 2**30, "factory": None, "epoch": -1, "max_part": -1,
              "sha256": None},
    "counts": {}, "vectors": {"precision": "float16", "keep": "float", "int8_ranges": None},
    "reranker": "org/reranker", "receipt": None, "ocr": True, "search": {"min_score": 0.25},
}
# A collection from before Matryoshka, videos, precisions, OCR, rerankers and min-score: those
# keys are absent and read as the values such a collection had.
OLDEST_MANIFEST = {
    "format_version": 1, "faste_mm_version": "0.0.1", "model_id": "org/model-A", "model_revision": None,
    "dim": D, "vector_dtype": "float16", "normalized": True, "metric": "ip",
    "document_instruction": "Represent the user's input.", "serializer": {"min_pixels": 4096, "max_pixels": 1843200},
    "fast_e": None, "index": {"type": "auto", "memory_budget_bytes": 2**30}, "counts": {"ok": 2},
}


def _collection_with(root: Path, manifest: dict) -> Path:
    """A real collection of two vectors whose manifest.json is then replaced by `manifest`."""
    with Collection.create(root, Manifest(model_id=manifest["model_id"], dim=D)) as col:
        col.add(np.eye(D, dtype=np.float32)[:2], [ItemRecord(uri=f"u{i}", modality="text") for i in range(2)])
    (root / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return root


def test_an_old_format_manifest_opens_with_every_value_it_recorded(tmp_path):
    root = _collection_with(tmp_path / "c", OLD_MANIFEST)
    with Collection.open(root, writable=True) as col:
        assert (col.manifest.model_id, col.manifest.dim, col.manifest.vectors, col.manifest.vector_dtype) == (
            "org/model-A", D, "float16", "float32")
        assert col.info().n_ok == 2
    profile = read_profile(root)
    assert (profile.model_revision, profile.model_dim, profile.max_pixels) == ("abc123", 16, 501760)
    assert profile.video == VideoConfig(fps=2.0, max_frames=8)
    assert (profile.r_max, profile.warmup_layer, profile.threshold, profile.threshold_source) == (
        0.3, 2, 0.6, "given (--threshold)")
    assert (profile.reranker, profile.ocr, profile.min_score, profile.is_matryoshka) == ("org/reranker", True, 0.25, True)
    # the collection wrote its manifest again on close: the same content, in the same layout
    written = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    derived = ("index", "counts")  # the index state and counts are the collection's to update
    assert {k: v for k, v in written.items() if k not in derived} == {
        k: v for k, v in OLD_MANIFEST.items() if k not in derived}
    assert Manifest.from_dict(copy.deepcopy(OLD_MANIFEST)).to_dict() == OLD_MANIFEST


def test_the_oldest_manifest_reads_as_the_settings_such_a_collection_had(tmp_path):
    root = _collection_with(tmp_path / "c", OLDEST_MANIFEST)
    with Collection.open(root) as col:
        assert (col.manifest.vectors, col.manifest.keep, col.manifest.memory_budget_bytes) == ("float32", "float", 2**30)
    profile = read_profile(root)
    assert profile.video == VideoConfig() and profile.r_max == 0.0 and profile.warmup_layer is None
    assert (profile.model_dim, profile.is_matryoshka) == (D, False)  # the full width was stored
    assert (profile.reranker, profile.ocr, profile.min_score, profile.receipt) == (None, False, None, None)
    assert profile.max_pixels == OFFICIAL_MAX_PIXELS


def test_a_damaged_settings_section_is_refused_naming_it(tmp_path):
    root = _collection_with(tmp_path / "c", {**OLD_MANIFEST, "serializer": "x"})
    with pytest.raises(CollectionError, match="invalid collection settings.*'serializer' must be an object"):
        read_profile(root)


@dataclasses.dataclass(frozen=True, slots=True)
class _WithANewSetting(CollectionProfile):
    """A profile one setting richer, declared the way docs/collections.md says: nothing else changes."""

    patch_shingles: int | None = setting(
        None, "serializer.patch_shingles", "--patch-shingles", "A made-up setting for this test.",
        valid=lambda value: isinstance(value, int) and value >= 1, rule="an int >= 1", missing=None, carry=True)


def test_a_setting_declared_once_in_the_profile_is_stored_compared_and_carried_without_touching_the_manifest(tmp_path):
    profile = _WithANewSetting(model_id="org/model-A", dim=D, model_dim=D, patch_shingles=3)
    with Collection.create(tmp_path / "c", profile.to_manifest()):
        pass
    stored = json.loads((tmp_path / "c" / "manifest.json").read_text(encoding="utf-8"))
    assert stored["serializer"]["patch_shingles"] == 3
    with Collection.open(tmp_path / "c") as col:
        again = _WithANewSetting.from_manifest(col.manifest)
        assert again == profile
        # code that does not know the setting keeps it when it writes the manifest again
        base = CollectionProfile.from_manifest(col.manifest).to_manifest(base=col.manifest)
    assert _WithANewSetting.from_manifest(base).patch_shingles == 3
    assert "patch_shingles (--patch-shingles): collection has 3, request has 4" in again.conflicts(
        dataclasses.replace(again, patch_shingles=4))[0]
    assert again.carried_over()["patch_shingles"] == 3
    older = _WithANewSetting.from_manifest(CollectionProfile(model_id="m", dim=D).to_manifest())
    assert older.patch_shingles is None  # a collection from before the setting: its `missing` value


def test_fields_the_storage_layer_and_the_profile_share_are_declared_once():
    """The profile's model id, width and precisions are the manifest's declarations reused (same
    key, same check), and no other profile setting is a field of `Manifest`."""
    stored = {f.metadata["stored"].key: f.name for f in dataclasses.fields(Manifest) if "stored" in f.metadata}
    shared = {name: declared for name, declared in settings_of(CollectionProfile).items() if declared.key in stored}
    assert sorted(shared) == ["dim", "keep", "model_id", "vectors"]
    for name, declared in shared.items():
        assert declared.valid is Manifest.declared(stored[declared.key]).valid, name
    assert {f.name for f in dataclasses.fields(Manifest)} & set(settings_of(CollectionProfile)) == set(shared)


def _package_files() -> list[Path]:
    top = Path(__file__).resolve().parents[1]
    return [p for folder in ("faste_mm", "indexers", "cli", "datasets") for p in sorted((top / folder).rglob("*.py"))]


def test_the_official_pixel_cap_is_written_as_a_number_in_one_module_only():
    written = []
    for path in _package_files():
        for token in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
            if token.type == tokenize.NUMBER and token.string.replace("_", "").isdigit() and int(
                    token.string.replace("_", "")) == OFFICIAL_MAX_PIXELS:
                written.append(f"{path.name}:{token.start[0]}")
            elif token.type == tokenize.STRING and not token.string.startswith(('"""', "'''", 'f"""')) and (
                    "1843200" in token.string or "1,843,200" in token.string):
                written.append(f"{path.name}:{token.start[0]} (a string)")
    assert written == []  # faste_mm/model/official.py spells it 1800 x PIXELS_PER_VISUAL_TOKEN
