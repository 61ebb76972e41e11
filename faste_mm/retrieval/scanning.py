"""Scanning: the paths a user gives `faste-mm index` (or `embed`) -> the files they name, each
with its kind (`faste_mm.kinds`) and stat; hidden, excluded and removed (`exclusions`) paths
skipped, missing ones reported. Reads no file contents and loads no model code.

Receives paths and a `ScanFilter`; hands a `Scan` to planning (`retrieval.ingest.ingest_work`)
or the items of `document_items` to the embedder.
"""

from __future__ import annotations

import fnmatch
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Sequence

from faste_mm.errors import ConfigError, InputError
from faste_mm.indexers import Collection, FileStat
from faste_mm.kinds import KINDS, UNSUPPORTED, kind_name
from faste_mm.model.file_decoding import not_a_file_reason
from faste_mm.model.items import Item, as_item
from faste_mm.retrieval.decoders import document_input

log = logging.getLogger(__name__)


def file_kind(path: Path) -> str:
    """"image" | "pdf" | "text" | "video" | "unsupported", decided by the file name's suffix
    (`faste_mm.kinds`, the one table of input kinds)."""
    return kind_name(path)


@dataclass(frozen=True, slots=True)
class ScanFilter:
    """Which files a folder walk selects.

    exclude: glob patterns (fnmatch: `*` also matches `/`) tested against the path relative to
        the walked folder and against every name in it, so "*.gif", "drafts/*" and "node_modules"
        all work.
    include_hidden: also walk names starting with "." (skipped by default).
    follow_links: also index a file link whose target lies outside every walked folder (skipped and
        counted by default, as rsync, restic and ripgrep do: a link planted in an indexed folder must
        not pull a private file into the collection and its front ends). Links into /proc, /sys and
        /dev are never followed; links to folders are never walked either way.
    """

    exclude: tuple[str, ...] = ()
    include_hidden: bool = False
    follow_links: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.exclude, str):
            raise ConfigError(f"ScanFilter.exclude must be a sequence of glob strings, got the "
                              f"single string {self.exclude!r}; wrap it in a list")
        patterns = tuple(self.exclude)
        for pattern in patterns:
            if not isinstance(pattern, str) or not pattern.strip():
                raise ConfigError(f"ScanFilter.exclude entries must be non-empty glob strings, "
                                  f"got {pattern!r}")
        object.__setattr__(self, "exclude", patterns)

    def is_excluded(self, relative: str) -> bool:
        """True when `relative` (a posix path below the walked folder) matches a pattern."""
        names = relative.split("/")
        return any(fnmatch.fnmatchcase(relative, p) or any(fnmatch.fnmatchcase(n, p) for n in names)
                   for p in self.exclude)

    def is_hidden(self, relative: str) -> bool:
        return not self.include_hidden and any(n.startswith(".") for n in relative.split("/"))


@dataclass(frozen=True, slots=True)
class ScannedFile:
    """One file found by a scan: its path, kind and stat (stat.uri is the resolved path)."""

    path: Path
    kind: str
    stat: FileStat

    @property
    def uri(self) -> str:
        return self.stat.uri

    @property
    def modality(self) -> str:
        # the modality recorded per kind: a PDF contributes one "page" item per page
        return KINDS[self.kind].modality if self.kind in KINDS else UNSUPPORTED


@dataclass(frozen=True, slots=True)
class Scan:
    """What `scan_paths` found.

    roots: each walked folder (resolved) with the files found below it; the collection removes
        items under a root whose file is no longer found there.
    named: files the user named explicitly (an unsupported one is kept, to be recorded as a
        failure; folder walks silently ignore unsupported files).
    missing: paths that cannot be indexed as files (named ones that do not exist; dangling or
        looping symlinks, FIFOs and devices, named or found by a walk), with the message to record.
    excluded: removed paths (see `honour_exclusions`) whose files the folder walks left out;
        items under them are never reported vanished. n_excluded: how many files that was.
    outside_links: the walked file links skipped because their target lies outside every walked
        folder (`ScanFilter.follow_links` off): the link paths, never their targets' contents.
    """

    roots: tuple[tuple[str, tuple[ScannedFile, ...]], ...]
    named: tuple[ScannedFile, ...]
    missing: tuple[tuple[str, str], ...]
    excluded: tuple[str, ...] = ()
    n_excluded: int = 0
    outside_links: tuple[str, ...] = ()

    def files(self) -> list[ScannedFile]:
        """Every file once (by uri), in scan order."""
        seen: dict[str, ScannedFile] = {}
        for _, found in self.roots:
            for f in found:
                seen.setdefault(f.uri, f)
        for f in self.named:
            seen.setdefault(f.uri, f)
        return list(seen.values())


