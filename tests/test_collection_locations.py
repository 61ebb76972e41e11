"""Where the default collection is looked for when an MCP client or a service starts faste-mm with a
minimal environment: no HOME and no XDG_DATA_HOME, or a HOME of its own (docs/agents.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from faste_mm.retrieval.locations import _collections_dir
from tests.helpers.bounds import HANG_S

pwd = pytest.importorskip("pwd", reason="the password database is POSIX's")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the XDG layout is Linux's")
def test_without_home_or_xdg_data_home_the_default_collection_is_under_the_accounts_home():
    env = {key: value for key, value in os.environ.items() if key not in ("HOME", "XDG_DATA_HOME", "FASTE_MM_COLLECTION")}
    code = "from faste_mm.retrieval.locations import collection_path; print(collection_path(None))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    account = pwd.getpwuid(os.getuid()).pw_dir
    assert Path(done.stdout.strip()) == Path(account) / ".local" / "share" / "faste-mm" / "collections" / "default"


def test_a_home_of_the_clients_own_falls_back_to_the_accounts_collections(tmp_path):
    sandbox, account = tmp_path / "client-home", tmp_path / "me"
    found = sandbox / ".local" / "share" / "faste-mm" / "collections"  # platformdirs' answer under the client's HOME
    twin = account / ".local" / "share" / "faste-mm" / "collections"
    assert _collections_dir(found, sandbox, str(account), None) == found  # nothing at the account's either
    twin.mkdir(parents=True)
    assert _collections_dir(found, sandbox, str(account), None) == twin
    assert _collections_dir(found, sandbox, str(account), str(tmp_path / "data")) == found  # XDG_DATA_HOME is the user's word
    found.mkdir(parents=True)
    assert _collections_dir(found, sandbox, str(account), None) == found  # collections under HOME come first
    assert _collections_dir(found, sandbox, None, None) == found  # no password database entry
