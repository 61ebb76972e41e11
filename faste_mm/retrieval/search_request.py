"""A search request: every option of a search (the query inputs, k, mode, filters, order, minimum
score, rescoring, reranking) declared once, as `CollectionProfile` declares a collection's settings.

Each field of `SearchRequest` is declared with `option(...)`: its default, its check (type, bounds,
choices), its help, its command-line flag and which front ends show it. The rest of faste-mm reads
the declarations: the keywords of `Retriever.search` / `search_batch` / `more_like`, the options of
`faste-mm search` (cli/search_command.py), the HTTP JSON body and multipart form of POST /search
(serving/api.py), the MCP `search` tool's input schema (serving/mcp_tools.py), the thin client's
wire form (serving/discovery.py), the LangChain and LlamaIndex keywords, and the manual's table of
search options (docs/search.md, `python -m faste_mm.retrieval.search_request`).

Adding an option is ONE change: a field below. A query text is understood as meaning and filters
unless `literal` (`understood_search`); its filters join the request's with
`SearchRequest.with_filters`. Standard library only: the thin client
(a search answered by a running server) builds and checks requests without numpy, FAISS or torch.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import os
import re
from dataclasses import dataclass, field, fields
from datetime import date
from typing import Any, Mapping

from faste_mm.errors import ConfigError, InputError

log = logging.getLogger(__name__)

# The front ends an option can be shown by: the Python API (Retriever.search, search_batch,
# more_like), the command line (faste-mm search), POST /search's JSON body and its multipart form
# (the page, curl -F), the MCP `search` tool, the thin client (faste-mm search answered by a
# running server) and the LangChain / LlamaIndex retrievers.
FRONTS = ("python", "cli", "http", "form", "mcp", "client", "adapters")
_EVERYWHERE = frozenset(FRONTS)
_NO_FILES = _EVERYWHERE - {"client", "adapters"}  # inputs a text-only front end cannot carry

MODES = ("dense", "lexical", "hybrid")  # faste_mm.indexers.search.MODES (a test keeps them equal)
SORTS = ("relevance", "date", "-date")  # "date": oldest first, "-date": newest first
KINDS = ("image", "pdf", "text", "video")  # faste_mm.kinds.KINDS (a test keeps them equal)
MAX_K = 1000  # a server answers at most this many hits per request (each is a JSON object)
# A query is a sentence or a paragraph: a longer text is searched by its first MAX_QUERY_CHARS
# characters (logged), in every front end: the request cuts it, so nothing after it (the filters read
# from the text, the server's token count) ever reads more. Past this the words add little to one
# query vector but cost a reranker every pair's tokens: a 300 KB query with the collection's
# reranker took a minute.
MAX_QUERY_CHARS = 2_000
MAX_MCP_K = 50  # each MCP hit carries a thumbnail: 50 is already more than an assistant can look at
# What `where` takes, in every front end (the JSON body's and the MCP schema's types are made from
# these): one condition, a list of them, or a mapping KEY -> VALUE of these scalars.
WHERE_VALUES = (str, int, float, bool)
WHERE_SHAPES = ("a condition string (\"country=Kenya\"), a list of them ([\"taken>=2024\", \"rating>=4\"]) or a "
                "mapping KEY -> VALUE, VALUE a string, number or true/false ({\"country\": \"Kenya\"})")


@dataclass(frozen=True, slots=True)
class Option:
    """How one search option is declared.

    help: one line for the manual and every front end's help. flag: the command-line flag (None:
    not a flag: the positional QUERY, or an option the command line spells its own way).
    fronts: the front ends that show it (`FRONTS`). kind: what its wire value is, for the JSON
    body, the form and the MCP schema: "text", "int", "float", "bool", "choice", "texts" (one
    string or a list), "where" (condition strings or a metadata mapping), "image", "like", "box"
    (a region: "X,Y,W,H" or four whole numbers).
    min / max: inclusive bounds (numbers); limits: a front end's own lower maximum ("mcp": 50).
    choices: the valid values of a "choice". form: the form field's name when not the option's
    (`q` for the query text). aliases: other names the JSON body and form accept (`id`).
    rule: the words of a bad value's message, when the bounds alone do not say what it is.
    """

    help: str
    kind: str
    flag: str | None = None
    fronts: frozenset[str] = _EVERYWHERE
    min: float | None = None
    max: float | None = None
    limits: Mapping[str, int] = dataclasses.field(default_factory=dict)
    choices: tuple[str, ...] = ()
    form: str | None = None
    aliases: tuple[str, ...] = ()
    rule: str = ""

    @property
    def bounds(self) -> dict[str, float]:
        """The bounds a front end's own parser checks (typer, pydantic): none when the option has
        its own `rule`, so every front end answers with the request's one message."""
        return {} if self.rule else {key: value for key, value in (("min", self.min), ("max", self.max))
                                     if value is not None}

    @property
    def envvar(self) -> str | None:
        """The FASTE_MM_* variable of its flag (FASTE_MM_SEARCH_MODE for --mode, as before)."""
        if self.flag is None:
            return None
        name = self.flag.lstrip("-").replace("-", "_").upper()
        return "FASTE_MM_" + {"MODE": "SEARCH_MODE", "INSTRUCTION": "QUERY_INSTRUCTION"}.get(name, name)

    def maximum(self, front: str) -> float | None:
        """The upper bound `front` applies (its own limit, else the option's)."""
        return self.limits.get(front, self.max)


