"""Ray's C++ log lines kept off the terminal during an `index --ray` run (shown with --debug).

Ray's core worker in the driver writes its own log lines straight to file descriptor 2, past
Python's logging; for every Ray Data actor pool it writes, at ERROR level,

    [2026-11-27 00:42:33,293 E 17483 17483] core_worker.cc:2465: Actor with class name:
    'MapWorker(MapBatches(EmbedActor))' ... has constructor arguments in the object store and
    max_restarts > 0. If the arguments in the object store go out of scope or are lost, the actor
    restart will fail. See https://github.com/ray-project/ray/issues/53727 ...

Ray Data itself puts an actor's constructor arguments in the object store (`ray.put` of its map
transformer and context) and restarts its actors by default (ray-project/ray#57733), so the line
cannot be avoided without giving up the actor restarts a run relies on; RAY_BACKEND_LOG_LEVEL
hides it but makes Ray print a line about that setting instead. So, for the run only, fd 2 goes
through a pipe whose reader thread drops whole lines in Ray's C++ log format and passes every
other byte on as it arrives; Python's own writes (logging, the progress bar) keep the real
stderr, so the terminal stays a terminal for them.
"""

from __future__ import annotations

import os
import re
import select
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

# "[2026-11-27 00:42:33,293 E 17483 17483] core_worker.cc:2465: ..." (Ray's RAY_LOG format)
RAY_CPP_LINE = re.compile(rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [DIWEF] \d+ \d+\] [\w./-]+:\d+: ")
_LONGEST_PREFIX = 120  # a partial line starting with "[" is held this long at most, waiting for its end


@contextmanager
def hidden_cpp_log_lines() -> Iterator[None]:
    """Drop Ray's C++ log lines written to fd 2 while the block runs; pass everything else on."""
    if os.name == "nt":  # select() takes no pipes there: Ray's lines are left as they are
        yield
        return
    sys.stderr.flush()
    terminal = os.dup(2)
    read_end, write_end = os.pipe()
    stop_read, stop_write = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    thread = threading.Thread(target=_forward, args=(read_end, stop_read, terminal), name="faste-mm-ray-stderr",
                              daemon=True)
    thread.start()
    python_stderr = sys.stderr
    if _writes_fd_2(python_stderr):  # Python's writes bypass the pipe: isatty() stays true for rich
        sys.stderr = open(terminal, "w", encoding=python_stderr.encoding, errors=python_stderr.errors,
                          buffering=1, closefd=False)
    try:
        yield
    finally:
        if sys.stderr is not python_stderr:
            sys.stderr.flush()
            sys.stderr = python_stderr
        os.dup2(terminal, 2)
        # Not EOF: a process started during the run may still hold the pipe; drain and stop.
        os.write(stop_write, b"x")
        thread.join()
        for fd in (read_end, stop_read, stop_write, terminal):
            os.close(fd)


def _writes_fd_2(stream) -> bool:
    try:
        return stream.fileno() == 2
    except (AttributeError, OSError, ValueError):  # pytest's capsys, click's runner: not fd 2
        return False


def _forward(read_end: int, stop_read: int, terminal: int) -> None:
    """Copy the pipe to the terminal, without Ray's C++ log lines, until told to stop."""
    pending = b""
    stopping = False
    while True:
        ready, _, _ = select.select([read_end, stop_read], [], [], 0 if stopping else None)
        if read_end not in ready:
            if stopping:
                break
            stopping = True  # the stop byte: read what is left in the pipe, then end
            continue
        data = os.read(read_end, 65536)
        if not data:
            break
        pending = _passed(pending + data, terminal)
    if pending:
        _write(terminal, pending)


def _passed(data: bytes, terminal: int) -> bytes:
    """Write `data`'s lines to `terminal`, dropping Ray's; returns a held partial line."""
    *lines, rest = data.split(b"\n")
    kept = [line + b"\n" for line in lines if not RAY_CPP_LINE.match(line)]
    if rest and not (rest.startswith(b"[") and len(rest) < _LONGEST_PREFIX):
        kept.append(rest)  # no Ray line: pass it on now (a prompt, a progress line)
        rest = b""
    _write(terminal, b"".join(kept))
    return rest


def _write(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]
