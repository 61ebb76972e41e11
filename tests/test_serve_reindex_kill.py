"""A running `faste-mm serve` survives a killed `index --reindex` (issue 38, item 3): with four
clients searching, a re-index SIGKILLed at the `create-before-manifest` crash point leaves the
collection half-made; searches then get a clear 503 "being re-indexed, retry" with Retry-After
(never a 500, never "damaged, re-index"), and once `index` has run again /health and /search
answer as before. Everything goes through the real server process and the real CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="needs the serve extra: pip install 'faste-mm[serve]'")

from faste_mm.indexers.crash_points import CRASH_ENV  # noqa: E402
from tests.helpers.warm_process import run_cli, start_cli  # noqa: E402
from tests.helpers.inputs import tiny_vl_dir  # noqa: E402
from tests.helpers.serve_fixtures import make_gallery, scene_image  # noqa: E402
from tests.helpers.bounds import first_line  # noqa: E402

# Client-side failure detector only (a hung server fails the test instead of hanging it); no
# assertion is about how fast anything answers.
HUNG_S = 120
CLIENTS = 4


def _cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    """`faste-mm ARGS` in a process of its own, forked warm (tests/helpers/warm_process.py)."""
    return run_cli(list(args), env=env)


def _request(url: str, body: dict | None = None) -> tuple[int, dict, object]:
    """(status, JSON body, headers) of a GET (body None) or a JSON POST."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=HUNG_S) as response:
            return response.status, json.loads(response.read()), response.headers
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), error.headers


def _thumbnail(url: str, item_id: int) -> int:
    try:
        with urllib.request.urlopen(f"{url}/thumbnails/{item_id}", timeout=HUNG_S) as response:
            assert response.headers["Content-Type"] == "image/jpeg"
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.fixture()
def served(tmp_path):
    """(url, collection, gallery, env) of `faste-mm serve -c COL` over a 4-image collection."""
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "FASTE_MM_COLLECTION", CRASH_ENV)}
    env.update({"FASTE_MM_DEVICE": "cpu", "XDG_DATA_HOME": str(tmp_path / "data")})
    model = tiny_vl_dir(tmp_path)
    gallery = make_gallery(tmp_path / "gallery", n=4)
    col = tmp_path / "col"
    made = _cli("index", str(gallery), "-c", str(col), "--model", str(model), env=env)
    assert made.returncode == 0, made.stderr
    proc = start_cli(["serve", "-c", str(col), "--port", "0", "--threads", "1"], env=env)
    line = first_line(proc, "faste-mm serve")  # printed once the socket listens
    assert line.startswith("serving on http://127.0.0.1:"), line
    try:
        yield line.split()[2].rstrip("/"), col, gallery, model, env
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=60)
        proc.close()


