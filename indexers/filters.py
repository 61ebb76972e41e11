"""Search filters: which stored items a search may return (metadata values, kind, path glob).

`SearchFilter` is plain validated data; `store.MetaStore.filtered_ids` turns it into one SQL
query with bound parameters and hands the matching live ids to `Collection.search`, which
restricts FAISS to them (an id selector) so a filtered search still returns k hits when k match.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from faste_mm.errors import CollectionError, ConfigError
from faste_mm.indexers.fact_filters import FactCondition, parse_fact_condition
from faste_mm.kinds import FILTER_TYPES

_SCALARS = (str, int, float, bool)
# SQLite stores integers as 64-bit: a value outside this range cannot be compared (OverflowError).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True, slots=True)
class SearchFilter:
    """Conditions a hit must meet, all of them (AND).

    where: metadata key -> value; an item matches when its metadata holds that key with an equal
        value (str, int, float or bool; 2024 and "2024" differ). Keys are top-level names.
    types: item kinds, any of `faste_mm.kinds.FILTER_TYPES` ("image", "pdf", "text", "video"); empty = every kind.
    path: a glob on the stored uri (SQLite GLOB: case-sensitive, `*` also matches `/`), e.g.
        "*/invoices/*" or "*.pdf"; one starting with "~" or "." is made absolute first, as the
        stored uris of files are.
    facts: conditions on the items' facts (`fact_filters`): FactConditions or strings such as
        "taken>=2024-05-01", "taken<2025", "camera~pixel", "rating>=4", "place~lisbon", "has:gps".
    phrases: exact phrases the item's words must hold, each one (its text, file name or metadata
        words in the lexical index; a quoted phrase of an understood query).
    """

    where: Mapping[str, Any] = field(default_factory=dict)
    types: tuple[str, ...] = ()
    path: str | None = None
    facts: tuple[FactCondition | str, ...] = ()
    phrases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.where, Mapping):
            raise ConfigError(f"search where must be a dict of metadata key -> value, got {type(self.where).__name__}")
        for key, value in self.where.items():
            if not isinstance(key, str) or not key or '"' in key:
                raise ConfigError(f"search where: key {key!r} must be a non-empty string without '\"'")
            if not isinstance(value, _SCALARS) or (isinstance(value, float) and not math.isfinite(value)):
                raise ConfigError(f"search where[{key!r}] = {value!r}: values must be a str, int, finite float "
                                  f"or bool")
            if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
                raise ConfigError(f"search where[{key!r}] = {str(value)[:40]}: an integer must fit 64 bits, "
                                  f"{INT64_MIN}..{INT64_MAX}; compare a larger number as a string")
        types = (self.types,) if isinstance(self.types, str) else tuple(self.types)
        for kind in types:
            if kind not in FILTER_TYPES:
                raise ConfigError(f"search type {kind!r} is not one of {', '.join(FILTER_TYPES)}")
        object.__setattr__(self, "types", types)
        object.__setattr__(self, "where", dict(self.where))
        object.__setattr__(self, "facts", tuple(_fact(c) for c in ((self.facts,) if isinstance(self.facts, str)
                                                                   else self.facts)))
        phrases = (self.phrases,) if isinstance(self.phrases, str) else tuple(self.phrases)
        if not all(isinstance(p, str) and p.strip() for p in phrases):
            raise ConfigError(f"search phrases must be non-empty strings, got {phrases!r:.80}")
        object.__setattr__(self, "phrases", phrases)
        if self.path is not None:
            if not isinstance(self.path, str) or not self.path.strip():
                raise ConfigError(f"search path must be a non-empty glob, got {self.path!r}")
            if self.path.startswith(("~", ".")):  # abspath also folds "..", as resolved uris have none
                object.__setattr__(self, "path", os.path.abspath(os.path.expanduser(self.path)))

    @property
    def is_empty(self) -> bool:
        return not self.where and not self.types and self.path is None and not self.facts and not self.phrases

    @property
    def modalities(self) -> tuple[str, ...]:
        """The stored modalities `types` stands for (empty: no condition on the kind)."""
        return tuple(m for kind in self.types for m in FILTER_TYPES[kind])

    def to_dict(self) -> dict[str, Any]:
        return {"where": dict(self.where), "types": list(self.types), "path": self.path,
                "facts": [str(c) for c in self.facts], **({"phrases": list(self.phrases)} if self.phrases else {})}


def _fact(condition: FactCondition | str) -> FactCondition:
    if isinstance(condition, FactCondition):
        return condition
    parsed = parse_fact_condition(condition) if isinstance(condition, str) else None
    if parsed is None:
        raise ConfigError(f"search facts: {condition!r} is not a condition on a fact; write FIELD OP VALUE "
                          f"(e.g. taken>=2024-05-01, camera~pixel, rating>=4) or has:NAME (e.g. has:gps)")
    return parsed


def parse_where(conditions: Sequence[str]) -> tuple[dict[str, Any], tuple[FactCondition, ...]]:
    """`--where` strings (and the API's) -> (metadata key -> value, fact conditions). A condition on a
    fact ("taken>=2024-05-01", "has:gps": `fact_filters.FIELDS`, which take precedence over metadata
    keys of the same name) or KEY=VALUE on metadata, VALUE read as JSON when it is a number, true or
    false, or a quoted string, any other text as itself (so tag=invoice needs no quotes). ConfigError
    naming the condition and the valid form."""
    where: dict[str, Any] = {}
    facts: list[FactCondition] = []
    for condition in conditions:
        fact = parse_fact_condition(condition)
        if fact is not None:
            facts.append(fact)
            continue
        key, sep, text = condition.partition("=")
        if not sep or not key.strip() or any(op in key for op in "<>~!"):
            raise ConfigError(f"where {condition!r}: write KEY=VALUE for metadata (e.g. tag=invoice), or a "
                              f"comparison on a fact (e.g. taken>=2024-05-01, rating>=4, camera~pixel, has:gps)")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        where[key.strip()] = value if isinstance(value, (str, int, float, bool)) else text
    return where, tuple(facts)


def json_path(key: str) -> str:
    """The SQLite JSON path of a top-level metadata key; quoted, so dots and spaces are literal."""
    return f'$."{key}"'


def sql_conditions(where: SearchFilter, indexed: bool, has_facts: bool = True) -> tuple[list[str], list[Any]]:
    """SQL conditions on `items` (and their bound parameters) of a live item meeting `where`;
    `indexed`: the file has schema 5's metadata index `items_meta` (else json_extract on each row);
    `has_facts`: it has schema 7's `item_facts` (else a condition on facts is a CollectionError)."""
    clauses, params = ["items.status = 'ok'"], []
    if where.facts and not has_facts:
        raise CollectionError(f"the collection predates item facts (date taken, camera, place...), so it cannot "
                              f"filter by {where.facts[0]}; run `faste-mm index` on its folders once to read them "
                              f"(nothing is embedded again)")
    for condition in where.facts:
        clause, values = condition.sql()
        clauses.append(clause)
        params += values
    for key, value in where.where.items():
        kinds = (["true" if value else "false"] if isinstance(value, bool)
                 else ["text"] if isinstance(value, str) else ["integer", "real"])
        if indexed:  # a range of the (key, value, id) primary key: the ids of the matches
            clauses.append("items.id IN (SELECT id FROM items_meta WHERE key = ? AND value = ? "
                           "AND kind IN (SELECT value FROM json_each(?)))")
            params += [key, int(value) if isinstance(value, bool) else value, json.dumps(kinds)]
            continue
        path = json_path(key)
        if isinstance(value, bool):
            clauses.append("json_type(metadata, ?) = ?")
            params += [path, kinds[0]]
        else:
            clauses.append("json_extract(metadata, ?) = ? AND json_type(metadata, ?) "
                           "IN (SELECT value FROM json_each(?))")
            params += [path, value, path, json.dumps(kinds)]
    if where.types:
        clauses.append("modality IN (SELECT value FROM json_each(?))")
        params.append(json.dumps(list(where.modalities)))
    if where.path is not None:
        clauses.append("uri GLOB ?")
        params.append(where.path)
    for phrase in where.phrases:  # an FTS5 string: the words in this order, side by side
        clauses.append("items.id IN (SELECT rowid FROM items_fts WHERE items_fts MATCH ?)")
        params.append(phrase_match(phrase))
    return clauses, params


def phrase_match(phrase: str) -> str:
    """The FTS5 expression of an exact phrase: one string (its double quotes doubled), matched in
    any column of the lexical index (text, file name, metadata words)."""
    return '"' + phrase.replace('"', '""') + '"'

