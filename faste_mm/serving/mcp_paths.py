"""Which paths an MCP client may make this server read: the roots the user allowed for the
`index` tool (--allow-index PATH; none by default) and, for a search by picture, an indexed
image file of the collection. An assistant's arguments may come from anything it read (a web
page, a document), so a path is resolved (links followed), refused under /proc, /sys and /dev,
refused unless it is a regular file or folder, and refused outside what the user allowed.

Receives path strings from tool arguments; hands back resolved `Path`s (or a decoded picture),
or raises InputError naming the path and what to do.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from faste_mm.errors import ConfigError, InputError
from faste_mm.kinds import kind_name



@dataclass(frozen=True, slots=True)
class IndexRoots:
    """The folders (resolved) under which the `index` tool may read; empty = it may read nothing."""

    roots: tuple[Path, ...] = ()

    @classmethod
    def of(cls, paths) -> "IndexRoots":
        """ConfigError naming a root that is not an existing folder (checked when the server starts)."""
        roots = []
        for given in paths or ():
            path = Path(given).expanduser()
            if not path.is_dir():
                raise ConfigError(f"--allow-index {given}: not an existing folder; give a folder the index tool "
                                  f"may read")
            resolved = path.resolve()
            if _under_system_tree(resolved):
                raise ConfigError(f"--allow-index {given}: {resolved} is a system tree (/proc, /sys, /dev); "
                                  f"give a folder of your files")
            roots.append(resolved)
        return cls(tuple(roots))

    def allows(self, resolved: Path) -> bool:
        return any(resolved == root or resolved.is_relative_to(root) for root in self.roots)

    def check(self, given: str) -> Path:
        """The resolved path of `given` for the index tool; InputError when no root allows it."""
        if not self.roots:
            raise InputError(f"index: {given[:200]}: this server may not index anything; its user starts it with "
                             f"--allow-index FOLDER to let an assistant index files under that folder")
        resolved = _resolved(given, "index")
        if not self.allows(resolved):
            raise InputError(f"index: {given[:200]} is outside the folders this server may index "
                             f"({', '.join(map(str, self.roots))}); give a path under one of them")
        mode = os.stat(resolved).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise InputError(f"index: {given[:200]} is not a regular file or folder (a FIFO, socket or device); "
                             f"give files or folders")
        return resolved


def query_image_file(given: str, collection, roots: IndexRoots):
    """The picture of a search by image: a data: URL decoded in memory, or an indexed image file
    of `collection` (an open Collection) read as search reads it. Any other path is refused
    without being opened: an assistant may only show the server pictures it already holds."""
    from faste_mm.model.file_decoding import load_image
    from faste_mm.model.items import Item
    from faste_mm.serving.inputs import decode_image_url

    if given.startswith("data:"):
        return decode_image_url(given, "image", allow_remote=False)
    if given.split(":", 1)[0].lower() in ("http", "https", "file", "ftp"):
        raise InputError("search: `image` takes the path of an indexed image file or a data: URL; URLs are not "
                         "fetched")
    resolved = _resolved(given, "search: image")
    ids = collection.read(lambda rows: rows.live_ids_of(str(resolved)))
    if not ids and not roots.allows(resolved):
        raise InputError(f"search: image {given[:200]} is not a file of the collection {collection.root}; give "
                         f"the path of an indexed image (search results' uri), more_like_this with its id, or the "
                         f"picture as a data: URL")
    if kind_name(resolved) != "image":
        raise InputError(f"search: image {given[:200]} is a {kind_name(resolved)} file, not an image; use "
                         f"more_like_this with its id to find items like it")
    if ids:  # an indexed file: read only while it is the file indexed (as thumbnails and rerank read it)
        from faste_mm.retrieval.stored_files import stored_file

        resolved = stored_file(collection.get(ids[:1])[0])  # read through the checked descriptor
    elif not stat.S_ISREG(os.stat(resolved).st_mode):
        raise InputError(f"search: image {given[:200]} is not a regular file")
    return load_image(Item(image=resolved), max_pixels=64_000_000)


def _resolved(given: str, what: str) -> Path:
    if "\0" in given:
        raise InputError(f"{what}: the path contains a NUL character")
    try:
        resolved = Path(given).expanduser().resolve(strict=True)
    except (OSError, RuntimeError):
        raise InputError(f"{what}: {given[:200]}: no such file or folder") from None
    if _under_system_tree(resolved):
        raise InputError(f"{what}: {given[:200]} is under /proc, /sys or /dev, which are never read")
    return resolved


def _under_system_tree(path: Path) -> bool:
    from faste_mm.retrieval.stored_files import is_system_path  # the one list of trees never read

    return is_system_path(str(path))
