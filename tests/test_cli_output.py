"""Messages are never hard-wrapped: a piped stderr has no width, and a narrow or absent COLUMNS
must not split a path or a sentence across lines (logs are grepped line by line)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.bounds import HANG_S
from tests.helpers.warm_process import run_cli


@pytest.mark.parametrize("columns", [None, "20", "80", "200"])
def test_an_error_naming_a_long_path_stays_on_one_line_whatever_the_width(tmp_path, columns):
    target = tmp_path / ("a-folder-with-a-rather-long-name-" * 3) / "collection"
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    if columns is not None:
        env["COLUMNS"] = columns
    done = run_cli(["info", "-c", target], env=env, timeout=HANG_S)  # a process of its own (tests/helpers/warm_process.py)
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert str(target) in lines[0] and "not a faste-mm collection" in lines[0]


@pytest.mark.parametrize("force_color", ["1", None])
def test_json_on_a_pipe_is_plain_json_even_when_colour_is_forced(force_color):
    """FORCE_COLOR (many CI runners set it) makes rich colour a pipe: `--format json` stays plain
    JSON there (`| jq` works), colours only on a real terminal."""
    env = {key: value for key, value in os.environ.items() if key not in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE")}
    if force_color is not None:
        env["FORCE_COLOR"] = force_color
    code = "from faste_mm.cli.common import print_json; print_json({'rows': [{'name': 'full', 'seconds': 0.5}]})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    assert "\x1b[" not in done.stdout
    assert json.loads(done.stdout) == {"rows": [{"name": "full", "seconds": 0.5}]}
