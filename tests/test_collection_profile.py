"""The collection profile: one record of a collection's settings, its stored form, the defaults
rule (the collection's value, else the user's, else the documented default) and the refusal of
a conflicting user value; and the API using it (`Retriever.from_pretrained(m).index(p,
collection=existing)` embeds with the collection's settings, as the CLI does)."""

from __future__ import annotations

import dataclasses
import inspect
import logging
from pathlib import Path

import numpy as np
import pytest

from faste_mm import BatchingConfig, Embedder
from faste_mm.errors import CollectionError, ConfigError, ModelLoadError
from faste_mm.indexers import Collection
from faste_mm.indexers.manifest import Manifest
from faste_mm.model.video import VideoConfig
from faste_mm.retrieval.collection_settings import for_collection
from faste_mm.retrieval.profile import DOCUMENT_R_MAX, CollectionProfile, read_profile, setting_of
from faste_mm.retrieval.receipt import PlanReceipt
from faste_mm.retrieval.retriever import Retriever

from tests.helpers.inputs import noise_image


def _stored(**changes) -> CollectionProfile:
    return dataclasses.replace(CollectionProfile(model_id="org/model", dim=8, model_dim=8), **changes)


@pytest.mark.parametrize("profile", [
    _stored(),
    _stored(r_max=0.0),
    _stored(r_max=0.3, warmup_layer=2, threshold=0.6, threshold_source="given", trigger_layer=3),
    _stored(dim=4, model_dim=8, min_pixels=1024, max_pixels=65536, video=VideoConfig(fps=2.0, max_frames=8)),
])
def test_a_profile_round_trips_through_the_manifest(profile):
    manifest = profile.to_manifest("HNSW32")
    assert manifest.index_type == "HNSW32"
    assert CollectionProfile.from_manifest(Manifest.from_dict(manifest.to_dict())) == profile


def test_every_profile_field_has_a_manifest_key_and_a_flag():
    for f in dataclasses.fields(CollectionProfile):
        setting = f.metadata["setting"]
        assert setting.key and setting.flag, f.name
    keys = [f.metadata["setting"].key for f in dataclasses.fields(CollectionProfile)]
    assert len(keys) == len(set(keys))


# A valid value other than `_stored(r_max=0.3)`'s for each profile field (the tests below run over
# the dataclass's fields, so a new field fails here until it has one, not silently).
SAMPLES = dict(model_id="org/other", model_revision="abc123", dim=4, model_dim=16,
               document_instruction="Represent the page.", min_pixels=1024, max_pixels=65536,
               video=VideoConfig(fps=2.0), r_max=0.25, warmup_layer=2, threshold=0.6, threshold_source="given",
               trigger_layer=3, vectors="float16", keep="none", reranker="org/reranker", min_score=0.25,
               receipt=PlanReceipt(0.3, 65536, "float32", None, 8, 10, 0.9, None, 0.99, 0.95, 1.5, 1.4, "cpu",
                                   "2026-11-26T00:00:00", "org/model"), ocr=True, patch_dedup="exact")


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(CollectionProfile)])
def test_every_profile_field_round_trips_through_the_manifest_and_is_compared_on_conflict(name):
    assert name in SAMPLES, f"new profile field {name!r}: give it a sample value in SAMPLES"
    base = _stored(r_max=0.3)  # FastE on: the manifest stores its fields
    changed = dataclasses.replace(base, **{name: SAMPLES[name]})
    assert getattr(changed, name) != getattr(base, name)
    assert CollectionProfile.from_manifest(Manifest.from_dict(changed.to_manifest().to_dict())) == changed
    conflicts = base.conflicts(changed)
    if setting_of(name).refuse:
        assert len(conflicts) == 1 and conflicts[0].startswith(f"{name} ({setting_of(name).flag})"), conflicts
    else:  # informational: the collection's value is kept
        assert conflicts == []
    assert CollectionProfile.resolve(None, **{name: SAMPLES[name]}) == dataclasses.replace(
        CollectionProfile(), **{name: SAMPLES[name]})