def option(default: Any, help: str, kind: str, **declared: Any) -> Any:
    """A dataclass field of `SearchRequest` carrying its `Option`."""
    return field(default=default, metadata={"option": Option(help, kind, **declared)})


@dataclass(frozen=True, slots=True)
class SearchRequest:
    """One search, whichever front end it came from; each field is one option (`OPTIONS`).

    Give a query text, an image, a video (any combination), or `like` (an item id or an indexed
    file's path: "more like this", the item itself left out), never both kinds.
    Raises ConfigError naming the option, the value and the valid range for a bad value,
    InputError when nothing is asked or `like` is combined with a query.
    """

    query: str | None = option(None, f"What to find, in words (a text query); a longer text than "
                                     f"{MAX_QUERY_CHARS:,} characters is searched by its first {MAX_QUERY_CHARS:,}.",
                               "text", form="q")
    image: Any = option(None, "Find by picture: a file path (Python: also a PIL image; HTTP: a data: URL or an "
                              "uploaded file; MCP: an indexed file's path or a data: URL). Alone it finds "
                              "visually similar items.", "image", flag="--image", fronts=_NO_FILES)
    video: Any = option(None, "Find by video, sampled like the collection's videos; alone it finds similar items.",
                        "image", flag="--video", fronts=frozenset({"python", "cli"}))
    like: Any = option(None, "More like this: an item id, or the path of an indexed file (its first page), whose "
                             "stored vector is searched with; the item itself is left out.", "like", flag="--like",
                       fronts=_EVERYWHERE - {"adapters"}, aliases=("id",))
    crop: Any = option(None, "Find by a region of the picture: X,Y,W,H (left, top, width, height) in its pixels, "
                             "with an image or like (the region of that item's file is read and embedded; like "
                             "without crop searches with the stored vector). A photo's pixels as viewers show it "
                             "(EXIF orientation applied), a PDF page's as rendered for the model (a PDF file: its "
                             "first page). A small region is upscaled as any small image is.", "box", flag="--crop",
                       fronts=_EVERYWHERE - {"adapters"})
    instruction: str | None = option(None, "The query's task instruction. Default: the model's official query "
                                           "instruction ('Retrieve images or text relevant to the user's query.' "
                                           "for Qwen3-VL-Embedding).", "text", flag="--instruction",
                                     fronts=frozenset({"python", "cli"}))
    k: int = option(10, "Number of results.", "int", flag="-k", min=1, limits={"http": MAX_K, "form": MAX_K,
                                                                              "client": MAX_K, "mcp": MAX_MCP_K})
    mode: str = option("dense", "dense (by meaning) | lexical (by words: file names, text, PDF text layers, "
                                "metadata; loads no model) | hybrid (both, reciprocal-rank fused).", "choice",
                       flag="--mode", choices=MODES)
    where: Any = option(None, "Only items meeting every condition: on the facts read from the files "
                              "(taken>=2024-05-01, taken<2025, camera~pixel (~: contains), rating>=4, place~lisbon, "
                              "country=Kenya, keyword=beach, has:gps; docs/photos.md) or on metadata (KEY=VALUE, "
                              "VALUE a number, true/false or text; quote a number to match it as text: "
                              "year='\"2024\"'). Python, JSON and MCP take " + WHERE_SHAPES + "; a mapping reads as "
                              "KEY=VALUE words.",
                        "where", flag="--where")
    type: Any = option(None, "Only items of these kinds: image | pdf | text | video (any of them).", "texts",
                       flag="--type", choices=KINDS)
    path: str | None = option(None, "Only files whose path matches this glob ('*' also matches '/'), e.g. "
                                    "'*/invoices/*', '*.pdf', './photos/*'.", "text", flag="--path")
    since: Any = option(None, "Only items taken on or after this date (YYYY, YYYY-MM, YYYY-MM-DD, or an ISO time; "
                              "UTC unless it has an offset).", "text", flag="--since")
    until: Any = option(None, "Only items taken on or before this date, all of it (until 2024-05 keeps May).",
                        "text", flag="--until")
    sort: str = option("relevance", "relevance | date (oldest first) | -date (newest first): the k best hits, in "
                                    "this order.", "choice", flag="--sort", choices=SORTS)
    min_score: float | None = option(None, "Drop hits whose cosine with the query is below this, -1..1 (e.g. 0.3). "
                                           "Default: the collection's (index --min-score), else none. Lexical mode "
                                           "computes no cosine: refused there.", "float", flag="--min-score",
                                     min=-1.0, max=1.0, rule="a minimum cosine similarity between -1 and 1 (e.g. 0.3; "
                                                             "hits scoring below it are dropped)")
    rescore: int | None = option(None, "Candidates per hit that an int8/binary/PQ index returns to be rescored "
                                       "exactly from the copy on disk (0 = none). Default: 20 for binary, 2 for "
                                       "int8, 4 for PQ.", "int", flag="--rescore", min=0,
                                 limits={"http": MAX_K, "form": MAX_K, "client": MAX_K, "mcp": MAX_K})
    lexical_syntax: bool = option(False, "Read the query as SQLite FTS5 syntax (AND OR NOT \"phrase\" prefix*) in "
                                         "lexical and hybrid modes; default: plain words.", "bool",
                                  flag="--lexical-syntax")
    literal: bool = option(False, "Search the query text as typed: no dates, places, cameras, ratings, kinds or "
                                  "\"quoted phrases\" are read from it as filters (default: they are, docs/asking.md).",
                           "bool", flag="--literal")
    rerank: Any = option(None, "Re-score the top rerank_top hits with the reranker. Default: the collection's "
                               "reranker when it records one (index --reranker); false: never; true: always "
                               "(an error without a reranker). Python also takes a faste_mm.Reranker.", "bool")
    rerank_top: int = option(50, "Hits the reranker re-scores (at least k).", "int", flag="--rerank-top", min=1,
                             limits={"http": MAX_K, "form": MAX_K, "client": MAX_K, "mcp": MAX_K})

    def __post_init__(self) -> None:
        for name, declared in OPTIONS.items():
            object.__setattr__(self, name, _checked(name, declared, getattr(self, name)))
        if self.query is not None and len(self.query) > MAX_QUERY_CHARS:  # cut once, before anything reads it
            log.warning("search: the query text has %d characters; searching with its first %d (MAX_QUERY_CHARS)",
                        len(self.query), MAX_QUERY_CHARS)
            object.__setattr__(self, "query", self.query[:MAX_QUERY_CHARS])
        asked = [name for name in ("query", "image", "video") if getattr(self, name) is not None]
        if self.like is not None and asked:
            raise InputError(f"search: give `like` (more like this) or a query ({', '.join(asked)}), not both")
        if self.like is None and not asked:
            raise InputError("search: give a query text, an image, a video, or `like` (an item id or an indexed "
                             "file's path)")
        if self.crop is not None and (self.video is not None or (self.image is None and self.like is None)):
            raise InputError("search: `crop` cuts a region of a picture: give it with `image` (a picture or a PDF: "
                             "its first page) or `like` (an image or PDF page item)" +
                             ("; a video query cannot be cropped" if self.video is not None else ""))

    @classmethod
    def of(cls, caller: str = "search", /, **given: Any) -> "SearchRequest":
        """A request from keyword options; ConfigError naming `caller`, the unknown names and the
        valid ones for a keyword that is not an option."""
        unknown = sorted(set(given) - set(OPTIONS))
        if unknown:
            raise ConfigError(f"{caller}: unknown search options {unknown}; valid ones are {list(OPTIONS)}")
        return cls(**given)

    def with_filters(self, **filters: Any) -> "SearchRequest":
        """This request with more filters (a parsed query's): `where` conditions are added to
        this request's, the other options (since, until, type, path, sort, ...) replace them."""
        where = filters.pop("where", None)
        if where is not None:
            filters["where"] = _joined_where(self.where, where)
        return SearchRequest.of("with_filters", **{**self.options(), **filters})

    def checked_for(self, front: str) -> "SearchRequest":
        """This request, when it also keeps `front`'s own lower maximums (`Option.limits`: a
        server's k <= MAX_K, MCP's k <= 50); ConfigError naming the option, the value and the
        front end's range otherwise (the message every bound gives)."""
        for name in OPTIONS:
            check_option(name, getattr(self, name), front)
        return self

    def options(self) -> dict[str, Any]:
        """Every option by name, as given (the keyword form `of` takes)."""
        return {name: getattr(self, name) for name in OPTIONS}

    @property
    def is_like(self) -> bool:
        return self.like is not None

    def wire(self, front: str = "client") -> dict[str, Any]:
        """The JSON body of POST /search for this request: the options `front` shows that differ
        from their defaults (the thin client's wire form). ConfigError for an option given here
        that the front end cannot carry."""
        body = {}
        for name, declared in OPTIONS.items():
            value = getattr(self, name)
            if value == DEFAULTS[name]:
                continue
            if front not in declared.fronts:
                raise ConfigError(f"search option {name} cannot be sent by {front}")
            body[name] = list(value) if isinstance(value, tuple) else value
        return body


