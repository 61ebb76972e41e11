"""The rows OCR works on (faste_mm.retrieval.library.ocr): live images and pages whose lexical row has no
body yet, and the text already read for identical content. Receives the collection's `MetaStore`;
hands back item records and texts. Read-only; `MetaStore.set_texts` writes what OCR found.
"""

from __future__ import annotations

import json
from typing import Sequence

from faste_mm.indexers.records import ItemRecord
from faste_mm.indexers.schema import from_db
from faste_mm.indexers.store import MetaStore, _row_to_record


def items_without_body(store: MetaStore, modalities: Sequence[str]) -> list[ItemRecord]:
    """Live records of these modalities whose lexical row has no body yet, in id order (OCR's work
    list: an image or a scanned page; an item read with no text found has the empty body)."""
    rows = store.db.execute(
        f"SELECT {store.record_columns()} FROM items JOIN items_fts ON items_fts.rowid = items.id WHERE items.status = 'ok' "
        "AND items.modality IN (SELECT value FROM json_each(?)) AND items_fts.body IS NULL ORDER BY items.id",
        (json.dumps(list(modalities)),)).fetchall()
    return [_row_to_record(r) for r in rows]


def texts_by_content(store: MetaStore, keys: Sequence[tuple[str, int | None]]) -> dict[tuple[str, int | None], str]:
    """The lexical text of live items with these (content hash, page), where one has text."""
    hashes = sorted({h for h, _ in keys})
    rows = store.db.execute(
        "SELECT items.content_hash, items.page, items_fts.body FROM items JOIN items_fts ON items_fts.rowid = "
        "items.id WHERE items.status = 'ok' AND items_fts.body IS NOT NULL AND items.content_hash IN "
        "(SELECT value FROM json_each(?))", (json.dumps(hashes),)).fetchall()
    wanted = set(keys)
    return {(h, page): from_db(body) for h, page, body in rows if (h, page) in wanted}
