"""Folder scanning (kinds, hidden files, --exclude, named vs walked files) over the generated
corpus of tests/helpers/inputs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from faste_mm.errors import ConfigError, InputError
from faste_mm.retrieval.scanning import ScanFilter, file_kind, scan_paths

from tests.helpers.inputs import CORPUS_FILES, make_corpus


# ---- scanning tests (no model) ---------------------------------------------------------------
def _names(scan, root: Path) -> list[str]:
    return sorted(Path(f.uri).relative_to(root.resolve()).as_posix() for f in scan.files())


def test_walk_selects_supported_files_and_skips_hidden_and_unsupported(tmp_path):
    root = make_corpus(tmp_path / "corpus")
    scan = scan_paths([root])
    assert _names(scan, root) == ["corrupt.png", "doc.pdf", "empty.jpg", "gray.jpg", "green_rgba.png",
                                  "notes.txt", "red.png", "sub/copy_of_red.png", "sub/small.bmp", "sub/wide.webp"]
    assert len(scan.files()) == CORPUS_FILES
    assert scan.roots[0][0] == str(root.resolve()) and not scan.named and not scan.missing
    assert {f.kind for f in scan.files()} == {"image", "pdf", "text"}
    with_hidden = scan_paths([root], ScanFilter(include_hidden=True))
    assert "secret.png" in {Path(f.uri).name for f in with_hidden.files()}


def test_exclude_globs_match_names_folders_and_relative_paths(tmp_path):
    root = make_corpus(tmp_path / "corpus")
    assert not any(n.endswith(".png") for n in _names(scan_paths([root], ScanFilter(exclude=("*.png",))), root))
    assert not any(n.startswith("sub/") for n in _names(scan_paths([root], ScanFilter(exclude=("sub",))), root))
    assert _names(scan_paths([root], ScanFilter(exclude=("sub/*.bmp",))), root).count("sub/small.bmp") == 0


def test_named_files_keep_unsupported_kinds_and_report_missing_paths(tmp_path):
    root = make_corpus(tmp_path / "corpus")
    scan = scan_paths([root / "readme.docx", root / "red.png", root / "nope.png"])
    assert [(f.path.name, f.kind) for f in scan.named] == [("readme.docx", "unsupported"), ("red.png", "image")]
    assert len(scan.missing) == 1 and "nope.png" in scan.missing[0][1] and "not found" in scan.missing[0][1]


def test_scan_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="exclude"):
        ScanFilter(exclude="*.png")
    with pytest.raises(InputError, match="no paths"):
        scan_paths([])
    assert file_kind(Path("A.JPEG")) == "image" and file_kind(Path("x.md")) == "text"
