"""The layering of docs/architecture.md, checked on the installed package: which layer may import
which (function-level imports count), no import cycles anywhere, and a start-up that loads no
torch, transformers or FAISS for `import faste_mm` and the CLI's cheap commands."""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

import faste_mm

from tests.helpers.bounds import HANG_S

HEAVY = ("torch", "transformers", "faiss")


def _modules() -> dict[str, Path]:
    """Every module of the installed faste_mm package (wherever package-dir maps it) -> its file."""
    found: dict[str, Path] = {}
    # pyproject maps the component folders in by package-dir, so they are not below faste_mm/
    pending = ["faste_mm", "faste_mm.indexers", "faste_mm.cli", "faste_mm.datasets"]
    while pending:
        name = pending.pop()
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        found[name] = Path(spec.origin)
        for location in spec.submodule_search_locations or ():
            for path in sorted(Path(location).iterdir()):
                if path.is_dir() and (path / "__init__.py").exists():
                    pending.append(f"{name}.{path.name}")
                elif path.suffix == ".py" and path.name != "__init__.py":
                    found[f"{name}.{path.stem}"] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, module: str, known: set[str]) -> set[str]:
    """faste_mm modules imported anywhere in the file (top level or inside functions), resolved to
    the deepest known module; `if TYPE_CHECKING:` blocks are skipped (never executed)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets: set[str] = set()

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                targets.add(resolve(alias.name))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.add(full if full in known else resolve(base))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {t for t in targets if t is not None and t.startswith("faste_mm") and t != module}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, set(modules)) for name, path in modules.items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_package_walk_sees_every_layer(graph):
    layers = {_layer(m) for m in graph}
    assert {"model", "retrieval", "tools", "integrations", "indexers", "datasets", "cli", "errors", "testing"} <= layers
    assert "faste_mm.model.faste" in graph and "faste_mm.indexers.derived_index" in graph


@pytest.mark.parametrize(
    "layer, forbidden",
    [
        ("model", {"retrieval", "tools", "integrations", "indexers", "datasets", "cli", "testing", "scale"}),
        ("indexers", {"model", "retrieval", "tools", "integrations", "datasets", "cli", "testing", "scale"}),
        ("retrieval", {"tools", "integrations", "datasets", "cli", "testing", "scale"}),
        ("scale", {"tools", "integrations", "datasets", "cli", "testing"}),
        ("tools", {"integrations", "cli", "testing"}),
        ("datasets", {"tools", "integrations", "cli", "testing"}),
        ("serving", {"tools", "integrations", "datasets", "cli", "testing"}),
        ("errors", {"model", "retrieval", "tools", "integrations", "indexers", "datasets", "cli", "testing"}),
    ],
)
def test_imports_point_one_way(graph, layer, forbidden):
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if _layer(module) == layer
        for target in targets
        if _layer(target) in forbidden
    )
    assert wrong == []


def test_no_library_layer_imports_the_bench_tool(graph):
    """faste_mm.bench is a front end like the CLI (issue 34): it may use every layer, none uses it
    (the CLI registers its suites); only its `python -m` entry calls the CLI app."""
    library = {"model", "indexers", "retrieval", "scale", "tools", "datasets", "serving", "errors", "integrations"}
    wrong = sorted(f"{module} -> {target}" for module, targets in graph.items() if _layer(module) in library
                   for target in targets if _layer(target) == "bench")
    assert wrong == []
    assert sorted(f"{module} -> {target}" for module, targets in graph.items() if _layer(module) == "bench"
                  for target in targets if _layer(target) == "cli") == ["faste_mm.bench.__main__ -> faste_mm.cli.bench"]


def test_the_embedding_core_never_imports_the_reranker_wing(graph):
    """faste_mm.model is the embedding core; faste_mm.model.rerank builds on it, never the reverse."""
    wing = "faste_mm.model.rerank"
    in_wing = lambda module: module == wing or module.startswith(wing + ".")  # noqa: E731
    assert any(in_wing(m) for m in graph) and "faste_mm.model.rerank.reranker" in graph
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if _layer(module) == "model" and not in_wing(module)
        for target in targets
        if in_wing(target)
    )
    assert wrong == []


def _in_package(package: str):
    return lambda module: module == package or module.startswith(package + ".")


def test_the_cpu_wing_is_the_floor_under_the_embedding_core(graph):
    """faste_mm.model.cpu (machine facts, machine plan, kernel choices, decoder kernels, int8) is
    what the core asks about the CPU: it imports nothing of faste_mm but `errors` and itself, so
    the core, the bench suites and the CLI's option words can all stand on it."""
    in_wing = _in_package("faste_mm.model.cpu")
    assert {"faste_mm.model.cpu.machine", "faste_mm.model.cpu.machine_plan", "faste_mm.model.cpu.kernel_choice",
            "faste_mm.model.cpu.decoder_kernels", "faste_mm.model.cpu.int8"} <= set(graph)
    wrong = sorted(f"{module} -> {target}" for module, targets in graph.items() if in_wing(module)
                   for target in targets if not in_wing(target) and target != "faste_mm.errors")
    assert wrong == []


