"""A collection's profile: everything that decides how its items and queries are embedded and
stored (model and revision, image and video pixel settings, FastE, dim, document instruction),
as one frozen record read from and written to `manifest.json`. Every front end (CLI, Retriever,
serve, Ray, calibrate) takes a collection's settings from here and nowhere else.

Receives a `Manifest` (the stored form) and the settings a user gave; hands on the profile the
embedder, the Ray workers and the server use, and the manifest a new collection is created with.

Why here: the profile needs the model layer's `VideoConfig` and official numbers (its defaults are
the documented defaults) and the indexers' `Manifest` (the stored form), and `retrieval` is the
lowest layer that may import both. Nothing here imports torch, numpy or FAISS: the CLI reads the
documented defaults at start-up, and `info` and `serve`'s checks read profiles cheaply.

Adding a setting is ONE change: a field below declared with `setting(...)`
(faste_mm/retrieval/setting.py): its manifest key (dotted JSON path), its words and CLI flags, its
check, its help, the value of collections that predate it, whether a different user value on
an existing collection is refused and whether a re-index carries it over. The stored form (the
manifest keeps it in `Manifest.settings` without naming it), `conflicts`, `resolve`,
`carried_over`, the keywords of `Retriever`, the flags of `faste-mm index` and `serve` and the
manual's table all read it (docs/collections.md "Adding a setting"). The few settings the storage
layer reads itself (model id, width, precision) reuse its declarations (`Manifest.declared`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from faste_mm.errors import CollectionError, ConfigError
from faste_mm.indexers.manifest import MANIFEST_NAME, Manifest, read_manifest
from faste_mm.indexers.vector_choices import KEEPS, PRECISIONS  # noqa: F401  (the choices of vectors and keep)
from faste_mm.model.official import (DOCUMENT_INSTRUCTION, OFFICIAL_MAX_PIXELS, OFFICIAL_MIN_PIXELS, PIXELS_PER_VISUAL_TOKEN,
                                     QUERY_INSTRUCTION)
from faste_mm.model.patch_dedup import PATCH_DEDUP_MODES
from faste_mm.model.video import VideoConfig
from faste_mm.retrieval.receipt import PlanReceipt
from faste_mm.retrieval.setting import ABSENT, Flag, Setting, get_key, put_key, setting, settings_of

if TYPE_CHECKING:
    from faste_mm.model.embedder import Embedder
    from faste_mm.model.faste import FastEConfig
    from faste_mm.retrieval.calibrations import Calibration

DEFAULT_MODEL = "Qwen/Qwen3-VL-Embedding-2B"
# FastE's r_max for the documents of a new collection when the user gives none (and for `embed`);
# queries always run the full forward.
DOCUMENT_R_MAX = 0.5

_DOC_MODEL = (f"Hub id or local model directory. Default: a collection's own model (index, serve -c), else "
              f"{DEFAULT_MODEL}.")
SWEEP_R_MAX = (0.0, 0.3, 0.5, 0.7)  # eval, bench and plan: the removal ratios of docs/evaluation.md's table


def _is_int(minimum: int) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _is_ratio(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value < 1.0


def _is_cosine(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and -1.0 <= value <= 1.0


_STORED = Manifest.declared  # the storage layer's declaration of a field it reads itself


@dataclass(frozen=True, slots=True)
class CollectionProfile:
    """Everything that decides how a collection's items and queries are embedded and stored.

    Each field is one setting, declared once with `setting(...)` (faste_mm.retrieval.setting):
    its manifest key, the words and flags that set it, its check and its help; the docstring of
    each is its `help` (docs/collections.md "Settings" lists them all).
    model_dim: the model's own width, recorded when the collection is created.
    threshold_source: where theta came from (a calibration, --threshold, the backbone default).
    receipt: what `faste-mm plan` measured for these settings (`index --plan`), None = not measured.
    ocr: read the text inside images and scanned PDF pages (OCR, faste_mm.retrieval.library.ocr) into the
        lexical index at index time; it changes no vector, so `index --ocr` / `--no-ocr` switches it
        on an existing collection (its images are read at that run, nothing is re-embedded).
    """

    model_id: str = setting(
        DEFAULT_MODEL, _STORED("model_id"), "--model", "The embedding model: a hub id, or a local folder (recorded "
        "by its absolute path).", keyword=False, carry=True,
        flags=(Flag("--model", str, _DOC_MODEL),))
    model_revision: str | None = setting(
        None, "model_revision", "--revision", "The model's hub revision (commit, branch or tag); None = main.",
        keyword=False, carry=True, flags=(Flag("--revision", str, "The model's hub revision (commit, branch or tag). Default: "
                                                      "a collection's own, else the hub's main."),))
    dim: int | None = setting(
        None, _STORED("dim"), "--dim", "Matryoshka width: documents and queries keep their first `dim` dimensions, "
        "re-normalised (smaller index, faster search, some quality lost); None = the model's full width.",
        rule="None (the model's width) or an int >= 1", carry=True,
        flags=(Flag("--dim", int, "Matryoshka: store only the first DIM dimensions of each vector, re-normalised "
                                  "(e.g. 512: 4x smaller index, faster search, some quality lost); queries are "
                                  "truncated the same way. Default: the collection's, the model's full width for "
                                  "a new one.", min=1),))
    model_dim: int | None = setting(None, "model_dim", "the model's width", "The model's own width, recorded "
                                    "when the collection is created.", keyword=False)
    document_instruction: str = setting(DOCUMENT_INSTRUCTION, "document_instruction", "document instruction",
                                        "The instruction documents are serialized with.", keyword=False)
    min_pixels: int = setting(
        OFFICIAL_MIN_PIXELS, "serializer.min_pixels", "--min-pixels", "Smallest image and page size in pixels (smart resize "
        "scales a smaller one up).", valid=_is_int(1), rule="an int >= 1",
        flags=(Flag("--min-pixels", int, "Resize each image and PDF page to at least this many pixels. Default: "
                                         f"a collection's own, else {OFFICIAL_MIN_PIXELS}.", min=1),))
    max_pixels: int = setting(
        OFFICIAL_MAX_PIXELS, "serializer.max_pixels", "--max-pixels", "Image and page budget: each is resized to "
        f"at most this many pixels (N visual tokens = N x {PIXELS_PER_VISUAL_TOKEN} px); image queries are resized "
        "the same way.", valid=_is_int(1), rule="an int >= 1", carry=True,
        flags=(Flag("--max-pixels", int, "Resize each image and PDF page (and image queries) to at most this many "
                                         f"pixels. Default: a collection's own, else {OFFICIAL_MAX_PIXELS} (the official "
                                         f"cap: {OFFICIAL_MAX_PIXELS // PIXELS_PER_VISUAL_TOKEN:,} visual tokens).",
                    min=OFFICIAL_MIN_PIXELS),
               Flag("--visual-tokens", int, f"The same budget in merged visual tokens: N means --max-pixels N x "
                                            f"{PIXELS_PER_VISUAL_TOKEN} (980 = {980 * PIXELS_PER_VISUAL_TOKEN} px); "
                                            "give one of the two.", unit=PIXELS_PER_VISUAL_TOKEN,
                    min=OFFICIAL_MIN_PIXELS // PIXELS_PER_VISUAL_TOKEN)))
    video: VideoConfig = setting(
        None, "serializer.video", "--video-*", "Videos' frame sampling and per-frame pixel budget (`VideoConfig`; "
        "a mapping of some of its fields, e.g. {\"fps\": 2.0}, sets just those).", factory=VideoConfig, carry=True,
        flags=(Flag("--video-fps", float, "Video frames sampled per second. Default: the collection's, 1 (the "
                                          "official embedder's) for a new one.", part="fps"),
               Flag("--video-max-frames", int, "At most this many frames per video. Default: the collection's, "
                                               "64 for a new one.", part="max_frames"),
               Flag("--video-max-pixels", int, "Pixels per video frame at most (32x32 px = one visual token per "
                                               "frame pair). Default: the collection's, 786432 for a new one.",
                    part="max_pixels")))
    patch_dedup: str = setting(
        "off", "serializer.patch_dedup", "--patch-dedup", "Duplicate-patch removal before the vision tower: off, "
        "exact or near (faste_mm.model.patch_dedup); PDF pages and lossless images only, never photos.",
        valid=lambda value: value in PATCH_DEDUP_MODES, rule=f"one of {PATCH_DEDUP_MODES}", missing="off", carry=True,
        flags=(Flag("--patch-dedup", str, "Drop repeated 32x32 px units of PDF pages, screenshots, slides and scans "
                                          "before the vision tower: off | exact | near (within 3 of 255 levels); "
                                          "photos stay whole. Default: the collection's, off for a new one."),))
    r_max: float = setting(
        DOCUMENT_R_MAX, "fast_e.r_max", "--r-max", "FastE r_max for documents: the largest share of prefix "
        "tokens removed, 0 <= r < 1 (0 = full forward); queries always run the full forward.",
        valid=_is_ratio, rule="in [0, 1) (0 = full forward)", missing=0.0, carry=True,
        flags=(Flag("--r-max", float, f"FastE r_max: the largest share of prefix tokens removed from each "
                                      f"document, 0 <= r < 1 (0 = full forward); eval, bench and plan sweep several, "
                                      f"comma-separated. Default: a collection's own (index, serve -c); "
                                      f"{DOCUMENT_R_MAX:g} for new collections, embed and calibrate (0 for embed "
                                      f"--instruction: queries); 0 for serve without -c; "
                                      f"{','.join(f'{r:g}' for r in SWEEP_R_MAX)} for eval, bench and plan."),))
    warmup_layer: int | None = setting(
        None, "fast_e.warmup_layer", "--warmup-layer", "FastE warm-up layer l_w: no alignment check before "
        "it; None = the backbone's.", valid=_is_int(0), rule=">= 0", missing=None,
        flags=(Flag("--warmup-layer", int, "FastE warm-up layer l_w: no alignment check before this layer. "
                                           "Default: a collection's own, else the backbone's (8).", min=0),))
    threshold: float | None = setting(
        None, "fast_e.threshold", "--threshold", "FastE theta: the readout/prefix cosine that triggers "
        "compression; None = the model's saved calibration, else the backbone's.",
        valid=_is_cosine, rule="a cosine in [-1, 1]", missing=None,
        flags=(Flag("--threshold", float, "FastE theta: the readout/prefix cosine that triggers compression, "
                                          "-1..1. Default: a collection's own, else the model's saved calibration "
                                          "(faste-mm calibrate --save), else the backbone's (0.70 for "
                                          "Qwen3-VL-Embedding). calibrate: check this theta only.",
                    min=-1.0, max=1.0),))
    threshold_source: str | None = setting(None, "fast_e.threshold_source", "threshold source",
                                           "Where theta came from (given, a calibration, the backbone default).",
                                           keyword=False, missing=None, refuse=False)
    trigger_layer: int | None = setting(
        None, "fast_e.trigger_layer", "--trigger-layer", "Compress right before this layer instead of FastE's "
        "alignment trigger (the fixed-layer ablation); None = FastE's trigger.", valid=_is_int(0), rule=">= 0",
        missing=None,
        flags=(Flag("--trigger-layer", int, "Compress right before this layer instead of FastE's alignment "
                                            "trigger (fixed-layer ablation; eval: the layer of its 'fixed' "
                                            "baseline). Default: none (eval: half the depth).", min=0),))
    vectors: str = setting(
        ABSENT, _STORED("vectors"), "--vectors", "Precision of the index in RAM: float32, float16, int8 "
        "(8-bit codes, 1/4 the RAM) or binary (sign bits, 1/32; dim a multiple of 8).",
        carry=True,
        flags=(Flag("--vectors", str, "Precision of the index in RAM: float32 | float16 | int8 (8-bit codes, 1/4 "
                                      "the RAM) | binary (sign bits, 1/32; dim a multiple of 8); searches rescore "
                                      "candidates from the copy kept on disk. Default: the collection's, float32 "
                                      "for a new one."),))
    keep: str = setting(
        ABSENT, _STORED("keep"), "--keep", "The copy kept on disk to rescore with: float, int8 (with binary "
        "vectors) or none (smallest; results unrescored).",
        carry=True,
        flags=(Flag("--keep", str, "Copy kept on disk to rescore with: float (default) | int8 (8-bit codes, with "
                                   "--vectors binary) | none (smallest; results unrescored). Default: the "
                                   "collection's, float for a new one."),))
    reranker: str | None = setting(
        None, "reranker", "--reranker", "The collection's reranker (hub id or folder): searches rerank their "
        "top hits with it unless told not to. Changes no vector: set when created or re-indexed.",
        valid=_is_text, rule="a hub id or folder (or None)", missing=None, refuse=False,
        flags=(Flag("--reranker", str, "Record a default reranker (hub id or folder, e.g. "
                                       "Qwen/Qwen3-VL-Reranker-2B) that search and serve use for a second stage; "
                                       "set when the collection is created or re-indexed. Default: none."),))
    receipt: PlanReceipt | None = setting(None, "receipt", "--plan", "What `faste-mm plan` measured for these "
                                          "settings (PlanReceipt; on the command line `index --plan`).",
                                          missing=None, refuse=False)
    ocr: bool = setting(
        False, "ocr", "--ocr", "Read the text inside images and scanned PDF pages (OCR, faste_mm.retrieval.library.ocr) "
        "into the lexical index at index time. Changes no vector: given for an existing collection, it switches "
        "OCR on (its images are read at that run) or off.", valid=lambda value: isinstance(value, bool),
        rule="True or False", missing=False, refuse=False, carry=True,
        flags=(Flag("--ocr", bool, "Read the text inside images and scanned PDF pages (OCR) into the "
                                            "lexical index, so --mode lexical finds a plate or an invoice number "
                                            "(seconds per image on a CPU; needs faste-mm[ocr]). Recorded by the "
                                            "collection: switches an existing one without re-embedding. Default: "
                                            "the collection's, off for a new one."),))
    min_score: float | None = setting(
        None, "search.min_score", "--min-score", "The searches' default minimum score: hits whose cosine is below "
        "it are dropped (a search's own min_score overrides it); None = keep every hit. Changes no vector: set "
        "when created or re-indexed.", valid=_is_cosine, rule="a cosine in [-1, 1] (or None)", missing=None,
        refuse=False,
        flags=(Flag("--min-score", float, "Record the searches' default minimum score, a cosine -1..1 (hits below "
                                          "it are dropped; search --min-score overrides it); set when the collection "
                                          "is created or re-indexed. Default: none.", min=-1.0, max=1.0),))

    def __post_init__(self) -> None:
        if isinstance(self.video, Mapping):  # as read from JSON; unknown keys are a ConfigError
            object.__setattr__(self, "video", _video(self.video))
        if not isinstance(self.video, VideoConfig):
            raise ConfigError(f"CollectionProfile.video must be a VideoConfig, got {type(self.video).__name__}")
        if isinstance(self.receipt, Mapping):  # as read from JSON
            object.__setattr__(self, "receipt", PlanReceipt.from_dict(self.receipt))
        if self.receipt is not None and not isinstance(self.receipt, PlanReceipt):
            raise ConfigError(f"CollectionProfile.receipt must be a PlanReceipt or None, got {type(self.receipt).__name__}")
        if self.model_id is None:
            raise ConfigError("CollectionProfile.model_id must be a non-empty string, got None")
        for name, declared in settings_of(type(self)).items():
            declared.check("CollectionProfile", name, getattr(self, name))
        if not self.min_pixels <= self.max_pixels:
            raise ConfigError(f"CollectionProfile: need 1 <= min_pixels <= max_pixels, got {self.min_pixels} "
                              f"and {self.max_pixels}")
        object.__setattr__(self, "r_max", float(self.r_max))

    # ---- the stored form -----------------------------------------------------------------
    @classmethod
    def from_manifest(cls, manifest: Manifest) -> "CollectionProfile":
        """The profile of a collection, from its manifest; a key the manifest lacks (written
        before the setting existed) reads as the setting's `missing` value, else its default."""
        return cls.from_stored(manifest.to_dict())

    @classmethod
    def from_stored(cls, stored: Mapping[str, Any]) -> "CollectionProfile":
        """`from_manifest` on the manifest's JSON form (`Manifest.to_dict()`, `info --format json`'s
        "settings"): `faste-mm info` answered by a server reads it without loading FAISS."""
        try:
            values = {}
            for f in fields(cls):
                setting = _declared(f)
                value = get_key(stored, setting.key)
                if value is ABSENT or (value is None and f.name == "video"):
                    value = setting.missing
                if value is not ABSENT:
                    values[f.name] = value
            if values.get("model_dim") is None:  # collections from before Matryoshka stored the full width
                values["model_dim"] = stored["dim"]
            return cls(**values)
        except (TypeError, ConfigError) as error:
            raise CollectionError(f"{stored['model_id']}: invalid collection settings in the manifest ({error}); "
                                  f"restore it from a backup or re-index into a new collection") from None

    def to_manifest(self, index_type: str = "auto", base: Manifest | None = None) -> Manifest:
        """The manifest a new collection is created with (or `base` with this profile's settings;
        its index state and counts are kept). Needs `dim` (a completed profile, see `completed`)."""
        if self.dim is None:
            raise ConfigError("CollectionProfile.to_manifest needs dim: complete the profile with the loaded "
                              "model first (CollectionProfile.completed)")
        stored = base.to_dict() if base is not None else {"index": {"type": index_type}}
        for f in fields(self):
            value = getattr(self, f.name)
            put_key(stored, _declared(f).key, value.to_dict() if isinstance(value, (VideoConfig, PlanReceipt)) else value)
        if self.r_max == 0:  # the full forward: the manifest records no FastE settings
            stored["fast_e"] = None
        return Manifest.from_dict(stored)

    # ---- comparing and defaulting ----------------------------------------------------------
    def conflicts(self, other: "CollectionProfile") -> list[str]:
        """Every refusing setting in which `other` (the request) differs from this profile (the
        collection's), in words naming the setting, the collection's value and the requested one."""
        return [_conflict(f, getattr(self, f.name), getattr(other, f.name))
                for f in fields(self) if _declared(f).refuse and getattr(self, f.name) != getattr(other, f.name)]

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
        (`model_id` None or equal) those declared `carry=True` (the model's revision, r_max, dim, the
        image pixel cap, video, precision, OCR); with another model none (the documented defaults
        apply). theta and l_w are resolved again (the saved calibration may be newer)."""
        if model_id is not None and model_name(model_id) != self.model_id:
            return {}
        return {name: getattr(self, name) for name, declared in settings_of(type(self)).items() if declared.carry}

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
        if loaded.r_max == 0:  # the full forward: no FastE setting but r_max
            return replace(loaded, **{name: None for name in FAST_E_SETTINGS if name != "r_max"})
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
        return {name: getattr(self, name) for name in FAST_E_SETTINGS}


# The FastE settings (docs/design.md's r_max, l_w, theta, and where theta came from): those stored
# under "fast_e" in the manifest, in declaration order.
FAST_E_SETTINGS = tuple(name for name, declared in settings_of(CollectionProfile).items()
                        if declared.key.startswith("fast_e."))


def read_profile(root: str | os.PathLike) -> CollectionProfile:
    """The profile of the collection at `root` (its manifest only: no database, no lock).
    Raises CollectionError when there is no collection or its manifest cannot be read."""
    return CollectionProfile.from_manifest(read_manifest(Path(root)))


def existing_profile(root: str | os.PathLike) -> CollectionProfile | None:
    """The profile of the collection at `root`, or None when there is no collection there yet
    (CollectionError for one that cannot be read)."""
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
    return _declared(CollectionProfile.__dataclass_fields__[name])


def _declared(f: dataclasses.Field) -> Setting:
    return f.metadata["setting"]


def _conflict(f: dataclasses.Field, ours: Any, theirs: Any) -> str:
    if isinstance(ours, VideoConfig) and isinstance(theirs, VideoConfig):
        ours, theirs = ours.to_dict(), theirs.to_dict()
        changed = [k for k in ours if ours[k] != theirs[k]]
        ours, theirs = ({k: d[k] for k in changed} for d in (ours, theirs))
    return f"{f.name} ({_declared(f).flag}): collection has {ours!r}, request has {theirs!r}"


def _video(values: Mapping[str, Any]) -> VideoConfig:
    names = [f.name for f in fields(VideoConfig)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ConfigError(f"video settings have unknown keys {unknown}; valid keys are {names}")
    return VideoConfig(**values)
