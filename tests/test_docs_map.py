"""The map cannot drift and the project stands alone (issue 45 item 5): docs/architecture.md's
module table names every module of the tree and nothing that is gone; README.md and docs/*.md
have no dead relative link or anchor and no untagged code block (which the docs-blocks test
would not see); no file of the repository cites a document outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# Where a table path starts -> the folder it names (faste_mm's sub-packages by their short name;
# the components pyproject maps in by package-dir by their own folder).
_SHORT = ("model", "retrieval", "tools", "integrations", "scale", "serving", "bench")
_COMPONENTS = ("indexers", "cli", "datasets")


# ---- the module table ---------------------------------------------------------------------
def _source_modules() -> set[str]:
    """Every Python module of the package, as a path relative to the repository root; package
    `__init__.py` and `__main__.py` files (lazy re-exports, maps, entry points) are not listed."""
    found = set()
    for top in ("faste_mm", *_COMPONENTS):
        for path in (ROOT / top).rglob("*.py"):
            if path.name not in ("__init__.py", "__main__.py"):
                found.add(path.relative_to(ROOT).as_posix())
    return found


def _expand(entry: str) -> list[str]:
    """`bench/{a,b}.py` -> [`bench/a.py`, `bench/b.py`]; other entries as they are."""
    braces = re.search(r"\{([^}]*)\}", entry)
    if braces is None:
        return [entry]
    return [out for part in braces[1].split(",") for out in _expand(entry[:braces.start()] + part + entry[braces.end():])]


def _repository_path(entry: str) -> str:
    """A table entry as a path from the repository root (`model/faste.py` -> faste_mm/model/faste.py)."""
    first = entry.split("/", 1)[0]
    return f"faste_mm/{entry}" if first in _SHORT else entry


def module_table(text: str) -> list[str]:
    """The paths the first column of the "Modules, one line each" table names, from the repository root."""
    section = text.split("## Modules, one line each", 1)[1].split("\n## ", 1)[0]
    entries = []
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            first_cell = line.split("|")[1]
            entries += [_repository_path(path) for code in re.findall(r"`([^`]+)`", first_cell) for path in _expand(code)]
    return entries


def _covered(entries: list[str]) -> tuple[set[str], list[str]]:
    """(modules the entries name, entries that name nothing in the tree)."""
    modules, dead = set(), []
    for entry in entries:
        matches = sorted(ROOT.glob(entry)) if "*" in entry else [ROOT / entry] if (ROOT / entry).exists() else []
        if not matches:
            dead.append(entry)
        modules |= {m.relative_to(ROOT).as_posix() for m in matches if m.suffix == ".py"}
    return modules, dead


def test_the_module_table_lists_every_module_and_nothing_that_is_gone():
    listed, dead = _covered(module_table(ARCHITECTURE.read_text(encoding="utf-8")))
    assert dead == [], "docs/architecture.md lists modules that no longer exist"
    missing = sorted(_source_modules() - listed)
    assert missing == [], "docs/architecture.md's module table lacks these modules (one line each)"


def test_the_table_reader_expands_braces_and_maps_short_paths(tmp_path):
    text = ("## Modules, one line each\n\n| module | what |\n|---|---|\n"
            "| `bench/{peers,pixels}.py`, `indexers/store.py` | x |\n| `faste_mm/errors.py` | y |\n\n## Next\n| `z.py` | no |\n")
    assert module_table(text) == ["faste_mm/bench/peers.py", "faste_mm/bench/pixels.py", "indexers/store.py",
                                  "faste_mm/errors.py"]
    assert _covered(["faste_mm/errors.py", "model/gone.py"]) == ({"faste_mm/errors.py"}, ["model/gone.py"])


# ---- links and code blocks ----------------------------------------------------------------
def _documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


_FENCE = re.compile(r"^\s*(```+|~~~+)(.*)$")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(text: str, inline_code: bool = False) -> str:
    """`text` without its fenced code blocks, and without inline code unless `inline_code` (links
    there are not links)."""
    out, fence = [], None
    for line in text.splitlines():
        opening = _FENCE.match(line)
        if fence is None and opening:
            fence = opening[1]
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        out.append(line if inline_code else re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def anchors(text: str) -> set[str]:
    """The GitHub anchors of a markdown file's headings (lower case, punctuation dropped, spaces
    to hyphens, repeats numbered)."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(text, inline_code=True).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading[1].replace("`", "").lower()).replace(" ", "-")
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def dead_links(path: Path) -> list[str]:
    """Relative links of `path` whose file, or whose #anchor in that file, does not exist."""
    text = path.read_text(encoding="utf-8")
    dead = []
    for target in _LINK.findall(_prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...: not checked (no network)
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            dead.append(f"{path.name}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text(encoding="utf-8")):
            dead.append(f"{path.name}: {target} (no such heading in {linked.name})")
    return dead


@pytest.mark.parametrize("path", _documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_and_anchors_resolve(path):
    assert dead_links(path) == []


def untagged_blocks(path: Path) -> list[int]:
    """Lines of opening fences without a language tag."""
    lines, fence = [], None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        opening = _FENCE.match(line)
        if fence is None and opening:
            fence = opening[1]
            if not opening[2].strip():
                lines.append(number)
        elif fence is not None and line.strip().startswith(fence):
            fence = None
    return lines


@pytest.mark.parametrize("path", _documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_code_block_has_a_language_tag(path):
    """An untagged block escapes tests/test_docs_blocks.py; `text` marks one that is not code."""
    assert untagged_blocks(path) == []


def test_the_link_check_sees_dead_files_and_anchors_but_not_code(tmp_path):
    (tmp_path / "other.md").write_text("# A `code` Heading!\n\n## Twice\n\n## Twice\n", encoding="utf-8")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](other.md#a-code-heading) [ok2](other.md#twice-1) [bad](gone.md) [bad2](other.md#nope)\n"
                   "[self](#local) [web](https://example.org/x)\n\n# Local\n\n```text\n[in code](gone.md)\n```\n\n"
                   "```\nuntagged\n```\n", encoding="utf-8")
    assert dead_links(doc) == ["doc.md: gone.md (no such file)", "doc.md: other.md#nope (no such heading in other.md)"]
    assert untagged_blocks(doc) == [10]


# ---- a project that stands alone ----------------------------------------------------------
# Documents that live outside the repository (the files the project was first specified in).
_OUTSIDE = re.compile(r"\b(DESIGN|STYLE)\.md\b|\.\./shared/|/work/shared")


def _tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def test_no_file_cites_a_document_outside_the_repository():
    here = Path(__file__).resolve()
    wrong = []
    for path in _tracked_files():
        if path == here:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):  # images, binaries
            continue
        wrong += [f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}: {m[0]}" for m in _OUTSIDE.finditer(text)]
    assert wrong == [], "cite the repository's own docs (docs/design.md, docs/contributing.md) instead"
