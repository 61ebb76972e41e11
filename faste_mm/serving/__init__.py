"""faste_mm.serving: the HTTP front end (`faste-mm serve`). An engine owning one loaded model
behind a dynamic batcher, the FastAPI app (OpenAI-compatible embeddings, search, thumbnails,
metrics) and the search page. Needs the `serve` extra: pip install 'faste-mm[serve]'.
Names load on first use: `faste_mm.serving.discovery` (used by `faste-mm search`) needs no
model code, so importing this package imports no torch.
"""

from __future__ import annotations

from importlib import import_module

_EXPORTS = {"Batcher": "batcher", "BatcherConfig": "batcher", "QueueFullError": "batcher",
            "ServeConfig": "engine", "ServeEngine": "engine", "check_bind": "security"}
__all__ = [*_EXPORTS, "create_app"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f"faste_mm.serving.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'faste_mm.serving' has no attribute {name!r}")


def create_app(engine):
    """The FastAPI app (imported on use, so the batcher and engine need no FastAPI)."""
    from faste_mm.serving.api import create_app as _create_app

    return _create_app(engine)
