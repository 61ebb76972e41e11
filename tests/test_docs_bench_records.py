"""Benchmarks as records (issue 45 item 7): every result committed in docs/bench/ is in the one
schema (`faste_mm.bench.schema.BenchResult`), older shapes live in docs/bench/archive/ beside a
README that says so, and nothing else (no scratch script) sits there. Reads files only: runs no suite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faste_mm.bench.schema import SCHEMA, BenchResult
from faste_mm.errors import ConfigError

BENCH = Path(__file__).resolve().parents[1] / "docs" / "bench"
RESULTS = sorted(BENCH.glob("*.json"))


def test_docs_bench_holds_results_and_the_archive_only():
    others = sorted(p.name for p in BENCH.iterdir() if p.suffix != ".json" and p.name != "archive")
    assert others == [], "docs/bench/ holds result JSON only; scripts and notes go elsewhere"
    assert RESULTS and (BENCH / "archive" / "README.md").is_file()
    archived = sorted(p.name for p in (BENCH / "archive").iterdir() if p.suffix == ".json")
    readme = (BENCH / "archive" / "README.md").read_text(encoding="utf-8")
    assert [name for name in archived if name not in readme] == [], "the archive's README names each file"


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_every_committed_result_is_in_the_one_schema(path):
    data = json.loads(path.read_text(encoding="utf-8"))
    result = BenchResult.from_dict(data, where=path.name)
    assert result.to_dict() == {**data, "load_start": tuple(data["load_start"]), "load_end": tuple(data["load_end"])}


def _valid() -> dict:
    return {"suite": "search", "commit": "abc-dirty", "command": "faste-mm bench search", "started_at": "2026-11-28T12:00:00Z",
            "wall_s": 1.5, "device": None, "cpu": "x", "cores": 2, "cpu_flags": {"avx2": True}, "dtype": None,
            "torch": None, "threads": None, "load_start": [0.1, 0.2, 0.3], "load_end": [1, 2, 3], "params": {},
            "machine": {}, "rows": [{"a": 1}], "schema": SCHEMA}


@pytest.mark.parametrize("change, needle", [
    ({"cores": "2"}, "'cores'"), ({"load_end": [1, 2]}, "'load_end'"), ({"rows": [1]}, "'rows'"),
    ({"cpu_flags": {"avx2": "yes"}}, "'cpu_flags'"), ({"schema": "faste-mm-bench/0"}, "expected"),
    ({"wall_s": True}, "'wall_s'"), ({"extra": 1}, "unknown \\['extra'\\]"),
])
def test_a_result_off_the_schema_is_refused_naming_the_field(change, needle):
    assert BenchResult.from_dict(_valid()).rows == [{"a": 1}]
    with pytest.raises(ConfigError, match=f"r.json: .*{needle}"):
        BenchResult.from_dict({**_valid(), **change}, where="r.json")
    with pytest.raises(ConfigError, match="missing \\['suite'\\].*archive"):
        BenchResult.from_dict({k: v for k, v in _valid().items() if k != "suite"}, where="r.json")
