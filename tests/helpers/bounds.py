"""Bounds on the suite's waits: a guard that turns a hung child process or thread into a named
failure, never a timing (each wait ends as soon as what it waits for happens). pytest-timeout
(pyproject's `timeout`) bounds each test as a whole; these bound the single waits inside one."""

from __future__ import annotations

import queue
import subprocess
import threading

HANG_S = 300.0  # generous: a loaded 2-core machine runs a child process's start several times slower


def first_line(process: subprocess.Popen, what: str, timeout_s: float = HANG_S) -> str:
    """The first line `process` prints on stdout, waited for at most `timeout_s`; a process that
    prints nothing by then is killed and the test fails naming `what` and the process's stderr."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: lines.put(process.stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout_s)
    except queue.Empty:
        process.kill()
        process.wait(timeout_s)
        raise AssertionError(f"{what} printed no line in {timeout_s:g} s; stderr: "
                             f"{process.stderr.read()[-2000:] if process.stderr else '(not captured)'}") from None
