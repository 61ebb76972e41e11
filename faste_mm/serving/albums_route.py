"""GET /albums and GET /albums/{name}: the served collection's albums (faste_mm.retrieval.library.albums),
as `faste-mm album list` / `album show --format json` print them, each member shaped as a POST /search
hit (thumbnail link included) so the search page shows an album as it shows results. Read-only and
model-free: a handler thread opens the collection itself; a `serve --watch` poll keeps them current.
"""

from __future__ import annotations

from typing import Callable

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from faste_mm.indexers.albums import UnknownAlbumError
from faste_mm.retrieval.library.albums import Albums
from faste_mm.retrieval.profile import read_profile
from faste_mm.serving.engine import NoCollectionError, ServeEngine, UnknownItemError


def add_albums_route(app: FastAPI, engine: ServeEngine, auth, hit_json: Callable[[int, object], dict]) -> None:
    """Register GET /albums (every album, without members) and GET /albums/{name} (404: no such album).
    hit_json(rank, hit): the search answer's shape of a hit."""

    def albums() -> Albums:
        if engine.collection is None:
            raise NoCollectionError("this server has no collection; start it with `faste-mm serve -c NAME|DIR`")
        root = engine.collection
        return Albums(root, default_min_score=lambda: read_profile(root).min_score)

    @app.get("/albums", dependencies=[auth])
    async def album_list() -> dict:
        found = await run_in_threadpool(lambda: albums().list())
        return {"albums": [album.to_dict(hits=False) for album in found]}

    @app.get("/albums/{name}", dependencies=[auth])
    async def album_show(name: str) -> dict:
        try:
            album = await run_in_threadpool(lambda: albums().show(name))
        except UnknownAlbumError as error:
            raise UnknownItemError(str(error)) from None
        return {**album.to_dict(hits=False), "hits": [hit_json(rank, hit) for rank, hit in enumerate(album.hits, 1)]}
