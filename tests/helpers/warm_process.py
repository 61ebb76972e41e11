"""`faste-mm ARGS` or `python -c CODE ARGS` as a process of its own, for the tests that need one:
a writer SIGKILLed at a named crash point, a server, a program that starts the command itself
(an MCP client, bash running the docs' blocks). One way to run them, two modes:

- warm (the default): each process is forked from one warm process per test worker, started on
  first use, that has imported torch, transformers, faiss and the CLI (~6 s of CPU a fresh
  interpreter pays before the CLI parses its first option) and has loaded, through faste-mm's own
  loader, the preprocessors of the tiny models the worker has asked for (faste-mm keeps them
  parsed per process: faste_mm/model/backbones/preprocessors.py).
- fresh (`FASTE_MM_TEST_FRESH=1`): the installed `faste-mm` script and `python -c` started by
  `subprocess`, exactly as a user starts them (docs/contributing.md; CI runs this mode too).

`run_cli`/`run_python` answer as `subprocess.run(..., capture_output=True, text=True)` does
(returncode -9 for a SIGKILL); `start_cli`/`start_python` as `subprocess.Popen(..., text=True)`
(stdin, stdout, stderr, pid, poll, wait, send_signal, terminate, kill, close); `cli_command`
is a `faste-mm` executable for programs that start the command themselves.

What a warm process differs in from a fresh one: modules are imported already (a variable read
only at import time by torch or transformers keeps the worker's value; faste-mm reads its
`FASTE_MM_*` variables when a command runs) and `atexit` handlers do not run (non-daemon threads
are joined). Tests about what a fresh interpreter prints while importing start one themselves.

The protocol: a request is a length-prefixed JSON header sent with the caller's stdin, stdout and
stderr descriptors (SCM_RIGHTS). The warm process forks a waiter, which forks the command onto
those descriptors, answers "pid N", waits, and answers "exit CODE" (negative: the signal); if the
caller's end closes first, the waiter kills the command. The warm process computes nothing before
forking, so no half-made thread pool is copied into a child (fork-safety).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from subprocess import DEVNULL, PIPE

from tests.helpers.bounds import HANG_S  # a failure detector for a hung process, not a speed assertion

FRESH_ENV = "FASTE_MM_TEST_FRESH"  # "1": every process starts fresh (a test-suite switch, not a faste-mm setting)
ROOT = Path(__file__).resolve().parents[2]


def is_fresh() -> bool:
    return os.environ.get(FRESH_ENV, "") not in ("", "0")


def installed_cli() -> str:
    """The `faste-mm` script of the Python running the tests (the venv's bin beside it)."""
    return str(Path(sys.executable).parent / "faste-mm")


def run_cli(args: list, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    """`faste-mm ARGS`: (returncode, stdout, stderr) as text, returncode negative for the signal
    that killed it (-9: SIGKILL), like `subprocess.run`. env None: this process's environment."""
    return _run(_cli(args), env, cwd, timeout)


def run_python(code: str, args: list = (), env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -c CODE ARGS` (an uncaught exception prints its traceback and exits 1)."""
    return _run(_python(code, args), env, cwd, timeout)


def start_cli(args: list, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
              stdin=DEVNULL, stdout=PIPE, stderr=PIPE):
    """`faste-mm ARGS` started (the caller ends it): a `subprocess.Popen(..., text=True)` or its
    warm equal. stdin/stdout/stderr as Popen takes them: PIPE, DEVNULL, a file or a descriptor."""
    return _start(_cli(args), env, cwd, stdin, stdout, stderr)


def start_python(code: str, args: list = (), env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
                 stdin=DEVNULL, stdout=PIPE, stderr=PIPE):
    """`python -c CODE ARGS` started, as `start_cli`."""
    return _start(_python(code, args), env, cwd, stdin, stdout, stderr)


def cli_command(folder: Path) -> str:
    """A `faste-mm` executable for a program that starts the command itself: the installed script
    (fresh mode), or a small script written into `folder` that hands its descriptors, arguments,
    folder and environment to the warm process and exits as the forked command does."""
    if is_fresh():
        return installed_cli()
    shim = Path(folder) / "faste-mm"
    shim.write_text(_SHIM.format(python=sys.executable, socket=_server().socket))
    shim.chmod(0o755)
    return str(shim)


# ---- the commands ------------------------------------------------------------------------------
def _cli(args: list) -> tuple[list[str], list[str], dict]:
    """(shown argv, fresh argv, warm request) of `faste-mm ARGS`."""
    argv = [str(a) for a in args]
    return ["faste-mm", *argv], [installed_cli(), *argv], {"argv": argv, "code": None}


def _python(code: str, args: list) -> tuple[list[str], list[str], dict]:
    argv = [str(a) for a in args]
    return ["python", "-c", code, *argv], [sys.executable, "-c", code, *argv], {"argv": argv, "code": code}


def _run(command, env, cwd, timeout: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = _start(command, env, cwd, DEVNULL, out, err)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(HANG_S)
            raise
        finally:
            process.close()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(process.args, code, out.read().decode("utf-8", "replace"),
                                           err.read().decode("utf-8", "replace"))


def _start(command, env, cwd, stdin, stdout, stderr):
    shown, fresh_argv, request = command
    env = dict(os.environ if env is None else env)
    cwd = str(cwd or os.getcwd())
    if is_fresh():
        return FreshProcess(fresh_argv, env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr, text=True,
                            encoding="utf-8", errors="replace")
    return WarmProcess(shown, {**request, "kind": "run", "cwd": cwd, "env": env}, stdin, stdout, stderr)


class FreshProcess(subprocess.Popen):
    """A fresh process, with `close()` as `WarmProcess` has."""

    def close(self) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                stream.close()


class WarmProcess:
    """A command forked from the warm process, used as a `subprocess.Popen(..., text=True)`."""

    def __init__(self, shown: list[str], request: dict, stdin, stdout, stderr) -> None:
        self.args, self.returncode, self._buffer = shown, None, b""
        self._reading = threading.Lock()  # poll() may be called from several threads, as Popen's may
        self.stdin = self.stdout = self.stderr = None
        given, theirs = [], []  # descriptors handed over; the ones to close here once sent
        for position, spec in enumerate((stdin, stdout, stderr)):
            if spec == PIPE:
                read, write = os.pipe()
                mine, child = (write, read) if position == 0 else (read, write)
                stream = os.fdopen(mine, "w" if position == 0 else "r", encoding="utf-8", errors="replace")
                setattr(self, ("stdin", "stdout", "stderr")[position], stream)
                theirs.append(child)
            elif spec == DEVNULL:
                child = os.open(os.devnull, os.O_RDWR)
                theirs.append(child)
            elif spec is None:
                child = position  # inherited, as Popen does
            else:
                child = spec if isinstance(spec, int) else spec.fileno()
            given.append(child)
        self._conn = socket.socket(socket.AF_UNIX)
        try:
            self._conn.settimeout(HANG_S)
            self._conn.connect(_server().socket)
            header = json.dumps(request).encode()
            socket.send_fds(self._conn, [len(header).to_bytes(8, "big") + header], given)
        finally:
            for fd in theirs:
                os.close(fd)
        self.pid = int(self._line(HANG_S).removeprefix("pid "))

    def _line(self, timeout: float | None) -> str:
        self._conn.settimeout(timeout)
        while b"\n" not in self._buffer:
            try:
                chunk = self._conn.recv(64)
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            if not chunk:
                raise RuntimeError(f"{self.args[:2]}: the warm process's waiter went away without an exit status")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def poll(self) -> int | None:
        with self._reading:
            if self.returncode is None and (b"\n" in self._buffer or select.select([self._conn], [], [], 0)[0]):
                self.returncode = int(self._line(HANG_S).removeprefix("exit "))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._reading.acquire(timeout=-1 if timeout is None else timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        try:
            if self.returncode is None:
                self.returncode = int(self._line(timeout).removeprefix("exit "))
        finally:
            self._reading.release()
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        """(stdout, stderr) read to their end, once the command has ended (stdin closed first)."""
        if self.stdin is not None:
            self.stdin.close()
        read: dict[str, str] = {}
        readers = [threading.Thread(target=lambda name=name, stream=stream: read.__setitem__(name, stream.read()),
                                    daemon=True)
                   for name, stream in (("stdout", self.stdout), ("stderr", self.stderr)) if stream is not None]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(timeout)
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(timeout)
        return read.get("stdout"), read.get("stderr")

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # ended just now; wait() reads its status
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def close(self) -> None:
        """Close the pipes and the connection (a command still running is killed by its waiter)."""
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self._conn.close()


# ---- the warm process, seen from the test worker ----------------------------------------------
class _Server:
    """The worker's warm process: started on first use, ended when the worker exits."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="faste-mm-warm-")  # short: a Unix socket path is at most 107 bytes
        self.socket = os.path.join(self.folder, "socket")
        self.warmed: set[Path] = set()
        with open(os.path.join(self.folder, "stderr"), "wb") as err:
            # stdin stays open while this worker lives: its end is the warm process's signal to go
            self.process = subprocess.Popen([sys.executable, "-c", _SERVER_MAIN, self.socket, str(ROOT)],
                                            stdin=PIPE, stdout=PIPE, stderr=err, cwd=self.folder)
        atexit.register(self.stop)
        if not select.select([self.process.stdout], [], [], HANG_S)[0] or \
                self.process.stdout.readline().strip() != b"ready":
            self.stop()
            raise RuntimeError(f"the warm process did not start: {self.error_text()}")

    def error_text(self) -> str:
        return Path(self.folder, "stderr").read_text(errors="replace")[-3000:]

    def warm(self, models: list[Path]) -> None:
        """Load the preprocessors of `models` in the warm process: its forks start with them parsed."""
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(HANG_S)
            conn.connect(self.socket)
            header = json.dumps({"kind": "warm", "models": [str(m) for m in models]}).encode()
            conn.sendall(len(header).to_bytes(8, "big") + header)
            answer = conn.makefile("r").readline().strip()
        if answer != "ok":
            raise RuntimeError(f"the warm process could not load {models}: {answer or self.error_text()}")
        self.warmed.update(models)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


_the_server: _Server | None = None
_server_lock = threading.Lock()


def _server() -> _Server:
    """The running warm process, with the tiny models this worker asked for so far loaded."""
    from tests.helpers.tiny_models import asked_models

    global _the_server
    with _server_lock:
        if _the_server is None:
            _the_server = _Server()
        new = [model for model in asked_models() if model not in _the_server.warmed and model.is_dir()]
        if new:
            _the_server.warm(new)
        return _the_server


# ---- the warm process itself ------------------------------------------------------------------
# `python -c _SERVER_MAIN SOCKET ROOT`: the checkout goes last on sys.path (the tests' helpers
# import from it; faste_mm comes from the installed package, as for the `faste-mm` script).
_SERVER_MAIN = ("import sys; sys.path.pop(0); sys.path.append(sys.argv[2]); "
                "from tests.helpers.warm_process import serve; serve(sys.argv[1])")
_PRELOAD = ("torch", "transformers", "faiss", "faste_mm.cli.app", "faste_mm.retrieval.retriever",
            "faste_mm.model.backbones.preprocessors", "transformers.models.qwen3_vl.modeling_qwen3_vl",
            "transformers.models.qwen3.modeling_qwen3")

# The `faste-mm` of `cli_command`. `-S`: no site imports, it starts in ~20 ms. Signals it gets
# go to the command; it ends as the command did (the same signal, or its exit status).
_SHIM = """#!{python} -S
import json, os, signal, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect({socket!r})
header = json.dumps({{"kind": "run", "argv": sys.argv[1:], "code": None, "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
socket.send_fds(s, [len(header).to_bytes(8, "big") + header], [0, 1, 2])
answers = s.makefile("r")
pid = int(answers.readline().removeprefix("pid "))
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, lambda number, _: os.kill(pid, number))
line = answers.readline()
code = int(line.removeprefix("exit ")) if line else 1
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


def serve(path: str) -> None:
    """Import what commands import, then fork one command per request on the Unix socket `path`
    until stdin closes (the test worker went away)."""
    import importlib

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker's Ctrl-C ends it through stdin; commands reset it
    for module in _PRELOAD:
        importlib.import_module(module)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, _reap)  # the waiters
    print("ready", flush=True)
    while True:
        if 0 in select.select([listener, 0], [], [])[0]:
            return  # stdin's end: the worker is gone; running commands end with their callers
        conn, _ = listener.accept()
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        request = _receive(conn, data)
        if request is None:
            conn.close()
        elif request["kind"] == "warm":
            conn.sendall((_warm(request["models"]) + "\n").encode())
            conn.close()
        elif os.fork() == 0:
            listener.close()
            try:
                _wait_for_command(conn, request, fds)
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        conn.close()


def _receive(conn: socket.socket, data: bytes) -> dict | None:
    while len(data) < 8 or len(data) < 8 + int.from_bytes(data[:8], "big"):
        chunk = conn.recv(1 << 20)
        if not chunk:
            return None
        data += chunk
    return json.loads(data[8:])


def _warm(models: list[str]) -> str:
    """Each model's preprocessor loaded as faste-mm's loaders load it ("ok", or why not)."""
    from faste_mm.model.backbones.preprocessors import load_preprocessor
    from faste_mm.model.backbones.registry import family_for

    try:
        for model in models:
            model_type = json.loads(Path(model, "config.json").read_text())["model_type"]
            load_preprocessor(model, family_for(model_type, model).is_multimodal)
    except Exception as error:  # noqa: BLE001 - reported to the worker, which fails the test with it
        return f"{type(error).__name__}: {error}"
    return "ok"


def _reap(*_) -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _wait_for_command(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the waiter: fork the command, answer its pid, wait for it (or for the caller to go
    away, then kill it), answer its exit status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # this process waits for its own child
    pid = os.fork()
    if pid == 0:
        conn.close()
        _command(request, fds)
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    try:
        conn.sendall(f"pid {pid}\n".encode())
        caller_gone = pidfd not in select.select([conn, pidfd], [], [])[0]  # its end closed first
    except OSError:
        caller_gone = True
    if caller_gone:
        os.kill(pid, signal.SIGKILL)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    try:
        conn.sendall(f"exit {code}\n".encode())
    except OSError:  # nobody is listening any more
        pass


def _command(request: dict, fds: list[int]) -> None:
    """In the command's process: take the caller's descriptors, folder and environment, run
    `faste-mm ARGV` (the installed entry point's `main`, as the script does) or the code, exit."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # Ctrl-C as a fresh interpreter started from a terminal has it (KeyboardInterrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if request["env"].get("PYTHONUNBUFFERED"):  # what the variable does to a fresh interpreter's streams
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    code = _exit_code(request)
    threading._shutdown()  # non-daemon threads are joined, as at a fresh interpreter's exit
    sys.stdout.flush()
    sys.stderr.flush()
    if code < 0:  # an uncaught KeyboardInterrupt: a fresh interpreter dies of SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _exit_code(request: dict) -> int:
    import traceback

    try:
        if request["code"] is None:
            from faste_mm.cli.app import main

            sys.argv = ["faste-mm", *request["argv"]]
            main()
        else:
            sys.argv = ["-c", *request["argv"]]
            exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__"})
        return 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return -signal.SIGINT
    except BaseException:  # what an uncaught exception does to a fresh interpreter: a traceback, 1
        traceback.print_exc()
        return 1
