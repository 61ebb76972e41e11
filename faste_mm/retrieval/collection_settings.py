"""The profile a retriever embeds a collection's documents with, and the collection opened for
writing or reading with it: the defaults rule applied to the settings given to the retriever, the
existing collection's profile and the loaded model (`CollectionProfile.resolve`, `completed`).
`RetrieverSettings` holds one retriever's given settings, model and resolved profiles;
`CheckedReader` its collection opened for searching. Both hand `CollectionProfile`s and open
`Collection`s to `Retriever`.
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
from faste_mm.retrieval.documents import CollectionDocuments
from faste_mm.retrieval.model_spec import RetrieverModel
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
        errors = profile.conflicts(profile.as_loaded(embedder))  # pixels: see RetrieverModel.serializing
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


class RetrieverSettings:
    """The settings one retriever writes and reads its collections with: those given to it, its
    model, and the profile resolved from both for each collection. It exists so the defaults rule
    as a retriever applies it (the given settings, the collection's profile and the loaded model,
    each checked against the others; resolved once per collection and state) is one unit with its
    cache, which `Retriever` only asks.

    given: the settings given to the retriever (`given_settings`: not-given ones left out).
    resolved: (root, reindex, profile) that `for_collection` already resolved, so an index run
        resolves its settings once."""

    def __init__(self, model: RetrieverModel, given: dict[str, Any],
                 resolved: tuple[Path, bool, CollectionProfile] | None = None) -> None:
        self.model = model
        self.given = given
        self._resolved: dict[tuple[Path, bool, bool], CollectionProfile] = {}
        if resolved is not None:
            root, reindex, profile = resolved
            self._resolved[(root, reindex, existing_profile(root) is not None)] = profile

    def embedder(self, root: Path) -> Embedder:
        """The model, loaded now if it was not, with the pixel and video settings of `current(root)`."""
        return self.model.load(lambda: self.current(root))

    def embedder_for(self, profile: CollectionProfile, root: Path) -> Embedder:
        """The model serializing with `profile`'s pixel and video settings (`RetrieverModel.serializing`;
        loaded, if it was not, as `embedder(root)`)."""
        return self.model.serializing(profile, lambda: self.current(root))

    def documents(self, root: Path, col: Collection, profile: CollectionProfile) -> CollectionDocuments:
        """Documents for `col` (the collection at `root`), embedded with `profile` (`embedder_for`)."""
        return CollectionDocuments(lambda wanted: self.embedder_for(wanted, root), col, profile)

    def current(self, root: Path) -> CollectionProfile:
        """The collection's profile as it is, else the one a new collection would be made with
        (`resolve`), not yet completed with the model: what reads r_max or pixels without loading it."""
        return existing_profile(root) or self.resolve(root)[1]

    def profile(self, root: Path) -> CollectionProfile:
        """The settings the retriever embeds the collection at `root` with (see `Retriever.profile`):
        the existing collection's after the checks, else the resolved ones completed with the model
        (which this loads)."""
        existing = existing_profile(root)
        if existing is None:
            return completed_profile(self.resolve(root)[1], self.embedder(root))
        return self.checked(existing, root)

    def request(self) -> dict[str, Any]:
        """The settings given to the retriever, with its model's id (and revision, if known)."""
        return {**self.given, **self.model.identity()}

    def checked(self, existing: CollectionProfile, root: Path) -> CollectionProfile:
        """`existing` after checking the given settings and the model, if loaded, against it
        (`checked_profile`). Raises CollectionError naming what differs."""
        return checked_profile(existing, root, self.request(), self.model.loaded,
                               None if self.model.spec is None else self.model.spec.model_id)

    def resolve(self, root: Path, reindex: bool = False) -> tuple[bool, CollectionProfile]:
        """(whether the collection at `root` exists, the profile the retriever writes it with),
        resolved once per collection and state: an existing collection's after checking the given
        settings against it; else, or when it is about to be rebuilt (`reindex`), the given settings
        over the ones carried over (`CollectionProfile.carried_over`) over the model's serializer's
        over the defaults, still to be completed with the model (`completed_profile`). Raises
        CollectionError."""
        existing = existing_profile(root)
        key = (root, reindex, existing is not None)
        if key not in self._resolved:
            if existing is not None and not reindex:
                self._resolved[key] = self.checked(existing, root)
            else:
                carried = None if existing is None else existing.carried_over(self.request()["model_id"])
                self._resolved[key] = requested_profile(self.request(), self.model.serializer(), carried)
        return existing is not None, self._resolved[key]

    def open_for_writing(self, root: Path, index_type: str) -> tuple[Collection, CollectionProfile]:
        """The collection at `root` to write into, and its profile (`open_for_writing`; a new
        one's completed with the model, which this then loads)."""
        exists, profile = self.resolve(root)
        return open_for_writing(root, index_type, exists, profile,
                                lambda new: completed_profile(new, self.embedder(root)))

    def open_for_index(self, root: Path, index_type: str, reindex: bool) -> tuple[Collection, CollectionProfile]:
        """The collection an index run writes into, and its profile: `open_for_writing`, or with
        `reindex` the collection erased and created again with the retriever's settings (those not
        given carried over) once nothing that follows can refuse: the model loads (re-indexing
        embeds everything anyway) before `recreate`, so ModelLoadError, ConfigError or
        CollectionError leave the collection untouched. A given `ocr` that differs from the
        collection's is switched in place: OCR changes no vector."""
        if reindex:
            col, profile = recreate(root, index_type,
                                    completed_profile(self.resolve(root, reindex=True)[1], self.embedder(root)))
        else:
            col, profile = self.open_for_writing(root, index_type)
        if self.given.get("ocr", profile.ocr) != profile.ocr:
            profile = dataclasses.replace(profile, ocr=self.given["ocr"])
            col.update_settings(profile.to_manifest(base=col.manifest).settings)
        return col, profile


class CheckedReader:
    """A retriever's collection opened for reading, and its profile once checked against the
    retriever's settings and model. It exists so every search shares one open collection (its
    SQLite connection, FAISS index and caches), checked once, until a write closes it. Not
    thread-safe on its own: the retriever's lock guards it."""

    def __init__(self, settings: RetrieverSettings) -> None:
        self._settings = settings
        self.collection: Collection | None = None
        self.profile: CollectionProfile | None = None  # set once the model was checked against the collection

    def open(self, root: Path, check_model: bool = True) -> Collection:
        """The collection at `root` opened for reading, once its profile is checked against the
        retriever's settings and model (which this loads; `check_model` False: a lexical search,
        which needs no model). Raises CollectionError."""
        if self.collection is None:
            self.collection = Collection.open(root)
        if check_model and self.profile is None:
            try:
                self._settings.embedder(root)  # loads the model: its width and pixels are checked
                self.profile = self._settings.checked(CollectionProfile.from_manifest(self.collection.manifest), root)
            except BaseException:
                self.close()
                raise
        return self.collection

    def close(self) -> None:
        """Close the collection; the next `open` opens and checks it again."""
        if self.collection is not None:
            self.collection.close()
            self.collection = None
        self.profile = None