def scan_paths(paths: Iterable[str | os.PathLike], scan_filter: ScanFilter | None = None) -> Scan:
    """Walk folders recursively (sorted, symlinked folders not followed) and stat every file.

    A file link found by a walk is indexed when its target lies inside one of the walked folders
    (under the target's resolved path when that is inside the link's own folder, else under the
    link's path, so its items go with the link). A link whose target lies outside every walked
    folder is skipped and listed in `Scan.outside_links`, unless `scan_filter.follow_links`. A
    file the user names is read wherever it leads (the user chose it), except into /proc, /sys or
    /dev, which no link ever leads a scan into (reported in `Scan.missing`).
    Raises InputError when `paths` is empty. A path that cannot be indexed as a file (missing,
    a dangling or looping symlink, a FIFO or device) is reported in `Scan.missing` with its
    reason, not raised, so one bad path does not stop the others.
    """
    scan_filter = scan_filter or ScanFilter()
    paths = [Path(p).expanduser() for p in paths]
    if not paths:
        raise InputError("no paths to index; give at least one file or folder")
    folders = [path.resolve() for path in paths if path.is_dir()]
    roots, named, missing, outside = [], [], [], []
    for path in paths:
        if path.is_dir():
            root = path.resolve()
            found = []
            for entry in _walk(root, scan_filter, folders, outside):
                (found if isinstance(entry, ScannedFile) else missing).append(entry)
            roots.append((str(root), tuple(found)))
        elif path.is_file():
            reason = _system_link_reason(path)
            if reason is not None:
                missing.append((os.path.abspath(path), reason))
                continue
            try:
                named.append(ScannedFile(path, file_kind(path), FileStat.of(path)))
            except (OSError, RuntimeError) as error:
                missing.append((_uri(path), f"{path}: cannot stat the file ({error})"))
        else:
            missing.append((_uri(path), not_a_file_reason(path) or f"{path}: file not found; check the path"))
    if outside:
        log.info("skipped %d links that lead outside the indexed folders (%s); ScanFilter(follow_links=True) "
                 "includes them", len(outside), ", ".join(outside[:5]) + (", ..." if len(outside) > 5 else ""))
    return Scan(tuple(roots), tuple(named), tuple(missing), outside_links=tuple(outside))


def honour_exclusions(col: Collection, scan: Scan) -> Scan:
    """Apply the collection's exclusions (paths removed with `remove`) to a scan: a folder walk
    skips the files under an exclusion strictly below the walked folder. Naming an excluded path
    itself (a folder or file given to `index`) clears its exclusion; a file or folder named
    inside an excluded folder is indexed without clearing it."""
    named = [root for root, _ in scan.roots] + [f.uri for f in scan.named]
    cleared = col.include_again(named)
    if cleared:
        log.info("indexing again the removed paths %s", ", ".join(cleared))
    return apply_exclusions(scan, col.exclusions())


def apply_exclusions(scan: Scan, exclusions: Sequence[str]) -> Scan:
    """`scan` without the walked files under an exclusion strictly below their walked folder."""
    roots, applied, n_excluded = [], set(), 0
    for root, found in scan.roots:
        inside = {e for e in exclusions if _is_under(e, root) and e != root}
        kept = tuple(f for f in found if not is_under_any(f.uri, inside))
        applied.update(inside)
        n_excluded += len(found) - len(kept)
        roots.append((root, kept))
    if n_excluded:
        log.info("skipped %d files under removed paths (%s); name a path on index to include it again",
                 n_excluded, ", ".join(sorted(applied)))
    return replace(scan, roots=tuple(roots), excluded=tuple(sorted(applied)), n_excluded=n_excluded)


def _is_under(uri: str, path: str) -> bool:
    """`uri` is `path` itself or below it."""
    prefix = path.rstrip("/")
    return uri == prefix or uri.startswith(prefix + "/")


def is_under_any(uri: str, paths: set[str]) -> bool:
    """`uri` or one of its ancestors is in `paths`: one set lookup per folder level, so a scan
    stays linear in its files however many paths were removed."""
    if "/" in paths and uri.startswith("/"):  # the file system root was removed
        return True
    while uri:
        if uri in paths:
            return True
        uri = uri[:uri.rfind("/")] if "/" in uri else ""
    return False


def _uri(path: Path) -> str:
    """The resolved absolute path; for a link that does not lead to a file (dangling, a loop),
    the link's own absolute path, which is the name the user knows."""
    if os.path.islink(path) and not_a_file_reason(path) is not None:
        return os.path.abspath(path)
    try:
        return str(path.resolve())
    except (OSError, RuntimeError):  # RuntimeError: pathlib's "Symlink loop" before Python 3.13
        return os.path.abspath(path)


