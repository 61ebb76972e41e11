"""What a search keeps and in which order, past relevance: a date range (--since/--until, turned
into conditions on the facts' `taken`), where a minimum score applies, and the order of the hits (by relevance, or by date taken either way). Receives the user's values and the hits of
`querying.hits`; hands back filter conditions and re-ordered hits. One place for CLI, API and HTTP.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import date, datetime
from typing import Any, Mapping, Sequence

from faste_mm.errors import ConfigError
from faste_mm.indexers.fact_filters import FIELDS, FactCondition, date_period
from faste_mm.indexers.filters import SearchFilter, parse_where
from faste_mm.retrieval.hits import Hit


def check_min_score_mode(min_score: float | None, mode: str) -> None:
    """ConfigError for a minimum score given to a lexical search: the cut is a cosine with the
    query's vector, which a lexical search never computes (it embeds no query). Hybrid searches
    apply it to every hit, whichever side found it (`Collection.find`)."""
    if min_score is not None and mode == "lexical":
        raise ConfigError(f"min_score {min_score:g}: a minimum cosine similarity to the query, which lexical mode "
                          f"does not compute (it embeds no query); use mode hybrid (the word matches whose "
                          f"cosine reaches it, with the dense ones) or dense, or leave min_score out")


def date_conditions(since: str | date | None, until: str | date | None) -> tuple[FactCondition, ...]:
    """--since/--until as conditions on `taken`: since the start of `since`, until the end of
    `until` (both included: until=2024-05 keeps all of May). ConfigError naming a bad date."""
    conditions = []
    for name, value, op in (("since", since, ">="), ("until", until, "<=")):
        if value is None:
            continue
        text = value.isoformat() if isinstance(value, (date, datetime)) else value
        if not isinstance(text, str):
            raise ConfigError(f"search {name} must be a date string or a datetime.date, got {type(value).__name__}")
        try:
            date_period(text)
        except ConfigError as error:
            raise ConfigError(f"search {name}: {error}") from None
        conditions.append(FactCondition("taken", op, text))
    return tuple(conditions)


def search_filter(where: SearchFilter | Mapping[str, Any] | Sequence[str] | str | None,
                  type: str | Sequence[str] | None, path: str | None, since: str | date | None = None,
                  until: str | date | None = None) -> SearchFilter:
    """The SearchFilter of a search's arguments. `where`: condition strings ("taken>=2024-05-01",
    "camera~pixel", "country=Kenya", "tag=invoice": `filters.parse_where`), a mapping key -> value
    read as those KEY=VALUE words are (a fact's name, e.g. country or place, is the fact, else a
    metadata key), or a whole SearchFilter (then `type` and `path` must be None: it has its own)."""
    if isinstance(where, SearchFilter):
        if type is not None or path is not None:
            raise ConfigError("search: give type and path inside the SearchFilter passed as `where`, not beside it")
        return replace(where, facts=where.facts + date_conditions(since, until))
    if where is None or isinstance(where, Mapping):  # KEY=VALUE words: a fact's name is the fact (as --where)
        metadata = {key: value for key, value in (where or {}).items() if not _is_fact(key)}
        facts = tuple(FactCondition(key.lower(), "=", _fact_text(value)) for key, value in (where or {}).items()
                      if _is_fact(key))
    else:
        metadata, facts = parse_where([where] if isinstance(where, str) else list(where))
    return SearchFilter(where=metadata, types=() if type is None else type, path=path,
                        facts=facts + date_conditions(since, until))


def _is_fact(key: Any) -> bool:
    return isinstance(key, str) and key.lower() in FIELDS


def _fact_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def sort_hits(hits: list[Hit], sort: str) -> list[Hit]:
    """`hits` in `sort` order: as ranked ("relevance"), or by date taken, oldest ("date") or newest
    ("-date") first; hits without a date go last, in their ranked order (a stable sort)."""
    if sort == "relevance":
        return hits
    dated = [h for h in hits if h.facts is not None and h.facts.taken is not None]
    undated = [h for h in hits if h.facts is None or h.facts.taken is None]
    return sorted(dated, key=lambda h: h.facts.taken, reverse=sort == "-date") + undated