# What the photo-library wing may import of retrieval (its floor, beside ingest), and the modules
# of it a front end may import (its documented entry points; faste_mm/retrieval/library/__init__.py).
LIBRARY_FLOOR = {"faste_mm.retrieval.lexical", "faste_mm.retrieval.stored_files", "faste_mm.retrieval.results",
                 "faste_mm.retrieval.scanning"}
LIBRARY_ENTRY_POINTS = {"faste_mm.retrieval.library.duplicates", "faste_mm.retrieval.library.watching",
                        "faste_mm.retrieval.library.watch_status", "faste_mm.retrieval.library.albums"}


def test_the_photo_library_wing_has_its_floor_and_its_doors(graph):
    """faste_mm.retrieval.library (facts, places, OCR, duplicates, folder sync): nothing below
    retrieval imports it; it imports of retrieval only `LIBRARY_FLOOR` (never the ingest, indexing
    or Retriever modules that ask it); the front ends reach it only through its entry points (the
    bench measures its parts, as it measures the core's)."""
    in_wing = _in_package("faste_mm.retrieval.library")
    assert {"faste_mm.retrieval.library.photo_metadata", "faste_mm.retrieval.library.ocr",
            "faste_mm.retrieval.library.near_pairs"} | LIBRARY_ENTRY_POINTS <= set(graph)
    edges = [(module, target) for module, targets in graph.items() for target in targets]
    below = {"model", "indexers", "errors", "kinds"}
    assert sorted(f"{m} -> {t}" for m, t in edges if _layer(m) in below and in_wing(t)) == []
    assert sorted(f"{m} -> {t}" for m, t in edges if in_wing(m) and _layer(t) == "retrieval"
                  and not in_wing(t) and t not in LIBRARY_FLOOR) == []
    front_ends = {"cli", "serving", "integrations", "scale", "tools", "datasets"}
    assert sorted(f"{m} -> {t}" for m, t in edges if _layer(m) in front_ends and in_wing(t)
                  and t not in LIBRARY_ENTRY_POINTS) == []


def test_no_import_cycles(graph):
    """Tarjan's strongly connected components over every import edge: each must be one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    assert cycles == []


def _fresh_python(code: str) -> list[str]:
    """Heavy modules loaded after running `code` in a new interpreter (nothing cached)."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "80"},
                         timeout=HANG_S)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_faste_mm_and_the_cli_app_load_nothing_heavy():
    assert _fresh_python("import faste_mm, faste_mm.cli.app") == []


def test_public_names_resolve_lazily_to_their_modules():
    assert faste_mm.Embedder.__module__ == "faste_mm.model.embedder"
    assert faste_mm.FastEConfig.__module__ == "faste_mm.model.faste"
    assert faste_mm.Retriever.__module__ == "faste_mm.retrieval.retriever"
    assert set(faste_mm.__all__) <= set(dir(faste_mm))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        faste_mm.Nope  # noqa: B018


@pytest.mark.parametrize(
    "argv, allowed",
    [
        (["--help"], ()),
        (["--version"], ()),
        (["search", "--help"], ()),
        (["info", "-c", "{tmp}/none"], ("faiss",)),
        (["remove", "x", "-c", "{tmp}/none"], ("faiss",)),
        (["compact", "-c", "{tmp}/none"], ("faiss",)),
    ],
)
def test_cheap_commands_never_import_torch_or_transformers(tmp_path, argv, allowed):
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    code = (
        "import sys\nfrom faste_mm.cli.app import app\n"
        f"try:\n    app({argv!r})\nexcept SystemExit:\n    pass"
    )
    assert [m for m in _fresh_python(code) if m not in allowed] == []


def test_the_walk_counts_function_level_and_relative_imports_but_not_type_checking(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from faste_mm.tools import bench\n"
        "def later():\n    from faste_mm.model.faste import FastEConfig\n"
        "from . import results\n"
    )
    known = {"faste_mm.model.faste", "faste_mm.tools.bench", "faste_mm.retrieval.results", "faste_mm.retrieval.probe"}
    assert _imports(source, "faste_mm.retrieval.probe", known) == {"faste_mm.model.faste", "faste_mm.retrieval.results"}


# ---- one place per fact: a collection's settings, the input kinds --------------------------
# Reading a collection's settings other than through `faste_mm.retrieval.profile` (the manifest
# file, the Manifest class, or a setting off `col.manifest`): how front ends drifted apart.
_MANIFEST_NAMES = {"read_manifest", "Manifest", "MANIFEST_NAME"}
_SETTING_OFF_MANIFEST = re.compile(
    r"\bmanifest\s*\.\s*(model_id|model_revision|model_dim|document_instruction|min_pixels|max_pixels|video|"
    r"fast_e|r_max|is_matryoshka)\b")


