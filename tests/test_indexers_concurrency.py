"""Readers search while a writer adds, deletes and compacts: one consistent snapshot per search."""

from __future__ import annotations

import textwrap
import threading
import time

import numpy as np

from faste_mm.indexers import Collection, ItemRecord, Manifest
from tests.helpers.warm_process import start_python

from tests.helpers.bounds import HANG_S

D = 16
RACE_SECONDS = 3.0

# Adds a few items, deletes one of the live ones, compacts every third round, for RACE_SECONDS.
# Each deleted id is appended to `deleted.log` AFTER its tombstone commits, so a reader that
# read the log before a search knows those ids were tombstoned before its snapshot began.
WRITER = textwrap.dedent(f"""
    import sys, time
    import numpy as np
    from faste_mm.indexers import Collection, ItemRecord

    root, log_path = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(1)
    live, n, rounds = [], 0, 0
    deadline = time.monotonic() + {RACE_SECONDS}
    with Collection.open(root, writable=True) as col, open(log_path, "a") as log:
        while time.monotonic() < deadline:
            v = rng.standard_normal((4, {D})).astype(np.float32)
            v /= np.linalg.norm(v, axis=1, keepdims=True)
            live.extend(col.add(v, [ItemRecord(uri=f"w{{n + i}}", modality="text") for i in range(4)]).tolist())
            n += 4
            victim = live.pop(int(rng.integers(len(live))))
            col.delete([victim])
            log.write(f"{{victim}}\\n")
            log.flush()
            rounds += 1
            if rounds % 3 == 0:
                col.compact()
    print(rounds)
""")


def test_searches_during_add_delete_compact_see_one_snapshot_and_no_tombstones(tmp_path):
    root, log_path = tmp_path / "c", tmp_path / "deleted.log"
    rng = np.random.default_rng(0)
    seed = rng.standard_normal((40, D)).astype(np.float32)
    seed /= np.linalg.norm(seed, axis=1, keepdims=True)
    with Collection.create(root, Manifest(model_id="m", dim=D)) as col:
        col.add(seed, [ItemRecord(uri=f"s{i}", modality="text") for i in range(len(seed))])
    log_path.write_text("")
    writer = start_python(WRITER, [root, log_path])  # a process of its own (tests/helpers/warm_process.py)
    errors: list[str] = []
    tombstoned_hits: list[int] = []
    n_searches = [0]

    def reader(seed_: int) -> None:
        queries = np.random.default_rng(seed_).standard_normal((3, D)).astype(np.float32)
        while writer.poll() is None:
            deleted = {int(x) for x in log_path.read_text().split()}
            try:
                with Collection.open(root) as col:  # a reader that reopens per search
                    dense = col.find(10, queries=queries)
                    ids, records = dense.ids, dense.records
            except Exception as e:  # noqa: BLE001 - the test counts every failure
                errors.append(f"{type(e).__name__}: {e}")
                continue
            found = set(ids[ids >= 0].tolist())
            tombstoned_hits.extend(found & deleted)
            assert set(records) == found
            n_searches[0] += 1

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    out, err = writer.communicate(timeout=120)
    for t in threads:
        t.join(HANG_S)
        assert not t.is_alive(), "a reader thread never finished"
    assert writer.returncode == 0, err
    assert int(out) >= 3 and n_searches[0] >= 3  # the race really ran (writer compacted, readers searched)
    assert errors == []
    assert tombstoned_hits == []