def test_for_collection_resolves_the_given_settings_once_and_a_reindex_carries_the_collections(tmp_path):
    names = Retriever.SETTINGS  # read from the profile's declarations
    assert {"r_max", "warmup_layer", "threshold", "trigger_layer", "dim", "vectors", "keep", "video",
            "max_pixels", "reranker"} <= set(names)
    assert not {"model_id", "model_revision", "model_dim", "threshold_source"} & set(names)  # model= / not given
    given = {name: SAMPLES[name] for name in names}
    assert for_collection(tmp_path / "new", None, None, False, given) == dataclasses.replace(CollectionProfile(), **given)
    retriever = Retriever.for_collection(tmp_path / "new", "org/never-loaded", **given)
    assert retriever.r_max == SAMPLES["r_max"]
    # --reindex: the given settings over the ones carried over from the collection
    existing = _stored(r_max=0.3, dim=4, vectors="float16", keep="none", reranker="org/reranker")
    Collection.create(tmp_path / "col", existing.to_manifest()).close()
    resolved = for_collection(tmp_path / "col", None, None, True, {"threshold": 0.5})
    assert (resolved.r_max, resolved.dim, resolved.vectors, resolved.keep, resolved.threshold) == (
        0.3, 4, "float16", "none", 0.5)
    assert resolved.reranker is None  # informational: not carried over


def test_a_full_forward_collection_records_no_fast_e_and_reads_r_max_zero():
    manifest = _stored(r_max=0.0, warmup_layer=3).to_manifest()
    assert manifest.to_dict()["fast_e"] is None
    assert CollectionProfile.from_manifest(manifest).r_max == 0.0


def test_the_defaults_rule_collection_then_user_then_documented_default():
    new = CollectionProfile.resolve(None)
    assert (new.r_max, new.video, new.dim) == (DOCUMENT_R_MAX, VideoConfig(), None)
    given = CollectionProfile.resolve(None, r_max=0.25, video={"fps": 2.0}, dim=None)
    assert (given.r_max, given.video) == (0.25, VideoConfig(fps=2.0))  # None = not given
    existing = _stored(r_max=0.3, video=VideoConfig(max_frames=8))
    assert CollectionProfile.resolve(existing) == existing  # nothing given: the collection's
    assert CollectionProfile.resolve(existing, r_max=0.3, video={"max_frames": 8}) == existing


def test_a_conflicting_user_value_is_refused_naming_the_flag_and_both_values():
    existing = _stored(r_max=0.3, video=VideoConfig(max_frames=8))
    with pytest.raises(CollectionError) as caught:
        CollectionProfile.resolve(existing, r_max=0.5, video={"fps": 2.0})
    message = str(caught.value)
    assert "--r-max" in message and "0.3" in message and "0.5" in message
    assert "--video-*" in message and "'fps': 1.0" in message and "'fps': 2.0" in message
    assert "--reindex" in message
    with pytest.raises(ConfigError, match="unknown collection settings.*rmax"):
        CollectionProfile.resolve(None, rmax=0.5)


def test_conflicts_list_each_differing_setting_and_ignore_informational_ones():
    ours = _stored(threshold_source="calibrated")
    theirs = _stored(model_id="org/other", dim=4, threshold_source="backbone default")
    assert ours.conflicts(theirs) == [
        "model_id (--model): collection has 'org/model', request has 'org/other'",
        "dim (--dim): collection has 8, request has 4",
    ]
    assert ours.conflicts(ours) == []


def test_a_manifest_without_newer_keys_reads_as_documented():
    old = _stored().to_manifest().to_dict()
    del old["serializer"]["video"], old["serializer"]["patch_dedup"], old["model_dim"], old["fast_e"]["trigger_layer"]
    profile = CollectionProfile.from_manifest(Manifest.from_dict(old))
    assert (profile.video, profile.model_dim, profile.trigger_layer, profile.patch_dedup) == (VideoConfig(), 8, None, "off")


