"""Collection manifest: the stored form of a collection's settings, plus the derived index state.

`manifest.json` is written atomically. The storage layer declares here only what it reads itself
(model id, width, vector precision, index state, counts), each field once with `stored(...)`: its
JSON key, default and check. Every other collection setting (pixels, video, FastE, reranker, ...)
is declared once in `faste_mm.retrieval.profile.CollectionProfile`; the manifest keeps those in
`settings` exactly as written, so a new setting needs no change here.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from dataclasses import dataclass, field
from importlib import metadata as _pkg_metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from faste_mm.errors import CollectionError, ConfigError
from faste_mm.indexers.atomic_files import atomic_write
from faste_mm.indexers.vector_choices import KEEPS, METRICS, PRECISIONS, VECTOR_DTYPES

if TYPE_CHECKING:  # quantization loads numpy: imported where vectors are coded
    from faste_mm.indexers.quantization import Codec, Int8Ranges

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
_REQUIRED = dataclasses.MISSING


def _faste_mm_version() -> str:
    try:
        return _pkg_metadata.version("faste-mm")
    except _pkg_metadata.PackageNotFoundError:
        return "unknown"


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _is_int(minimum: int) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _one_of(choices: tuple[str, ...]) -> Callable[[Any], bool]:
    return lambda value: value in choices


@dataclass(frozen=True, slots=True)
class Stored:
    """How one field of `Manifest` is stored and checked.

    key: where it lives in manifest.json, a dotted path ("vectors.precision").
    default: its value when a manifest lacks it (written before the field existed);
        `dataclasses.MISSING` = required. valid / rule: a check of its value (None is not
        checked) and the words for it. refuse: vectors stored under a different value cannot
        share the collection's index (`Manifest.compatibility_errors`).
    The profile reuses the declarations of the fields it also offers (`setting(..., key=Stored)`).
    """

    key: str
    default: Any = _REQUIRED
    valid: Callable[[Any], bool] | None = None
    rule: str = ""
    refuse: bool = False


def stored(key: str, default: Any = _REQUIRED, *, valid: Callable[[Any], bool] | None = None, rule: str = "",
           refuse: bool = False, factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field of `Manifest` carrying its `Stored` declaration."""
    if default is _REQUIRED and factory is not None:  # a manifest without it reads as a fresh value
        default = factory()
    meta = {"stored": Stored(key, default, valid, rule, refuse)}
    if factory is not None:  # a new manifest's value
        return field(default_factory=factory, metadata=meta)
    if default is _REQUIRED:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, slots=True)
