"""A file opened once and read only through that descriptor (`OpenedFile`): how a stored item's
file reaches its decoder (Pillow, PDFium, PyAV) after `retrieval.stored_files` checked it on the
open descriptor, so nothing opens it again by path (a link planted between the check and the read
is never followed). Receives an open descriptor and its resolved path; hands decoders readers.
"""

from __future__ import annotations

import io
import os
import weakref
from pathlib import Path
from typing import BinaryIO


class OpenedFile:
    """A file opened once, and read only through that descriptor: what a stored item's file
    becomes after `retrieval.stored_files` checked it on the open descriptor, so that the decoder
    (PIL, PDFium, PyAV) reads the very file that passed the check, never what is at its path by
    the time it would open it again (a link planted in between). Each `reader()` is its own
    buffered, seekable view (positioned reads on the one descriptor, no shared offset), so
    several decoders may read it at once; nothing is loaded whole (a long video streams).

    `path`: the resolved path it was opened at (messages, and the kind by its suffix: never
    opened again). `identity`: (device, inode, ctime_ns, mtime_ns, size) of the opened file,
    what caches of its decoded content key on. The descriptor closes with the last reference
    (or `close()`); readers keep the file alive while they are used.
    """

    __slots__ = ("path", "identity", "_fd", "_closer", "__weakref__")

    def __init__(self, fd: int, path: str | Path) -> None:
        st = os.fstat(fd)
        self.path = Path(path)
        self.identity = (st.st_dev, st.st_ino, st.st_ctime_ns, st.st_mtime_ns, st.st_size)
        self._fd = fd
        self._closer = weakref.finalize(self, os.close, fd)

    @property
    def size(self) -> int:
        return self.identity[4]

    @property
    def mtime(self) -> float:
        """Modification time in seconds, as `os.stat_result.st_mtime` gives it."""
        return self.identity[3] / 1e9

    def reader(self) -> BinaryIO:
        """A fresh binary reader over the opened file, from its start."""
        return io.BufferedReader(_PositionedReads(self))

    def close(self) -> None:
        self._closer()

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"OpenedFile({str(self.path)!r})"


class _PositionedReads(io.RawIOBase):
    """A raw reader with its own position over an `OpenedFile`'s descriptor (os.pread)."""

    def __init__(self, owner: OpenedFile) -> None:
        super().__init__()
        self._owner = owner  # keeps the descriptor open while this reader lives
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        data = os.pread(self._owner._fd, len(view), self._position)
        view[:len(data)] = data
        self._position += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position}.get(whence)
        position = (os.fstat(self._owner._fd).st_size if base is None else base) + offset
        if position < 0:
            raise ValueError(f"negative seek position {position}")
        self._position = position
        return position

    def tell(self) -> int:
        return self._position


def file_name(source: str | Path | OpenedFile) -> Path:
    """The path of a file source, for messages and its kind (an `OpenedFile` is not opened again)."""
    return source.path if isinstance(source, OpenedFile) else Path(source)


def decoder_input(source: str | Path | OpenedFile):
    """What PIL, PDFium or PyAV is handed: a reader of an `OpenedFile`, else the path as a string."""
    return source.reader() if isinstance(source, OpenedFile) else str(source)

