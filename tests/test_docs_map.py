"""The map cannot drift and the project stands alone (issue 45 item 5): docs/architecture.md's
module table names every module of the tree and nothing that is gone, and its table of the files
outside the packages every script, tool and CI file; README.md and docs/*.md have no dead relative
link or anchor and no untagged code block (which the docs-blocks test would not see), and every
script, `python -m` module and `faste-mm bench` suite and option they name exists; no file of the
repository cites a document outside it, an unnamed paper included."""

from __future__ import annotations

import importlib.util
import re
import shlex
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


def _first_column(text: str, heading: str) -> list[str]:
    """The code spans of the first column of the table under `## heading`."""
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    return [code for line in section.splitlines() if line.startswith("|") and not line.startswith("|---")
            for code in re.findall(r"`([^`]+)`", line.split("|")[1])]


def module_table(text: str) -> list[str]:
    """The paths the first column of the "Modules, one line each" table names, from the repository root."""
    return [_repository_path(path) for code in _first_column(text, "Modules, one line each") for path in _expand(code)]


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


# Folders of files that are not modules but that a contributor meets: each file has its line.
_OUTSIDE_FOLDERS = ("scripts", "docs/tools", ".ci")


def outside_table(text: str) -> list[str]:
    """The paths the first column of the "Files outside the packages" table names."""
    return _first_column(text, "Files outside the packages")


def test_the_outside_table_lists_every_script_tool_and_ci_file_and_nothing_that_is_gone():
    listed = outside_table(ARCHITECTURE.read_text(encoding="utf-8"))
    assert [entry for entry in listed if not (ROOT / entry).exists()] == [], "docs/architecture.md lists files that are gone"
    present = {path.relative_to(ROOT).as_posix() for path in _tracked_files()
               if path.relative_to(ROOT).as_posix().startswith(tuple(f"{folder}/" for folder in _OUTSIDE_FOLDERS))}
    missing = sorted(present - set(listed))
    assert missing == [], "docs/architecture.md's \"Files outside the packages\" lacks these files (one line each)"


def test_the_outside_table_reader_takes_the_first_column_of_its_section_only():
    text = ("## Files outside the packages\n\n| file | what |\n|---|---|\n| `.ci/run` | CI (`not/this`) |\n"
            "| `scripts/a.sh`, `docs/tools/b.py` | x |\n\n## Next\n| `c.py` | no |\n")
    assert outside_table(text) == [".ci/run", "scripts/a.sh", "docs/tools/b.py"]


# ---- links and code blocks ----------------------------------------------------------------
def _documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


# A backtick fence's info string holds no backtick (```` ```bash ```` in prose is inline code).
_FENCE = re.compile(r"^\s*(`{3,}(?!.*`)|~{3,})(.*)$")
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


# ---- commands the docs name ----------------------------------------------------------------
def code_pieces(text: str) -> list[tuple[int, str]]:
    """(line, code) for each piece of code in a markdown text: each line of a fenced block with its
    backslash continuations joined, and each inline code span (which may cross a line break).
    The `was` column of a `| was | now |` table (retired names, kept as history) is left out."""
    pieces, prose, fence, pending, start, retired = [], [], None, "", 0, False
    for number, line in enumerate(text.splitlines(), 1):
        opening = _FENCE.match(line)
        if fence is None and opening:
            fence = opening[1]
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is not None and line.rstrip().endswith("\\"):
            start, pending = start or number, pending + line.rstrip()[:-1] + " "
        elif fence is not None:
            pieces.append((start or number, pending + line))
            start, pending = 0, ""
        else:
            retired = re.match(r"^\|\s*was\s*\|\s*now\s*\|", line) is not None or (retired and line.startswith("|"))
            prose.append((number, "|" + line.split("|", 2)[2] if retired and line.count("|") > 2 else line))
    joined = "\n".join(line for _, line in prose)
    starts = [0]
    for _, line in prose:
        starts.append(starts[-1] + len(line) + 1)
    for span in re.finditer(r"`([^`]+)`", joined):
        row = sum(1 for offset in starts[1:] if offset <= span.start())
        pieces.append((prose[row][0], span[1].replace("\n", " ")))
    return sorted(pieces, key=lambda piece: piece[0])


