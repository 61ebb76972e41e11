"""The tiny random-weight models of `faste_mm.testing.build_tiny_model`, built once per test run.

Building one costs 2-6 s of CPU (mostly parsing and writing the real Qwen tokenizer), and a
dozen modules asked for the same few models, each building its own copy, once per xdist worker.
Here each (family, layers) is built once into the run's shared temp folder, under a file lock so
two workers never build the same one at once (the second waits and reuses it). Same seed, same
function: the files are what a module building its own copy would get.

A test that changes the files of a model (edits its config, deletes it) copies it first
(`shutil.copytree`), as the tests did before this cache.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

from faste_mm.testing import build_tiny_model


def run_root(basetemp: Path) -> Path:
    """The temp folder every worker of this run shares: under xdist a worker's basetemp is
    `pytest-N/popen-gwK`, so its parent; else the basetemp itself."""
    return basetemp.parent if re.fullmatch(r"popen-gw\d+", basetemp.name) else basetemp


def models_root(basetemp: Path) -> Path:
    """The folder holding this run's tiny models."""
    return run_root(basetemp) / "tiny-models"


def tiny_model_dir(basetemp: Path, family: str, num_layers: int = 6) -> Path:
    """The folder of the tiny `family` model with `num_layers` layers (built on first use in
    this run; `basetemp` is the asking worker's `tmp_path_factory.getbasetemp()`)."""
    root = models_root(basetemp)
    root.mkdir(parents=True, exist_ok=True)
    path = root / (family if num_layers == 6 else f"{family}-{num_layers}-layers")  # the family names the folder, as messages show
    with open(root / f"{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not path.is_dir():
            partial = root / f"{path.name}.partial-{os.getpid()}"
            shutil.rmtree(partial, ignore_errors=True)
            build_tiny_model(partial, family, num_layers=num_layers)
            partial.rename(path)  # complete or absent: a killed build leaves only a .partial folder
    _asked.add(path)
    return path


_asked: set[Path] = set()  # the models this process asked for (tests/helpers/warm_process.py loads their preprocessors)


def asked_models() -> list[Path]:
    return sorted(_asked)


class TinyModels(Mapping):
    """family -> tiny model folder, each built on first access (a module that needs only the
    Qwen3-VL model no longer waits for the four text families)."""

    def __init__(self, basetemp: Path, families: tuple[str, ...]) -> None:
        self._basetemp, self._families = basetemp, families

    def __getitem__(self, family: str) -> Path:
        if family not in self._families:
            raise KeyError(family)
        return tiny_model_dir(self._basetemp, family)

    def __iter__(self) -> Iterator[str]:
        return iter(self._families)

    def __len__(self) -> int:
        return len(self._families)
