"""The profile a retriever embeds a collection's documents with, and the collection opened for
writing with it: the defaults rule applied to the settings given to the retriever, the existing
collection's profile and the loaded model (`CollectionProfile.resolve`, `completed`). Receives
the retriever's request (given settings + model id) and its model; hands a `CollectionProfile`
and an open `Collection` to `Retriever`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from faste_mm.errors import CollectionError
from faste_mm.indexers import Collection
from faste_mm.indexers.faiss_index import validate_factory
from faste_mm.indexers.manifest import settings_mismatch
from faste_mm.model.backbones.loading import check_local_path
from faste_mm.model.embedder import Embedder
from faste_mm.model.serialization import SerializerConfig
from faste_mm.model.video import VideoConfig
from faste_mm.retrieval.calibrations import load_calibration
from faste_mm.retrieval.profile import CollectionProfile, existing_profile


def resolve_at(root: Path, existing: CollectionProfile | None, given: Mapping[str, Any],
               model: str | os.PathLike | None) -> CollectionProfile:
    """`CollectionProfile.resolve` for the collection at `root`, its message naming the folder;
    a mistyped model path is reported as "not found", not as another model."""
    try:
        return CollectionProfile.resolve(existing, **given)
    except CollectionError as error:
        if model is not None:
            check_local_path(os.fspath(model))
        raise CollectionError(f"{root}: {error.message}", hint=error.hint, cli_hint=error.cli_hint) from None


def checked_profile(existing: CollectionProfile, root: Path, request: Mapping[str, Any], embedder: Embedder | None,
                    model_path: str | os.PathLike | None) -> CollectionProfile:
    """`existing` after checking the requested settings against it, and the model once loaded
    (its width and pixel settings too). Raises CollectionError naming what differs."""
    profile = resolve_at(root, existing, request, model_path)
    if embedder is not None:
        errors = profile.conflicts(profile.as_loaded(embedder))  # pixels: see Retriever._embedder_for
        if errors:
            raise settings_mismatch(root, errors)
    return profile


def requested_profile(request: Mapping[str, Any], loaded: SerializerConfig | None,
                      carried: Mapping[str, Any] | None = None) -> CollectionProfile:
    """The profile of a new collection before the model completes it: the requested settings over
    `carried` (a re-indexed collection's, see `CollectionProfile.carried_over`), over the model's
    pixel and video settings (`loaded`, its serializer's; None = the defaults), over the defaults."""
    given = {name: value for name, value in request.items() if value is not None}
    base = {} if loaded is None else dict(min_pixels=loaded.min_pixels, max_pixels=loaded.max_pixels,
                                          video=loaded.video)
    settings = {**base, **(carried or {}), **given}
    if isinstance(given.get("video"), Mapping):  # some video fields given: over the others' video
        settings["video"] = dataclasses.replace({**base, **(carried or {})}.get("video", VideoConfig()),
                                                **given["video"])
    return CollectionProfile.resolve(None, **settings)


def completed_profile(profile: CollectionProfile, embedder: Embedder) -> CollectionProfile:
    """A new collection's resolved `profile` completed with the loaded model: its id, revision and
    width, and theta from the user, else the model's saved calibration, else the backbone's."""
    calibration = None
    if profile.r_max > 0 and profile.threshold is None:  # theta: the model's saved calibration, if any
        calibration = load_calibration(embedder.model_id, embedder.loaded.revision)
    return profile.completed(embedder, calibration)


def open_for_writing(root: Path, index_type: str, existing: bool, profile: CollectionProfile,
                     complete: Callable[[CollectionProfile], CollectionProfile]) -> tuple[Collection, CollectionProfile]:
    """The collection to write into, and its profile, from the `profile` resolved for it once
    (an existing collection's after checking the request against it, or a new one's request).
    A new one is created with `complete(profile)`, which needs the model (its dim and revision go
    into the manifest); an existing one is opened without loading it, refusing at once an index
    type FAISS cannot build (else found only after every file is embedded)."""
    if existing:
        validate_factory(index_type, profile.dim)
        col = Collection.open(root, writable=True)
        return col, CollectionProfile.from_manifest(col.manifest)
    completed = complete(profile)
    col = Collection.create(root, completed.to_manifest(index_type), exist_ok=True)
    made = CollectionProfile.from_manifest(col.manifest)
    errors = made.conflicts(completed)  # another process created it meanwhile, with other settings
    if errors:
        col.close()
        raise settings_mismatch(root, errors)
    return col, made


def recreate(root: Path, index_type: str, profile: CollectionProfile) -> tuple[Collection, CollectionProfile]:
    """Erase the collection for `index --reindex` and create it again with `profile`, once nothing
    that follows can refuse: the index type must suit its dim, and the folder must hold nothing
    that would stop `Collection.create`. Raises ConfigError or CollectionError, the collection untouched."""
    validate_factory(index_type, profile.dim)
    Collection.erase(root, for_create=True)
    col = Collection.create(root, profile.to_manifest(index_type))
    return col, CollectionProfile.from_manifest(col.manifest)


def for_collection(root: Path, model: str | os.PathLike | None, revision: str | None, reindex: bool,
                   settings: Mapping[str, Any]) -> CollectionProfile:
    """The profile `Retriever.for_collection` hands its retriever, resolved once: the collection
    at `root`'s under the defaults rule (its values, else the given ones, else the defaults; with
    `reindex`, the given ones over its values carried over). Raises CollectionError when a given
    setting differs from the collection's."""
    existing = existing_profile(root)
    given = {name: value for name, value in settings.items() if value is not None}
    if model is not None:
        given.update(model_id=model, model_revision=revision)
    if reindex and existing is not None:
        return requested_profile(given, None, existing.carried_over(model))
    return resolve_at(root, existing, given, model)


def adapted_embedder(embedder: Embedder, profile: CollectionProfile, adapted: Embedder | None) -> Embedder:
    """The embedder serializing with `profile`'s pixel and video settings: `embedder` itself, the
    earlier `adapted` one, or the same weights with the profile's serializer (`Embedder.with_serializer`)."""
    if not embedder.family.is_multimodal:
        return embedder
    wanted = profile.serializer(embedder.serializer.config)
    if wanted == embedder.serializer.config:
        return embedder
    if adapted is None or adapted.serializer.config != wanted:
        adapted = embedder.with_serializer(wanted)
    return adapted