def shell_words(command: str) -> list[str]:
    """The words of a command line up to its first shell operator or comment, quotes honoured;
    [] for a fragment with an unbalanced quote (prose, not a command)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = []
    try:
        for word in lexer:
            if set(word) <= set("|&;<>()"):
                break
            words.append(word)
    except ValueError:
        return []
    return words


def bench_arguments_problems(suite: str, words: list[str]) -> list[str]:
    """What `faste-mm bench SUITE words` would refuse: an unknown option or a stray argument
    (`...` and `[...]` stand for elided words)."""
    from faste_mm.bench.entry import parser_for

    actions = parser_for(suite, f"faste-mm bench {suite}")._option_string_actions
    problems, index = [], 0
    while index < len(words):
        word = words[index]
        index += 1
        if word == "..." or word.startswith("["):
            continue
        name, has_value, _ = word.partition("=")
        action = actions.get(name) if word.startswith("-") else None
        if not word.startswith("-"):
            problems.append(f"bench {suite}: stray {word!r}")
        elif action is None:
            problems.append(f"bench {suite}: no option {name}")
            while index < len(words) and not words[index].startswith("-"):  # its values
                index += 1
        elif not has_value and action.nargs in (None, 1):
            index += 1
        elif not has_value and action.nargs != 0:  # '?', '*', '+': the values up to the next option
            while index < len(words) and not words[index].startswith("-"):
                index += 1
    return problems


_PLACEHOLDER = re.compile(r"^\[?[A-Z][A-Z_]*\]?$|^\.\.\.$")


def command_problems(text: str) -> list[str]:
    """Commands a document names that do not exist: a script under scripts/, docs/tools/ or .ci/,
    a `python -m` module, a `faste-mm bench` suite or one of its options."""
    from faste_mm.bench import SUITES

    problems = []
    for line, code in code_pieces(text):
        for path in re.findall(r"(?<![\w/.~-])((?:scripts|docs/tools|\.ci)/[\w.-]*\w)", code):
            if not (ROOT / path).exists():
                problems.append(f"{line}: no file {path}")
        for module in re.findall(r"\bpython3? -m ([\w.]+)", code):
            if importlib.util.find_spec(module) is None:
                problems.append(f"{line}: no module {module}")
        for rest in re.findall(r"\bfaste-mm bench\b(.*)", code):
            words = shell_words(rest)
            if not words or _PLACEHOLDER.match(words[0]):
                continue
            if words[0] in SUITES or words[0].startswith("-"):
                suite, arguments = (words[0], words[1:]) if words[0] in SUITES else ("model", words)
                problems += [f"{line}: {problem}" for problem in bench_arguments_problems(suite, arguments)]
            else:
                problems.append(f"{line}: no bench suite {words[0]!r}")
    return problems


@pytest.mark.parametrize("path", _documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_script_module_and_bench_option_the_docs_name_exists(path):
    """A command the reader copies runs: renamed scripts and suites are listed in benchmarks-log.md's
    `| was | now |` table, not left in commands."""
    assert command_problems(path.read_text(encoding="utf-8")) == []


def test_the_command_check_sees_gone_scripts_modules_suites_and_options():
    text = ("Run `python scripts/gone.py` or\n`bash scripts/gpu_bench.sh quick`.\n\n"
            "```bash\nfaste-mm bench pdf-memory --pages 1 100 \\\n    --nope 3   # a comment --also-not-checked\n"
            "python -m faste_mm.no_such_module\nfaste-mm bench warp-speed --n 1\nfaste-mm bench --r-max 0.5 extra\n"
            "faste-mm bench rerank --drop '^FastE r=0\\.5 (fixed|protect)' --top 20\nfaste-mm bench SUITE [OPTIONS]\n```\n\n"
            "| was | now |\n|---|---|\n| `python scripts/bench_old.py` | `faste-mm bench pixels --n 1` |\n"
            "| `python scripts/bench_old2.py` | `faste-mm bench pixels --bad` |\n")
    assert command_problems(text) == ["1: no file scripts/gone.py", "5: bench pdf-memory: no option --nope",
                                      "7: no module faste_mm.no_such_module", "8: no bench suite 'warp-speed'",
                                      "9: bench model: stray 'extra'", "17: bench pixels: no option --bad"]


# ---- a project that stands alone ----------------------------------------------------------
# Documents that live outside the repository (the files the project was first specified in).
_OUTSIDE = re.compile(r"\b(DESIGN|STYLE)\.md\b|\.\./shared/|/work/shared")
# "The paper" as a source: a document the repository neither holds nor names. What the code
# needs of the method is docs/design.md's ("FastE, the method"); its reference figures are
# docs/evaluation.md's. Paper as material (a paper page, receipts, "paper-2col") is not a citation.
_UNNAMED_PAPER = re.compile(
    r"\bpaper's\b"  # the paper's table, the paper's order
    r"|\b(?:the|this|our|FastE)\s+paper\b(?![\s-]+(?:pages?|receipts?|documents?|sizes?|form)\b)"
    r"|\(paper\b"  # (paper Eq. 2), (paper, "Backbone-Specific Settings")
    r"|\bpaper[ -](?:eq\b|equations?|appendix|symbols?|notation|order|style|table|quantities)"
    r"|\b(?:the|paper)\s+appendix\b",
    re.IGNORECASE)


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
        wrong += [f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}: {m[0]}"
                  for pattern in (_OUTSIDE, _UNNAMED_PAPER) for m in pattern.finditer(text)]
    assert wrong == [], ("cite the repository's own docs instead: the method and its symbols are docs/design.md's "
                         "\"FastE, the method\", reference figures docs/evaluation.md's, the code style docs/contributing.md's")


@pytest.mark.parametrize("text, cites", [
    ("Algorithm 1 of the paper", True), ("the paper's cross-modal table", True), ("(paper Eq. 2)", True),
    ('(paper, "Backbone-Specific Settings")', True), ("FLOPs follow the paper appendix", True),
    ("the appendix formula", True), ("Paper quantities keep their names", True), ("the FastE paper", True),
    ("results.md (the paper-style table)", True), ("in the paper order", True),
    ("a two-column paper page", False), ("~/papers/report.pdf", False), ("--kinds text-page,paper-2col", False),
    ("paper_table(results)", False), ("100 MiB on paper", False), ("scan the paper receipts", False),
    ("Algorithm 1 in docs/design.md", False),
])
def test_an_unnamed_paper_citation_is_told_from_paper_the_material(text, cites):
    assert (_UNNAMED_PAPER.search(text) is not None) == cites