OPTIONS: dict[str, Option] = {f.name: f.metadata["option"] for f in fields(SearchRequest)}
DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(SearchRequest)}


def options_for(front: str) -> dict[str, Option]:
    """The options `front` shows, in declaration order."""
    return {name: declared for name, declared in OPTIONS.items() if front in declared.fronts}


def check_option(name: str, value: Any, front: str | None = None) -> Any:
    """`value` of option `name` checked as a request checks it (within `front`'s own maximum when
    given: a form's k <= MAX_K) and normalised: the one message of a bad value, whichever front end
    parses it. ConfigError naming the option, the value and what it takes."""
    declared = OPTIONS[name]
    if front is not None and declared.kind in ("int", "float") and isinstance(value, (int, float)) \
            and not isinstance(value, bool):
        _bounded(name, declared, value, front)
    return _checked(name, declared, value)


def _checked(name: str, declared: Option, value: Any) -> Any:
    """`value` normalised (a list of kinds as a tuple, a number as a float), or ConfigError naming
    the option, the value and the valid range."""
    if value is None:
        return None
    kind = declared.kind
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"search {name} must be an integer, got {value!r}")
        _bounded(name, declared, value)
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"search {name} must be a number, got {value!r}")
        _bounded(name, declared, value)
        value = float(value)
    elif kind == "bool":
        if name != "rerank" and not isinstance(value, bool):
            raise ConfigError(f"search {name} must be true or false, got {value!r}")
    elif kind == "choice":
        if value not in declared.choices:
            raise ConfigError(f"search {name} {value!r} is not one of {', '.join(declared.choices)}")
    elif kind == "texts":
        values = (value,) if isinstance(value, str) else tuple(value)
        bad = [v for v in values if v not in declared.choices]
        if bad:
            raise ConfigError(f"search {name} {bad[0]!r} is not one of {', '.join(declared.choices)}")
        value = values or None
    elif kind == "text":
        if name in ("since", "until") and isinstance(value, date):
            return value
        if not isinstance(value, str):
            raise ConfigError(f"search {name} must be a string, got {type(value).__name__}")
    elif kind == "where":
        value = _where(value)
    elif kind == "like":
        if isinstance(value, bool) or not isinstance(value, (int, str, os.PathLike)):
            raise ConfigError(f"search like must be an item id or a file path, got {type(value).__name__}")
    elif kind == "box":
        value = _box(name, value)
    return value


