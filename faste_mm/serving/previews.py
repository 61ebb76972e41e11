"""What the search page shows of a hit beyond its thumbnail: a larger picture when a thumbnail is
clicked (GET /previews/{id}, rendered on request, not cached; with the size a region drawn on it is
given in, for a search by that region) and the first lines of a text note
(`note_snippets`, sent with the hits). Both read the item's file only while it is the file that
was indexed (retrieval.stored_files); receives the engine, hands the API bytes and strings.
"""

from __future__ import annotations

from fastapi import FastAPI, Response

from faste_mm.errors import FasteError
from faste_mm.indexers.filters import INT64_MAX
from faste_mm.kinds import kind_name
from faste_mm.retrieval.query_crop import picture_size, stored_picture
from faste_mm.retrieval.stored_files import open_stored
from faste_mm.serving.engine import ServeEngine, UnknownItemError
from faste_mm.serving.thumbnails import preview

PREVIEW_PX = 1280  # longest side: a laptop screen's worth; the original stays where it is
SNIPPET_BYTES = 1024  # read at most this much of a note...
SNIPPET_CHARS = 280  # ...and show at most this much of it


def add_preview_routes(app: FastAPI, engine: ServeEngine, auth) -> None:
    @app.get("/previews/{item_id}", dependencies=[auth])
    def previews(item_id: str) -> Response:
        # ids only (ASCII digits of a 64-bit id), as /thumbnails: nothing from the request becomes a path
        if not (item_id.isascii() and item_id.isdigit() and len(item_id) <= 19 and int(item_id) <= INT64_MAX):
            raise UnknownItemError(f"{item_id[:40]!r} is not an item id; previews are served by numeric id")
        record = engine.record(int(item_id))
        picture = preview(record, PREVIEW_PX)
        return Response(picture, media_type="image/jpeg", headers={"Cache-Control": "private, max-age=600",
                                                                   **_picture_size(record, engine)})


def _picture_size(record, engine: ServeEngine) -> dict[str, str]:
    """The X-Picture-Size header of an image's or a PDF page's preview: the size (WxH) of the picture
    a search's `crop` is given in, which the page scales a box drawn on the preview to; none for a
    video (a crop cuts pictures only) or a file that cannot be read now."""
    try:
        width, height = picture_size(stored_picture(record), engine.profile.max_pixels)
    except FasteError:
        return {}
    return {"X-Picture-Size": f"{width}x{height}"}


def note_snippets(engine: ServeEngine, hits: list) -> dict[int, str]:
    """{hit id: its first lines} for the hits that are text files; a note whose file is gone,
    replaced or unreadable simply has none (the search still answers)."""
    notes = [hit.id for hit in hits if kind_name(hit.uri) == "text" and not hit.uri.startswith("item:")]
    if not notes:
        return {}
    snippets = {}
    for item_id, record in engine.records(notes).items():
        try:
            with open_stored(record) as f:
                raw = f.read(SNIPPET_BYTES)
        except (FasteError, OSError):
            continue
        text = " ".join(raw.decode("utf-8", errors="replace").split("\n")[:6]).strip()
        snippets[item_id] = text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS - 1].rstrip() + "…"
    return snippets
