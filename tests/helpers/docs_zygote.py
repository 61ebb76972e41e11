"""A warm process that forks one child per documented command, so the docs' code blocks run
through the real CLI without paying torch's and transformers' import (~4 s of CPU) per command.

`python -m tests.helpers.docs_zygote SOCKET MODEL_DIR...` (or `serve_forked`, forked from
tests/helpers/forked_cli.py's warm process, which has imported them already): imports the CLI and the library, loads each
model once (transformers imports its model classes lazily; tokenizers are parsed once, see
`_cache_tokenizers`), prints "ready", then answers on the Unix
socket SOCKET. A request is a length-prefixed JSON header sent with the client's stdin, stdout
and stderr descriptors (SCM_RIGHTS):

- `{"kind": "cli", "argv", "cwd", "env"}`: a child takes over the three descriptors, the folder
  and the environment, runs `faste-mm ARGV...` (the installed entry point's `main`), and answers
  its exit status; the `faste-mm` shim (`SHIM`) sends these, so bash runs blocks unchanged.
- `{"kind": "python", "cwd", "env"}`: a child that execs code blocks in one namespace (a
  document's Python blocks build on each other), answering each `{"code"}` with `{"ok", "error"}`.

The zygote computes nothing before forking and torch runs one thread, so no thread pool is
copied half-made into a child (fork-safety).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import traceback
from pathlib import Path

SHIM = """#!{python} -S
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["FASTE_MM_DOCS_SOCKET"])
header = json.dumps({{"kind": "cli", "argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
socket.send_fds(s, [len(header).to_bytes(8, "big") + header], [0, 1, 2])
answer = b""
while chunk := s.recv(64):
    answer += chunk
sys.exit(int(answer or b"1"))
"""


def send_message(conn: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    conn.sendall(len(data).to_bytes(8, "big") + data)


def receive_message(conn: socket.socket, data: bytes = b"") -> dict | None:
    """One length-prefixed JSON message (None at the end of the stream)."""
    while len(data) < 8:
        chunk = conn.recv(1 << 16)
        if not chunk:
            return None
        data += chunk
    size = int.from_bytes(data[:8], "big")
    while len(data) < 8 + size:
        chunk = conn.recv(1 << 16)
        if not chunk:
            return None
        data += chunk
    return json.loads(data[8:8 + size])


def _run_cli(argv: list[str]) -> int:
    from faste_mm.cli.app import main

    sys.argv = ["faste-mm", *argv]
    try:
        main()
        return 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException:  # what an uncaught exception does to a real process: a traceback, 1
        traceback.print_exc()
        return 1


def _run_python(conn: socket.socket) -> None:
    namespace = {"__name__": "__main__"}
    while (message := receive_message(conn)) is not None:
        try:
            exec(compile(message["code"], message.get("label", "<doc block>"), "exec"), namespace)
            answer = {"ok": True, "error": None}
        except BaseException:
            answer = {"ok": False, "error": traceback.format_exc()}
        sys.stdout.flush()
        sys.stderr.flush()
        send_message(conn, answer)


def _child(conn: socket.socket, request: dict, fds: list[int]) -> None:
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if request["kind"] == "cli":
        code = _run_cli(request["argv"])
        sys.stdout.flush()
        sys.stderr.flush()
        conn.sendall(str(code).encode())
    else:
        _run_python(conn)
    conn.close()


def _cache_tokenizers() -> None:
    """Parse each tokenizer once: the real Qwen tokenizer's 11 MB of JSON is ~1 s of CPU per load,
    more than the rest of a tiny command. The first load (here, in the zygote) is the real one;
    children get the parsed object by fork. Everything else about loading stays real."""
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    load = PreTrainedTokenizerBase.from_pretrained.__func__
    parsed: dict = {}

    def from_pretrained(cls, path, *args, **kwargs):
        key = (cls, str(path), repr(args), repr(sorted(kwargs.items())))
        if key not in parsed:
            parsed[key] = load(cls, path, *args, **kwargs)
        return parsed[key]

    PreTrainedTokenizerBase.from_pretrained = classmethod(from_pretrained)


def _warm_up(model_dirs: list[str]) -> None:
    """Import what a command imports and load each model once: the children start warm."""
    import faiss  # noqa: F401
    import torch

    torch.set_num_threads(1)
    import faste_mm.cli.app  # noqa: F401
    import faste_mm.retrieval.retriever  # noqa: F401
    from faste_mm import Embedder, Reranker

    _cache_tokenizers()
    for model_dir in model_dirs:
        loader = Reranker if "reranker" in Path(model_dir).name else Embedder
        loader.from_pretrained(model_dir, device="cpu")


def _reap(*_) -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def serve(path: str, model_dirs: list[str]) -> None:
    _warm_up(model_dirs)
    signal.signal(signal.SIGCHLD, _reap)  # waited for, so their CPU time counts as the test's
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(16)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        request = receive_message(conn, data)
        if request is None or len(fds) != 3:
            conn.close()
            continue
        if os.fork() == 0:
            server.close()
            try:
                _child(conn, request, fds)
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        conn.close()


def serve_forked(path: str, model_dirs: list[str], env: dict[str, str], cwd: str, out: int, err: int) -> None:
    """`serve` in a process forked from tests/helpers/forked_cli.py's warm one (its imports are
    done): `out` (where "ready" goes) and `err` are the descriptors of stdout and stderr."""
    from tests.helpers.forked_cli import _enter

    _enter(env, cwd, out, err)
    serve(path, model_dirs)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
