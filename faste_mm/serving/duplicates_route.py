"""GET /duplicates: the served collection's duplicate groups (faste_mm.retrieval.library.duplicates), as
`faste-mm duplicates --format json` prints them. Read-only and model-free: a handler thread opens the
collection itself; nothing is ever deleted.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from faste_mm.retrieval.library.duplicates import DEFAULT_THRESHOLD, collection_duplicates
from faste_mm.serving.engine import NoCollectionError, ServeEngine


def add_duplicates_route(app: FastAPI, engine: ServeEngine, auth) -> None:
    """Register GET /duplicates?threshold=T&exact=false (400 for a threshold outside (0, 1])."""

    @app.get("/duplicates", dependencies=[auth])
    async def duplicates(threshold: float = DEFAULT_THRESHOLD, exact: bool = False) -> dict:
        if engine.collection is None:
            raise NoCollectionError("this server has no collection; start it with `faste-mm serve -c NAME|DIR`")
        report = await run_in_threadpool(collection_duplicates, engine.collection, threshold, near=not exact)
        return report.to_dict()