def _walk(root: Path, scan_filter: ScanFilter, folders: Sequence[Path],
          outside: list[str]) -> Iterable[ScannedFile | tuple[str, str]]:
    """The supported files below `root`, and (uri, reason) for entries with a supported name that
    are not regular files (dangling or looping links, FIFOs, ...). A file link whose target lies
    outside every walked folder (`folders`, resolved) is appended to `outside` unless the filter
    follows links: its target is stat'ed (to see where it lies), never read."""
    for folder, dirs, names in os.walk(root, onerror=_log_walk_error):
        rel_folder = Path(folder).relative_to(root).as_posix()
        prefix = "" if rel_folder == "." else rel_folder + "/"
        # Pruning in place keeps os.walk out of hidden and excluded folders (and sorts the walk).
        dirs[:] = sorted(d for d in dirs if not scan_filter.is_hidden(prefix + d)
                         and not scan_filter.is_excluded(prefix + d))
        for name in sorted(names):
            relative = prefix + name
            path = Path(folder) / name
            if (scan_filter.is_hidden(relative) or scan_filter.is_excluded(relative)
                    or file_kind(path) == "unsupported"):
                continue
            reason = not_a_file_reason(path) or _system_link_reason(path)
            if reason is not None:
                yield (str(root / relative) if os.path.islink(path) else _uri(path)), reason
                continue
            try:
                resolved = FileStat.of(path)
            except (OSError, RuntimeError) as error:
                yield _uri(path), f"{path}: cannot stat the file ({error}); check its permissions"
                continue
            if not scan_filter.follow_links and _leads_outside(path, resolved.uri, folders):
                outside.append(str(root / relative))
                continue
            yield ScannedFile(path, file_kind(path), _walked_stat(root, resolved, relative))


# Pseudo-file systems no scan reads through a link: /proc/self/environ holds the process's own
# environment (API keys, tokens), /sys and /dev kernel state and devices.
_SYSTEM_TREES = frozenset({"/proc", "/sys", "/dev"})


def _system_link_reason(path: Path) -> str | None:
    """Why a link at `path` is not read: it leads into /proc, /sys or /dev; None otherwise."""
    if not os.path.islink(path):
        return None
    target = os.path.realpath(path)
    if not is_under_any(target, _SYSTEM_TREES):
        return None
    return (f"{path}: is a link to {target}, a system file; faste-mm never reads /proc, /sys or /dev "
            f"through a link. Remove the link or exclude it")


def _leads_outside(path: Path, target: str, folders: Sequence[Path]) -> bool:
    """`path` is a link (or a chain of links) whose `target` (resolved) lies outside every folder in
    `folders`. Hard links cannot be told from the file they share an inode with: they are indexed
    (see docs/security.md)."""
    return os.path.islink(path) and not any(_is_under(target, str(folder)) for folder in folders)


def _walked_stat(root: Path, resolved: FileStat, relative: str) -> FileStat:
    """The stat of a walked file (`resolved`: `FileStat.of` it). A link to a file outside the walked
    folder is recorded under the link's own path below `root`, so its items vanish when the link
    goes (a rescan of the folder no longer finds that path); every other file under its resolved path."""
    if _is_under(resolved.uri, str(root)):
        return resolved
    return FileStat(uri=str(root / relative), size=resolved.size, mtime=resolved.mtime, dev=resolved.dev,
                    ino=resolved.ino)


def _log_walk_error(error: OSError) -> None:
    log.warning("%s: cannot list the folder, skipped (%s)", error.filename, error)


def document_items(paths: Iterable[str | os.PathLike]) -> tuple[list[Item], list[str]]:
    """Items for files and folders embedded outside a collection (embed, calibrate, bench).

    Text files become text items, videos video items; images, PDFs and any file the user named (missing or of an
    unsupported type too) become image items, so the embedder reports each bad one by name.
    Returns the items and the reasons for text files that could not be read.
    """
    scan = scan_paths(paths)
    items: list[Item] = []
    unreadable: list[str] = []
    for found in scan.files():
        if found.kind not in KINDS:  # named by the user: the embedder reports it by name
            items.append(Item(image=found.path))
            continue
        try:
            items.append(as_item(document_input(found.path, found.kind), len(items)))
        except InputError as error:
            unreadable.append(str(error))
    items.extend(Item(image=Path(uri)) for uri, _ in scan.missing)
    return items, unreadable
