"""faste_mm.serving: the HTTP front end (`faste-mm serve`). An engine owning one loaded model
behind a dynamic batcher, the FastAPI app (OpenAI-compatible embeddings, search, thumbnails,
metrics) and the search page. Needs the `serve` extra: pip install 'faste-mm[serve]'.
"""

from faste_mm.serving.batcher import Batcher, BatcherConfig, QueueFullError
from faste_mm.serving.engine import ServeConfig, ServeEngine
from faste_mm.serving.security import check_bind

__all__ = ["Batcher", "BatcherConfig", "QueueFullError", "ServeConfig", "ServeEngine", "check_bind", "create_app"]


def create_app(engine: ServeEngine):
    """The FastAPI app (imported on use, so the batcher and engine need no FastAPI)."""
    from faste_mm.serving.api import create_app as _create_app

    return _create_app(engine)