def _where(value: Any) -> tuple[str, ...] | Mapping[str, Any]:
    """`where` as conditions (one string is one condition) or as the mapping given; ConfigError
    naming `where`, the accepted shapes (`WHERE_SHAPES`) and what was wrong for any other."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Mapping):
        bad = next(((key, v) for key, v in value.items() if not isinstance(key, str) or
                    not isinstance(v, WHERE_VALUES) or (isinstance(v, float) and not math.isfinite(v))), None)
        if bad is None:
            return value
        wrong = f"key {bad[0]!r} is not a string" if not isinstance(bad[0], str) else \
            f"{bad[0]}'s value {_shown_value(bad[1])} is not a string, number or true/false (one value per key; " \
            f"several conditions on one key: a list of conditions)"
        raise ConfigError(f"search where must be {WHERE_SHAPES}; {wrong}")
    if isinstance(value, (list, tuple)):
        bad = next((v for v in value if not isinstance(v, str)), None)
        if bad is None:
            return tuple(value)
        raise ConfigError(f"search where must be {WHERE_SHAPES}; the list holds {_shown_value(bad)}, not a condition "
                          f"string")
    raise ConfigError(f"search where must be {WHERE_SHAPES}; got {type(value).__name__} {_shown_value(value)}")


def _shown_value(value: Any) -> str:
    return repr(value)[:60]


def _box(name: str, value: Any) -> tuple[int, int, int, int]:
    """A region (x, y, width, height) in whole pixels, from "X,Y,W,H" or four integers; ConfigError
    naming the option for any other form, a corner left of or above the picture, or no area. (That
    it lies inside the picture is checked against the picture: retrieval/query_crop.py.)"""
    parts = value.split(",") if isinstance(value, str) else value
    if isinstance(parts, (list, tuple)) and len(parts) == 4:
        given = [int(p) if isinstance(p, str) and re.fullmatch(r"\s*-?[0-9]+\s*", p) else p for p in parts]
        if all(isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in given):  # numpy's too
            x, y, width, height = map(int, given)
            if x < 0 or y < 0:
                raise ConfigError(f"search {name} {_shown(value)}: the box starts left of or above the picture; X and "
                                  f"Y (its top-left corner, in pixels from the picture's top-left) must be 0 or more")
            if width < 1 or height < 1:
                raise ConfigError(f"search {name} {_shown(value)}: the box has no area; W and H (its width and height "
                                  f"in pixels) must be at least 1")
            return x, y, width, height
    raise ConfigError(f"search {name} must be X,Y,W,H: four whole numbers of pixels (the box's left, top, width and "
                      f"height, e.g. 120,40,300,200), got {_shown(value)}")


def _shown(value: Any) -> str:
    """A given box as its message shows it (its first 60 characters)."""
    text = value if isinstance(value, str) else ",".join(map(str, value)) if isinstance(value, (list, tuple)) \
        else repr(value)
    return repr(text[:60])


def _bounded(name: str, declared: Option, value: float, front: str | None = None) -> None:
    low, high = declared.min, declared.max if front is None else declared.maximum(front)
    if declared.rule and ((low is not None and value < low) or (high is not None and value > high)):
        raise ConfigError(f"{name} {value!r}: {declared.rule}")
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"{low:g}..{high:g}" if low is not None and high is not None else f">= {low:g}" if low is not None \
            else f"<= {high:g}"
        raise ConfigError(f"search {name} must be {span}, got {value!r}")


def _joined_where(ours: Any, theirs: Any) -> Any:
    """Two `where` values as one: conditions of both (a mapping becomes KEY=VALUE conditions)."""
    def conditions(value: Any) -> tuple:
        if value is None:
            return ()
        if isinstance(value, Mapping):
            return tuple(f"{key}={_where_value(v)}" for key, v in value.items())
        return (value,) if isinstance(value, str) else tuple(value)

    return conditions(ours) + conditions(theirs)


def _where_value(value: Any) -> str:
    import json

    return json.dumps(value) if isinstance(value, str) and _looks_typed(value) else \
        str(value).lower() if isinstance(value, bool) else str(value)


def _looks_typed(text: str) -> bool:
    """Whether a metadata text would be read as a number or a boolean in a KEY=VALUE condition."""
    if text.lower() in ("true", "false"):
        return True
    try:
        float(text)
        return True
    except ValueError:
        return False


def options_table() -> str:
    """The manual's table of search options (docs/search.md "Search options"), generated from the
    declarations: the Python keyword, the flag, the default, the front ends and the help line."""
    names = {"python": "Python", "cli": "CLI", "http": "JSON", "form": "form", "mcp": "MCP", "client": "thin client",
             "adapters": "LangChain/LlamaIndex"}
    rows = ["| option (Python keyword, JSON field) | flag | default | bounds | front ends | what it is |",
            "|---|---|---|---|---|---|"]
    for name, declared in OPTIONS.items():
        default = DEFAULTS[name]
        shown = "none" if default is None else f"`{str(default).lower() if isinstance(default, bool) else default}`"
        flag = f"`{declared.flag}`" if declared.flag else ("`QUERY` (argument)" if name == "query" else
                                                          "`--rerank MODEL`, `--no-rerank`" if name == "rerank" else "")
        bounds = ", ".join(declared.choices) if declared.kind == "choice" else _bounds_text(declared)
        fronts = ", ".join(names[front] for front in FRONTS if front in declared.fronts)
        also = "".join(f" (also `{alias}`)" for alias in declared.aliases) + \
            (f" (form `{declared.form}`)" if declared.form else "")
        rows.append(f"| `{name}`{also} | {flag} | {shown} | {bounds} | {fronts} | {declared.help.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def _bounds_text(declared: Option) -> str:
    if declared.min is None and declared.max is None:
        return ""
    text = f"{declared.min:g}..{declared.max:g}" if declared.max is not None else f">= {declared.min:g}"
    own = ", ".join(f"{front} <= {limit}" for front, limit in declared.limits.items() if front in ("http", "mcp"))
    return f"{text} ({own})" if own else text


if __name__ == "__main__":
    print(options_table(), end="")
