"""Shared fixtures: tiny random-weight models (built once per run) and generated inputs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `pytest -n 2` (the README's command) runs two workers on a 2-core machine: a torch thread
    # pool per worker would put 4 spinning threads on 2 cores. Set before torch is imported, so
    # the CLI subprocesses a test starts compute with the same thread count as the test itself.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
from PIL import Image

import faste_mm
from faste_mm import BatchingConfig, Embedder
from tests.helpers.file_order import longest_files_first
from tests.helpers.tiny_models import TinyModels

TEXT_FAMILIES = ("qwen3", "mistral", "llama", "qwen2")


def pytest_sessionstart(session) -> None:
    """The components installed as faste_mm.* must come from this checkout: an editable install
    of another clone would test that clone's indexers/cli/datasets instead."""
    import faste_mm.cli
    import faste_mm.datasets
    import faste_mm.indexers

    root = Path(__file__).resolve().parents[1]
    for module in (faste_mm, faste_mm.indexers, faste_mm.cli, faste_mm.datasets):
        origin = Path(module.__file__).resolve()
        if root not in origin.parents:
            raise pytest.UsageError(f"{module.__name__} is imported from {origin}, not from {root}; run pip install -e {root}")


_ROOT = Path(__file__).resolve().parents[1]

def pytest_configure(config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        # = --no-loadscope-reorder: workers get whole files in collection order, which
        # pytest_collection_modifyitems makes longest first (tests/helpers/file_order.py)
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items) -> None:
    items[:] = longest_files_first(items)


@pytest.fixture(autouse=True)
def _no_top_level_components():
    """`python -m pytest` puts this checkout on sys.path, where its `datasets/`, `cli/` and
    `indexers/` folders import as top-level packages when a library probes for Hugging Face
    `datasets` (transformers does). An installed faste-mm has no such modules, and a library
    that then trusts `"datasets" in sys.modules` (LanceDB) must not find ours: forget them."""
    yield
    for name in ("datasets", "cli", "indexers"):
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None) or ""
        if module is not None and _ROOT in Path(origin).resolve().parents:
            del sys.modules[name]


@pytest.fixture(autouse=True)
def _isolated_user_config(tmp_path_factory, monkeypatch):
    """Saved calibrations live in the user config dir: tests never read or write the real one."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.getbasetemp() / "user-config"))
    # measured kernel choices (model/cpu/kernel_choice.py) likewise: a test's trial never lands in the user's cache
    monkeypatch.setenv("FASTE_MM_KERNEL_CACHE", str(tmp_path_factory.getbasetemp() / "kernel_choices.json"))


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> TinyModels:
    """family -> tiny model folder, each built once per run on first use (tests/helpers/tiny_models.py)."""
    return TinyModels(tmp_path_factory.getbasetemp(), ("qwen3_vl", *TEXT_FAMILIES))


@pytest.fixture(scope="session")
def vl_embedder(model_dirs) -> Embedder:
    # One batch for everything: FastE's trigger is a batch decision, and references mirror it.
    return Embedder.from_pretrained(str(model_dirs["qwen3_vl"]), device="cpu", batching=BatchingConfig(batch_tokens=1 << 20))


@pytest.fixture(scope="session")
def text_embedders(model_dirs) -> dict[str, Embedder]:
    return {
        family: Embedder.from_pretrained(str(model_dirs[family]), device="cpu", batching=BatchingConfig(batch_tokens=1 << 20))
        for family in TEXT_FAMILIES
    }


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory) -> Path:
    """Images of mixed sizes and modes, plus a two-page PDF."""
    import pypdfium2 as pdfium

    root = tmp_path_factory.mktemp("images")
    Image.new("RGB", (100, 70), (200, 30, 30)).save(root / "red.png")
    Image.new("RGBA", (64, 160), (0, 200, 0, 100)).save(root / "green_rgba.png")
    Image.new("L", (90, 90), 128).save(root / "gray.jpg")
    pdf = pdfium.PdfDocument.new()
    for width, height in ((200, 300), (300, 200)):
        pdf.new_page(width, height)
    pdf.save(str(root / "doc.pdf"))
    pdf.close()
    return root


@pytest.fixture(scope="session")
def mixed_items(image_dir):
    """Text, image and image+text items of different lengths."""
    from faste_mm import Item

    return [
        "a red bicycle leaning on a wall",
        Item(image=image_dir / "red.png"),
        Item(text="a green square with some transparency, seen from far away", image=image_dir / "green_rgba.png"),
        "short",
        Item(image=image_dir / "gray.jpg", instruction="Find a day-to-day image that looks similar to the provided image."),
        "the quick brown fox jumps over the lazy dog " * 3,
    ]


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray (2 CPUs, no dashboard) for every test that needs one, started on first use:
    starting Ray costs seconds of CPU, and the tests share nothing else through it (each names its
    own actors and collections). Yields the address a separate driver process joins with.
    Its workers run at the tests' priority: Ray starts them at nice 15, and on a machine busy with
    the other test worker (or other jobs) they got so little CPU that one Ray test ran 900 s."""
    ray = pytest.importorskip("ray", reason="needs faste-mm[ray]")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _system_config={"worker_niceness": 0})
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
