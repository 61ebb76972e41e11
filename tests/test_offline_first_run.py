"""The first run without internet: the hub cannot be reached and the model is not cached. One
clear message (no retry per request, printed twice, over a minute; no literal "\\n"), saying how
to use a copy downloaded elsewhere, in CLI words on the CLI and Python words in the API."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from faste_mm.errors import ModelLoadError


def _offline_env(tmp_path) -> dict[str, str]:
    # port 9 (discard) on loopback refuses at once: an unreachable hub without a network
    env = {key: value for key, value in os.environ.items() if not key.startswith("HF_")}
    return {**env, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf-home")}


def test_the_cli_says_once_that_the_model_cannot_be_downloaded_and_how_to_use_a_local_copy(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("a note")
    proc = subprocess.run([sys.executable, "-m", "faste_mm.cli.app", "index", str(tmp_path / "notes"),
                           "-c", str(tmp_path / "col"), "--model", "someorg/some-model"],
                          capture_output=True, text=True, env=_offline_env(tmp_path), timeout=300)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "cannot download" in line]
    assert len(errors) == 1, proc.stderr
    assert "127.0.0.1 cannot be reached" in errors[0] and "--model DIR" in errors[0], errors
    assert "hf download someorg/some-model --local-dir DIR" in errors[0]
    assert "Retry" not in proc.stderr and "\\n" not in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "col").exists()


def test_the_api_names_the_python_way(tmp_path, monkeypatch):
    from faste_mm.model.backbones import loading

    monkeypatch.setattr(loading, "hub_unreachable", lambda name: "huggingface.co cannot be reached")
    with pytest.raises(ModelLoadError, match=r"cannot download the model.*from_pretrained\(DIR\)") as caught:
        loading.load_model("someorg/some-model", device="cpu")
    assert "--model" not in str(caught.value)
