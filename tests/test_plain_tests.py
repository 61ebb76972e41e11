"""Tests stay plain: no test patches a third-party library (transformers, torch, PIL, pypdfium2,
huggingface_hub, qwen-vl-utils, ...). Every patch in tests/ is read from the source (ast):
`monkeypatch.setattr/delattr/setitem/delitem`, `mock.patch(...)` and its `.object/.dict/.multiple`,
the builtins `setattr/delattr`, and assignments to an attribute. Its target is resolved through
the file's imports and local assignments (`type(x)` is x's owner) to a module: faste_mm and tests
are ours to patch; the standard library only through the settings below; anything else, or an
object faste-mm holds from a library (its processor, tokenizer or model), fails the check with
the file, the line and what to do instead (docs/contributing.md, "Plain tests"). Setting an
attribute of a library's object the test made itself (`frame.sample_rate = 8000`) is using it."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).parent
ROOT = TESTS.parent

OWN = ("faste_mm", "tests")
# Standard-library settings a test may set (monkeypatch.setenv/delenv/chdir/syspath_prepend are
# not patches): the environment, the platform, the command line, the temporary folder; and a
# `sys.modules` entry set to None (an import that must fail, as if the package were not installed).
STDLIB_SETTINGS = ("os.environ", "sys.platform", "sys.argv", "tempfile.tempdir")
# Attributes under which faste-mm objects hold a library's object: patching through them (or
# through `type()` of them) patches transformers, whatever faste-mm object the chain starts at.
HELD = ("processor", "preprocessor", "tokenizer", "image_processor", "video_processor", "model")

INSTEAD = ("tests never patch a third-party library: make the input cause the condition (a file cut in its "
           "pixel data, a real 5 MB text), build the real object the test needs (a processor from its parts, a "
           "subclass of the library's class loaded with from_pretrained: tests/helpers/processors.py), run the "
           "library in a process of its own with its own settings (tests/test_video.py), or patch faste-mm's "
           "own named call around the library (e.g. file_decoding._pdfium_document, "
           "bench.rounds._cuda_synchronize); see docs/contributing.md, \"Plain tests\"")


@dataclass(frozen=True, slots=True)
class Origin:
    """Where an expression's value comes from: `kind` own / stdlib / third / unknown (a fixture, a
    parameter), `path` the dotted name it resolves to, `is_module` whether that is a module, and
    `shared` whether others use it too (a module, a class, a function, an object faste-mm holds)
    rather than an object the test made by a call (its own: setting its attributes is using it)."""

    kind: str
    path: str
    is_module: bool = False
    shared: bool = False
    note: str = ""  # why a path that does not name a library is one


@dataclass(frozen=True, slots=True)
class Patch:
    """One patch in a test file that reaches outside faste-mm: where, what, and whose code."""

    file: str
    line: int
    call: str
    owner: str  # what it does to whose code

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.call} {self.owner}"


def _third_party_tops() -> frozenset[str]:
    """Top-level modules of the installed distributions (not ours, not the standard library)."""
    return frozenset(top for top in importlib.metadata.packages_distributions()
                     if top not in OWN and top not in sys.stdlib_module_names)


_THIRD_PARTY_TOPS = _third_party_tops()


def _kind(path: str) -> str:
    top = path.split(".", 1)[0]
    if top in OWN or top == "":
        return "own"
    return "stdlib" if top in sys.stdlib_module_names else "third"


# Where our dotted names live (pyproject's package-dir maps three components in from the root).
_OWN_FOLDERS = {"faste_mm.indexers": "indexers", "faste_mm.cli": "cli", "faste_mm.datasets": "datasets",
                "faste_mm": "faste_mm", "tests": "tests"}


@functools.lru_cache(maxsize=None)
def _is_module(path: str) -> bool:
    """Whether `path` names a module: ours by its file (importing faste-mm here would load torch),
    the standard library's by its spec; a library's is never looked up (its patches fail the
    check whatever they name)."""
    kind = _kind(path)
    if kind == "own":
        for package, folder in _OWN_FOLDERS.items():
            if path == package or path.startswith(package + "."):
                base = ROOT / folder / path[len(package):].lstrip(".").replace(".", "/")
                return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file() or base == ROOT / folder
        return False
    if kind == "third":
        return False
    try:
        return importlib.util.find_spec(path) is not None
    except (ImportError, ValueError):
        return False


class _Scan:
    """One pass over a file: its imports (anywhere in it), per function its `name = value`
    assignments (looked up innermost first, then the module's), and each patch with the
    functions it is in."""

    def __init__(self, tree: ast.Module) -> None:
        self.imports: dict[str, str] = {}
        self.assigned: dict[ast.AST | None, dict[str, ast.expr]] = {}
        self.patches: list[tuple[ast.AST, list[ast.AST | None]]] = []
        self._visit(tree, [None])

    def _visit(self, node: ast.AST, scopes: list[ast.AST | None]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    top = alias.name.split(".")[0]
                    self.imports[alias.asname or top] = alias.name if alias.asname else top
            elif isinstance(child, ast.ImportFrom):
                base = "tests" if child.level else (child.module or "")
                for alias in child.names:
                    self.imports[alias.asname or alias.name] = f"{base}.{alias.name}"
            elif isinstance(child, ast.Assign) and len(child.targets) == 1 and isinstance(child.targets[0], ast.Name):
                self.assigned.setdefault(scopes[0], {})[child.targets[0].id] = child.value
            if _targets(child):
                self.patches.append((child, scopes))
            is_function = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            self._visit(child, [child, *scopes] if is_function else scopes)

    def origin(self, node: ast.expr, scopes: list[ast.AST | None], depth: int = 0) -> Origin:
        if depth > 8:
            return Origin("unknown", "?")
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return Origin(_kind(node.value), node.value, _is_module(node.value), shared=True)
        if isinstance(node, ast.Name):
            for scope in scopes:
                value = self.assigned.get(scope, {}).get(node.id)
                if value is not None:
                    return self.origin(value, scopes, depth + 1)
            if node.id in self.imports:
                path = self.imports[node.id]
                return Origin(_kind(path), path, _is_module(path), shared=True)
            return Origin("unknown", node.id)
        if isinstance(node, ast.Attribute):
            base = self.origin(node.value, scopes, depth + 1)
            path = f"{base.path}.{node.attr}"
            if base.kind == "third":
                return Origin("third", path, shared=base.shared, note=base.note)
            if not base.is_module and node.attr in HELD:  # shared: faste-mm parses a processor once per process
                return Origin("third", path, shared=True, note=" (a library's object that faste-mm holds)")
            if base.kind == "own" and base.is_module and node.attr in _THIRD_PARTY_TOPS and not _is_module(path):
                return Origin("third", path, shared=True, note=" (a library module seen through faste-mm's)")
            return Origin(base.kind, path, base.is_module and _is_module(path), base.shared)
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id == "type" and len(node.args) == 1:
                of = self.origin(node.args[0], scopes, depth + 1)  # the class of an object: its owner's
                return Origin(of.kind, f"type({of.path})", shared=True, note=of.note)
            called = self.origin(node.func, scopes, depth + 1)
            return Origin(called.kind, f"{called.path}(...)")  # an object the test made
        if isinstance(node, ast.Subscript):
            return self.origin(node.value, scopes, depth + 1)
        return Origin("unknown", ast.unparse(node))


_MOCK_PATCHES = ("patch", "patch.object", "patch.dict", "patch.multiple")


def _targets(node: ast.AST) -> list[tuple[str, ast.expr | None, str | None, ast.expr | None]]:
    """(how, target, attribute or key, value) for each patch `node` makes; [] for other nodes.
    A dotted string target comes back as a Constant with attribute None."""
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        how = "del" if isinstance(node, ast.Delete) else "assignment"
        return [(how, t.value, t.attr, None) for t in targets if isinstance(t, ast.Attribute)]
    if not isinstance(node, ast.Call):
        return []
    func, args = node.func, node.args
    name = ast.unparse(func)
    if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and len(args) >= 2:
        return [(name, args[0], _text(args[1]), None)]
    if isinstance(func, ast.Attribute) and func.attr in ("setattr", "delattr") and args:
        if isinstance(args[0], ast.Constant) and isinstance(args[0].value, str) and len(args) == (2 if func.attr == "setattr" else 1):
            return [(name, args[0], None, None)]  # monkeypatch.setattr("package.module.name", value)
        return [(name, args[0], _text(args[1]) if len(args) > 1 else None, None)]
    if isinstance(func, ast.Attribute) and func.attr in ("setitem", "delitem") and len(args) >= 2:
        return [(name, args[0], _text(args[1]), args[2] if len(args) > 2 else None)]
    if any(name == patch or name.endswith("." + patch) for patch in _MOCK_PATCHES) and args:
        if name.endswith("patch") and isinstance(args[0], ast.Constant):
            return [(name, args[0], None, None)]
        return [(name, args[0], _text(args[1]) if len(args) > 1 else None, None)]
    return []


def _text(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def third_party_patches(source: str, file: str) -> list[Patch]:
    """Every patch in `source` whose target is not faste-mm's or the tests' own, nor a
    standard-library setting (a `sys.modules` entry may be set to None: "not installed"). An
    attribute assigned on a library's object that the test made itself (`frame.sample_rate = 8000`)
    is use, not a patch; monkeypatching one is a patch."""
    scan = _Scan(ast.parse(source))
    found = []
    for node, scopes in scan.patches:
        for how, target, name, value in _targets(node):
            origin = scan.origin(target, scopes)
            call = f"{how}({ast.unparse(target)}{', ' + repr(name) if name else ''})"
            patched = origin.path if name is None or origin.kind == "third" else f"{origin.path}.{name}"
            if origin.kind == "third" and (origin.shared or how not in ("assignment", "del")):
                found.append(Patch(file, node.lineno, call, f"patches third-party code: {patched}{origin.note}"))
            elif origin.kind == "stdlib" and origin.path == "sys.modules":
                if value is not None and not (isinstance(value, ast.Constant) and value.value is None):
                    found.append(Patch(file, node.lineno, call, f"puts a stand-in for the library {name!r} in sys.modules"))
            elif origin.kind == "stdlib" and origin.shared and origin.path not in STDLIB_SETTINGS and patched not in STDLIB_SETTINGS:
                found.append(Patch(file, node.lineno, call, f"patches the standard library's {patched}, which is no setting"))
    return sorted(found, key=lambda patch: patch.line)


def test_no_test_patches_a_third_party_library():
    found = [patch for path in sorted(TESTS.rglob("*.py"))
             for patch in third_party_patches(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())]
    assert not found, "\n".join(str(patch) for patch in found) + "\n" + INSTEAD


# The six patches a review found (before they were replaced), as they were written.
_FOUND_BY_REVIEW = '''
import pytest
from PIL import Image, ImageFile
from faste_mm.model.serialization import VLSerializer

def test_downscale(monkeypatch):
    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    monkeypatch.setattr(VLSerializer, "prepare_image", no_decoding)

def test_pdfium(monkeypatch):
    import pypdfium2
    monkeypatch.setattr(pypdfium2, "PdfDocument", checked)

def test_hub(monkeypatch):
    import huggingface_hub
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", lambda *a, **k: None)

@pytest.fixture()
def tokenized_lengths(vl_reranker, monkeypatch):
    tokenizer_type = type(vl_reranker.serializer.processor.tokenizer)
    monkeypatch.setattr(tokenizer_type, "__call__", recording)

def test_tails(vl_reranker, monkeypatch):
    image_processor = vl_reranker.loaded.preprocessor.image_processor
    monkeypatch.setattr(type(image_processor), "__call__", _recording(type(image_processor).__call__, []))

def test_sync(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
'''

# What stays allowed: faste-mm's and the tests' own objects, standard-library settings.
_PLAIN = '''
import os, sys, tempfile
import faste_mm
from faste_mm.bench import rounds as bench_rounds
from faste_mm.model import file_decoding as decoding
from faste_mm import Embedder

def test_own(monkeypatch, embedder, col, tmp_path):
    monkeypatch.setattr(bench_rounds, "_cuda_synchronize", lambda device: None)
    monkeypatch.setattr(decoding, "_pdfium_document", checked)
    monkeypatch.setattr(faste_mm.datasets.hub, "_data_repo_files", offline)
    monkeypatch.setattr(Embedder, "encode", counting)
    monkeypatch.setattr(type(col._index), "can_select", property(lambda self: False))
    monkeypatch.setattr(embedder, "encode", slow)
    monkeypatch.setattr("faste_mm.model.backbones.loading.read_cpu_flags", lambda: frozenset())
    monkeypatch.setattr("sys.platform", "linux")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(os.environ, "FASTE_MM_X", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    setattr(embedder, "encode_documents", counted)
    embedder.batching = None
'''


def test_the_check_finds_the_six_patches_the_review_found_and_names_file_and_line():
    found = third_party_patches(_FOUND_BY_REVIEW, "tests/probe.py")
    held = " (a library's object that faste-mm holds)"
    assert [(patch.line, patch.owner) for patch in found] == [
        (7, "patches third-party code: PIL.ImageFile.ImageFile"), (12, "patches third-party code: pypdfium2"),
        (16, "patches third-party code: huggingface_hub.HfApi"),
        (21, "patches third-party code: type(vl_reranker.serializer.processor.tokenizer)" + held),
        (25, "patches third-party code: type(vl_reranker.loaded.preprocessor.image_processor)" + held),
        (29, "patches third-party code: torch.cuda")]
    assert str(found[0]) == ("tests/probe.py:7: monkeypatch.setattr(ImageFile.ImageFile, 'load') patches "
                             "third-party code: PIL.ImageFile.ImageFile")


def test_the_check_leaves_faste_mm_objects_and_standard_library_settings_alone():
    assert third_party_patches(_PLAIN, "tests/probe.py") == []


def test_the_check_sees_mock_builtins_assignments_stand_ins_and_the_standard_library():
    source = '''
import os, sys
from unittest import mock
import transformers
import uvicorn
from faste_mm.model.backbones import loading

@mock.patch("transformers.AutoModel.from_pretrained")
def test_a(reranker):
    with mock.patch.object(transformers.AutoTokenizer, "from_pretrained"):
        setattr(reranker.serializer.tokenizer, "model_max_length", 10)
    reranker.loaded.preprocessor.image_processor.patch_size = 8
    loading.transformers.AutoConfig = None
    monkeypatch.setitem(sys.modules, "decord", object())
    monkeypatch.setattr(os, "open", opener)
    server = uvicorn.Server(config)
    server.should_exit = True
    monkeypatch.setattr(server, "run", fake_run)
'''
    lines = [patch.line for patch in third_party_patches(source, "tests/probe.py")]
    assert lines == [8, 10, 11, 12, 13, 14, 15, 18]
