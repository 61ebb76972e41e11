"""Where collections live: the default collection, named ones under the user's data folder, a
path as given. Standard library only, so a search through a running server (the thin client)
resolves its collection without loading FAISS or torch."""

from __future__ import annotations

import os
from pathlib import Path

from faste_mm.errors import ConfigError

DEFAULT_COLLECTION = "default"


def collections_dir() -> Path:
    """`user_data_dir("faste-mm")/collections` (platformdirs; honours XDG_DATA_HOME on Linux). An MCP
    client or a service may start faste-mm with a minimal environment: no HOME (the home is then
    the password database's) or a HOME of its own that holds no collections; when XDG_DATA_HOME is
    not set and that folder does not exist, the same folder under the account's home from the
    password database is used if it exists there."""
    import platformdirs

    return _collections_dir(Path(platformdirs.user_data_dir("faste-mm")) / "collections",
                            Path(os.path.expanduser("~")), _account_home(), os.environ.get("XDG_DATA_HOME"))


def _collections_dir(found: Path, home: Path, account_home: str | None, xdg_data_home: str | None) -> Path:
    """`found` (platformdirs' answer under `home`), or its twin under `account_home` (see
    `collections_dir`)."""
    if found.is_dir() or xdg_data_home or account_home is None or home == Path(account_home):
        return found
    if not found.is_relative_to(home):
        return found
    twin = Path(account_home) / found.relative_to(home)
    return twin if twin.is_dir() else found


def _account_home() -> str | None:
    """The user's home from the password database (pwd.getpwuid(os.getuid()).pw_dir); None where
    there is none (Windows, a uid without an entry in a container)."""
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_dir or None
    except (ImportError, KeyError):
        return None


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
