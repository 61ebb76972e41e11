"""`faste-mm search`, `info` and `explain` through a running `faste-mm serve` (a live server on
127.0.0.1): the server announces itself in the collection (owner-only file, gone when it stops),
the CLI uses it and prints the same hits, report and explanation as doing the work itself
(`--no-server`), says which with --debug, imports nothing heavy on that path, and ignores a stale
or foreign announcement. Also: `serve` without -c serves the default collection, and `serve`
without the serve extra says what to install before loading anything."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("fastapi", reason="needs the serve extra: pip install 'faste-mm[serve]'")

from faste_mm import Item, Retriever  # noqa: E402
from faste_mm.cli.app import app  # noqa: E402
from faste_mm.indexers import Collection  # noqa: E402
from faste_mm.indexers.directory import SERVER_FILE  # noqa: E402
from faste_mm.retrieval.model_spec import ModelSpec  # noqa: E402
from faste_mm.serving.discovery import find_server  # noqa: E402
from tests.helpers.warm_process import start_cli  # noqa: E402
from tests.helpers.serve_fixtures import make_gallery  # noqa: E402
from tests.helpers.inputs import tiny_vl_dir  # noqa: E402
from tests.helpers.tiny_models import tiny_model_dir  # noqa: E402
from tests.helpers.bounds import HANG_S, first_line  # noqa: E402

runner = CliRunner()


@pytest.fixture(scope="module")
def data_home(tmp_path_factory) -> Path:
    """XDG_DATA_HOME whose default collection holds 4 images, a 2-page PDF and a text note."""
    base = tmp_path_factory.mktemp("server-search")
    model = tiny_vl_dir(tmp_path_factory.getbasetemp())
    root = base / "data" / "faste-mm" / "collections" / "default"
    gallery = make_gallery(base / "gallery", n=4)
    (gallery / "lake.txt").write_text("A picnic by the lake at sunset, then a swim.\n")  # explain's text spans
    with Retriever(ModelSpec(str(model), device="cpu"), collection=root, r_max=0.5) as retriever:
        retriever.index([gallery])
        retriever.add([Item(text="notes about a picnic by the lake")], uris=["notes:picnic"],
                      metadata=[{"year": 2024}])
    return base / "data"


def _env(data_home: Path) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "FASTE_MM_COLLECTION")}
    env.update({"XDG_DATA_HOME": str(data_home), "FASTE_MM_DEVICE": "cpu"})
    return env


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory) -> Path:
    """A tiny random-weight Qwen3-VL reranker (the server's --rerank: /explain)."""
    return tiny_model_dir(tmp_path_factory.getbasetemp(), "qwen3_vl_reranker")


@pytest.fixture(scope="module")
def server(data_home, reranker_dir):
    """`faste-mm serve --rerank DIR` with no -c (the default collection) on a free loopback port."""
    # forked from the warm process of tests/helpers/warm_process.py: no fresh torch import
    proc = start_cli(["serve", "--port", "0", "--threads", "1", "--rerank", str(reranker_dir)], env=_env(data_home))
    line = first_line(proc, "faste-mm serve")  # printed once the server is announced and its socket listens
    assert line.startswith("serving on http://127.0.0.1:"), proc.stderr.read() if not line else line
    yield proc, data_home / "faste-mm" / "collections" / "default"
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


def _search(data_home: Path, *args: str) -> tuple[dict, str]:
    env = {"XDG_DATA_HOME": str(data_home), "FASTE_MM_DEVICE": "cpu"}
    result = runner.invoke(app, ["search", *args, "--format", "json", "--debug"], env=env)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout), result.stderr


def _same_hits(served: dict, local: dict) -> None:
    assert [(h["id"], h["uri"], h["page"], h["metadata"]) for h in served["hits"]] == \
        [(h["id"], h["uri"], h["page"], h["metadata"]) for h in local["hits"]]
    for a, b in zip(served["hits"], local["hits"]):
        assert a["score"] == pytest.approx(b["score"], abs=1e-5)
    assert served["collection"] == local["collection"] and served["filter"] == local["filter"]


