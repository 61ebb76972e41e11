"""Tokenizers parsed once in the forkserver of tests/helpers/forked_cli.py, for the tiny models of
tests/helpers/tiny_models.py.

Parsing the real Qwen tokenizer (11 MB of JSON) is ~1 s of CPU, about half of loading a tiny
model, and every forked `faste-mm index`/`search`/`serve` loads one. Imported in the forkserver
(a preload module), this parses the tokenizer of each tiny model already built when the forkserver
starts; a child then gets the parsed object by fork, its own copy (a child's changes stay in that
child). Everything else about loading stays real: config, weights, processor, errors.

Only the folders named in `WARM_ENV` are cached, and only while their files are unchanged (same
inode, size and mtime): the tests copy a model before changing or deleting it, and a changed or
vanished folder is loaded (or refused) afresh.

In the test processes themselves, `share_in_process` (installed by tests/conftest.py) does the same
for the loads faste-mm's own loaders make of the run's tiny models.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

WARM_ENV = "FORKED_CLI_WARM_MODELS"  # os.pathsep-separated model folders; not a FASTE_MM_* variable
_IGNORED = ("revision", "local_files_only")  # where files come from: the same local folder either way


def _fingerprint(folder: Path) -> tuple:
    return tuple(sorted((p.name, s.st_ino, s.st_size, s.st_mtime_ns)
                        for p in folder.iterdir() if p.is_file() for s in (p.stat(),)))


def _parsed_once(load, shared) -> classmethod:
    """`load` (a from_pretrained) whose result is kept and handed out again for the calls
    `shared(folder, caller)` accepts, while the folder's files are unchanged."""
    parsed: dict = {}

    def from_pretrained(cls, path, *args, **kwargs):
        folder = os.path.realpath(str(path))
        if not shared(folder, sys._getframe(1).f_globals.get("__name__")) or not os.path.isdir(folder):
            return load(cls, path, *args, **kwargs)
        key = (cls, folder, _fingerprint(Path(folder)), repr(args),
               repr(sorted((k, v) for k, v in kwargs.items() if k not in _IGNORED)))
        if key not in parsed:
            parsed[key] = load(cls, path, *args, **kwargs)
        return parsed[key]

    return classmethod(from_pretrained)


def _install(folders: set[str]) -> None:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    PreTrainedTokenizerBase.from_pretrained = _parsed_once(PreTrainedTokenizerBase.from_pretrained.__func__,
                                                           lambda folder, _caller: folder in folders)


def _warm(folders: set[str]) -> None:
    """Load each folder's preprocessor as faste-mm does (a processor for Qwen3-VL, else a tokenizer)."""
    import json

    from transformers import AutoProcessor, AutoTokenizer

    for folder in sorted(folders):
        model_type = json.loads((Path(folder) / "config.json").read_text())["model_type"]
        (AutoProcessor if model_type == "qwen3_vl" else AutoTokenizer).from_pretrained(folder)


# The callers whose loads `share_in_process` shares: faste-mm's own model loaders, which never
# change the preprocessor they get (tests and sentence-transformers load theirs afresh).
_PRODUCT_LOADERS = frozenset({"faste_mm.model.backbones.loading", "faste_mm.model.rerank.loading"})


def share_in_process(root: Path) -> None:
    """In a test process: the preprocessor (AutoProcessor or AutoTokenizer) that faste-mm's
    loaders ask for, for a tiny model under `root` whose files are unchanged, is parsed on the
    first load and that object is handed to every later one. Measured: 61 such loads took ~155 s
    of two workers' time in six CLI-heavy modules (~2.5 s each, mostly transformers rebuilding
    the 11 MB Qwen tokenizer in Python); each Embedder/Reranker/CLI command in the same worker
    loaded the same files again. Loads by anyone else (a test's own AutoTokenizer, a
    SentenceTransformer, both of which change theirs), of another folder (a test's copy) or of
    changed files go through transformers as before; so do the config and the weights."""
    from transformers import AutoProcessor, AutoTokenizer

    prefix = os.path.realpath(root) + os.sep
    for auto in (AutoProcessor, AutoTokenizer):
        auto.from_pretrained = _parsed_once(auto.from_pretrained.__func__, lambda folder, caller: (
            caller in _PRODUCT_LOADERS and folder.startswith(prefix)))


_folders = {os.path.realpath(f) for f in os.environ.get(WARM_ENV, "").split(os.pathsep) if f}
if _folders:
    _install(_folders)
    _warm(_folders)
