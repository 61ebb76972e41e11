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

The forkserver computes nothing before forking (fork-safety: no half-made thread pool is copied)
but parse the tokenizers of the tiny models this process has asked for so far
(tests/helpers/warm_tokenizers.py): ~1 s of CPU per model load saved in every child.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from multiprocessing.connection import wait
from pathlib import Path

# Imported once in the forkserver; every child starts with them loaded.
_PRELOAD = ["torch", "transformers", "faiss", "faste_mm.cli.app", "faste_mm.retrieval.retriever",
            "transformers.models.qwen3_vl.modeling_qwen3_vl", "tests.helpers.warm_tokenizers"]
_context = None


def _forkserver():
    global _context
    if _context is None:
        from multiprocessing import forkserver

        from tests.helpers.tiny_models import asked_models
        from tests.helpers.warm_tokenizers import WARM_ENV

        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(_PRELOAD)
        # the forkserver reads the folders to warm from its environment, inherited when it starts here
        os.environ[WARM_ENV] = os.pathsep.join(map(str, asked_models()))
        try:
            forkserver.ensure_running()
        finally:
            del os.environ[WARM_ENV]
    return _context


class _Fd:
    """A descriptor of the test process handed to the child (sent to the forkserver with the
    process, as multiprocessing sends its own), where it arrives as an int."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction

        return _inherited, (reduction.DupFd(self.fd),)


def _inherited(dup) -> int:
    return dup.detach()


def _enter(env: dict[str, str], cwd: str, out, err, inp: int | None = None) -> None:
    """The forked child takes the caller's descriptors (or files), folder and environment."""
    for target, where in ((1, out), (2, err)):
        fd = where if isinstance(where, int) else os.open(where, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, target)
        os.close(fd)
    stdin = os.open(os.devnull, os.O_RDONLY) if inp is None else inp
    os.dup2(stdin, 0)
    os.close(stdin)
    if inp is not None:  # multiprocessing made sys.stdin a devnull file; the command reads fd 0
        sys.stdin = open(0, "r", closefd=False)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    # Ctrl-C as a fresh interpreter started from a terminal has it (KeyboardInterrupt): the
    # forkserver ignores SIGINT, and the test runner may have started us ignoring it too.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if env.get("PYTHONUNBUFFERED"):  # what the variable does to a fresh interpreter's streams
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)


def _child(argv: list[str], env: dict[str, str], cwd: str, out, err, inp: int | None = None) -> None:
    _enter(env, cwd, out, err, inp)
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


