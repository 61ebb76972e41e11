"""Crash safety: a writer SIGKILLed at any step of a write leaves a consistent collection on reopen.

The writer stores vectors without a model (numpy), and stops itself at named crash points
(FASTE_MM_CRASH_AT=NAME#N: the Nth time it reaches NAME), so each kill lands mid-run at a known
step whatever the machine's load: no polling, no timing."""

from __future__ import annotations

import os
import signal
import sqlite3
import textwrap

import numpy as np

from faste_mm.indexers import Collection
from faste_mm.indexers.crash_points import CRASH_ENV
from tests.helpers.warm_process import run_python

D = 24
N_ITEMS = 3000
BATCH = 25

# The writer derives each vector from its item number, so the test can check every stored row
# against the vector it must hold. It skips items already present, like an incremental re-index,
# tombstones every 7th batch's first item, and saves index.faiss every 5 batches so the kill can
# also land during an index save.
WRITER = textwrap.dedent(f"""
    import sys
    import numpy as np
    from faste_mm.indexers import Collection, FileStat, ItemRecord, Manifest

    def vector(i):
        v = np.random.default_rng(i).standard_normal({D}).astype(np.float32)
        return v / np.linalg.norm(v)

    root = sys.argv[1]
    with Collection.create(root, Manifest(model_id="m", dim={D}), exist_ok=True) as col:
        files = [FileStat(f"item-{{i}}", 0, 0.0) for i in range({N_ITEMS})]
        todo = [int(f.uri.split("-")[1]) for f in col.plan_scan(files).new]
        for b, start in enumerate(range(0, len(todo), {BATCH})):
            chunk = todo[start:start + {BATCH}]
            ids = col.add(np.stack([vector(i) for i in chunk]),
                          [ItemRecord(uri=f"item-{{i}}", modality="text") for i in chunk])
            if b % 7 == 3:
                col.delete(ids[:1])
            if b % 5 == 4:
                col.save_index()
""")


def expected_vector(i: int) -> np.ndarray:
    v = np.random.default_rng(i).standard_normal(D).astype(np.float32)
    return v / np.linalg.norm(v)


def run_writer(root, crash_at: str | None) -> None:
    """Run the writer to its end (crash_at None) or until it SIGKILLs itself at `crash_at`."""
    env = {key: value for key, value in os.environ.items() if key != CRASH_ENV}
    if crash_at is not None:
        env[CRASH_ENV] = crash_at
    proc = run_python(WRITER, [root], env=env, timeout=300)  # a process of its own (tests/helpers/warm_process.py)
    if crash_at is None:
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode == -signal.SIGKILL, f"the writer did not reach {crash_at}: {proc.stderr}"


def check_consistent(root) -> int:
    """Reopen as the next writer would; return the number of live items after checks."""
    with Collection.open(root, writable=True) as col:
        db = sqlite3.connect(root / "meta.sqlite")
        referenced = {p for (p,) in db.execute("SELECT part FROM parts")}
        on_disk = {int(p.name[5:11]) for p in (root / "vectors").iterdir()}
        assert on_disk == referenced, "orphaned or missing part files"
        assert not list(root.glob("*.tmp")) and not list((root / "vectors").glob("*.tmp"))
        rows = db.execute("SELECT id, uri, status, part FROM items").fetchall()
        db.close()
        live = [(i, u) for i, u, s, _ in rows if s == "ok"]
        assert len({u for _, u in live}) == len(live), "duplicate live uri"
        assert all(p in referenced for _, _, _, p in rows)
        ids = np.array([i for i, _ in live])
        want = np.stack([expected_vector(int(u.split("-")[1])) for _, u in live])
        np.testing.assert_allclose(col.vectors(ids), want, atol=2e-3)  # rows match their items
        queries = want[:: max(1, len(want) // 20)]
        scores, found = col.search(queries, k=5)
        exact = queries @ col.vectors(ids).T
        np.testing.assert_allclose(scores, -np.sort(-exact, axis=1)[:, :5], atol=1e-5)
        assert set(found.ravel().tolist()) <= set(ids.tolist())
        assert col.read(lambda rows: rows.lexical_ids()) == sorted(ids.tolist())  # the lexical index kept in step with the rows
        return len(live)


def test_sigkilled_writer_leaves_no_duplicates_orphans_or_stale_index(tmp_path):
    root = tmp_path / "c"
    n_live = []
    # each run resumes the last one's work and dies at another step: after the 3rd part file,
    # during the 2nd index save, after a tombstone commit, after the 30th row commit
    for crash_at in ("add-after-part-written#3", "index-after-replace#2", "delete-after-commit#2",
                     "add-after-commit#30"):
        run_writer(root, crash_at)
        n_live.append(check_consistent(root))
    run_writer(root, None)  # re-running finishes the job without duplicating anything
    n_live.append(check_consistent(root))
    assert n_live[0] <= n_live[1] <= n_live[2]
    db = sqlite3.connect(root / "meta.sqlite")
    uris = {u for (u,) in db.execute("SELECT uri FROM items")}
    db.close()
    assert uris == {f"item-{i}" for i in range(N_ITEMS)}  # every item stored, live or deleted
    with Collection.open(root) as col:
        assert col.info().index_is_current
