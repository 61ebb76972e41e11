"""The headless browser the page tests share: Debian's chromium through Playwright (skipped where
either is missing), one per test module."""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers.warm_process import start_cli

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def browser():
    playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@contextmanager
def serving(*args: str):
    """`faste-mm serve ARGS --port 0` in a subprocess: yields its base URL once it listens (the
    line it prints then), and stops it after. The pages the browser tests drive."""
    # forked from the warm process of tests/helpers/warm_process.py: no fresh torch import per server
    process = start_cli(["serve", *args, "--port", "0"], env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=REPO)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    try:
        line = lines.get(timeout=120)  # a failure detector, not a speed assertion
    except queue.Empty:
        process.kill()
        pytest.fail(f"faste-mm serve printed no URL in 120 s; stderr: {process.stderr.read()[-2000:]}")
    assert line.startswith("serving on http://127.0.0.1:"), line
    try:
        yield line.split()[-1].rstrip("/")
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