def _python_child(code: str, argv: list[str], env: dict[str, str], cwd: str, out, err) -> None:
    _enter(env, cwd, out, err)
    sys.argv = ["-c", *argv]
    try:
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def run_python(code: str, args: list, env: dict[str, str] | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -c CODE ARGS` in a process forked from the warm one (for a script that imports
    the library and is killed at a crash point): as `subprocess.run(..., capture_output=True,
    text=True)` reports it; an uncaught exception prints its traceback and exits 1."""
    return _run_forked(_python_child, (code, [str(a) for a in args]), ["python", "-c", code, *map(str, args)],
                       env, None, timeout)


def run_cli(args: list[str], env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    """`faste-mm ARGS` in a forked process: (returncode, stdout, stderr) as text, returncode
    negative for the signal that killed it (-9: SIGKILL), like `subprocess.run`."""
    argv = [str(a) for a in args]
    return _run_forked(_child, (argv,), ["faste-mm", *argv], env, cwd, timeout)


def _run_forked(target, args: tuple, shown: list[str], env: dict[str, str] | None, cwd, timeout: float):
    with tempfile.TemporaryDirectory(prefix="forked-cli-") as scratch:
        out_path, err_path = os.path.join(scratch, "stdout"), os.path.join(scratch, "stderr")
        process = _forkserver().Process(target=target, args=(*args, dict(os.environ if env is None else env),
                                                             str(cwd or os.getcwd()), out_path, err_path))
        process.start()
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(shown, timeout)
        with open(out_path, encoding="utf-8", errors="replace") as out, \
                open(err_path, encoding="utf-8", errors="replace") as err:
            return subprocess.CompletedProcess(shown, process.exitcode, out.read(), err.read())


class ForkedCli:
    """`faste-mm ARGS` running in a forked process (a server): `stdout` and `stderr` are text
    pipes like `subprocess.Popen(..., stdout=PIPE, stderr=PIPE, text=True)`'s, with the same
    `poll`, `wait`, `send_signal`, `terminate`, `kill` and `returncode`."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None) -> None:
        self.args = ["faste-mm", *map(str, args)]
        (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
        self._process = _forkserver().Process(target=_child, args=(self.args[1:], dict(os.environ if env is None else env),
                                                                    str(cwd or os.getcwd()), _Fd(out_w), _Fd(err_w)))
        try:
            self._process.start()
        finally:
            os.close(out_w)
            os.close(err_w)
        self.pid = self._process.pid
        self.stdout = os.fdopen(out_r, "r", encoding="utf-8", errors="replace")
        self.stderr = os.fdopen(err_r, "r", encoding="utf-8", errors="replace")

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def close(self) -> None:
        """Reap it (after it ended) and close the pipes."""
        self.stdout.close()
        self.stderr.close()


def start_cli(args: list[str], env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None) -> ForkedCli:
    """`faste-mm ARGS` started in a forked process (see `ForkedCli`); the caller ends it."""
    return ForkedCli(args, env, cwd)


def start_warm(target, *args) -> multiprocessing.Process:
    """`target(*args)` started in a process forked from the warm one (torch, transformers, faiss
    and the CLI imported); `passed_fd(fd)` in `args` arrives as the child's own copy of the
    descriptor. For helpers that are themselves warm servers (tests/helpers/docs_zygote.py)."""
    process = _forkserver().Process(target=target, args=args)
    process.start()
    return process


def passed_fd(fd: int) -> _Fd:
    return _Fd(fd)


# The `faste-mm` a `CliRelay` writes: it hands its stdin, stdout and stderr, arguments, folder
# and environment to the relay and exits with the status of the forked command (128+N for
# signal N, as a shell reports it). `-S`: no site imports, it starts in ~20 ms.
_RELAY_SHIM = """#!{python} -S
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect({socket!r})
header = json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
socket.send_fds(s, [len(header).to_bytes(8, "big") + header], [0, 1, 2])
answer = b""
while chunk := s.recv(64):
    answer += chunk
sys.exit(int(answer or b"1"))
"""


class CliRelay:
    """A `faste-mm` for programs that start the command themselves (an MCP client spawns its
    server): `command` is a small script that passes its stdin/stdout/stderr to this test
    process, which runs `faste-mm ARGS` on them in a process forked from the warm one. The
    command's process ends when the forked one does, with its status; if the script is killed
    first, the forked process is killed too."""

    def __init__(self, folder: Path) -> None:
        _forkserver()  # started here, in the test's thread (it sets a variable while it starts)
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(str(folder / "relay.sock"))
        self._listener.listen(8)
        self.command = str(folder / "faste-mm")
        Path(self.command).write_text(_RELAY_SHIM.format(python=sys.executable, socket=str(folder / "relay.sock")))
        os.chmod(self.command, 0o755)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            while len(data) < 8 or len(data) < 8 + int.from_bytes(data[:8], "big"):
                data += conn.recv(1 << 20)
            request = json.loads(data[8:])
            try:
                process = _forkserver().Process(target=_child, args=(
                    request["argv"], request["env"], request["cwd"], _Fd(fds[1]), _Fd(fds[2]), _Fd(fds[0])))
                process.start()
            finally:
                for fd in fds:
                    os.close(fd)
            if conn not in wait([conn, process.sentinel]) or process.exitcode is not None:
                process.join()
            else:  # the script went away (killed): its command goes too
                process.kill()
                process.join()
            code = process.exitcode
            try:
                conn.sendall(str(code if code >= 0 else 128 - code).encode())
            except OSError:
                pass

    def close(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        except OSError:
            pass
        self._listener.close()
