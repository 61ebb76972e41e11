"""The wheel installs one import package, faste_mm, and no top-level datasets/cli/indexers."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.helpers.bounds import HANG_S

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_installs_only_the_faste_mm_package(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)],
        check=True, timeout=HANG_S,
    )
    (wheel,) = tmp_path.glob("faste_mm-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"faste_mm"}
    for component in ("indexers", "cli", "datasets"):
        assert f"faste_mm/{component}/__init__.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "faste-mm = faste_mm.cli.app:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_importing_faste_mm_does_not_shadow_hugging_face_datasets(tmp_path):
    """From outside the checkout (as a user runs it), importing faste-mm's evaluators must not
    make a top-level `datasets` module resolve to ours."""
    probe = (
        "import importlib.util, faste_mm.datasets as ours\n"
        "spec = importlib.util.find_spec('datasets')\n"
        "assert ours.__name__ == 'faste_mm.datasets'\n"
        "assert spec is None or spec.origin != ours.__file__, spec.origin\n"
    )
    subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, check=True, timeout=HANG_S)
