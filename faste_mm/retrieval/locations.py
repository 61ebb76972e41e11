"""Where collections live: the default collection, named ones under the user's data folder, a
path as given. Standard library only, so a search through a running server (the thin client)
resolves its collection without loading FAISS or torch."""

from __future__ import annotations

import os
from pathlib import Path

from faste_mm.errors import ConfigError

DEFAULT_COLLECTION = "default"


def collections_dir() -> Path:
    """`user_data_dir("faste-mm")/collections` (platformdirs; honours XDG_DATA_HOME on Linux)."""
    import platformdirs

    return Path(platformdirs.user_data_dir("faste-mm")) / "collections"


def collection_path(collection: str | os.PathLike | None) -> Path:
    """Where a collection lives: None -> the default collection; a path (any os.PathLike), or a
    string holding a path separator or starting with "." or "~" -> that directory; any other
    string -> a named collection under `collections_dir()`."""
    if collection is None:
        return collections_dir() / DEFAULT_COLLECTION
    if isinstance(collection, os.PathLike):
        return Path(collection).expanduser().absolute()
    if not isinstance(collection, str) or not collection.strip():
        raise ConfigError(f"collection must be a name or a directory, got {collection!r}")
    if "/" in collection or os.sep in collection or collection.startswith((".", "~")):
        return Path(collection).expanduser().absolute()  # the manifest and lock must not depend on the cwd
    return collections_dir() / collection