def test_the_server_announces_itself_owner_only_in_the_collection_it_serves_by_default(server):
    proc, root = server
    path = root / SERVER_FILE
    info = path.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid()
    address = find_server(root)
    assert address is not None and address.pid == proc.pid and address.url.startswith("http://127.0.0.1:")


@pytest.mark.parametrize("filters", [[], ["--type", "text", "--where", "year=2024", "--path", "notes:*"]])
def test_search_through_the_server_equals_a_local_search(server, filters):
    _, root = server
    data_home = root.parents[2]
    served, said = _search(data_home, "a sunset over the sea", "-k", "5", *filters)
    assert "through the server at http://127.0.0.1:" in said
    local, said_locally = _search(data_home, "a sunset over the sea", "-k", "5", *filters, "--no-server")
    assert "through the server" not in said_locally
    assert served["hits"], served
    _same_hits(served, local)


def test_the_table_through_the_server_equals_the_local_table(server):
    _, root = server
    env = {"XDG_DATA_HOME": str(root.parents[2]), "FASTE_MM_DEVICE": "cpu"}
    served = runner.invoke(app, ["search", "a picnic by the lake", "-k", "4"], env=env)
    local = runner.invoke(app, ["search", "a picnic by the lake", "-k", "4", "--no-server"], env=env)
    assert served.exit_code == 0 and local.exit_code == 0, (served.stderr, local.stderr)
    assert "4 results" in served.stdout and served.stdout == local.stdout


def _run(data_home: Path, *args: str):
    result = runner.invoke(app, [*args, "--debug"], env={"XDG_DATA_HOME": str(data_home), "FASTE_MM_DEVICE": "cpu"})
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def _note_id(root: Path) -> int:
    with Collection.open(root) as col:
        return next(record.id for record in col.read(lambda rows: rows.live_records_after(-1, 100)) if record.uri.endswith("lake.txt"))


def test_info_through_the_server_equals_a_local_read(server):
    _, root = server
    data_home = root.parents[2]
    served, local = _run(data_home, "info", "--format", "json"), _run(data_home, "info", "--format", "json", "--no-server")
    assert "info: through the server at http://127.0.0.1:" in served.stderr and "through" not in local.stderr
    report = json.loads(served.stdout)
    assert report == json.loads(local.stdout) and report["path"] == str(root)
    assert report["n_ok"] == 8 and report["settings"]["model_id"]  # 4 images, 2 PDF pages, a note file, a text
    served, local = _run(data_home, "info"), _run(data_home, "info", "--no-server")
    assert "through the server" in served.stderr and "collection" in served.stdout and served.stdout == local.stdout


def test_explain_through_the_server_equals_a_local_explanation(server, reranker_dir):
    _, root = server
    data_home, note = root.parents[2], _note_id(root)
    args = ("explain", "a picnic by the lake", str(note), "--rerank", str(reranker_dir))
    served, local = _run(data_home, *args, "--format", "json"), _run(data_home, *args, "--format", "json", "--no-server")
    assert "explain: through the server at http://127.0.0.1:" in served.stderr and "through" not in local.stderr
    why, here = json.loads(served.stdout), json.loads(local.stdout)
    assert why["item"] == here["item"] and why["item"]["id"] == note and why["item"]["uri"].endswith("lake.txt")
    assert why["text"] and [s["text"] for s in why["text"]] == [s["text"] for s in here["text"]]
    assert set(why) == set(here)
    for key in ("score", "query_share", "document_share", "template_share"):
        assert why[key] == pytest.approx(here[key], abs=1e-5)
    assert why["layer"] == here["layer"] and why["reranker"] == here["reranker"] == str(reranker_dir)
    # the table renders that same JSON (one function both ways): it shows the item, the score, the spans
    table = _run(data_home, *args).stdout
    assert "lake.txt" in table and f"{why['score']:.4f}" in table and "not attribution" in table
    assert why["text"][0]["text"].strip() in table