class Manifest:
    """Settings of a collection (see module docstring); one instance per `manifest.json`.

    model_id / dim: the embedding model and the stored width (a Matryoshka collection stores the
        first `dim` dimensions; the model's own width is a setting, `CollectionProfile.model_dim`).
    vector_dtype: on-disk storage of vectors ("float16" halves disk; search runs in float32).
    normalized / metric: vectors are unit-norm and compared by inner product ("ip").
    vectors: precision of the index in RAM ("float32", "float16", "int8" 8-bit codes, "binary" sign
        bits); keep: the copy the parts keep on disk for rescoring ("float": vector_dtype, "int8":
        8-bit codes, "none": the index's codes only, results unrescored). See indexers.quantization.
    int8_ranges: the calibrated per-dimension ranges of 8-bit codes, set by the first add and
        fixed thereafter (None until then, and for collections without 8-bit codes).
    index_type: "auto" or a FAISS factory string; memory_budget_bytes guides "auto".
    index_factory / index_epoch / index_max_part / index_sha256: written by the collection, describe
        index.faiss (the checksum rejects a torn, edited or foreign file, which is then rebuilt).
    counts: written by the collection at close ({"ok", "failed", "deleted"}), informational.
    settings: the rest of manifest.json as written: the collection settings that
        `CollectionProfile` declares (read and written through it; opaque here).
    """

    model_id: str = stored("model_id", valid=_is_text, rule="a non-empty string", refuse=True)
    dim: int = stored("dim", valid=_is_int(1), rule="an int >= 1", refuse=True)
    vector_dtype: str = stored("vector_dtype", "float16", valid=_one_of(VECTOR_DTYPES), rule=f"one of {VECTOR_DTYPES}")
    normalized: bool = stored("normalized", True, valid=lambda value: isinstance(value, bool),
                              rule="True or False", refuse=True)
    metric: str = stored("metric", "ip", valid=_one_of(METRICS), rule=f"one of {METRICS}", refuse=True)
    vectors: str = stored("vectors.precision", "float32", valid=_one_of(PRECISIONS), rule=f"one of {PRECISIONS}",
                          refuse=True)
    keep: str = stored("vectors.keep", "float", valid=_one_of(KEEPS), rule=f"one of {KEEPS}", refuse=True)
    int8_ranges: Int8Ranges | None = stored("vectors.int8_ranges", None)
    index_type: str = stored("index.type", "auto", valid=_is_text, rule="'auto' or a FAISS factory string")
    memory_budget_bytes: int = stored("index.memory_budget_bytes", 4 * 2**30, valid=_is_int(2**20),
                                      rule=">= 1 MiB (1048576)")
    index_factory: str | None = stored("index.factory", None)
    index_epoch: int = stored("index.epoch", -1)
    index_max_part: int = stored("index.max_part", -1)
    index_sha256: str | None = stored("index.sha256", None)
    counts: Mapping[str, int] = stored("counts", factory=dict)
    format_version: int = stored("format_version", FORMAT_VERSION)
    faste_mm_version: str = stored("faste_mm_version", "unknown", factory=_faste_mm_version)
    settings: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from faste_mm.indexers.quantization import Int8Ranges, check_precision

        for f in dataclasses.fields(self):
            declared = f.metadata.get("stored")
            value = getattr(self, f.name)
            if declared is not None and value is not None and declared.valid is not None and not declared.valid(value):
                raise ConfigError(f"Manifest.{f.name} must be {declared.rule}, got {value!r}")
        if not isinstance(self.settings, Mapping):
            raise ConfigError(f"Manifest.settings must be a mapping (manifest.json's collection settings), "
                              f"got {self.settings!r}")
        object.__setattr__(self, "settings", copy.deepcopy(dict(self.settings)))
        shadowed = [f.metadata["stored"].key for f in dataclasses.fields(self) if "stored" in f.metadata
                    and _pop(copy.deepcopy(self.settings), f.metadata["stored"].key) is not _ABSENT]
        if shadowed:  # two values for one key: which one manifest.json holds would be an accident
            raise ConfigError(f"Manifest.settings holds {shadowed}, which are fields of the manifest itself; "
                              f"give them as Manifest's own arguments")
        object.__setattr__(self, "counts", dict(self.counts))
        check_precision(self.vectors, self.keep)
        if isinstance(self.int8_ranges, Mapping):  # as read from JSON
            object.__setattr__(self, "int8_ranges", Int8Ranges.from_dict(self.int8_ranges))
        if self.int8_ranges is not None and self.int8_ranges.lo.shape != (self.dim,):
            raise ConfigError(f"Manifest.int8_ranges must have {self.dim} dimensions, got {self.int8_ranges.lo.shape[0]}")

    @classmethod
    def declared(cls, name: str) -> Stored:
        """How field `name` is stored and checked (the profile reuses it for the settings it shares)."""
        return cls.__dataclass_fields__[name].metadata["stored"]

    @property
    def stored_precision(self) -> str:
        """Precision of the vector parts on disk (`quantization.stored_precision`)."""
        from faste_mm.indexers.quantization import stored_precision

        return stored_precision(self.vectors, self.keep, self.vector_dtype)

    @property
    def codec(self) -> Codec:
        """How the parts store vectors (their precision, and the 8-bit ranges when calibrated)."""
        from faste_mm.indexers.quantization import Codec

        return Codec(self.stored_precision, self.dim, self.int8_ranges)

    @property
    def uses_int8(self) -> bool:
        from faste_mm.indexers.quantization import uses_int8

        return uses_int8(self.vectors, self.keep)

    def compatibility_errors(self, other: "Manifest") -> list[str]:
        """Every stored field whose difference makes `other`'s vectors (the request's) unable to
        share this collection's index (`Stored.refuse`), in words; [] = compatible. The settings
        that decide how items are embedded are compared by `CollectionProfile.conflicts`."""
        return [f"{f.name}: collection has {getattr(self, f.name)!r}, request has {getattr(other, f.name)!r}"
                for f in dataclasses.fields(self)
                if "stored" in f.metadata and f.metadata["stored"].refuse and getattr(self, f.name) != getattr(other, f.name)]

    def to_dict(self) -> dict[str, Any]:
        """manifest.json's content: `settings` as written, each stored field at its key."""
        out = copy.deepcopy(dict(self.settings))
        for f in dataclasses.fields(self):
            if "stored" in f.metadata:
                value = getattr(self, f.name)
                value = value.to_dict() if hasattr(value, "to_dict") else dict(value) if isinstance(value, Mapping) else value
                put_key(out, f.metadata["stored"].key, value)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Manifest":
        """Inverse of `to_dict`; a stored field a manifest lacks reads as its default. Raises
        ConfigError naming a missing required or an invalid field."""
        values: dict[str, Any] = {}
        settings = copy.deepcopy(dict(d))
        for f in dataclasses.fields(cls):
            if "stored" not in f.metadata:
                continue
            declared: Stored = f.metadata["stored"]
            value = _pop(settings, declared.key)
            if value is _ABSENT:
                if declared.default is _REQUIRED:
                    raise ConfigError(f"manifest is missing the required field {declared.key!r}")
                value = declared.default
            values[f.name] = value
        return cls(**values, settings=settings)

    def replace(self, **changes: Any) -> "Manifest":
        return dataclasses.replace(self, **changes)


_ABSENT = object()


def put_key(stored: dict[str, Any], key: str, value: Any) -> None:
    """Set dotted `key` in a manifest dict, making the dicts on its path."""
    *path, last = key.split(".")
    node = stored
    for part in path:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def _pop(stored: dict[str, Any], key: str) -> Any:
    """Remove dotted `key` from `stored` and return its value (_ABSENT when missing); a parent
    left empty by the removal goes too, so `settings` keeps only what the profile declares."""
    *path, last = key.split(".")
    nodes = [stored]
    for depth, part in enumerate(path):
        child = nodes[-1].get(part)
        if child is None:  # written before the field existed
            return _ABSENT
        if not isinstance(child, dict):
            raise ConfigError(f"manifest field {'.'.join(path[:depth + 1])!r} must be an object, got {child!r}")
        nodes.append(child)
    if last not in nodes[-1]:
        return _ABSENT
    value = nodes[-1].pop(last)
    for parent, part, child in reversed(list(zip(nodes, path, nodes[1:]))):
        if child:
            break
        del parent[part]
    return value


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
