"""Search filters: which stored items a search may return (metadata values, kind, path glob).

`SearchFilter` is plain validated data; `store.MetaStore.filtered_ids` turns it into one SQL
query with bound parameters and hands the matching live ids to `Collection.search`, which
restricts FAISS to them (an id selector) so a filtered search still returns k hits when k match.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from faste_mm.errors import ConfigError

# What a user filters by -> the modalities stored for it (`ItemRecord.modality`): an image added
# with a caption ("image+text") is still an image; a PDF contributes one "page" item per page.
TYPES: dict[str, tuple[str, ...]] = {"image": ("image", "image+text"), "pdf": ("page",), "text": ("text",),
                                     "video": ("video", "video+text")}
_SCALARS = (str, int, float, bool)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1  # SQLite's INTEGER


@dataclass(frozen=True, slots=True)
class SearchFilter:
    """Conditions a hit must meet, all of them (AND).

    where: metadata key -> value; an item matches when its metadata holds that key with an equal
        value (str, int, float or bool; 2024 and "2024" differ). Keys are top-level names.
    types: item kinds, any of `TYPES` ("image", "pdf", "text", "video"); empty = every kind.
    path: a glob on the stored uri (SQLite GLOB: case-sensitive, `*` also matches `/`), e.g.
        "*/invoices/*" or "*.pdf"; one starting with "~" or "." is made absolute first, as the
        stored uris of files are.
    """

    where: Mapping[str, Any] = field(default_factory=dict)
    types: tuple[str, ...] = ()
    path: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.where, Mapping):
            raise ConfigError(f"search where must be a dict of metadata key -> value, got {type(self.where).__name__}")
        for key, value in self.where.items():
            if not isinstance(key, str) or not key or '"' in key:
                raise ConfigError(f"search where: key {key!r} must be a non-empty string without '\"'")
            if not isinstance(value, _SCALARS) or (isinstance(value, float) and not math.isfinite(value)):
                raise ConfigError(f"search where[{key!r}] = {value!r}: values must be a str, int, finite float "
                                  f"or bool")
            if isinstance(value, int) and not isinstance(value, bool) and not _INT64_MIN <= value <= _INT64_MAX:
                raise ConfigError(f"search where[{key!r}] = {value}: integers must lie in the 64-bit range "
                                  f"{_INT64_MIN}..{_INT64_MAX} (metadata stores them as SQLite integers); "
                                  f"compare a larger number as a string")
        types = (self.types,) if isinstance(self.types, str) else tuple(self.types)
        for kind in types:
            if kind not in TYPES:
                raise ConfigError(f"search type {kind!r} is not one of {', '.join(TYPES)}")
        object.__setattr__(self, "types", types)
        object.__setattr__(self, "where", dict(self.where))
        if self.path is not None:
            if not isinstance(self.path, str) or not self.path.strip():
                raise ConfigError(f"search path must be a non-empty glob, got {self.path!r}")
            if self.path.startswith(("~", ".")):  # abspath also folds "..", as resolved uris have none
                object.__setattr__(self, "path", os.path.abspath(os.path.expanduser(self.path)))

    @property
    def is_empty(self) -> bool:
        return not self.where and not self.types and self.path is None

    @property
    def modalities(self) -> tuple[str, ...]:
        """The stored modalities `types` stands for (empty: no condition on the kind)."""
        return tuple(m for kind in self.types for m in TYPES[kind])

    def to_dict(self) -> dict[str, Any]:
        return {"where": dict(self.where), "types": list(self.types), "path": self.path}


def json_path(key: str) -> str:
    """The SQLite JSON path of a top-level metadata key; quoted, so dots and spaces are literal."""
    return f'$."{key}"'
