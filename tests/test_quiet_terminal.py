"""Third-party chatter stays off a user's terminal unless --debug: LanceDB's Rust WARN lines on
export (Ray's and the hub client's are checked in test_ray_index / test_offline_first_run)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from faste_mm.indexers import Collection, ItemRecord, Manifest

from tests.helpers.bounds import first_line

pytest.importorskip("lancedb", reason="needs faste-mm[lancedb]")


def _collection(root) -> None:
    vectors = np.eye(4, 8, dtype=np.float32)
    with Collection.create(root, Manifest(model_id="m", dim=8, vector_dtype="float32")) as col:
        col.add(vectors, [ItemRecord(uri=f"item:{i}", modality="text") for i in range(4)])


@pytest.mark.parametrize("debug", [False, True])
def test_export_to_lancedb_prints_lances_log_lines_only_with_debug(tmp_path, debug):
    _collection(tmp_path / "c")
    env = {key: value for key, value in os.environ.items() if key != "LANCEDB_LOG"}
    args = ["export", "-c", str(tmp_path / "c"), "--to", f"lancedb:{tmp_path / 'db'}/t", *(["--debug"] if debug else [])]
    proc = subprocess.run([sys.executable, "-m", "faste_mm.cli.app", *args], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert ("lance::" in proc.stderr) is debug, proc.stderr


def test_serve_loads_its_model_without_transformers_per_weight_bar(tmp_path):
    import signal

    from tests.helpers.tiny_models import tiny_model_dir

    env = {**os.environ, "FASTE_MM_DEVICE": "cpu", "XDG_DATA_HOME": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "faste_mm.cli.app", "serve", "--model", str(tiny_model_dir(tmp_path.parent, "qwen3")),
                             "--port", "0", "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        line = first_line(proc, "faste-mm serve")  # printed once the model is loaded and the socket listens
        assert line.startswith("serving on http://127.0.0.1:"), line or proc.stderr.read()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert "loading " in err and "Loading weights" not in err and "it/s" not in err, err
