"""The photo bench's contenders (faste_mm/bench/photos.py) compute what they claim: the facts of
the camera-like photos it writes, and date-range searches that return only items of the range."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np

from faste_mm.indexers.facts import ItemFacts
from faste_mm.bench import photos as photo_costs


def test_the_written_photos_give_full_facts_and_the_contenders_read_them(tmp_path):
    paths = photo_costs.write_photos(tmp_path / "p", 2, size=(64, 48))
    contenders = photo_costs.metadata_contenders(paths)
    facts = contenders["facts"]()
    assert all(isinstance(f, ItemFacts) and f.taken_source == "exif" and f.country and f.keywords for f in facts)
    assert len(set(contenders["sha256"]())) == 2


def test_a_date_range_contender_returns_only_items_of_the_range(tmp_path):
    col = photo_costs.dated_collection(tmp_path / "c", 500, 16)
    queries = np.eye(16, dtype=np.float32)[:2]
    contenders = photo_costs.search_contenders(col, queries, 5, (0.1,))
    _, ids = contenders[next(name for name in contenders if name != "unfiltered")]()
    cut = datetime.fromisoformat(photo_costs.date_range(0.1).split(">=")[1]).replace(tzinfo=timezone.utc).timestamp()
    found = col.get(sorted({int(i) for i in ids.ravel() if i >= 0}))
    assert (ids >= 0).all() and all(r.facts.taken >= cut for r in found)  # 5 hits each, all in the range
    col.close()
