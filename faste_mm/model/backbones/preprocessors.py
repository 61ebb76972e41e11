"""The processor (multimodal) or tokenizer a checkpoint's serializer is built on, parsed once per
process: `load_model` and `load_reranker` get it here, and a later load of the same unchanged
files (a second Embedder, a reranker beside it, the next command of a warm process) is handed
the object already parsed.

Why: transformers rebuilds the Qwen tokenizer (11 MB of JSON) in Python on every load, ~1 s of
CPU, more than loading a small model's weights. The key is the files' identity: the folder's
real path and each top-level file's name, inode, size and modification and change times (a hub
id's files are its snapshot folder in the Hugging Face cache), so an edited, replaced or copied
checkpoint is parsed afresh. `FASTE_MM_PREPROCESSOR_CACHE=off` parses on every load.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path

log = logging.getLogger(__name__)

CACHE_ENV = "FASTE_MM_PREPROCESSOR_CACHE"  # "off": parse on every load; read at each load
# A parsed Qwen processor holds ~100 MB; a process rarely uses more than an embedding model and a
# reranker, and a long-lived one that cycles through many checkpoints must not keep them all.
MAX_ENTRIES = 8

_parsed: OrderedDict[tuple, object] = OrderedDict()  # key -> preprocessor, least recently used first
_lock = threading.Lock()  # loads run in server threads too (serve loads its reranker in the background)


def load_preprocessor(name_or_path: str, multimodal: bool, revision: str | None = None,
                      local_files_only: bool = False):
    """The checkpoint's `AutoProcessor` (multimodal) or `AutoTokenizer`, shared with every earlier
    load of the same unchanged files in this process. The object is shared: read it, never change
    it (copy.deepcopy it first). transformers' errors pass through (the loaders word them)."""
    from transformers import AutoProcessor, AutoTokenizer

    preprocessor_class = AutoProcessor if multimodal else AutoTokenizer

    def parse():
        return preprocessor_class.from_pretrained(name_or_path, revision=revision, local_files_only=local_files_only)

    if os.environ.get(CACHE_ENV, "").strip().lower() == "off":
        return parse()
    key = _key(preprocessor_class, name_or_path, revision)
    with _lock:
        if key is not None and key in _parsed:
            _parsed.move_to_end(key)
            log.debug("%s: preprocessor parsed earlier in this process, files unchanged", name_or_path)
            return _parsed[key]
    preprocessor = parse()
    key = _key(preprocessor_class, name_or_path, revision)  # a hub id's files are in the cache only now
    if key is not None:
        with _lock:
            _parsed[key] = preprocessor
            while len(_parsed) > MAX_ENTRIES:
                _parsed.popitem(last=False)
    return preprocessor


def clear_preprocessor_cache() -> None:
    """Forget every parsed preprocessor (the next load of each parses its files again)."""
    with _lock:
        _parsed.clear()


def _key(preprocessor_class: type, name_or_path: str, revision: str | None) -> tuple | None:
    """What identifies the parsed result: the class, the folder and its files; None when the
    files cannot be found (not cached: a hub id not downloaded yet)."""
    folder = _files_folder(name_or_path, revision)
    if folder is None:
        return None
    try:
        files = tuple(sorted((entry.name, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns)
                             for entry in os.scandir(folder) if entry.is_file() for s in (entry.stat(),)))
    except OSError:  # vanished or unreadable: let the load say what is wrong
        return None
    return preprocessor_class.__qualname__, os.path.realpath(folder), revision, files


def _files_folder(name_or_path: str, revision: str | None) -> str | None:
    """A local folder as given, else the hub id's snapshot folder in the local Hugging Face cache."""
    if Path(name_or_path).expanduser().is_dir():
        return str(Path(name_or_path).expanduser())
    from huggingface_hub import try_to_load_from_cache

    try:
        config = try_to_load_from_cache(name_or_path, "config.json", revision=revision)
    except ValueError:  # not a valid hub id either: the load reports it
        return None
    return os.path.dirname(config) if isinstance(config, str) else None
