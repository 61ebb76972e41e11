"""A collection's profile: everything that decides how its items and queries are embedded and
stored (model and revision, image and video pixel settings, FastE, dim, document instruction),
as one frozen record read from and written to `manifest.json`. Every front end (CLI, Retriever,
serve, Ray, calibrate) takes a collection's settings from here and nowhere else.

Receives a `Manifest` (the stored form) and the settings a user gave; hands on the profile the
embedder, the Ray workers and the server use, and the manifest a new collection is created with.

Why here: the profile needs the model layer's `VideoConfig` (its defaults are the documented
defaults) and the indexers' `Manifest` (the stored form), and `retrieval` is the lowest layer that
may import both. Nothing here imports torch (nor, until a manifest is read, FAISS): the CLI reads
the documented defaults at start-up, and `info` and `serve`'s checks read profiles cheaply.

Adding a setting is ONE change: a field below whose metadata (`_setting(...)`) names its
manifest key (dotted JSON path), the flag that sets it, the value of collections that predate it,
and whether a different user value on an existing collection is refused. `from_manifest`,
`to_manifest`, `conflicts` and `resolve` read that table; the CLI adds the flag.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from faste_mm.errors import CollectionError, ConfigError
from faste_mm.model.video import VideoConfig
from faste_mm.retrieval.receipt import PlanReceipt

if TYPE_CHECKING:  # the indexers package loads FAISS: imported where a manifest is read or made
    from faste_mm.indexers.manifest import Manifest
    from faste_mm.model.embedder import Embedder
    from faste_mm.model.faste import FastEConfig
    from faste_mm.retrieval.calibrations import Calibration

DEFAULT_MODEL = "Qwen/Qwen3-VL-Embedding-2B"
# FastE's r_max for the documents of a new collection when the user gives none (and for `embed`);
# queries always run the full forward.
DOCUMENT_R_MAX = 0.5
# The official Qwen3-VL-Embedding document instruction (faste_mm.model.serialization's default).
DOCUMENT_INSTRUCTION = "Represent the user's input."
# The Qwen3-VL-Embedding model card's example retrieval instruction: the query instruction of
# vision-language models (Retriever.search, serve, eval's default); text models use their own.
QUERY_INSTRUCTION = "Retrieve images or text relevant to the user's query."

_ABSENT = object()


@dataclass(frozen=True, slots=True)
class Setting:
    """How one profile field is stored and checked.

    key: where it lives in manifest.json, a dotted path ("serializer.max_pixels").
    flag: what sets it, named in messages (the CLI flag; the Python keyword is the field name).
    missing: its value in a manifest written before the field existed; _ABSENT = the field's default.
    refuse: a user value that differs from an existing collection's is refused (vectors made
        with it would not be comparable); False: informational, the collection's value is kept.
    """

    key: str
    flag: str
    missing: Any = _ABSENT
    refuse: bool = True


def _setting(default: Any, key: str, flag: str, *, missing: Any = _ABSENT, refuse: bool = True,
             factory: Any = None) -> Any:
    meta = {"setting": Setting(key, flag, missing, refuse)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, slots=True)
class CollectionProfile:
    """Everything that decides how a collection's items and queries are embedded and stored.

    model_id / model_revision: the embedding model (hub id, or a local folder's absolute path).
    dim: stored width; None = the model's full width (filled in when the model loads).
        dim < model_dim: Matryoshka vectors (first `dim` dimensions, re-normalised).
    model_dim: the model's own width, recorded when the collection is created.
    document_instruction: the instruction documents are serialized with.
    min_pixels / max_pixels: image pixel bounds (smart resize), per image and PDF page.
    video: frame sampling and per-frame pixel budget of videos (`VideoConfig`, its defaults).
    r_max, warmup_layer, threshold, trigger_layer: FastE for documents (paper: r_max, l_w, theta;
        trigger_layer = fixed-layer ablation); r_max 0 = full forward; None = backbone default.
    threshold_source: where theta came from (a calibration, --threshold, the backbone default).
    vectors / keep: precision of the index in RAM ("float32", "float16", "int8", "binary") and the
        copy kept on disk for rescoring ("float", "int8", "none"); see faste_mm.indexers.quantization
        (checked there when the manifest is made).
    reranker: the default reranker of searches (hub id or folder; None = no second stage); it
        changes no vector, so it is informational: set when the collection is created or re-indexed.
    receipt: what `faste-mm plan` measured for these settings (`index --plan`), None = not measured.
    """

    model_id: str = _setting(DEFAULT_MODEL, "model_id", "--model")
    model_revision: str | None = _setting(None, "model_revision", "--revision")
    dim: int | None = _setting(None, "dim", "--dim")
    model_dim: int | None = _setting(None, "model_dim", "the model's width")
    document_instruction: str = _setting(DOCUMENT_INSTRUCTION, "document_instruction", "document instruction")
    min_pixels: int = _setting(4096, "serializer.min_pixels", "--min-pixels")
    max_pixels: int = _setting(1_843_200, "serializer.max_pixels", "--max-pixels")
    video: VideoConfig = _setting(None, "serializer.video", "--video-*", factory=VideoConfig)
    r_max: float = _setting(DOCUMENT_R_MAX, "fast_e.r_max", "--r-max", missing=0.0)
    warmup_layer: int | None = _setting(None, "fast_e.warmup_layer", "--warmup-layer", missing=None)
    threshold: float | None = _setting(None, "fast_e.threshold", "--threshold", missing=None)
    threshold_source: str | None = _setting(None, "fast_e.threshold_source", "threshold source",
                                            missing=None, refuse=False)
    trigger_layer: int | None = _setting(None, "fast_e.trigger_layer", "--trigger-layer", missing=None)
    vectors: str = _setting("float32", "vectors.precision", "--vectors", missing="float32")
    keep: str = _setting("float", "vectors.keep", "--keep", missing="float")
    reranker: str | None = _setting(None, "reranker", "--reranker", missing=None, refuse=False)
    receipt: PlanReceipt | None = _setting(None, "receipt", "--plan", missing=None, refuse=False)

    def __post_init__(self) -> None:
        if not isinstance(self.model_id, str) or not self.model_id:
            raise ConfigError(f"CollectionProfile.model_id must be a non-empty string, got {self.model_id!r}")
        if self.dim is not None and (isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 1):
            raise ConfigError(f"CollectionProfile.dim must be None (the model's width) or an int >= 1, got {self.dim!r}")
        if not 1 <= self.min_pixels <= self.max_pixels:
            raise ConfigError(f"CollectionProfile: need 1 <= min_pixels <= max_pixels, got {self.min_pixels} "
                              f"and {self.max_pixels}")
        if isinstance(self.video, Mapping):  # as read from JSON; unknown keys are a ConfigError
            object.__setattr__(self, "video", _video(self.video))
        if not isinstance(self.video, VideoConfig):
            raise ConfigError(f"CollectionProfile.video must be a VideoConfig, got {type(self.video).__name__}")
        if not isinstance(self.r_max, (int, float)) or not 0.0 <= self.r_max < 1.0:
            raise ConfigError(f"CollectionProfile.r_max must be in [0, 1) (0 = full forward), got {self.r_max!r}")
        object.__setattr__(self, "r_max", float(self.r_max))
        if self.warmup_layer is not None and self.warmup_layer < 0:
            raise ConfigError(f"CollectionProfile.warmup_layer must be >= 0, got {self.warmup_layer}")
        if self.threshold is not None and not -1.0 <= self.threshold <= 1.0:
            raise ConfigError(f"CollectionProfile.threshold is a cosine in [-1, 1], got {self.threshold}")
        if self.trigger_layer is not None and self.trigger_layer < 0:
            raise ConfigError(f"CollectionProfile.trigger_layer must be >= 0, got {self.trigger_layer}")
        if self.reranker is not None and (not isinstance(self.reranker, str) or not self.reranker.strip()):
            raise ConfigError(f"CollectionProfile.reranker must be a hub id or folder (or None), got {self.reranker!r}")
        if isinstance(self.receipt, Mapping):  # as read from JSON
            object.__setattr__(self, "receipt", PlanReceipt.from_dict(self.receipt))
        if self.receipt is not None and not isinstance(self.receipt, PlanReceipt):
            raise ConfigError(f"CollectionProfile.receipt must be a PlanReceipt or None, got {type(self.receipt).__name__}")

    # ---- the stored form -----------------------------------------------------------------
    @classmethod
    def from_manifest(cls, manifest: Manifest) -> "CollectionProfile":
        """The profile of a collection, from its manifest; a key the manifest lacks (written
        before the setting existed) reads as the setting's `missing` value, else its default."""
        stored = manifest.to_dict()
        values = {}
        for f in fields(cls):
            setting = _setting_of(f)
            value = _get(stored, setting.key)
            if value is _ABSENT or (value is None and f.name == "video"):
                value = setting.missing
            if value is not _ABSENT:
                values[f.name] = value
        if values.get("model_dim") is None:  # collections from before Matryoshka stored the full width
            values["model_dim"] = manifest.dim
        try:
            return cls(**values)
        except (TypeError, ConfigError) as error:
            raise CollectionError(f"{manifest.model_id}: invalid collection settings in the manifest ({error}); "
                                  f"restore it from a backup or re-index into a new collection") from None

    def to_manifest(self, index_type: str = "auto", base: Manifest | None = None) -> Manifest:
        """The manifest a new collection is created with (or `base` with this profile's settings;
        its index state and counts are kept). Needs `dim` (a completed profile, see `completed`)."""
        from faste_mm.indexers.manifest import Manifest

        if self.dim is None:
            raise ConfigError("CollectionProfile.to_manifest needs dim: complete the profile with the loaded "
                              "model first (CollectionProfile.completed)")
        stored = base.to_dict() if base is not None else {"index": {"type": index_type}}
        for f in fields(self):
            value = getattr(self, f.name)
            _put(stored, _setting_of(f).key, value.to_dict() if isinstance(value, (VideoConfig, PlanReceipt)) else value)
        if self.r_max == 0:  # the full forward: the manifest records no FastE settings
            stored["fast_e"] = None
        return Manifest.from_dict(stored)

    # ---- comparing and defaulting ----------------------------------------------------------
    def conflicts(self, other: "CollectionProfile") -> list[str]:
        """Every refusing setting in which `other` (the request) differs from this profile (the
        collection's), in words naming the setting, the collection's value and the requested one."""
        return [_conflict(f, getattr(self, f.name), getattr(other, f.name))
                for f in fields(self) if _setting_of(f).refuse and getattr(self, f.name) != getattr(other, f.name)]

    @classmethod
    def resolve(cls, collection: "CollectionProfile | None", **given: Any) -> "CollectionProfile":
        """The defaults rule: each setting is the collection's, else the one given, else the
        documented default. A given value (None = not given) that differs from an existing
        collection's is refused with a CollectionError naming the flag and both values.

        given: profile field names (`model_id`, `r_max`, `dim`, ...); `video` may be a mapping of
        just the VideoConfig fields given (e.g. {"fps": 2.0}). ConfigError for an unknown name.
        """
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise ConfigError(f"unknown collection settings {unknown}; valid ones are {names}")
        given = {name: value for name, value in given.items() if value is not None}
        if "model_id" in given:
            given["model_id"] = model_name(given["model_id"])
        base = collection or cls()
        if isinstance(given.get("video"), Mapping):
            given["video"] = replace(base.video, **given["video"])
        if collection is None:
            return replace(cls(), **given)
        requested = replace(collection, **given)
        errors = collection.conflicts(requested)
        if errors:
            raise CollectionError(
                f"the collection was built with different settings — {'; '.join(errors)}. Vectors from "
                f"different settings are not comparable: leave these settings out to use the collection's, "
                f"index into a new collection, or re-index this one",
                hint="Retriever.index(paths, options=IndexOptions(reindex=True)) (on the command line: "
                     "`faste-mm index --reindex`)",
                cli_hint="faste-mm index PATH... --reindex")
        return collection

    def carried_over(self, model_id: str | os.PathLike | None = None) -> dict[str, Any]:
        """The settings a re-index (`index --reindex`) keeps unless given again: with the same model
        (`model_id` None or equal) its revision, r_max, dim, image pixel cap and video settings; with another
        model none (the documented defaults apply). theta and l_w are resolved again (the saved
        calibration may be newer)."""
        if model_id is not None and model_name(model_id) != self.model_id:
            return {}
        return {"model_id": self.model_id, "model_revision": self.model_revision, "r_max": self.r_max,
                "dim": self.dim, "max_pixels": self.max_pixels, "video": self.video,
                "vectors": self.vectors, "keep": self.keep}

    # ---- what the model layer needs ---------------------------------------------------------
    @property
    def is_matryoshka(self) -> bool:
        return self.dim is not None and self.model_dim is not None and self.dim < self.model_dim

    def fast_e(self) -> "FastEConfig | None":
        """The documents' FastE config (None = full forward); imports the model layer."""
        from faste_mm.model.faste import FastEConfig

        if self.r_max == 0:
            return None
        return FastEConfig(r_max=self.r_max, warmup_layer=self.warmup_layer, threshold=self.threshold,
                           trigger_layer=self.trigger_layer)

    def serializer(self, base: Any = None) -> Any:
        """The `SerializerConfig` documents and queries are serialized with (`base`'s other fields)."""
        from faste_mm.model.serialization import SerializerConfig

        base = base or SerializerConfig()
        return replace(base, min_pixels=self.min_pixels, max_pixels=self.max_pixels, video=self.video)

    def as_loaded(self, embedder: "Embedder") -> "CollectionProfile":
        """This profile as `embedder` would realise it: its model id, revision and width (compare
        with `conflicts` to check a model against a collection). Pixel and video settings are the
        profile's: a retriever serializes with them whatever the embedder was loaded with."""
        width = embedder.dim
        return replace(self, model_id=embedder.model_id, model_revision=embedder.loaded.revision,
                       model_dim=width, dim=width if self.dim is None else self.dim)

    def completed(self, embedder: "Embedder", calibration: "Calibration | None" = None) -> "CollectionProfile":
        """The profile of a NEW collection made with `embedder`: its id, revision and width,
        theta from the user, else `calibration` (the model's saved one, see
        `calibrations.load_calibration`), else the backbone default, and the backbone's warm-up
        layer. ConfigError for a dim wider than the model's."""
        loaded = self.as_loaded(embedder)
        if loaded.dim > embedder.dim:
            raise ConfigError(f"dim {loaded.dim} is wider than {embedder.model_id}'s embeddings ({embedder.dim}); "
                              f"choose a dim between 1 and {embedder.dim}")
        if loaded.r_max == 0:
            return replace(loaded, warmup_layer=None, threshold=None, threshold_source=None, trigger_layer=None)
        given = "given (--threshold)"
        if loaded.receipt is not None:  # the plan measured this theta; it came from where the plan took it
            planned = loaded.receipt.threshold_source or "the plan's setting"
            given = f"{planned}; its fidelity measured by faste-mm plan ({loaded.receipt.created})"
        threshold, source = loaded.threshold, given
        if threshold is None:
            if calibration is not None and calibration.threshold is not None:
                threshold, source = calibration.threshold, calibration.describe()
            else:
                source = f"backbone default ({embedder.family.name})"
        resolved = embedder.resolve_fast_e(replace(loaded, threshold=threshold).fast_e())
        return replace(loaded, warmup_layer=resolved.warmup_layer, threshold=resolved.threshold,
                       threshold_source=source)

    def describe_fast_e(self) -> dict[str, Any] | None:
        """The FastE settings as a plain dict (None = full forward), for info and /info."""
        if self.r_max == 0:
            return None
        return {name: getattr(self, name) for name in
                ("r_max", "warmup_layer", "threshold", "threshold_source", "trigger_layer")}


def read_profile(root: str | os.PathLike) -> CollectionProfile:
    """The profile of the collection at `root` (its manifest only: no database, no lock).
    Raises CollectionError when there is no collection or its manifest cannot be read."""
    from faste_mm.indexers.manifest import read_manifest

    return CollectionProfile.from_manifest(read_manifest(Path(root)))


def existing_profile(root: str | os.PathLike) -> CollectionProfile | None:
    """The profile of the collection at `root`, or None when there is no collection there yet
    (CollectionError for one that cannot be read)."""
    from faste_mm.indexers.manifest import MANIFEST_NAME

    return read_profile(root) if (Path(root) / MANIFEST_NAME).exists() else None


def model_name(model: str | os.PathLike) -> str:
    """A model as a collection records it: a local directory by its absolute path (so a
    collection finds it again from any working directory), a hub id as given."""
    text = os.fspath(model)
    local = Path(text).expanduser()
    return str(local.resolve()) if local.is_dir() else text


def flag_of(name: str) -> str:
    """The flag that sets profile field `name` (for messages)."""
    return setting_of(name).flag


def setting_of(name: str) -> Setting:
    """How profile field `name` is stored and checked (its manifest key, flag, ...)."""
    return _setting_of(CollectionProfile.__dataclass_fields__[name])


def _setting_of(f: dataclasses.Field) -> Setting:
    return f.metadata["setting"]


def _conflict(f: dataclasses.Field, ours: Any, theirs: Any) -> str:
    if isinstance(ours, VideoConfig) and isinstance(theirs, VideoConfig):
        ours, theirs = ours.to_dict(), theirs.to_dict()
        changed = [k for k in ours if ours[k] != theirs[k]]
        ours, theirs = ({k: d[k] for k in changed} for d in (ours, theirs))
    return f"{f.name} ({_setting_of(f).flag}): collection has {ours!r}, request has {theirs!r}"


def _video(values: Mapping[str, Any]) -> VideoConfig:
    names = [f.name for f in fields(VideoConfig)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ConfigError(f"video settings have unknown keys {unknown}; valid keys are {names}")
    return VideoConfig(**values)


def _get(stored: Mapping[str, Any], key: str) -> Any:
    node: Any = stored
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _put(stored: dict[str, Any], key: str, value: Any) -> None:
    *path, last = key.split(".")
    node = stored
    for part in path:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value
