"""faste_mm.indexers: collections on disk and the FAISS indexes derived from them.

The public names load on first use (PEP 562): a light reader of one module (a manifest, a
filter, the server announcement) must not import FAISS through this package's __init__ --
`faste-mm search` through a running server imports neither FAISS nor torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "Collection": "faste_mm.indexers.collection",
    "CollectionInfo": "faste_mm.indexers.records",
    "FileStat": "faste_mm.indexers.records",
    "ItemRecord": "faste_mm.indexers.records",
    "Manifest": "faste_mm.indexers.manifest",
    "ScanPlan": "faste_mm.indexers.records",
    "SearchFilter": "faste_mm.indexers.filters",
    "auto_factory": "faste_mm.indexers.faiss_index",
    "content_hash": "faste_mm.indexers.records",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from faste_mm.indexers.collection import Collection
    from faste_mm.indexers.faiss_index import auto_factory
    from faste_mm.indexers.filters import SearchFilter
    from faste_mm.indexers.manifest import Manifest
    from faste_mm.indexers.records import CollectionInfo, FileStat, ItemRecord, ScanPlan, content_hash


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'faste_mm.indexers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value
