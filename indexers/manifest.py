"""Collection manifest: the settings that produced the vectors, plus the derived index state.

`manifest.json` is written atomically. The fields in `COMPATIBILITY_FIELDS` decide whether two
sets of vectors can share one index; everything else is informational or derived.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from importlib import metadata as _pkg_metadata
from pathlib import Path
from typing import Any, Mapping, Sequence

from faste_mm.errors import CollectionError, ConfigError
from faste_mm.indexers.atomic_files import atomic_write
from faste_mm.indexers.quantization import Codec, Int8Ranges, check_precision, stored_precision, uses_int8

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
VECTOR_DTYPES = ("float16", "float32")
METRICS = ("ip",)
DEFAULT_INSTRUCTION = "Represent the user's input."
DEFAULT_MEMORY_BUDGET_BYTES = 4 * 2**30

# Fields that make vectors incomparable when they differ (order = order of the error message).
COMPATIBILITY_FIELDS = (
    "model_id", "model_revision", "dim", "document_instruction",
    "min_pixels", "max_pixels", "video", "patch_dedup", "normalized", "metric", "vectors", "keep",
)


def _faste_mm_version() -> str:
    try:
        return _pkg_metadata.version("faste-mm")
    except _pkg_metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True, slots=True)
class CollectionFastE:
    """The FastE settings a collection's documents were embedded with (paper symbols: r_max, l_w,
    theta), and where theta came from ("backbone default (...)" or a calibration)."""

    r_max: float
    warmup_layer: int | None = None
    threshold: float | None = None
    threshold_source: str | None = None
    trigger_layer: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CollectionFastE":
        """From manifest JSON; ConfigError naming unknown or missing keys."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ConfigError(f"Manifest.fast_e has unknown keys {unknown}; valid keys are {names}")
        if "r_max" not in d:
            raise ConfigError("Manifest.fast_e needs r_max")
        return cls(**d)


