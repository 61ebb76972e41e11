"""GET /search/options: the search options POST /search takes, as JSON, made from their declarations
(`faste_mm.retrieval.search_request`): each one's kind, default, bounds (this server's maximum),
choices and help. The search page builds its controls from it (k, mode, order, type), so it shows the
declared defaults and never a list of its own. Public like the page: it holds no data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from faste_mm.retrieval.search_request import DEFAULTS, options_for

if TYPE_CHECKING:
    from fastapi import FastAPI

FRONT = "http"  # the options and bounds of POST /search's JSON body, which the page sends
K_STEPS = (1, 2, 5)  # the page's k menu: the declared default, twice and five times it


def search_options() -> dict[str, Any]:
    """{"options": {name: {kind, default, min, max, choices, help}}, "page": {"k": [...]}}: the
    declared options of POST /search, and the k values the page offers."""
    options = {}
    for name, declared in options_for(FRONT).items():
        shown: dict[str, Any] = {"kind": declared.kind, "default": DEFAULTS[name], "help": declared.help}
        if declared.min is not None:
            shown["min"] = declared.min
        if declared.maximum(FRONT) is not None:
            shown["max"] = declared.maximum(FRONT)
        if declared.choices:
            shown["choices"] = list(declared.choices)
        options[name] = shown
    return {"options": options, "page": {"k": page_k_choices(options["k"]["default"], options["k"]["max"])}}


def page_k_choices(default: int, most: int) -> list[int]:
    """The numbers of results the page offers: `K_STEPS` times the declared default, none past the
    server's maximum (10 and 1000: [10, 20, 50])."""
    return sorted({min(step * default, most) for step in K_STEPS})


def add_options_route(app: FastAPI) -> None:
    @app.get("/search/options")
    def options() -> dict:
        return search_options()