def _code_and_strings(path: Path) -> tuple[str, list[str], set[str]]:
    """The file's code with strings and comments blanked, its string literals, its names."""
    code, strings, names = [], [], set()
    for token in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if token.type == tokenize.STRING:
            try:
                strings.append(ast.literal_eval(token.string))
            except (ValueError, SyntaxError):  # f-strings: their text is no setting read
                pass
            code.append('""')
        elif token.type != tokenize.COMMENT:
            code.append(token.string)
            if token.type == tokenize.NAME:
                names.add(token.string)
    return " ".join(code), [s for s in strings if isinstance(s, str)], names


_STORAGE_BENCH_SUITES = {"faste_mm.bench.scale", "faste_mm.bench.search", "faste_mm.bench.startup"}


def test_front_ends_read_collection_settings_only_through_the_profile():
    wrong = []
    for module, path in sorted(_modules().items()):
        if _layer(module) == "indexers" or module == "faste_mm.retrieval.profile":
            continue
        code, strings, names = _code_and_strings(path)
        if module in _STORAGE_BENCH_SUITES:  # they make raw collections of random vectors (a Manifest, no model)
            names = names - {"Manifest"}
        wrong += [f"{module}: {name}" for name in sorted(names & _MANIFEST_NAMES)]
        wrong += [f"{module}: .manifest.{m.group(1)}" for m in _SETTING_OFF_MANIFEST.finditer(code)]
        wrong += [f"{module}: 'manifest.json'" for s in strings if s == "manifest.json"]
    assert wrong == []


def test_the_kinds_table_is_the_only_place_suffixes_are_listed():
    from faste_mm.kinds import KINDS

    suffixes = {suffix for kind in KINDS.values() for suffix in kind.suffixes}
    wrong = []
    for module, path in sorted(_modules().items()):
        if module == "faste_mm.kinds":
            continue
        _, strings, _ = _code_and_strings(path)
        wrong += [f"{module}: {s!r}" for s in strings if s.lower() in suffixes]
    assert wrong == []


def test_the_rule_checks_see_settings_reads_and_suffixes(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('x = col.manifest.fast_e  # a comment: manifest.video\ny = "manifest.json"\n'
                     'z = {".mp4"}\nfrom faste_mm.indexers.manifest import read_manifest\n')
    code, strings, names = _code_and_strings(probe)
    assert [m.group(1) for m in _SETTING_OFF_MANIFEST.finditer(code)] == ["fast_e"]
    assert "manifest.json" in strings and ".mp4" in strings and "read_manifest" in names


# ---- smaller rooms (issue 22): a module reads in one sitting ---------------------------------
MAX_MODULE_LINES = 450
_SIZE_NOTE = re.compile(r"^# Size: \S")


def _oversized(path: Path) -> str | None:
    """Why `path` breaks the size rule (None when it keeps it): more than MAX_MODULE_LINES lines
    and no line starting with "# Size:" (the reason it is bigger) among its first 15."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if len(lines) <= MAX_MODULE_LINES or any(_SIZE_NOTE.match(line) for line in lines[:15]):
        return None
    return f"{path.name}: {len(lines)} lines and no '# Size:' reason in its first 15 lines"


def test_every_module_is_at_most_450_lines_unless_its_top_says_why():
    wrong = [f"{module}: {reason}" for module, path in sorted(_modules().items())
             if (reason := _oversized(path)) is not None]
    assert wrong == []


def test_the_size_rule_sees_long_modules_and_their_reasons(tmp_path):
    long = tmp_path / "long.py"
    long.write_text('"""A module."""\n' + "x = 1\n" * MAX_MODULE_LINES)
    assert _oversized(long) is not None
    long.write_text('"""A module."""\n# Size: one straight loop, split it and it reads worse\n' + "x = 1\n" * MAX_MODULE_LINES)
    assert _oversized(long) is None
    late = tmp_path / "late.py"
    late.write_text("x = 1\n" * 15 + "# Size: too late to count\n" + "x = 1\n" * MAX_MODULE_LINES)
    assert _oversized(late) is not None
    short = tmp_path / "short.py"
    short.write_text("x = 1\n" * MAX_MODULE_LINES)
    assert _oversized(short) is None


# The facades' sizes (every `def` in the class body) after the round that shrank them: Retriever
# 44 -> 37, Collection 57 -> 46, ServeEngine 29 -> 24. A ratchet, not a target: a new method
# replaces one, or the work goes to a collaborator (collection_settings.RetrieverSettings,
# rerank_hits.RerankerChoice, serving.reindex_watch.ServedReads, ...); lower the number when one shrinks.
FACADE_METHODS = {("faste_mm/retrieval/retriever.py", "Retriever"): 37, ("indexers/collection.py", "Collection"): 46,
                  ("faste_mm/serving/engine.py", "ServeEngine"): 24}


@pytest.mark.parametrize("path, name", list(FACADE_METHODS))
def test_the_facades_do_not_grow(path, name):
    tree = ast.parse((Path(faste_mm.__file__).parents[1] / path).read_text(encoding="utf-8"))
    body = next(node.body for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == name)
    methods = [node.name for node in body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert len(methods) <= FACADE_METHODS[path, name], \
        f"{name} has {len(methods)} methods, past {FACADE_METHODS[path, name]}: move the new work into a collaborator"
