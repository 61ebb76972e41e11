"""`faste-mm ARGS` as a separate process, forked from one warm process instead of started fresh.

A test that SIGKILLs a writer at a named crash point needs the writer in a process of its own;
a fresh interpreter pays ~6-8 s of CPU importing torch, transformers and faiss before the CLI
parses its first option, and the crash tests start dozens. Here a multiprocessing forkserver (one
per test worker, started on first use) imports them once; each run is a fork of it that sets its
environment and working folder, points its stdout/stderr at files and calls the installed entry
point's `main` with ARGS, as the `faste-mm` script does. The crash point's SIGKILL kills that
child only, and `run_cli` reports it as `subprocess.run` would (returncode -9).

What differs from a fresh interpreter: modules are already imported (a variable read only at
import time by torch or transformers keeps the test worker's value; faste-mm reads its own
`FASTE_MM_*` variables when a command runs) and `atexit` handlers do not run (as in any
multiprocessing child; non-daemon threads are still joined). So tests about what a fresh process
prints while importing (tests/test_quiet_terminal.py) keep starting fresh interpreters.

The forkserver computes nothing before forking (fork-safety: no half-made thread pool is copied).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile

# Imported once in the forkserver; every child starts with them loaded.
_PRELOAD = ["torch", "transformers", "faiss", "faste_mm.cli.app", "faste_mm.retrieval.retriever",
            "transformers.models.qwen3_vl.modeling_qwen3_vl"]
_context = None


def _forkserver():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(_PRELOAD)
    return _context


def _child(argv: list[str], env: dict[str, str], cwd: str, out_path: str, err_path: str) -> None:
    for target, path in ((1, out_path), (2, err_path)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, target)
        os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    from faste_mm.cli.app import main

    sys.argv = ["faste-mm", *argv]
    try:
        main()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, (int, type(None))):
            print(stop.code, file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    raise SystemExit(code)


def run_cli(args: list[str], env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    """`faste-mm ARGS` in a forked process: (returncode, stdout, stderr) as text, returncode
    negative for the signal that killed it (-9: SIGKILL), like `subprocess.run`."""
    argv = [str(a) for a in args]
    with tempfile.TemporaryDirectory(prefix="forked-cli-") as scratch:
        out_path, err_path = os.path.join(scratch, "stdout"), os.path.join(scratch, "stderr")
        process = _forkserver().Process(target=_child, args=(argv, dict(os.environ if env is None else env),
                                                              str(cwd or os.getcwd()), out_path, err_path))
        process.start()
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(["faste-mm", *argv], timeout)
        with open(out_path, encoding="utf-8", errors="replace") as out, \
                open(err_path, encoding="utf-8", errors="replace") as err:
            return subprocess.CompletedProcess(["faste-mm", *argv], process.exitcode, out.read(), err.read())