@dataclass(frozen=True, slots=True)
class Manifest:
    """Settings of a collection (see module docstring); one instance per `manifest.json`.

    model_id / model_revision / dim: the embedding model and the stored width. model_dim: the
        model's own width when known; dim < model_dim means Matryoshka vectors (the first `dim`
        dimensions, re-normalised), and queries are truncated the same way.
    vector_dtype: on-disk storage of vectors ("float16" halves disk; search runs in float32).
    normalized / metric: vectors are unit-norm and compared by inner product ("ip").
    document_instruction, min_pixels, max_pixels, video: how documents were serialized (video:
        frame sampling and per-frame pixel budget, `faste_mm.model.video.VideoConfig`'s fields; None
        in collections written before videos, read as VideoConfig's defaults by the profile).
    The settings that decide how items are embedded are read and written through
    `faste_mm.retrieval.profile.CollectionProfile`; this record is their stored form.
    fast_e: FastE settings used for documents (`CollectionFastE`; a dict is converted); None = full.
    index_type: "auto" or a FAISS factory string; memory_budget_bytes guides "auto".
    index_factory / index_epoch / index_max_part / index_sha256: written by the collection, describe
        index.faiss (the checksum rejects a torn, edited or foreign file, which is then rebuilt).
    counts: written by the collection at close ({"ok", "failed", "deleted"}), informational.
    vectors: precision of the index in RAM ("float32", "float16", "int8" 8-bit codes, "binary" sign
        bits); keep: the copy the parts keep on disk for rescoring ("float": vector_dtype, "int8":
        8-bit codes, "none": the index's codes only, results unrescored). See indexers.quantization.
    int8_ranges: the calibrated per-dimension ranges of 8-bit codes, set by the first add and
        fixed thereafter (None until then, and for collections without 8-bit codes).
    reranker: the collection's default reranker (hub id or folder) for searches; None = none.
    ocr: the text inside images and scanned pages is read (OCR) into the lexical index at index time.
    min_score: the searches' default minimum score (a cosine; checked by the profile); None = none.
    patch_dedup: duplicate-patch removal before the vision tower ("off", "exact", "near"; checked by
        the profile); "off" for collections made before it.
    receipt: what `faste-mm plan` measured for these settings (read as a `PlanReceipt` by the
        profile), None when the collection was indexed without a plan; informational.
    """

    model_id: str
    dim: int
    model_revision: str | None = None
    model_dim: int | None = None
    vector_dtype: str = "float16"
    normalized: bool = True
    metric: str = "ip"
    document_instruction: str = DEFAULT_INSTRUCTION
    min_pixels: int = 4096
    max_pixels: int = 1_843_200
    video: Mapping[str, Any] | None = None
    fast_e: CollectionFastE | None = None
    index_type: str = "auto"
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET_BYTES
    index_factory: str | None = None
    index_epoch: int = -1
    index_max_part: int = -1
    index_sha256: str | None = None
    counts: Mapping[str, int] = field(default_factory=dict)
    vectors: str = "float32"
    keep: str = "float"
    int8_ranges: Int8Ranges | None = None
    receipt: Mapping[str, Any] | None = None
    format_version: int = FORMAT_VERSION
    faste_mm_version: str = field(default_factory=_faste_mm_version)
    reranker: str | None = None
    ocr: bool = False
    min_score: float | None = None
    patch_dedup: str = "off"

    def __post_init__(self) -> None:
        if not isinstance(self.model_id, str) or not self.model_id:
            raise ConfigError(f"Manifest.model_id must be a non-empty string, got {self.model_id!r}")
        if not isinstance(self.dim, int) or self.dim < 1:
            raise ConfigError(f"Manifest.dim must be an int >= 1, got {self.dim!r}")
        if self.model_dim is not None and (not isinstance(self.model_dim, int) or self.model_dim < self.dim):
            raise ConfigError(f"Manifest.model_dim must be None or an int >= dim ({self.dim}), got {self.model_dim!r}")
        if self.vector_dtype not in VECTOR_DTYPES:
            raise ConfigError(f"Manifest.vector_dtype must be one of {VECTOR_DTYPES}, "
                              f"got {self.vector_dtype!r}")
        if self.metric not in METRICS:
            raise ConfigError(f"Manifest.metric must be one of {METRICS}, got {self.metric!r}")
        if not 1 <= self.min_pixels <= self.max_pixels:
            raise ConfigError(f"Manifest.min_pixels/max_pixels must satisfy 1 <= min <= max, "
                              f"got min_pixels={self.min_pixels}, max_pixels={self.max_pixels}")
        if self.video is not None:
            if not isinstance(self.video, Mapping) or not all(isinstance(k, str) for k in self.video):
                raise ConfigError(f"Manifest.video must be None or a mapping of video settings, got {self.video!r}")
            object.__setattr__(self, "video", dict(self.video))
        if self.memory_budget_bytes < 2**20:
            raise ConfigError(f"Manifest.memory_budget_bytes must be >= 1 MiB (1048576), "
                              f"got {self.memory_budget_bytes}")
        if not isinstance(self.index_type, str) or not self.index_type.strip():
            raise ConfigError(f"Manifest.index_type must be 'auto' or a FAISS factory string, "
                              f"got {self.index_type!r}")
        if isinstance(self.fast_e, Mapping):  # as read from JSON
            object.__setattr__(self, "fast_e", CollectionFastE.from_dict(self.fast_e))
        object.__setattr__(self, "counts", dict(self.counts))
        check_precision(self.vectors, self.keep)
        if isinstance(self.int8_ranges, Mapping):  # as read from JSON
            object.__setattr__(self, "int8_ranges", Int8Ranges.from_dict(self.int8_ranges))
        if self.int8_ranges is not None and self.int8_ranges.lo.shape != (self.dim,):
            raise ConfigError(f"Manifest.int8_ranges must have {self.dim} dimensions, got {self.int8_ranges.lo.shape[0]}")

    @property
    def is_matryoshka(self) -> bool:
        """Whether the vectors are the model's first `dim` dimensions, re-normalised."""
        return self.model_dim is not None and self.dim < self.model_dim

    @property
    def stored_precision(self) -> str:
        """Precision of the vector parts on disk (`quantization.stored_precision`)."""
        return stored_precision(self.vectors, self.keep, self.vector_dtype)

    @property
    def codec(self) -> Codec:
        """How the parts store vectors (their precision, and the 8-bit ranges when calibrated)."""
        return Codec(self.stored_precision, self.dim, self.int8_ranges)

    @property
    def uses_int8(self) -> bool:
        return uses_int8(self.vectors, self.keep)

    @property
    def r_max(self) -> float:
        """FastE's r_max for this collection's documents; 0.0 when they use the full forward."""
        return 0.0 if self.fast_e is None else float(self.fast_e.r_max)

    def compatibility_errors(self, other: "Manifest") -> list[str]:
        """Every setting in which `other` (the request) differs from this collection, in words.

        An empty list means vectors produced under `other` can be searched together with ours.
        """
        return self.differences({name: getattr(other, name) for name in COMPATIBILITY_FIELDS})

    def differences(self, request: Mapping[str, Any]) -> list[str]:
        """`compatibility_errors` for a request that knows only some fields (a model not loaded
        yet knows its id and revision, not its dim); fields absent from `request` are skipped."""
        return [f"{name}: collection has {getattr(self, name)!r}, request has {request[name]!r}"
                for name in COMPATIBILITY_FIELDS if name in request and getattr(self, name) != request[name]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "faste_mm_version": self.faste_mm_version,
            "model_id": self.model_id,
            "model_revision": self.model_revision,
            "dim": self.dim,
            "model_dim": self.model_dim,
            "vector_dtype": self.vector_dtype,
            "normalized": self.normalized,
            "metric": self.metric,
            "document_instruction": self.document_instruction,
            "serializer": {"min_pixels": self.min_pixels, "max_pixels": self.max_pixels,
                           "video": None if self.video is None else dict(self.video), "patch_dedup": self.patch_dedup},
            "fast_e": self.fast_e.to_dict() if self.fast_e is not None else None,
            "index": {
                "type": self.index_type,
                "memory_budget_bytes": self.memory_budget_bytes,
                "factory": self.index_factory,
                "epoch": self.index_epoch,
                "max_part": self.index_max_part,
                "sha256": self.index_sha256,
            },
            "counts": dict(self.counts),
            "vectors": {"precision": self.vectors, "keep": self.keep,
                        "int8_ranges": None if self.int8_ranges is None else self.int8_ranges.to_dict()},
            "reranker": self.reranker,
            "receipt": None if self.receipt is None else dict(self.receipt),
            "ocr": self.ocr,
            "search": {"min_score": self.min_score},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Manifest":
        """Inverse of `to_dict`; raises ConfigError naming a missing or invalid field."""
        try:
            serializer = d.get("serializer") or {}
            index = d.get("index") or {}
            vectors = d.get("vectors") or {}
            return cls(
                model_id=d["model_id"],
                dim=d["dim"],
                model_revision=d.get("model_revision"),
                model_dim=d.get("model_dim"),
                vector_dtype=d.get("vector_dtype", "float16"),
                normalized=d.get("normalized", True),
                metric=d.get("metric", "ip"),
                document_instruction=d.get("document_instruction", DEFAULT_INSTRUCTION),
                min_pixels=serializer.get("min_pixels", 4096),
                max_pixels=serializer.get("max_pixels", 1_843_200),
                video=serializer.get("video"),
                patch_dedup=serializer.get("patch_dedup", "off"),
                fast_e=d.get("fast_e"),
                index_type=index.get("type", "auto"),
                memory_budget_bytes=index.get("memory_budget_bytes", DEFAULT_MEMORY_BUDGET_BYTES),
                index_factory=index.get("factory"),
                index_epoch=index.get("epoch", -1),
                index_max_part=index.get("max_part", -1),
                index_sha256=index.get("sha256"),
                counts=d.get("counts") or {},
                vectors=vectors.get("precision", "float32"),
                keep=vectors.get("keep", "float"),
                int8_ranges=vectors.get("int8_ranges"),
                reranker=d.get("reranker"),
                ocr=d.get("ocr", False),
                min_score=(d.get("search") or {}).get("min_score"),
                receipt=d.get("receipt"),
                format_version=d.get("format_version", FORMAT_VERSION),
                faste_mm_version=d.get("faste_mm_version", "unknown"),
            )
        except KeyError as e:
            raise ConfigError(f"manifest is missing the required field {e.args[0]!r}") from None

    def replace(self, **changes: Any) -> "Manifest":
        return dataclasses.replace(self, **changes)


def read_manifest(root: Path) -> Manifest:
    """Load `root/manifest.json`; CollectionError if absent, unreadable or from a newer format."""
    path = root / MANIFEST_NAME
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CollectionError(f"{root}: not a faste-mm collection ({MANIFEST_NAME} is missing)",
                              hint="create it with Collection.create, or index files into it with Retriever.index",
                              cli_hint=f"index files into it first: faste-mm index PATH -c {root}") from None
    except OSError as e:  # permissions, a folder in its place, a disk error: not damage
        raise CollectionError(f"{path}: cannot read the manifest ({e.strerror or e}); check that you may read "
                              f"the collection's folder and files") from None
    except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested absurdly deep
        why = "not UTF-8 text" if isinstance(e, UnicodeDecodeError) else "nested too deeply" if isinstance(
            e, RecursionError) else f"not JSON: {e}"
        raise CollectionError(f"{path}: cannot read the manifest ({why}); the file is damaged — restore it from "
                              f"a backup, or re-index into a new collection") from None
    version = raw.get("format_version", FORMAT_VERSION) if isinstance(raw, dict) else None
    if not isinstance(version, int):
        raise CollectionError(f"{path}: invalid manifest (not an object with an integer format_version); "
                              f"restore it from a backup or re-index into a new collection")
    if version > FORMAT_VERSION:
        raise CollectionError(
            f"{root}: collection format_version {version} is newer than this faste-mm "
            f"({_faste_mm_version()}) understands (up to {FORMAT_VERSION}); "
            f"upgrade faste-mm (pip install -U faste-mm) to open it")
    try:
        return Manifest.from_dict(raw)
    except (ConfigError, TypeError, AttributeError, ValueError) as e:
        raise CollectionError(f"{path}: invalid manifest: {e}; restore it from a backup or "
                              f"re-index into a new collection") from None


def settings_mismatch(root: Path, errors: Sequence[str]) -> CollectionError:
    """The error for a request whose settings differ from the collection's (`compatibility_errors`)."""
    return CollectionError(
        f"{root}: the collection was built with different settings — {'; '.join(errors)}. Vectors "
        f"from different settings are not comparable: index into a new collection, or re-index this one",
        hint="Retriever.index(paths, options=IndexOptions(reindex=True)) (on the command line: `faste-mm index --reindex`)",
        cli_hint="faste-mm index PATH... --reindex")


def write_manifest(root: Path, manifest: Manifest, crash_at: str | None = None) -> None:
    """Atomically replace `root/manifest.json` (crash_at: see `atomic_write`)."""
    text = json.dumps(manifest.to_dict(), indent=2, sort_keys=False) + "\n"
    atomic_write(root / MANIFEST_NAME, lambda f: f.write(text.encode("utf-8")), crash_at=crash_at)
