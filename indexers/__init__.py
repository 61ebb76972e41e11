"""faste_mm.indexers: collections on disk and the FAISS indexes derived from them."""

from faste_mm.indexers.collection import Collection
from faste_mm.indexers.faiss_index import auto_factory
from faste_mm.indexers.filters import SearchFilter
from faste_mm.indexers.manifest import Manifest
from faste_mm.indexers.records import (
    CollectionInfo,
    FileStat,
    ItemRecord,
    ScanPlan,
    content_hash,
)

__all__ = [
    "Collection",
    "CollectionInfo",
    "FileStat",
    "ItemRecord",
    "Manifest",
    "ScanPlan",
    "SearchFilter",
    "auto_factory",
    "content_hash",
]
