"""Reading a stored item's file again after indexing: the one check every reader at request time
goes through (thumbnails, /explain by document_id, rerank of search hits; docs/design.md "Reading a
stored file at request time").

An indexed folder may be writable by others (shared, synced). What is read again must be the file
that was indexed, never what was planted under its name since: a link to /proc/self/environ (the
server's API key), to a private file, or to an outside picture. So a stored file is read only when

- its path, and the path it resolves to, are outside /proc, /sys and /dev;
- it opens as a regular file (a FIFO or device never blocks or streams into a reader);
- it is the same file: the device and inode recorded at indexing (`ItemRecord.dev`/`ino`) equal the
  opened file's. A collection indexed before identities were recorded (schema < 6) has none until
  the next `index`: then the path must resolve to itself (no link followed), which keeps the read
  where the scan put it, inside the indexed folder.

Anything else raises `ReplacedFileError` (the server answers 409) whose message names the item and
what to do, never the file found there or its content; a file that is gone raises `GoneFileError`
(404). Receives an `ItemRecord` (uri, page, dev, ino); hands back an `Item` to rerank or an
`OpenedFile` to decode.

What is read is the descriptor that passed the check, never the path again: a text is read from
it, and an image, a PDF page or a video is handed to its decoder as an `OpenedFile`, which PIL,
PDFium and PyAV read through that descriptor (streamed, not loaded whole). A swap of the file
after the check (a link planted between check and read: `AFTER_CHECK`, the seam the race tests
use) changes nothing of what is read: the answer is the indexed file's content, and the next
read is refused. Caches of decoded content (resized images, thumbnails) key on the opened file's
identity (device, inode, ctime, size), so a replacement is never served from them.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from typing import BinaryIO, Callable

from faste_mm.errors import InputError
from faste_mm.kinds import KINDS, UNSUPPORTED, kind_name
from faste_mm.model.items import Item
from faste_mm.model.opened_files import OpenedFile
from faste_mm.retrieval.decoders import read_text

log = logging.getLogger(__name__)

# Pseudo-file systems never read as a stored item: process state (/proc/self/environ holds the
# server's environment, API keys included), kernel state and devices.
SYSTEM_TREES = ("/proc", "/sys", "/dev")

# The seam between the check and the read: called with the record once its file has passed the
# checks on the open descriptor, before anything is read from it. None outside tests; a race test
# sets it to swap the file at exactly that moment (tests/test_stored_file_race.py).
AFTER_CHECK: Callable[[object], None] | None = None


class GoneFileError(InputError):
    """The item's file is no longer there (moved or deleted): HTTP 404."""


class ReplacedFileError(InputError):
    """Something other than the indexed file is at the item's path (a link, another file, a FIFO,
    a system file): it is not read. HTTP 409."""


def is_system_path(path: str) -> bool:
    """Whether `path` (absolute) is /proc, /sys or /dev or below them."""
    return any(path == tree or path.startswith(tree + "/") for tree in SYSTEM_TREES)


def _name(record) -> str:
    page = "" if record.page is None else f" page {record.page}"
    return f"id {record.id} ({record.uri}{page})" if record.id is not None else f"{record.uri}{page}"


def _replaced(record, why: str) -> ReplacedFileError:
    # The log (the server's own) says why; the message (the client's) names only the item.
    log.warning("%s: not read: %s", record.uri, why)
    return ReplacedFileError(f"{_name(record)}: the file at this path is not the one that was indexed (replaced or "
                             f"linked elsewhere since), so it is not read; re-index the collection (`faste-mm "
                             f"index`) to index what is there now")


def open_stored(record) -> BinaryIO:
    """The item's file opened for binary reading, after the checks of the module docstring (made
    on the opened descriptor, so no swap between check and read slips through). The caller
    closes it. GoneFileError / ReplacedFileError as above; InputError for an item without a file."""
    return os.fdopen(_open_checked(record)[0], "rb")


def stored_file(record) -> OpenedFile:
    """The item's file opened and checked as `open_stored` does, as an `OpenedFile` to hand a
    decoder (images, PDF pages, videos), which reads that descriptor and never the path again."""
    fd, real = _open_checked(record)
    return OpenedFile(fd, real)


def _open_checked(record) -> tuple[int, str]:
    """(the checked, open descriptor, the resolved path it was opened at)."""
    uri = record.uri
    if not isinstance(uri, str) or not os.path.isabs(uri) or uri.startswith("item:"):
        raise InputError(f"{_name(record)}: the item has no file to read (added from Python, whose content the "
                         f"collection does not keep)")
    if is_system_path(uri):
        raise _replaced(record, "a system path")
    try:
        real = os.path.realpath(uri, strict=True)
    except (OSError, RuntimeError) as error:  # RuntimeError: a link loop before Python 3.13
        if isinstance(error, OSError) and error.errno == errno.ENOENT:
            raise GoneFileError(f"{_name(record)}: its file is gone (moved or deleted); re-index the collection "
                                f"(`faste-mm index`)") from None
        raise _replaced(record, f"cannot resolve ({error})") from None
    if is_system_path(real):
        raise _replaced(record, "leads into /proc, /sys or /dev")
    if record.ino is None and real != uri:  # indexed before identities: the path must be the file itself
        raise _replaced(record, "a link, and the collection has no identity recorded for it")
    try:  # O_NOFOLLOW: `real` has no link left; one planted since is refused, not followed
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        if error.errno == errno.ENOENT:
            raise GoneFileError(f"{_name(record)}: its file is gone (moved or deleted); re-index the collection "
                                f"(`faste-mm index`)") from None
        if error.errno in (errno.EACCES, errno.EPERM):
            raise GoneFileError(f"{_name(record)}: its file cannot be read (permission denied)") from None
        raise _replaced(record, f"cannot open ({error.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _replaced(record, "not a regular file")
        if record.ino is not None and (st.st_dev, st.st_ino) != (record.dev, record.ino):
            raise _replaced(record, "another file (device/inode differ from the indexed one)")
        os.set_blocking(fd, True)
        if AFTER_CHECK is not None:
            AFTER_CHECK(record)
        return fd, real
    except BaseException:
        os.close(fd)
        raise


def stored_item(record) -> Item:
    """The item of a collection row read back from its file, checked (`open_stored`): a text file's
    text read from the checked descriptor itself; an image, a PDF's page or a video as the checked
    `OpenedFile` (`stored_file`). InputError (GoneFileError, ReplacedFileError) when there is nothing to read."""
    kind = kind_name(record.uri)
    if kind == UNSUPPORTED:
        raise InputError(f"{_name(record)}: no file to read (an item added from Python, whose content the "
                         f"collection does not keep)")
    decoder = KINDS[kind].decoder
    if decoder != "text":
        opened = stored_file(record)
        return Item(video=opened) if decoder == "video" else Item(image=opened, page=record.page
                                                                  if decoder == "pdf-pages" else None)
    with open_stored(record) as f:
        return Item(text=read_text(f, _name(record)))