def test_a_killed_reindex_gives_searchers_a_503_and_never_stops_the_server(served):
    url, col, gallery, model, env = served
    answers: list[tuple[int, dict, dict]] = []
    answered = [threading.Event() for _ in range(CLIENTS)]
    stop = threading.Event()

    status, body, _ = _request(url + "/search", {"query": "a sunset", "k": 10})
    old_ids = {hit["id"] for hit in body["hits"]}
    first_id = body["hits"][0]["id"]
    assert _thumbnail(url, first_id) == 200  # a handler thread opens its reader

    def client(n: int) -> None:
        while not stop.is_set():
            answers.append(_request(url + "/search", {"query": "a sunset", "k": 3}))
            answered[n].set()

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(CLIENTS)]
    for thread in threads:
        thread.start()
    try:
        for event in answered:  # every client is searching before the re-index starts
            assert event.wait(HUNG_S), "a client never got an answer before the re-index"
        killed = _cli("index", str(gallery), "-c", str(col), "--model", str(model), "--reindex",
                      env={**env, CRASH_ENV: "create-before-manifest"})
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert not (col / "manifest.json").exists()  # the half-made collection the server now sees

        status, body, headers = _request(url + "/search", {"query": "a sunset", "k": 3})
        assert status == 503, body
        assert "being re-indexed" in body["error"]["message"] and "retry" in body["error"]["message"]
        assert headers.get("Retry-After") == "1"
        assert _request(url + "/health")[0] == 200
        status, body, _ = _request(url + f"/thumbnails/{first_id}")  # the handler threads' readers too
        assert status == 503 and "being re-indexed" in body["error"]["message"], body

        for event in answered:
            event.clear()
        scene_image(gallery / "added.png", 99)  # a new item, whose id the old collection never had
        again = _cli("index", str(gallery), "-c", str(col), "--model", str(model), env=env)
        assert again.returncode == 0, again.stderr
        for event in answered:  # the clients go on getting answers after the re-index
            assert event.wait(HUNG_S), "a client got no answer after the re-index"
    finally:
        stop.set()
        for thread in threads:
            thread.join(HUNG_S)
    assert not any(thread.is_alive() for thread in threads), "a search never returned: the server hangs"

    assert _request(url + "/health")[0] == 200
    status, body, _ = _request(url + "/search", {"query": "a sunset", "k": 3})
    assert status == 200 and len(body["hits"]) == 3, body
    status, body, _ = _request(url + "/search", {"query": "a sunset", "k": 10})
    new_ids = [hit["id"] for hit in body["hits"] if hit["id"] not in old_ids]
    assert new_ids, body  # the re-created collection has one item more: an id the erased one never had
    assert _thumbnail(url, new_ids[0]) == 200  # read from the re-created collection, not the erased one
    wrong = [(s, b) for s, b, _ in answers if s != 200 and not (s == 503 and "being re-indexed" in json.dumps(b))]
    assert not wrong, wrong[:3]  # never a 500, never "damaged, re-index" while it was re-created
    assert not any("damaged" in json.dumps(b) for _, b, _ in answers)


def test_a_stalled_model_thread_gives_a_503_and_health_still_answers(tmp_path):
    """No request waits forever on the model thread: one blocked (here by a task waiting on an
    event) answers embeddings with a 503 after `model_wait_s`, and /health answers meanwhile."""
    from fastapi.testclient import TestClient

    from faste_mm import Embedder
    from faste_mm.errors import ConfigError
    from faste_mm.serving import ServeConfig, ServeEngine, create_app

    with pytest.raises(ConfigError, match="model_wait_s"):
        ServeConfig(model_wait_s=0)
    embedder = Embedder.from_pretrained(str(tiny_vl_dir(tmp_path)), device="cpu")
    engine = ServeEngine(embedder, None, ServeConfig(model_wait_s=0.5))
    release, blocking = threading.Event(), threading.Event()

    def stall() -> None:
        blocking.set()
        assert release.wait(HUNG_S)

    with TestClient(create_app(engine), base_url="http://127.0.0.1:8000") as client:
        stalled = engine.batcher.submit("task", stall, 1)
        assert blocking.wait(HUNG_S)
        try:
            response = client.post("/v1/embeddings", json={"input": ["a cat"]})
            assert response.status_code == 503, response.text
            assert "did not answer" in response.json()["error"]["message"]
            assert response.headers["Retry-After"] == "1"
            assert client.get("/health").json() == {"status": "ok"}
        finally:
            release.set()
        stalled.result(HUNG_S)
        assert client.post("/v1/embeddings", json={"input": ["a cat"]}).status_code == 200


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread dies on purpose
def test_a_dead_model_thread_refuses_new_jobs_instead_of_queueing_them_forever():
    from faste_mm.serving import Batcher, QueueFullError

    def die(payloads):
        raise SystemExit("the runner ended the model thread")

    batcher = Batcher({"task": die}).start()
    first = batcher.submit("task", None, 1)
    with pytest.raises(SystemExit):
        first.result(HUNG_S)  # its client gets the error, never a hang
    batcher._thread.join(HUNG_S)
    with pytest.raises(QueueFullError, match="model thread stopped"):
        batcher.submit("task", None, 1)
    batcher.close()