def test_explain_says_what_is_missing_an_item_or_a_reranker(server, reranker_dir):
    _, root = server
    env = {"XDG_DATA_HOME": str(root.parents[2]), "FASTE_MM_DEVICE": "cpu"}
    unknown = runner.invoke(app, ["explain", "a picnic", "987654", "--rerank", str(reranker_dir)], env=env)
    assert unknown.exit_code == 1 and "id 987654: no such item" in unknown.stderr and "--format json" in unknown.stderr
    none = runner.invoke(app, ["explain", "a picnic", str(_note_id(root)), "--no-server"], env=env)
    assert none.exit_code == 1 and "no reranker" in none.stderr and "--rerank MODEL" in none.stderr


def test_search_info_and_explain_through_the_server_import_no_torch_transformers_faiss_or_numpy(
        server, reranker_dir, tmp_path):
    """The thin client (issue 34): from the command to the HTTP call, each command answered by the
    server loads only light modules (one process runs the three, noting its modules after each)."""
    _, root = server
    loaded = tmp_path / "loaded.json"
    commands = [["search", "a sunset over the sea", "-k", "3", "--format", "json"], ["info", "--format", "json"],
                ["explain", "a picnic by the lake", str(_note_id(root)), "--rerank", str(reranker_dir), "--format",
                 "json"]]
    code = ("import json, sys\nfrom faste_mm.cli.app import main\nseen = {}\n"
            f"for argv in {commands!r}:\n"
            "    sys.argv = ['faste-mm', *argv, '--debug']\n"
            "    try:\n        main()\n    except SystemExit as done:\n        assert not done.code, done.code\n"
            "    seen[argv[0]] = sorted(sys.modules)\n"
            f"open({str(loaded)!r}, 'w').write(json.dumps(seen))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(root.parents[2]),
                            timeout=300)
    assert result.returncode == 0, result.stderr
    for command in ("search", "info", "explain"):
        assert f"{command}: through the server at http://127.0.0.1:" in result.stderr, result.stderr
    assert json.JSONDecoder().raw_decode(result.stdout)[0]["hits"]  # search's JSON came first
    seen = json.loads(loaded.read_text())
    assert {"faste_mm.cli.search_command", "faste_mm.serving.discovery"} <= set(seen["search"])  # it sees imports
    assert "faste_mm.cli.explain_command" in seen["explain"]
    for command, modules in seen.items():
        assert [m for m in modules if m.split(".")[0] in ("torch", "transformers", "faiss", "numpy")] == [], command


def test_a_stale_or_foreign_announcement_is_ignored_and_the_model_loads_here(server, tmp_path):
    _, root = server
    data_home = root.parents[2]
    live = (root / SERVER_FILE).read_text()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          timeout=HANG_S)
    try:
        (root / SERVER_FILE).write_text(json.dumps({**json.loads(live), "pid": int(dead.stdout)}))
        _, said = _search(data_home, "a picnic", "-k", "2")
        assert "loading the model here (no running faste-mm serve" in said
        (root / SERVER_FILE).write_text(live)
        os.chmod(root / SERVER_FILE, 0o644)  # readable by others: not trusted
        _, said = _search(data_home, "a picnic", "-k", "2")
        assert "loading the model here" in said
    finally:
        (root / SERVER_FILE).write_text(live)
        os.chmod(root / SERVER_FILE, 0o600)


def test_the_announcement_goes_when_the_server_stops(server):
    proc, root = server
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    assert not (root / SERVER_FILE).exists()
    assert find_server(root) is None


def test_serve_without_a_default_collection_says_what_to_do(tmp_path):
    result = runner.invoke(app, ["serve", "--port", "0"], env={"XDG_DATA_HOME": str(tmp_path)})
    assert result.exit_code == 1
    assert "default collection" in result.stderr and "faste-mm index PATH" in result.stderr
    assert "--model MODEL" in result.stderr and "loading" not in result.stderr


def test_serve_without_the_serve_extra_says_how_to_install_it_before_loading_anything(tmp_path):
    code = ("import sys; sys.modules['fastapi'] = None; sys.argv = ['faste-mm', 'serve', '--model', "
            "'/nonexistent/model']; from faste_mm.cli.app import main; main()")
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 1, result.stderr
    assert "pip install 'faste-mm[serve]'" in result.stderr and "fastapi" in result.stderr
    assert "loading" not in result.stderr and "Traceback" not in result.stderr