# ---- the API: settings of an existing collection --------------------------------------------
@pytest.fixture(scope="module")
def embedder(model_dirs) -> Embedder:
    return Embedder.from_pretrained(str(model_dirs["qwen3_vl"]), device="cpu",
                                    batching=BatchingConfig(batch_tokens=1 << 16))


def test_from_pretrained_index_into_an_existing_collection_uses_its_settings(embedder, model_dirs, tmp_path, caplog):
    folder = tmp_path / "images"
    folder.mkdir()
    noise_image(folder / "a.png", (40, 32), 1)
    Retriever(embedder, collection=tmp_path / "col", r_max=0.25, dim=16).index([folder])
    created = read_profile(tmp_path / "col")
    noise_image(folder / "b.png", (32, 40), 2)
    retriever = Retriever.from_pretrained(Path(model_dirs["qwen3_vl"]), device="cpu")  # no r_max, no dim
    with caplog.at_level("WARNING"):
        report = retriever.index([folder], collection=tmp_path / "col")
    assert report.embedded == 1
    # nothing to ignore or warn (an INFO summary may pass the level another test left on faste_mm's logger)
    assert not [r for r in caplog.records if r.name.startswith("faste_mm.retrieval") and r.levelno >= logging.WARNING]
    assert read_profile(tmp_path / "col") == created and retriever.r_max == 0.25
    with Collection.open(tmp_path / "col") as col:
        (b_id,) = [r.id for r in col.get(col.live_ids(range(10))) if r.uri.endswith("b.png")]
        stored = col.vectors([b_id])[0]
    expected = embedder.encode_documents([folder / "b.png"], fast_e=created.fast_e(), dim=16).embeddings[0]
    np.testing.assert_allclose(stored, expected, atol=2e-3)  # float16 storage
    with pytest.raises(CollectionError, match=r"--r-max.*0\.25.*0\.5"):
        Retriever(embedder, collection=tmp_path / "col", r_max=0.5).index([folder])


def test_for_collection_takes_the_collection_model_and_refuses_another(embedder, model_dirs, tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "note.txt").write_text("a red bicycle")
    Retriever(embedder, collection=tmp_path / "col", r_max=0.0).index([folder])
    retriever = Retriever.for_collection(tmp_path / "col", device="cpu")
    assert retriever.model_id == embedder.model_id and retriever.r_max == 0.0
    assert retriever.search("a red bicycle", k=1)[0].uri.endswith("note.txt")
    with pytest.raises(CollectionError, match="--model"):
        Retriever.for_collection(tmp_path / "col", model=model_dirs["qwen3"], device="cpu")
    fresh = Retriever.for_collection(tmp_path / "new", model=model_dirs["qwen3"], r_max=0.2)
    assert fresh.model_id == str(Path(model_dirs["qwen3"]).resolve())


class _PathLike:
    """An os.PathLike that is not a pathlib.Path."""

    def __init__(self, path) -> None:
        self.path = path

    def __fspath__(self) -> str:
        return str(self.path)


def test_model_paths_may_be_any_path_like(model_dirs, tmp_path):
    folder = Path(model_dirs["qwen3"])
    by_path = Embedder.from_pretrained(folder, device="cpu")
    by_path_like = Embedder.from_pretrained(_PathLike(folder), device="cpu")
    assert by_path.model_id == by_path_like.model_id == str(folder.absolute())
    np.testing.assert_array_equal(by_path.encode(["a red bicycle"]).embeddings,
                                  Embedder.from_pretrained(str(folder), device="cpu").encode(["a red bicycle"]).embeddings)
    with pytest.raises(ModelLoadError, match="model not found"):
        Embedder.from_pretrained(tmp_path / "no-such-model", device="cpu")
    assert Retriever.for_collection(_PathLike(tmp_path / "col"), model=_PathLike(folder)).model_id == str(folder.resolve())
